"""A bench report keeps every field: the JSON's full nested key set matches a golden file.

The report is the project's contract with its readers (pypto-e2e, pypto-tune, the
compare command, people's scripts). A refactor of pypto-bench must not drop, rename or
move a field (issue 28), and a deliberate change must bump ``schema_version``
(docs/design: "a change that removes or renames a field bumps it") and regenerate the
golden file in the same commit:

    python tests-integration/test_report_golden.py --write

A real run each time: a tiny llama folder, decode and prefill, eager and graph arms (the
graph arm on the ``eager`` capture backend: the same report fields as the inductor backend
at a fraction of the compile time), warmup 0, one iteration. Values that legitimately
vary (timings, the machine, the load) are not compared; keys are, and each leaf's JSON type
where it is stable (a field that may be null has no fixed type). Under ``VOLATILE`` the
field itself must be there but what is inside it depends on the machine's load.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden" / "bench_report_keys.json"

#: The two regimes' runs: (regime, seq, gen).
RUNS = (("decode", 4, 4), ("prefill", 8, 1))

#: Fields whose contents depend on the machine's load (the noise guard); only the field's
#: presence is compared.
VOLATILE = {
    "warnings": "a noisy machine adds the noise guard's warning",
    "arms[].warnings": "a noisy measurement adds a line",
    "arms[].unreliable": "null, or the noise guard's verdicts on a loaded machine",
    "noise.held": "the noise checks that held on this machine",
    "noise.suggestion": "null unless a noise check held",
}

_TYPES = {bool: "bool", int: "number", float: "number", str: "string", type(None): "null"}


def key_types(doc: Any) -> dict[str, str]:
    """Every path of ``doc`` (``arms[].tokens_per_s.best``) -> its JSON type(s), ``|``-joined.

    List items share one path (``[]``); a path seen with several types (``null`` in one
    arm, a number in another) lists them all.
    """
    seen: dict[str, set[str]] = {}

    def walk(value: Any, path: str) -> None:
        if path in VOLATILE:
            seen.setdefault(path, set()).add("volatile")
            return
        if isinstance(value, dict):
            seen.setdefault(path or "$", set()).add("object")
            for key, item in value.items():
                walk(item, f"{path}.{key}" if path else str(key))
        elif isinstance(value, list):
            seen.setdefault(path, set()).add("array")
            for item in value:
                walk(item, f"{path}[]")
        else:
            seen.setdefault(path, set()).add(_TYPES[type(value)])

    walk(doc, "")
    return {path: "|".join(sorted(types)) for path, types in sorted(seen.items())}


def differences(golden: dict[str, str], got: dict[str, str]) -> list[str]:
    """What a report lost, gained or retyped against the golden key set."""
    out = [f"missing: {p}" for p in sorted(golden.keys() - got.keys())]
    out += [f"new: {p}" for p in sorted(got.keys() - golden.keys())]
    for path in sorted(golden.keys() & got.keys()):
        want, have = golden[path], got[path]
        if "null" in want.split("|") or "null" in have.split("|"):
            continue  # a nullable field: its type is not stable
        if want != have:
            out.append(f"type of {path}: {want} in the golden file, {have} now")
    return out


def run_reports(workdir: Path) -> dict[str, dict[str, Any]]:
    """The report JSON of each regime, as ``run_bench`` writes it to ``report_file``."""
    import torch

    from pypto_bench import BenchConfig, run_bench
    from pypto_testing.models import make_tiny_model

    torch.set_num_threads(1)
    model = make_tiny_model(workdir / "tiny-llama", "llama", seed=0)
    reports: dict[str, dict[str, Any]] = {}
    for regime, seq, gen in RUNS:
        out = workdir / f"{regime}.json"
        run_bench(
            BenchConfig(
                model_path=str(model),
                device="cpu",
                regime=regime,
                seq=seq,
                gen=gen,
                batch=1,
                arms=("eager", "graph"),
                graph_backend="eager",
                dtype="float32",
                warmup=0,
                iters=1,
                report_file=str(out),
            )
        )
        reports[regime] = json.loads(out.read_text())
    return reports


def golden_document(reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "about": (
            "Key set of pypto-bench's report JSON (tests-integration/test_report_golden.py). "
            "Regenerate only with a schema_version bump: "
            "python tests-integration/test_report_golden.py --write"
        ),
        "schema_version": {r: doc["schema_version"] for r, doc in reports.items()},
        "volatile": VOLATILE,
        "keys": {r: key_types(doc) for r, doc in reports.items()},
    }


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, dict[str, Any]]:
    return run_reports(tmp_path_factory.mktemp("golden-run"))


def test_golden_file_is_checked_in():
    golden = json.loads(GOLDEN.read_text())
    assert set(golden["keys"]) == {r for r, _, _ in RUNS}
    assert golden["volatile"] == VOLATILE, "VOLATILE changed: regenerate the golden file"


@pytest.mark.parametrize("regime", [r for r, _, _ in RUNS])
def test_report_key_set_matches_golden(reports, regime):
    golden = json.loads(GOLDEN.read_text())
    doc = reports[regime]
    assert doc["ok"] is True, [a.get("error") for a in doc["arms"]]
    assert [a["name"] for a in doc["arms"]] == ["eager", "graph"]
    diff = differences(golden["keys"][regime], key_types(doc))
    if diff and doc["schema_version"] == golden["schema_version"][regime]:
        pytest.fail(
            f"the {regime} report changed shape without a schema_version bump "
            f"(still {doc['schema_version']}):\n  " + "\n  ".join(diff)
        )
    assert doc["schema_version"] == golden["schema_version"][regime], (
        f"schema_version is {doc['schema_version']}, the golden file has "
        f"{golden['schema_version'][regime]}: regenerate it with "
        "python tests-integration/test_report_golden.py --write"
    )


def test_comparison_catches_a_dropped_renamed_or_retyped_field(reports):
    """The comparison itself has teeth: a real report edited three ways is told apart."""
    golden = key_types(reports["decode"])
    edited = json.loads(json.dumps(reports["decode"]))
    for arm in edited["arms"]:
        arm["tok_per_s"] = arm.pop("tokens_per_s")
        arm["memory"].pop("reserved_growth")
        arm["ok"] = "yes"
        arm["unreliable"] = {"verdicts": ["anything"], "why": "volatile: not compared"}
    edited["noise"]["held"] = ["a check that held"]
    edited["warnings"] = ["noisy run"]
    diff = differences(golden, key_types(edited))
    assert "missing: arms[].memory.reserved_growth" in diff
    assert "missing: arms[].tokens_per_s.best" in diff
    assert "new: arms[].tok_per_s.best" in diff
    assert "type of arms[].ok: bool in the golden file, string now" in diff
    assert not [d for d in diff if "unreliable" in d or "held" in d or "warnings" in d]


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests-integration/test_report_golden.py --write")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        document = golden_document(run_reports(Path(tmp)))
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}", file=sys.stderr)
