"""The NPU table format, its resolver and the version-bounded picking, on real modules.

No torch_npu here: a tiny package written to tmp_path stands in for it (real files, a
real import), and its "installed version" is pinned through NpuApi(versions=...).
"""

from __future__ import annotations

import sys

import pytest

from pypto_common.npu_api import NpuApi, NpuName, distribution_of, parse_table, parse_version

TABLE = """
module   fakenpu                                   | fakenpu/__init__.py
function fakenpu.run                               | P run
kwarg    fakenpu.run pool stream                   | P run(pool, stream)
kwarg    fakenpu.run auto_dispatch @>=2.5.1.post1   | P run(auto_dispatch) since .post1
function fakenpu.old_name @<2.9.0                  | P renamed in 2.9.0
function fakenpu.new_name @>=2.9.0                 | P renamed in 2.9.0
class    fakenpu.sub.Config                        | P sub.py
member?  fakenpu.sub.Config.Text                   | P optional member
env      fakenpu.FAKENPU_ALLOC_CONF                | P read by the library
"""


@pytest.fixture
def fakenpu(tmp_path, monkeypatch):
    pkg = tmp_path / "fakenpu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "def run(graph, pool=None, stream=None, auto_dispatch=False):\n"
        "    return (pool, stream, auto_dispatch)\n"
        "def old_name():\n    return 'old'\n"
        "def new_name():\n    return 'new'\n"
    )
    (pkg / "sub.py").write_text("class Config:\n    Db = 'db'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in [m for m in sys.modules if m == "fakenpu" or m.startswith("fakenpu.")]:
        del sys.modules[name]


def api(version: str | None) -> NpuApi:
    return NpuApi(parse_table(TABLE), owner="test", versions={"fakenpu": version})


def test_parse_rows_kinds_optional_and_bounds():
    rows = parse_table(TABLE, {"P": "fakenpu/"})
    assert NpuName("fakenpu.run", "kwarg", "fakenpu/run(pool, stream)", "stream") in rows
    dispatch = next(r for r in rows if r.kwarg == "auto_dispatch")
    assert (dispatch.since, dispatch.until) == ("2.5.1.post1", None)
    assert next(r for r in rows if r.path.endswith(".Text")).optional
    env = next(r for r in rows if r.kind == "env")
    assert env.path == "fakenpu.FAKENPU_ALLOC_CONF"


def test_continued_lines_join_the_previous_row():
    rows = parse_table("kwarg m.f a b\n      c d | src\n")
    assert [r.kwarg for r in rows] == ["a", "b", "c", "d"]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("function m.f", "no '| source'"),
        ("widget m.f | s", "unknown kind 'widget'"),
        ("kwarg m.f | s", "names no keyword"),
        ("function m.f extra | s", "only kwarg lines"),
        ("env NOPACKAGE | s", "<package>.<VARIABLE>"),
        ("function m.f @~=2.0 | s", "bad version bound"),
        ("function m.f @>=two | s", "is not a version"),
    ],
)
def test_malformed_lines_name_the_line(line, problem):
    with pytest.raises(ValueError, match=problem):
        parse_table(line)


def test_version_order_matches_pip():
    order = ["2.5.1rc1", "2.5.1", "2.5.1.post1", "2.5.1.post10", "2.6.0", "2.10.0"]
    assert sorted(order, key=parse_version) == order
    assert parse_version("2.9.0+cpu") == parse_version("2.9.0")
    assert parse_version("2.9") == parse_version("2.9.0")


def test_bounds_lower_inclusive_upper_exclusive():
    row = NpuName("m.f", "function", "s", since="2.6.0", until="2.9.0")
    assert [row.applies(v) for v in ("2.5.1", "2.6.0", "2.8.0.post4", "2.9.0")] == [
        False,
        True,
        True,
        False,
    ]
    assert row.applies(None)  # version unknown: the row is not ruled out


def test_resolve_walks_and_imports_submodules_lazily(fakenpu):
    a = api("2.12.0")
    assert a.resolve("fakenpu.run")(None) == (None, None, False)
    assert a.resolve("fakenpu.sub.Config").Db == "db"  # fakenpu.sub imported on the way


def test_undeclared_names_do_not_resolve(fakenpu):
    with pytest.raises(KeyError, match="not declared in test's NPU table"):
        api("2.12.0").resolve("fakenpu.sub")


def test_optional_missing_is_none_required_missing_raises(fakenpu, tmp_path):
    a = api("2.12.0")
    assert a.resolve("fakenpu.sub.Config.Text") is None
    broken = NpuApi(parse_table("function fakenpu.gone | s"), versions={"fakenpu": "1"})
    with pytest.raises(AttributeError, match=r"has no fakenpu\.gone"):
        broken.resolve("fakenpu.gone")


def test_pick_chooses_the_spelling_of_the_installed_version(fakenpu):
    for version, want in (("2.8.0.post4", "fakenpu.old_name"), ("2.9.0", "fakenpu.new_name")):
        a = api(version)
        path = a.pick("fakenpu.new_name", "fakenpu.old_name")
        assert path == want
        assert a.resolve(path)() == want.rsplit("_", 1)[0].split(".")[1]


def test_a_name_outside_its_bounds_is_reported_not_called(fakenpu):
    with pytest.raises(AttributeError, match=r"does not exist in fakenpu 2\.9\.0"):
        api("2.9.0").resolve("fakenpu.old_name")
    with pytest.raises(KeyError):
        api("2.9.0").pick("fakenpu.nope")


def test_kwargs_checks_declaration_and_version(fakenpu):
    new, old = api("2.5.1.post1"), api("2.5.1")
    assert new.kwargs("fakenpu.run", pool=1, auto_dispatch=True) == {
        "pool": 1,
        "auto_dispatch": True,
    }
    assert new.accepts("fakenpu.run", "auto_dispatch")
    assert not old.accepts("fakenpu.run", "auto_dispatch")
    with pytest.raises(TypeError, match=r"takes no \['auto_dispatch'\] in fakenpu 2.5.1"):
        old.kwargs("fakenpu.run", auto_dispatch=True)
    with pytest.raises(KeyError, match="with_flops"):
        new.kwargs("fakenpu.run", with_flops=True)


def test_env_rows(fakenpu, monkeypatch):
    a = api("1.0")
    assert a.env_name("fakenpu.FAKENPU_ALLOC_CONF") == "FAKENPU_ALLOC_CONF"
    monkeypatch.setenv("FAKENPU_ALLOC_CONF", "x")
    assert a.env("fakenpu.FAKENPU_ALLOC_CONF") == "x"
    with pytest.raises(KeyError):
        a.env_name("fakenpu.run")
    with pytest.raises(TypeError):
        a.resolve("fakenpu.FAKENPU_ALLOC_CONF")


def test_installed_version_comes_from_metadata_without_import():
    a = NpuApi(parse_table("module torch_npu | s\nmodule pypto_common | s"))
    assert a.version("torch_npu.npu.graph") is None  # not installed on this machine
    assert a.version("pypto_common") is not None
    assert "torch_npu" not in sys.modules
    assert distribution_of("torch.npu.graph") == distribution_of("torchair.x") == "torch-npu"


def test_label():
    row = NpuName("m.f", "kwarg", "s", "k", True, "2.6.0", "2.9.0")
    assert row.label == "kwarg? m.f(k=) @>=2.6.0,<2.9.0"


def test_key_rows_name_options_dict_keys_and_are_not_keywords():
    rows = parse_table("function p.jit | s\nkey p.jit runtime_options.run_mode | s\n")
    key = rows[1]
    assert (key.kind, key.kwarg, key.label) == (
        "key",
        "runtime_options.run_mode",
        "key p.jit[runtime_options.run_mode]",
    )
    a = NpuApi(rows, versions={"p": "1"})
    assert a.declared("p.jit")
    assert not a.accepts("p.jit", "runtime_options.run_mode")
