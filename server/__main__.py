"""python -m server: the same as `v4serve serve`."""
import sys

from server.cli import main

sys.exit(main())
