"""python -m codegen: the same as `v4serve codegen`."""
import sys

from codegen.cli import main

sys.exit(main())
