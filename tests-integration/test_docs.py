"""The docs promise only what the code does: the CLI reference matches ``--help``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import gen_docs  # noqa: E402


@pytest.mark.parametrize(("tool", "module"), gen_docs.TOOLS, ids=[t for t, _ in gen_docs.TOOLS])
def test_cli_reference_matches_help(tool, module):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed in this environment")
    page = ROOT / "docs" / "cli" / f"{tool}.md"
    assert page.exists(), f"missing {page}: run python tools/gen_docs.py"
    assert page.read_text() == gen_docs.render(tool, module), (
        f"{page.name} is stale: run python tools/gen_docs.py"
    )


def test_capture_gotchas_page_matches_the_explain_table():
    pytest.importorskip("pypto_capture")
    page = ROOT / "docs" / "capture-gotchas.md"
    assert page.read_text() == gen_docs.render_gotchas(), "run python tools/gen_docs.py"
    for code in ("107025", "107027", "107030", "507015", "507011", "507014", "900", "901"):
        assert f"| {code} |" in page.read_text()


def test_docs_link_to_existing_pages():
    for page in (ROOT / "docs").glob("*.md"):
        for target in __import__("re").findall(r"\]\(([\w./-]+\.md)\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_exit_code_page_matches_every_tool_table():
    for _, module in gen_docs.EXIT_TABLES:
        pytest.importorskip(module)
    page = ROOT / "docs" / "exit-codes.md"
    assert page.exists(), "missing docs/exit-codes.md: run python tools/gen_docs.py"
    assert page.read_text() == gen_docs.render_exit_codes(), "run python tools/gen_docs.py"


def test_every_tool_table_stays_in_its_range_and_covers_the_shared_codes():
    from pypto_common import EXIT_RANGES, EXTRA_EXIT_RANGES

    assert [t for t, _ in gen_docs.EXIT_TABLES] == list(EXIT_RANGES)
    # A second range belongs to one tool and overlaps no other range.
    spans = [*EXIT_RANGES.values(), *EXTRA_EXIT_RANGES.values()]
    for i, a in enumerate(spans):
        assert all(not set(a) & set(b) for b in spans[i + 1 :]), a
    for tool, module in gen_docs.EXIT_TABLES:
        table = pytest.importorskip(module).EXIT
        assert table.tool == tool
        extra = EXTRA_EXIT_RANGES.get(tool, range(0))
        for entry in table:
            assert entry.code <= 3 or entry.code in EXIT_RANGES[tool] or entry.code in extra, (
                tool,
                entry,
            )
        assert (table.OK, table.FAILED, table.USAGE, table.ENVIRONMENT) == (0, 1, 2, 3)


def test_support_matrix_in_readme_and_workflow_matches_the_suite_table():
    pytest.importorskip("pypto_testing.architectures")
    matrix = gen_docs.render_support_matrix()
    for page in gen_docs.MATRIX_PAGES:
        text = page.read_text()
        assert gen_docs.with_matrix(text, matrix) == text, (
            f"{page.name}: run python tools/gen_docs.py"
        )
    # Every decoder of the suite has a row, and the listed hybrids work in the decode graph arm.
    from pypto_testing import architectures as arch

    for model_type in (
        "qwen3_next",
        "qwen3_5_text",
        "qwen3_5_moe_text",
        "kimi_linear",
        "mamba2",
        "jamba",
        "nemotron_h",
        "granitemoehybrid",
        "lfm2",
        "falcon_h1",
    ):
        assert arch.expected_outcome(model_type, "decode", "graph") is None
        assert f"| `{model_type}` |" in matrix


def test_the_zoo_page_and_counts_are_the_committed_runs_own_numbers():
    """docs/zoo.md and the zoo's counts in the support matrix are rendered from the results
    a zoo run wrote (docs/zoo.json), not typed: the page matches, every type of the run has
    its row, and the counts add up to the run's types."""
    pytest.importorskip("pypto_testing.zoo_report")
    from pypto_testing.zoo_report import load_zoo_results, zoo_counts

    assert gen_docs.ZOO_PAGE.read_text() == gen_docs.render_zoo_page(), (
        "docs/zoo.md: run python tools/gen_docs.py"
    )
    results = load_zoo_results(gen_docs.ZOO_RUNS[0][0])
    types = {c["type"] for c in results["cells"]}
    page = gen_docs.ZOO_PAGE.read_text()
    assert all(f"| {t} |" in page for t in types)
    counts = zoo_counts(results)
    assert sum(counts["types"].values()) == len(types)
    matrix = gen_docs.render_support_matrix()
    assert f"{len(types)} types on transformers" in matrix
    assert f"| ok | {counts['types']['ok']} | {counts['cells']['ok']} |" in matrix
