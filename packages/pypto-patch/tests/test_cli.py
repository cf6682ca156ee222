"""The CLI as a shell sees it: one stdout line, one-line errors, documented exit codes."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from pypto_patch import EXIT


def test_bare_form_prints_only_the_export_line(hf_folder: Path, run_cli, tmp_path: Path):
    p = run_cli("--model-family", "tinytest", "--model-path", str(hf_folder))
    assert p.returncode == EXIT.OK, p.stderr
    assert p.stdout.splitlines() == [f"export MODEL_PATH={shlex.quote(str(hf_folder))}"]
    assert "applied: tinytest" in p.stderr


def test_relative_model_path_exports_absolute_path(hf_folder: Path, run_cli):
    p = run_cli(
        "apply", "--model-family", "tinytest", "--model-path", hf_folder.name, cwd=hf_folder.parent
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"export MODEL_PATH={shlex.quote(str(hf_folder))}"


def test_json_status_restore_list(hf_folder: Path, run_cli):
    p = run_cli("status", "--model-path", str(hf_folder), "--json")
    assert p.returncode == EXIT.NOT_PATCHED
    assert json.loads(p.stdout)["patched"] is False
    p = run_cli("apply", "--model-family", "tinytest", "--model-path", str(hf_folder), "--json")
    doc = json.loads(p.stdout)
    assert doc["action"] == "applied"
    assert doc["family"] == "tinytest"
    p = run_cli("status", "--model-path", str(hf_folder), "--json")
    assert p.returncode == 0
    assert json.loads(p.stdout)["intact"] is True
    (hf_folder / "modeling_tinytest.py").write_text("# edited")
    p = run_cli("status", "--model-path", str(hf_folder))
    assert p.returncode == EXIT.MODIFIED
    assert "changed since: modeling_tinytest.py" in p.stderr
    p = run_cli("restore", "--model-path", str(hf_folder))
    assert p.returncode == EXIT.MODIFIED
    assert p.stderr.count("\n") == 1
    assert "--force" in p.stderr
    p = run_cli("restore", "--model-path", str(hf_folder), "--force", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["kept_aside"] == {
        "modeling_tinytest.py": "modeling_tinytest.py.pypto_edited"
    }
    p = run_cli("list", "--json")
    assert p.returncode == 0
    fams = [x["family"] for x in json.loads(p.stdout)["presets"]]
    assert {"tinytest", "tinytest_alt"} <= set(fams)  # other installed model packages may add more
    assert fams == sorted(fams)


def test_custom_mode_and_dry_run(hf_folder: Path, run_cli, tmp_path: Path):
    (tmp_path / "modeling_mine.py").write_text("class M: pass\n")
    args = [
        "--model-path", str(hf_folder),
        "--auto-map", "AutoModelForCausalLM=modeling_mine.M",
        "--copy", "modeling_mine.py=modeling_mine.py",
        "--source-root", str(tmp_path),
    ]  # fmt: skip
    p = run_cli(*args, "--dry-run")
    assert p.returncode == 0
    assert p.stdout == ""
    assert "created   modeling_mine.py" in p.stderr
    assert not (hf_folder / "modeling_mine.py").exists()
    p = run_cli(*args)
    assert p.returncode == 0, p.stderr
    assert (hf_folder / "modeling_mine.py").exists()


def test_errors_are_one_line_with_exit_codes(hf_folder: Path, run_cli, tmp_path: Path):
    cases = [
        (
            ["--model-family", "nope", "--model-path", str(hf_folder)],
            EXIT.UNKNOWN_FAMILY,
            "tinytest, tinytest_alt",
        ),
        (
            ["--model-family", "tinytest", "--model-path", str(tmp_path / "x")],
            EXIT.USAGE,
            "does not exist",
        ),
        (
            [
                "--model-family",
                "tinytest",
                "--auto-map",
                "AutoConfig=c.C",
                "--model-path",
                str(hf_folder),
            ],
            EXIT.USAGE,
            "not both",
        ),
        (["--auto-map", "oops", "--model-path", str(hf_folder)], EXIT.USAGE, "KEY=VALUE"),
        (["restore", "--model-path", str(hf_folder)], EXIT.NOT_PATCHED, "not patched"),
        (["apply"], EXIT.USAGE, "--model-path"),
    ]
    for args, code, needle in cases:
        p = run_cli(*args)
        assert p.returncode == code, (args, p.stderr)
        assert needle in p.stderr, (args, p.stderr)
        assert p.stdout == ""
        if code != EXIT.USAGE or args[0] != "apply":
            assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    (hf_folder / "config.json").write_text('{"a": 1,,}')
    p = run_cli("--model-family", "tinytest", "--model-path", str(hf_folder))
    assert p.returncode == EXIT.USAGE
    assert "line 1, column 9" in p.stderr


def test_deeply_nested_json_is_a_one_line_error(hf_folder: Path, run_cli, snap, tmp_path: Path):
    """100000 nested lists used to end in a RecursionError traceback."""
    before_tok = (hf_folder / "tokenizer_config.json").read_bytes()
    for name in ("config.json", "tokenizer_config.json"):
        (hf_folder / name).write_text("[" * 100_000 + "]" * 100_000)
        before = snap(tmp_path)
        for extra in ([], ["--output-dir", str(tmp_path / "ov")], ["--dry-run"]):
            p = run_cli("--model-family", "tinytest", "--model-path", str(hf_folder), *extra)
            assert p.returncode == EXIT.USAGE, p.stderr
            assert "Traceback" not in p.stderr
            assert len(p.stderr.strip().splitlines()) == 1, p.stderr
            assert f"{name} is JSON nested too deeply" in p.stderr
            assert p.stdout == ""
            assert snap(tmp_path) == before
        (hf_folder / name).write_bytes(before_tok if name != "config.json" else b"{}")


def test_help_documents_both_meanings_of_force(run_cli):
    p = run_cli("apply", "--help")
    assert p.returncode == EXIT.OK
    text = " ".join(p.stdout.split())
    assert "--replace-overlay" in text
    assert "re-pin over an existing pin" in text
    assert "replace an overlay pypto-patch built earlier" in text


def test_overlay_refusal_through_the_cli(hf_folder: Path, run_cli, tmp_path: Path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    args = ["--model-family", "tinytest", "--model-path", str(hf_folder), "--output-dir", str(out)]
    p = run_cli(*args, "--replace-overlay", "--force")
    assert p.returncode == EXIT.OVERLAY_REFUSED, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert (out / "keep.txt").read_text() == "mine"
    out2 = tmp_path / "ov"
    args2 = [
        "--model-family",
        "tinytest",
        "--model-path",
        str(hf_folder),
        "--output-dir",
        str(out2),
    ]
    assert run_cli(*args2).returncode == EXIT.OK
    args3 = [*args2[:1], "tinytest_alt", *args2[2:]]
    p = run_cli(*args3)
    assert p.returncode == EXIT.OVERLAY_REFUSED
    assert "--replace-overlay" in p.stderr
    p = run_cli(*args3, "--replace-overlay")
    assert p.returncode == EXIT.OK, p.stderr
    assert "the earlier overlay there was replaced" in p.stderr
