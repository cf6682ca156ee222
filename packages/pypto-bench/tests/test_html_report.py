"""report.html (issue #33): one self-contained page per run, opened in a real headless
Chromium: no console error, no network request, the arms table and the plot present, a
screenshot of a laptop's width; a hostile model name shows as text.

The runs are real (`pypto-bench run --html` on a tiny Llama, the graph arm on the eager
backend to stay fast); the noisy and hostile pages are those runs' reports with fields
edited, rendered by the same renderer.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from pypto_bench import EXIT, ReportWriteError, report_to_html, write_html
from pypto_bench.cli import main
from pypto_bench.html_report import ARMS_TABLE_ID
from pypto_testing.browser import open_page, skip_reason

needs_chromium = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

FAST = [
    "--device",
    "cpu",
    "--seq",
    "8",
    "--gen",
    "8",
    "--warmup",
    "0",
    "--iters",
    "2",
    "--graph-backend",
    "eager",
    "--no-progress",
]


def _run(model: Path, folder: Path, arms: str) -> tuple[int, Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    page, report = folder / "page" / "report.html", folder / "json" / "report.json"
    page.parent.mkdir()
    report.parent.mkdir()
    code = main(
        [
            "run",
            "--model-path",
            str(model),
            *FAST,
            "--arms",
            arms,
            "--report-file",
            str(report),
            "--html",
            str(page),
        ]
    )
    return code, page, report


@pytest.fixture(scope="module")
def ok_run(tiny_llama, tmp_path_factory):
    return _run(tiny_llama, tmp_path_factory.mktemp("html-ok"), "eager,graph")


@pytest.fixture(scope="module")
def failed_run(tiny_llama, tmp_path_factory):
    # No kernel plug-in applies to a plain Llama: the pypto+graph arm fails for real.
    return _run(tiny_llama, tmp_path_factory.mktemp("html-failed"), "eager,graph,pypto+graph")


def _opened(page: Path):
    """The page in Chromium, with what every page must satisfy asserted."""
    got = open_page(page)
    assert got.console_errors == [], got.console_errors
    assert got.requests == [], got.requests
    assert f'id="{ARMS_TABLE_ID}"' in got.dom
    assert re.search(r'<figure class="plot"><svg', got.dom), "no inline plot"
    width, height = got.screenshot_size
    assert width == 1280
    assert height > 300
    return got


def _rows(dom: str) -> dict[str, str]:
    """The arms table's rows by arm name (the row's markup)."""
    table = dom.split(f'id="{ARMS_TABLE_ID}"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr[^>]*>.*?</tr>", table.split("<tbody>", 1)[1], flags=re.S)
    return {re.search(r"<td>(.*?)</td>", r).group(1): r for r in rows}


@needs_chromium
def test_the_page_of_a_real_run_opens_offline_and_shows_the_run(ok_run, capsys):
    code, page, report = ok_run
    assert code in (EXIT.OK,), capsys.readouterr().err
    data = json.loads(report.read_text())
    got = _opened(page)
    dom = got.dom
    rows = _rows(dom)
    assert set(rows) == {"eager", "graph"}
    graph = data["arms"][1]
    # Every ratio with its interval, as the report has it.
    lo, hi = graph["ratio_vs_eager"]["low"], graph["ratio_vs_eager"]["high"]
    assert f"[{lo:.2f}, {hi:.2f}]" in rows["graph"]
    assert "median [95% interval]" in dom
    # The environment line, the roofline line, the cache line, the JSON link.
    assert data["environment"]["versions"]["torch"] in dom
    assert "Roofline: measured bandwidth" in dom
    assert "bandwidth ceiling" in dom  # in the plot's legend
    assert 'href="../json/report.json"' in dom
    assert "KV cache:" in dom
    assert '<button type="button" class="copy">' in dom  # the command, copyable
    assert "pypto-bench run --model-path" in dom


@needs_chromium
def test_a_failed_arm_is_in_plain_sight(failed_run):
    code, page, report = failed_run
    assert code == EXIT.ARM_FAILED
    data = json.loads(report.read_text())
    failed = next(a for a in data["arms"] if not a["ok"])
    got = _opened(page)
    rows = _rows(got.dom)
    assert 'class="failed"' in rows[failed["name"]]
    assert "FAILED" in rows[failed["name"]]
    box = got.dom.split("Failed arms", 1)[1].split("</div>", 1)[0]
    assert failed["name"] in box
    assert "no kernel plug-in applies to this model" in box  # the arm's error, as recorded
    assert "no kernel plug-in applies to this model" in failed["error"]
    assert 'class="badge bad"' in got.dom


@needs_chromium
def test_a_noisy_run_shows_its_verdicts(ok_run, tmp_path):
    data = json.loads(ok_run[2].read_text())
    noisy = copy.deepcopy(data)
    noisy["noise"] = {
        "noisy": True,
        "held": ["spread at graph", "load at run"],
        "checks": [
            {
                "name": "spread",
                "where": "graph",
                "measure": "best / median tok/s",
                "value": 2.4,
                "threshold": 1.5,
                "holds": True,
            },
            {
                "name": "load",
                "where": "run",
                "measure": "share of all cores used by other processes",
                "value": 0.7,
                "threshold": 0.5,
                "holds": True,
            },
        ],
        "load": None,
        "thresholds": {},
        "suggestion": "rerun with more iterations (--iters 10) on a quiet machine",
    }
    noisy["arms"][1]["unreliable"] = {
        "verdicts": ["tok/s", "x eager"],
        "why": "graph tok/s spread: best / median tok/s 2.40 > 1.5",
    }
    noisy["warnings"] = [
        *noisy.get("warnings", []),
        "noisy run: spread at graph; rerun with more iterations",
    ]
    page = tmp_path / "noisy.html"
    page.write_text(report_to_html(noisy))
    got = _opened(page)
    assert 'class="unreliable"' in _rows(got.dom)["graph"]
    assert "UNRELIABLE" in _rows(got.dom)["graph"]
    assert "Noise verdicts" in got.dom
    assert "NOISY" in got.dom
    noise_table = got.dom.split('id="noise"', 1)[1].split("</table>", 1)[0]
    assert noise_table.count("HOLDS") == 2
    assert "rerun with more iterations (--iters 10) on a quiet machine" in got.dom


HOSTILE_NAME = "<script>alert(1)</script>"
HOSTILE_PATH = "\"'/><script>alert(2)</script><img src=x onerror=alert(3)>" + "A" * 5000


@needs_chromium
def test_a_hostile_model_name_is_text(ok_run, tmp_path):
    data = json.loads(ok_run[2].read_text())
    hostile = copy.deepcopy(data)
    hostile["model"]["class"] = HOSTILE_NAME
    hostile["model"]["path"] = HOSTILE_PATH
    hostile["model"]["model_type"] = 'x" onmouseover="alert(4)'
    hostile["command_line"] = ["pypto-bench", "run", "--model-path", HOSTILE_PATH]
    hostile["arms"][1]["warnings"] = ["<b>bold</b> & <iframe src='http://example.invalid/'>"]
    page = tmp_path / "hostile.html"
    page.write_text(report_to_html(hostile))
    got = _opened(page)
    dom = got.dom
    # Only the page's own script element exists; the name is text in the title and heading.
    assert dom.count("<script") == 1
    assert "<iframe" not in dom
    assert "<img" not in dom
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
    assert "<title>pypto-bench: &lt;script&gt;alert(1)&lt;/script&gt;, decode</title>" in dom
    assert "&lt;b&gt;bold&lt;/b&gt;" in dom
    # The 5000-character path is clipped where it is read (and says so); only the
    # copyable command keeps it whole, since a command must be exact.
    environment = dom.split('id="environment"', 1)[1].split("</p>", 1)[0]
    assert "A" * 5000 not in environment
    assert "characters)" in environment
    command = dom.split('id="command"', 1)[1].split("</code>", 1)[0]
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in command


@needs_chromium
def test_a_batch_sweep_page_plots_tok_s_against_batch(ok_run, tmp_path):
    data = json.loads(ok_run[2].read_text())
    sweep = copy.deepcopy(data)
    entries = []
    for batch, scale in ((1, 1.0), (4, 3.1)):
        arms = copy.deepcopy(data["arms"])
        for arm in arms:
            arm["tokens_per_s"]["median"] *= scale
            arm["tokens_per_s"]["best"] *= scale
        entries.append({"batch": batch, "ok": True, "arms": arms, "roofline": None})
    sweep["batch_sweep"] = entries
    page = tmp_path / "sweep.html"
    page.write_text(report_to_html(sweep))
    got = _opened(page)
    assert 'id="sweep"' in got.dom
    assert "batch sweep: each arm" in got.dom  # the sweep plot's caption


def test_the_page_names_no_json_without_one_and_links_what_it_is_given(ok_run):
    data = json.loads(ok_run[2].read_text())
    text = report_to_html(data, links=[("the diagnosis", "tune/report.html")])
    assert "--report-file FILE" in text
    assert 'href="tune/report.html"' in text


def test_an_unwritable_html_path_fails_before_the_run(tiny_llama, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code = main(["run", "--model-path", str(tiny_llama), *FAST, "--html", str(blocker / "p.html")])
    assert code == EXIT.USAGE
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1
    assert "--html folder" in err[0]
    assert "does not exist" in err[0]


def test_a_page_that_cannot_go_where_asked_goes_to_the_fallback(ok_run, tmp_path, monkeypatch):
    data = json.loads(ok_run[2].read_text())
    monkeypatch.setenv("TMPDIR", str(tmp_path / "fallback"))
    (tmp_path / "fallback").mkdir()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    written = write_html(data, blocker / "p.html", json_path=ok_run[2])
    assert written.parent == tmp_path / "fallback"
    assert written.name.startswith("pypto-bench-report-")
    assert written.suffix == ".html"
    assert f'id="{ARMS_TABLE_ID}"' in written.read_text()


def test_a_page_written_nowhere_is_one_error(ok_run, tmp_path, monkeypatch):
    import pypto_bench.html_report as html_report

    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setattr(html_report, "fallback_dirs", lambda: [blocker / "a", blocker / "b"])
    with pytest.raises(ReportWriteError, match="no fallback folder took the page") as err:
        write_html(json.loads(ok_run[2].read_text()), blocker / "p.html")
    assert err.value.exit_code == EXIT.REPORT_UNWRITTEN
