"""The project's exit codes: the shared 0-3 and one range of its own per tool.

Why ranges: pypto-e2e chains the tools and must say which step failed and how; when
two tools both used 10-20 for different things, e2e passed a download code through and
its README called it "load failed". Each tool declares its table here-validated
(:class:`ExitCodeTable`), and docs/exit-codes.md is generated from all of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = [
    "COMMON_CODES",
    "ENVIRONMENT",
    "EXIT_RANGES",
    "EXTRA_EXIT_RANGES",
    "FAILED",
    "OK",
    "USAGE",
    "ExitCode",
    "ExitCodeTable",
]

OK = 0
FAILED = 1
USAGE = 2
ENVIRONMENT = 3

#: (code, name, meaning) every tool shares.
COMMON_CODES: tuple[tuple[int, str, str], ...] = (
    (OK, "OK", "success"),
    (FAILED, "FAILED", "the job failed (details on stderr)"),
    (USAGE, "USAGE", "bad usage or bad input; nothing was changed"),
    (
        ENVIRONMENT,
        "ENVIRONMENT",
        "the environment lacks something (device, network, optional dependency)",
    ),
)

#: Each tool's own range for codes callers must tell apart (inclusive start, exclusive end).
EXIT_RANGES: dict[str, range] = {
    "pypto-download": range(10, 30),
    "pypto-patch": range(30, 40),
    "pypto-bench": range(40, 50),
    "pypto-doctor": range(50, 60),
    "pypto-e2e": range(60, 70),
    "pypto-gutenocr": range(70, 80),
    "pypto-tune": range(80, 90),
    "pypto-capture": range(90, 100),
    "pypto-precision": range(100, 110),
}

#: A second range for a tool whose first is full (pypto-bench's 40-49: its numerical gate
#: came after every code there was taken). Codes there mean one thing everywhere, too.
EXTRA_EXIT_RANGES: dict[str, range] = {
    "pypto-bench": range(110, 120),
}


@dataclass(frozen=True)
class ExitCode:
    code: int
    name: str
    meaning: str


class ExitCodeTable:
    """One tool's exit codes, checked against the project's ranges when it is built.

    Codes are read by name (``EXIT.LOAD_FAILED``) so tests and callers never hard-code
    numbers. The shared 0-3 are always present; a tool may reword their meaning.
    """

    def __init__(self, tool: str, codes: Iterable[tuple[int, str, str]]) -> None:
        if tool not in EXIT_RANGES:
            raise ValueError(f"{tool!r} has no exit-code range: add it to pypto_common.EXIT_RANGES")
        own = EXIT_RANGES[tool]
        entries: dict[str, ExitCode] = {}
        by_code: dict[int, ExitCode] = {}
        common = {c: (n, m) for c, n, m in COMMON_CODES}
        for code, name, meaning in codes:
            if code in common and name != common[code][0]:
                raise ValueError(f"{tool}: code {code} is the shared {common[code][0]}, not {name}")
            extra = EXTRA_EXIT_RANGES.get(tool, range(0))
            if code not in common and code not in own and code not in extra:
                raise ValueError(
                    f"{tool}: code {code} ({name}) is outside its range {own.start}-{own.stop - 1}"
                )
            if name in entries or code in by_code:
                raise ValueError(f"{tool}: code {code} / name {name} declared twice")
            entries[name] = by_code[code] = ExitCode(code, name, meaning)
        for code, (name, meaning) in common.items():
            if code not in by_code:
                entries[name] = by_code[code] = ExitCode(code, name, meaning)
        self.tool = tool
        self.range = own
        self._by_name = entries
        self._by_code = by_code

    def __getattr__(self, name: str) -> int:
        try:
            entry: ExitCode = self.__dict__["_by_name"][name]
            return entry.code
        except KeyError:
            raise AttributeError(f"{self.__dict__.get('tool')} has no exit code {name}") from None

    def __iter__(self) -> Iterator[ExitCode]:
        return iter(sorted(self._by_code.values(), key=lambda e: e.code))

    def __contains__(self, code: object) -> bool:
        return code in self._by_code

    def name_of(self, code: int) -> str:
        entry = self._by_code.get(code)
        return entry.name if entry else f"UNKNOWN({code})"

    def meaning(self, code: int) -> str:
        entry = self._by_code.get(code)
        return entry.meaning if entry else "undocumented"
