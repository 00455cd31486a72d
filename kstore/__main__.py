"""`python -m kstore`: the `kstore` command (kstore.tools.cli)."""
import sys

from kstore.tools.cli import main

sys.exit(main())
