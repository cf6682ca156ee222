"""``python -m pypto_capture``: the ``pypto-capture`` command."""

import sys

from .cli import main

__all__: list[str] = []

sys.exit(main())
