"""`python -m kstore`: the `kstore` command (kstore.tools.cli)."""
from kstore.tools.cli import main

raise SystemExit(main())
