"""``python -m pypto_bench.multi SPEC``: the launcher of a ``--nproc N`` run, started by
:func:`pypto_bench.multi.run_distributed` (not a command for people)."""

from __future__ import annotations

import sys

from .launch import launcher_main

__all__: list[str] = []

if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(
            "usage: python -m pypto_bench.multi SPEC.json (the launcher that "
            "pypto_bench.multi.run_distributed starts; run `pypto-bench run --nproc N` instead)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    raise SystemExit(launcher_main(sys.argv[1]))
