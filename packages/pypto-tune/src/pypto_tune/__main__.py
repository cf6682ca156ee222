"""``python -m pypto_tune`` == ``pypto-tune``."""

from .cli import main

__all__: list[str] = []

raise SystemExit(main())
