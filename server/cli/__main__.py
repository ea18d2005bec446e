"""python -m server.cli: the `v4serve` command."""
import sys

from server.cli import main

sys.exit(main())
