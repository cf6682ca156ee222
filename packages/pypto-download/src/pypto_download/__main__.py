"""``python -m pypto_download`` == ``pypto-download``."""

import sys

from .cli import main

sys.exit(main())
