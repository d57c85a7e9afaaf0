"""`python -m cli`: the `routescope` command."""
import sys

from .main import main

sys.exit(main())
