"""``python -m pypto_env`` is ``pypto-doctor``."""

import sys

from .doctor import main

__all__: list[str] = []

sys.exit(main())
