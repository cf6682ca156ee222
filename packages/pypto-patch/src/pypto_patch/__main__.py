"""``python -m pypto_patch``: the CLI."""

import sys

from .cli import main

__all__: list[str] = []

sys.exit(main())
