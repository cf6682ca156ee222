"""``python -m pypto_capture``: the ``pypto-capture`` command."""

import sys

from .cli import main

sys.exit(main())
