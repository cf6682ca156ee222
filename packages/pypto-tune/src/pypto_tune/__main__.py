"""``python -m pypto_tune`` == ``pypto-tune``."""

from .cli import main

raise SystemExit(main())
