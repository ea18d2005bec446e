"""python -m server: the same as `v4serve serve`."""
import sys

from server.cli.serve import main

sys.exit(main())
