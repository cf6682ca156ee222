"""``python -m pypto_precision``: the ``pypto-precision`` command."""

import sys

from .cli import main

__all__: list[str] = []

sys.exit(main())
