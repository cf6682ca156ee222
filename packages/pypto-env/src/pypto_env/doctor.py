"""``pypto-doctor``: which torch / torch_npu to install for this machine's CANN.

stdout carries only the ``pip install torch==X torch-npu==Y`` line (or, with ``--json``,
one JSON object) so scripts can ``eval``/parse it; the explanation goes to stderr.

Exit codes: :data:`pypto_env.EXIT` (0 consistent or not installed yet, 1 mismatch,
2 unknown ``--cann``, 3 no CANN found, 50 a detected CANN the matrix does not document).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from .detect import ENV_VARS, find_cann
from .errors import EXIT
from .matrix import (
    MatrixRow,
    UnknownCannVersionError,
    cann_for_torch,
    known_cann_versions,
    load_unpaired,
    rows_for,
    torch_base_version,
)

__all__ = ["EXIT", "EXIT_CODES", "Diagnosis", "diagnose", "main"]

SCHEMA_VERSION = 1
#: code -> meaning, derived from :data:`EXIT` (kept for callers of 0.1.0).
EXIT_CODES = {e.code: e.meaning for e in EXIT}
SET_ENV_HINT = (
    "source CANN's set_env.sh (e.g. `source /usr/local/Ascend/ascend-toolkit/set_env.sh` or "
    "`source /usr/local/Ascend/cann/set_env.sh`) or `export ASCEND_HOME_PATH=<toolkit dir>`; "
    "or pass --cann VERSION"
)


@dataclass
class Diagnosis:
    """Everything pypto-doctor says, as data (the CLI only formats it)."""

    exit_code: int
    status: str
    message: str
    cann: dict[str, Any] | None = None
    installed: dict[str, str | None] = field(default_factory=dict)
    pins: MatrixRow | None = None
    recommended: MatrixRow | None = None
    pairings: list[MatrixRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tried: list[tuple[str, str]] = field(default_factory=list)

    @property
    def pip_command(self) -> str | None:
        return self.pins.pins.pip_command() if self.pins else None

    def as_dict(self) -> dict[str, Any]:
        def row(r: MatrixRow | None) -> dict[str, Any] | None:
            return (
                None if r is None else {"cann": r.cann, "torch": r.torch, "torch_npu": r.torch_npu}
            )

        return {
            "schema_version": SCHEMA_VERSION,
            "exit_code": self.exit_code,
            "status": self.status,
            "message": self.message,
            "cann": self.cann,
            "installed": self.installed,
            "pins": row(self.pins),
            "recommended": row(self.recommended),
            "pip_command": self.pip_command,
            "pairings": [row(r) for r in self.pairings],
            "known_cann": known_cann_versions(),
            "notes": self.notes,
            "tried": [list(t) for t in self.tried],
        }


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _torch_note(torch: str) -> str:
    base = torch_base_version(torch)
    for u in load_unpaired():
        if u.torch == base:
            return u.note
    paired = cann_for_torch(base)
    if paired:
        return f"torch {base} pairs with CANN {', '.join(paired)}"
    return f"torch {base} has no documented torch_npu / CANN pairing"


def diagnose(cann: str | None = None, env: Mapping[str, str] | None = None) -> Diagnosis:
    """Compare installed torch / torch_npu with the matrix row(s) for ``cann`` (or the
    detected CANN when ``cann`` is None). Never imports torch."""
    installed = {"torch": _dist_version("torch"), "torch_npu": _dist_version("torch-npu")}
    tried: list[tuple[str, str]] = []
    if cann is not None:
        try:
            rows = rows_for(cann)
        except UnknownCannVersionError as exc:
            return Diagnosis(
                EXIT.USAGE,
                "bad-input",
                f"unknown CANN {cann!r}; pass one of: {', '.join(exc.known)}",
                installed=installed,
            )
        cann_info: dict[str, Any] = {"version": cann, "release": rows[0].cann, "origin": "argument"}
    else:
        detection = find_cann(env)
        tried = detection.tried
        if detection.install is None:
            return Diagnosis(
                EXIT.ENVIRONMENT,
                "no-cann",
                f"no CANN toolkit found ({', '.join(ENV_VARS)} unset or unusable): {SET_ENV_HINT}",
                installed=installed,
                tried=tried,
            )
        cann_info = {**detection.install.as_dict(), "origin": "detected"}
        try:
            rows = rows_for(detection.install.version)
        except UnknownCannVersionError as exc:
            return Diagnosis(
                EXIT.UNKNOWN_CANN,
                "unknown-cann",
                f"CANN {detection.install.version} (at {detection.install.home}) is not in the "
                f"matrix; install one of {', '.join(exc.known)} or pass --cann VERSION",
                cann={**cann_info, "release": None},
                installed=installed,
                tried=tried,
            )
        cann_info["release"] = rows[0].cann

    release = cann_info["release"]
    ordered = sorted(rows, key=lambda r: not r.recommended)
    recommended = ordered[0]
    torch = installed["torch"]
    npu = installed["torch_npu"]
    torch_base = torch_base_version(torch) if torch else None
    npu_base = torch_base_version(npu) if npu else None

    def agrees(r: MatrixRow) -> bool:
        return (torch_base is None or r.torch == torch_base) and (
            npu_base is None or r.torch_npu == npu_base
        )

    match = next((r for r in ordered if agrees(r)), None)
    notes: list[str] = []
    common: dict[str, Any] = {
        "cann": cann_info,
        "installed": installed,
        "recommended": recommended,
        "pairings": ordered,
        "tried": tried,
    }
    if match is not None:
        if torch and npu:
            status, msg = "ok", f"torch {torch} + torch_npu {npu} match CANN {release}"
        elif torch or npu:
            have = f"torch {torch}" if torch else f"torch_npu {npu}"
            status, msg = "incomplete", f"{have} matches CANN {release}; install the other one"
        else:
            status, msg = (
                "not-installed",
                f"torch / torch_npu not installed yet; the printed line installs the pair for CANN {release}",
            )
        return Diagnosis(EXIT.OK, status, msg, pins=match, notes=notes, **common)

    # Mismatch: keep the user's torch when this CANN supports it, else the recommended row.
    target = next((r for r in ordered if r.torch == torch_base), recommended)
    problems = []
    if torch and not any(r.torch == torch_base for r in ordered):
        problems.append(f"torch {torch} is not paired with CANN {release}")
        notes.append(_torch_note(torch))
    if npu and not any(
        r.torch_npu == npu_base for r in ordered if torch_base is None or r.torch == torch_base
    ):
        problems.append(
            f"torch_npu {npu} is not paired with CANN {release}"
            + (f" and torch {torch}" if torch else "")
        )
    msg = "; ".join(problems) or f"torch {torch} + torch_npu {npu} do not match CANN {release}"
    return Diagnosis(EXIT.FAILED, "mismatch", msg, pins=target, notes=notes, **common)


def _explain(d: Diagnosis) -> list[str]:
    lines = []
    c = d.cann
    if c is not None:
        if c["origin"] == "detected":
            lines.append(
                f"CANN {c['version']} detected at {c['home']} (layout {c['layout']}, "
                f"arch {c['arch'] or '?'}, read from {c['source']})"
            )
            if c.get("release") and c["release"] != c["version"]:
                lines.append(f"  using the matrix row(s) of its release {c['release']}")
        else:
            lines.append(f"CANN {c['version']} (from --cann)")
    else:
        for cand, why in d.tried:
            lines.append(f"  looked at {cand}: {why}")
    for name in ("torch", "torch_npu"):
        lines.append(f"{name}: {d.installed.get(name) or 'not installed'}")
    if d.pairings:
        lines.append(
            "documented pairings: "
            + ", ".join(
                f"torch {r.torch} + torch_npu {r.torch_npu}{' (recommended)' if r.recommended else ''}"
                for r in d.pairings
            )
        )
    lines += [f"note: {n}" for n in d.notes]
    lines.append(("ok: " if d.exit_code == EXIT.OK else "pypto-doctor: ") + d.message)
    if d.pip_command:
        lines.append(f"to install: {d.pip_command}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pypto-doctor",
        description="Detect CANN and print the pip line that installs the matching torch / torch_npu.",
        epilog="exit codes: " + "; ".join(f"{e.code} {e.name}: {e.meaning}" for e in EXIT),
    )
    parser.add_argument(
        "--cann", metavar="VERSION", help="use this CANN version instead of detecting it"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log detection details on stderr"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
    )
    d = diagnose(args.cann, os.environ)
    for line in _explain(d):
        print(line, file=sys.stderr)
    if args.json:
        print(json.dumps(d.as_dict(), indent=2))
    elif d.pip_command:
        print(d.pip_command)
    return d.exit_code
