"""``python -m pypto_models_gutenocr``: the CLI."""

import sys

from .cli import main

__all__: list[str] = []

sys.exit(main())
