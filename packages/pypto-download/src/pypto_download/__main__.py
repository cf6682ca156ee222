"""``python -m pypto_download`` == ``pypto-download``."""

import sys

from .cli import main

__all__: list[str] = []

sys.exit(main())
