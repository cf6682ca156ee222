"""``python -m pypto_e2e``: the CLI."""

import sys

from .cli import main

__all__: list[str] = []

sys.exit(main())
