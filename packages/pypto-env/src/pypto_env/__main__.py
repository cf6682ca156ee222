"""``python -m pypto_env`` is ``pypto-doctor``."""

import sys

from .doctor import main

sys.exit(main())
