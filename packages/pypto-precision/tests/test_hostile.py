"""A dump folder is written by a stranger: every refusal is one line (BadDumpError, exit
101 at the CLI), nothing outside the folder is read, nothing hangs."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest
import torch

from pypto_precision import EXIT, BadDumpError, Recorder, compare_dumps, read_dump
from pypto_precision.cli import main


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.fixture
def good(tmp_path) -> Path:
    torch.manual_seed(0)
    model = Tiny()
    with torch.no_grad(), Recorder(model, tmp_path / "good", mode="tensor"):
        model(torch.randn(2, 4))
    return tmp_path / "good"


def _index(folder: Path) -> dict:
    return json.loads((folder / "index.json").read_text())


def _write(folder: Path, data: dict) -> None:
    (folder / "index.json").write_text(json.dumps(data))


def _one_line(err: BadDumpError) -> str:
    text = str(err)
    assert "\n" not in text
    assert len(text) < 400
    return text


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d.update(extra=1), "top level"),
        (lambda d: d.update(format="other"), "format must be"),
        (lambda d: d.update(mode="weird"), "mode must be"),
        (lambda d: d["entries"][0].update(file="../../etc/passwd", key="e000000000"), "names"),
        (lambda d: d["entries"][0].update(shape=[-1]), "shape"),
        (lambda d: d["entries"][0].update(shape=[1] * 40), "shape"),
        (lambda d: d["entries"][0].update(dtype="object"), "dtype"),
        (lambda d: d["entries"][0].update(stats={"min": "x"}), "stats.min"),
        (lambda d: d["entries"][0].update(stats={"__class__": 1}), "stats must hold only"),
        (lambda d: d["entries"][0].update(evil=1), "not an entry object"),
        (lambda d: d["entries"][0].update(name=""), "name"),
        (lambda d: d["entries"][0].update(name="a\x1b]0;PWNED\x07"), "control, bidi or invisible"),
        (lambda d: d["entries"][0].update(name="a\u202eevil"), "control, bidi or invisible"),
        # a zero-width space made two module names look the same (issue #43 second pass, L4)
        (
            lambda d: d["entries"][0].update(name="model.layers\u200b.1"),
            "control, bidi or invisible",
        ),
        (lambda d: d["entries"][0].update(cls="os.system"), "class name"),
        (lambda d: d["entries"].append(dict(d["entries"][0])), "share one name"),
        (lambda d: d.update(entries={"a": 1}), "entries must be a list"),
    ],
)
def test_a_malformed_index_is_one_line(good, mutate, needle):
    data = _index(good)
    mutate(data)
    _write(good, data)
    with pytest.raises(BadDumpError) as err:
        read_dump(good)
    assert needle in _one_line(err.value)


def test_non_finite_and_deep_json_are_refused(good):
    (good / "index.json").write_text('{"format": NaN}')
    with pytest.raises(BadDumpError, match="not a number"):
        read_dump(good)
    (good / "index.json").write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(BadDumpError, match="levels deep"):
        read_dump(good)


def test_a_tensor_file_that_escapes_or_lies_is_refused(good, tmp_path):
    dump = read_dump(good)
    entry = dump.entries[0]
    shard = good / entry.file
    outside = tmp_path / "outside.safetensors"
    shutil.move(shard, outside)
    shard.symlink_to(outside)  # a link to a file outside the dump
    with pytest.raises(BadDumpError, match=r"outside the dump folder|not a regular file"):
        read_dump(good).tensor(entry)
    shard.unlink()
    shard.write_bytes(b"\xff" * 64)  # not safetensors
    with pytest.raises(BadDumpError, match="not a readable safetensors"):
        read_dump(good).tensor(entry)
    shard.unlink()
    from safetensors.torch import save_file

    save_file({entry.key: torch.zeros(7)}, str(shard))  # the right key, the wrong shape
    with pytest.raises(BadDumpError, match="altered"):
        read_dump(good).tensor(entry)


def test_a_fifo_index_does_not_hang(good):
    os.unlink(good / "index.json")
    os.mkfifo(good / "index.json")
    done: list[BaseException] = []

    def read() -> None:
        try:
            read_dump(good)
        except BaseException as err:
            done.append(err)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "reading a FIFO index hung"
    assert isinstance(done[0], BadDumpError)
    assert "not a regular file" in str(done[0])


def test_hostile_msprobe_folders(tmp_path):
    proc = tmp_path / "step0" / "proc0"
    proc.mkdir(parents=True)
    (proc / "dump.json").write_text(
        json.dumps(
            {
                "data": {
                    "Module.a.Linear.forward.0": {
                        "output": [
                            {
                                "type": "torch.Tensor",
                                "dtype": "torch.float32",
                                "shape": [2],
                                "data_name": "../../x.pt",
                            }
                        ]
                    }
                }
            }
        )
    )
    with pytest.raises(BadDumpError, match=r"not a plain \.pt name"):
        read_dump(tmp_path)
    (proc / "dump.json").write_text(json.dumps({"data": {"Functional.relu.0.forward": {}}}))
    with pytest.raises(BadDumpError, match="no module records"):
        read_dump(tmp_path)
    # NaN statistics (what msprobe writes for a tensor that holds them) read as missing
    (proc / "dump.json").write_text('{"task": "statistics", "data": {"Module.a.Linear.forward.0": '
                                    '{"output": [{"type": "torch.Tensor", "dtype": "torch.float32",'
                                    ' "shape": [2], "Max": NaN, "Min": 0, "Mean": 0, "Norm": 1}]}}}')  # fmt: skip
    dump = read_dump(tmp_path)
    assert dump.entries[0].stats["max"] is None
    (tmp_path / "step1" / "proc0").mkdir(parents=True)
    (tmp_path / "step1" / "proc0" / "dump.json").write_text("{}")
    with pytest.raises(BadDumpError, match="holds 2 msprobe dumps"):
        read_dump(tmp_path)
    # a .pt file holding code, not a tensor, is refused by torch.load(weights_only=True)
    proc2 = tmp_path / "p2"
    (proc2 / "dump_tensor_data").mkdir(parents=True)
    (proc2 / "dump.json").write_text(
        json.dumps(
            {
                "task": "tensor",
                "data": {
                    "Module.a.Linear.forward.0": {
                        "output": [
                            {
                                "type": "torch.Tensor",
                                "dtype": "torch.float32",
                                "shape": [2],
                                "data_name": "x.pt",
                            }
                        ]
                    }
                },
            }
        )
    )
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > /dev/null",))

    (proc2 / "dump_tensor_data" / "x.pt").write_bytes(pickle.dumps(Evil()))
    d = read_dump(proc2)
    with pytest.raises(BadDumpError, match="not a plain tensor file"):
        d.tensor(d.entries[0])


def test_the_cli_says_one_line_with_the_bad_dump_code(good, tmp_path, capsys):
    (good / "index.json").write_text("{}")
    assert main(["compare", str(good), str(good)]) == EXIT.BAD_DUMP
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("pypto-precision: error:")


def test_no_shared_entry_is_not_comparable(good, tmp_path):
    data = _index(good)
    for e in data["entries"]:
        e["name"] = "other." + e["name"]
    other = tmp_path / "other"
    shutil.copytree(good, other)
    _write(other, data)
    from pypto_precision import NotComparableError

    with pytest.raises(NotComparableError, match="share no entry"):
        compare_dumps(read_dump(good), read_dump(other))


def test_dump_and_check_without_pypto_bench_say_what_to_install(capsys):
    """`nox -s "package(pypto-precision)"` runs this without pypto-bench: compare works,
    dump and check name the install (exit 3) whatever flags they were given."""
    from importlib import metadata

    if any(ep.name == "dump" for ep in metadata.entry_points(group="pypto_precision.commands")):
        pytest.skip("pypto-bench is installed and registers dump/check (tested in pypto-bench)")
    for command in ("dump", "check"):
        assert main([command, "--model-path", "m", "--out", "o"]) == EXIT.ENVIRONMENT
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1
        assert "pip install pypto-bench" in err[0]
