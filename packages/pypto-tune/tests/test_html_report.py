"""report.html beside profile.md (issue #33): the diagnosis as one self-contained page,
opened in a real headless Chromium: no console error, no network request, the block plot,
findings with their evidence, recommendations with their estimate and a copyable command,
links to trace.json (Perfetto) and profile.json; a hostile profile's text stays text."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pypto_testing.browser import open_page, skip_reason
from pypto_tune import EXIT, load_profile, profile_to_html, write_outputs
from pypto_tune.cli import main

needs_chromium = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


@pytest.fixture(scope="module")
def written(eager_profile, tmp_path_factory) -> dict[str, str]:
    return write_outputs(eager_profile, tmp_path_factory.mktemp("tune-html") / "out")


def _opened(page: Path):
    got = open_page(page)
    assert got.console_errors == [], got.console_errors
    assert got.requests == [], got.requests
    assert re.search(r'<figure class="plot"><svg', got.dom), "no inline plot"
    assert got.screenshot_size[0] == 1280
    assert got.screenshot_size[1] > 300
    return got


@needs_chromium
def test_the_diagnosis_page_shows_findings_evidence_and_commands(written, eager_profile):
    page = Path(written["html"])
    assert page.name == "report.html"
    assert page.parent == Path(written["markdown"]).parent  # beside profile.md
    got = _opened(page)
    dom = got.dom
    assert eager_profile.findings, "the tiny eager profile is host-bound: it has findings"
    for finding in eager_profile.findings:
        assert f"{finding['id']}: " in dom
        key = next(iter(finding["evidence"]))
        assert f"<dt>{key}</dt>" in dom  # its evidence, key by key
    rec = eager_profile.recommendations[0]
    card = dom.split('class="card recommendation"', 1)[1].split('class="card', 1)[0]
    assert f"estimated {rec['estimated_speedup']:.2f}x" in card
    assert '<button type="button" class="copy">' in card
    assert rec["command"].split(" --")[0] in card  # the exact command, copyable
    assert 'id="blocks"' in dom
    assert 'id="operators"' in dom
    assert 'href="trace.json"' in dom
    assert 'href="https://ui.perfetto.dev"' in dom
    assert 'href="profile.json"' in dom


def test_the_page_reads_the_json_and_a_loaded_profile_gives_the_same_page(written):
    loaded = load_profile(written["profile"])
    assert profile_to_html(loaded) == profile_to_html(
        json.loads(Path(written["profile"]).read_text())
    )
    assert 'href="trace.json"' not in profile_to_html(loaded, trace_href=None)


@needs_chromium
def test_a_hostile_profile_is_text(eager_profile, tmp_path):
    data = json.loads(json.dumps(eager_profile.to_dict(), default=str))
    data["meta"]["model"]["class"] = "<script>alert(1)</script>"
    data["meta"]["model"]["path"] = "\"'/><img src=x onerror=alert(2)>" + "B" * 5000
    data["findings"][0]["title"] = "<iframe src='http://example.invalid/'></iframe>"
    data["findings"][0]["evidence"] = {"<k>": "<script>alert(3)</script>"}
    data["recommendations"][0]["command"] = "echo '</code><script>alert(4)</script>'"
    page = tmp_path / "report.html"
    page.write_text(profile_to_html(data))
    got = _opened(page)
    assert got.dom.count("<script") == 1
    assert "<iframe" not in got.dom
    assert "<img" not in got.dom
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in got.dom
    assert "echo '&lt;/code&gt;&lt;script&gt;alert(4)&lt;/script&gt;'" in got.dom
    assert "B" * 5000 not in got.dom


def test_advise_write_rewrites_the_page(written, tmp_path, capsys):
    folder = tmp_path / "prof"
    folder.mkdir()
    profile = folder / "profile.json"
    profile.write_bytes(Path(written["profile"]).read_bytes())
    (folder / "profile.md").write_text("the old diagnosis\n")
    (folder / "trace.json").write_text("{}")
    # advise --write with another threshold: the page and profile.md show the new diagnosis.
    code = main(["advise", str(profile), "--write", "-q", "--threshold", "host_syncs_per_step=5"])
    assert code == EXIT.OK
    page = (folder / "report.html").read_text()
    assert "host_syncs: " not in page
    assert 'href="trace.json"' in page
    assert load_profile(profile).meta["thresholds"]["host_syncs_per_step"] == 5
    assert (folder / "profile.md").read_text() != "the old diagnosis\n"
    # A profile.json alone elsewhere (not a pypto-tune --out folder): only the file changes.
    alone = tmp_path / "elsewhere"
    alone.mkdir()
    (alone / "p.json").write_bytes(Path(written["profile"]).read_bytes())
    assert main(["advise", str(alone / "p.json"), "--write", "-q"]) == EXIT.OK
    assert sorted(p.name for p in alone.iterdir()) == ["p.json"]


def test_write_outputs_names_the_page(written):
    assert set(written) >= {"profile", "markdown", "html"}
    text = Path(written["html"]).read_text()
    assert text.startswith("<!DOCTYPE html>")
    assert "Content-Security-Policy" in text


def test_a_graph_profile_page_says_how_the_captured_step_was_attributed(graph_profile):
    text = profile_to_html(graph_profile, trace_href=None)
    assert "Inside the captured step" in text
    assert 'id="blocks"' in text
    assert "graph arm" in text
