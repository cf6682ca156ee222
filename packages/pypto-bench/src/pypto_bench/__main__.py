"""``python -m pypto_bench`` == ``pypto-bench`` (for machines where only PYTHONPATH is set)."""

from .cli import main

__all__: list[str] = []

raise SystemExit(main())
