from __future__ import annotations

import re
import tomllib
from importlib import resources
from pathlib import Path

import pytest

import pypto_env
from pypto_env import (
    MatrixError,
    UnknownCannVersionError,
    cann_for_torch,
    cann_release,
    known_cann_versions,
    load_matrix,
    load_unpaired,
    pins_for,
    rows_for,
    torch_versions_for,
)
from pypto_env.matrix import cann_sort_key

# Ascend/pytorch's COMPATIBILITY table as transcribed in the project's facts. Within a line
# the torch_npu releases and the CANN versions pair position by position.
SOURCE_TABLE = """
| 2.12.0 | 2.12.0 | 9.1.0 |
| 2.11.0 | 2.11.0 | 9.1.0 |
| 2.10.0.post4 | 2.10.0 | 9.1.0 |
| 2.9.0.post6 / .post2 / 2.9.0 | 2.9.0 | 9.1.0 / 9.0.0 / 8.5.0 |
| 2.8.0.post4 / .post2 / 2.8.0 | 2.8.0 | 9.0.0 / 8.5.0 / 8.3.RC1 |
| 2.7.1.post8 / .post4 / .post2 / 2.7.1 | 2.7.1 | 9.1.0 / 9.0.0 / 8.5.0 / 8.3.RC1 |
| 2.6.0.post5 / .post3 / 2.6.0 | 2.6.0 | 8.5.0 / 8.3.RC1 / 8.2.RC1 |
| 2.5.1.post1 / 2.5.1 | 2.5.1 | 8.2.RC1 / 8.1.RC1 |
"""


def source_pairings() -> set[tuple[str, str, str]]:
    out = set()
    for line in SOURCE_TABLE.strip().splitlines():
        npu_cell, torch, cann_cell = (c.strip() for c in line.strip("| ").split("|"))
        npus = [p.strip() for p in npu_cell.split("/")]
        npus = [torch + p if p.startswith(".") else p for p in npus]
        canns = [c.strip() for c in cann_cell.split("/")]
        assert len(npus) == len(canns), line
        out |= {(c, torch, n) for c, n in zip(canns, npus, strict=True)}
    return out


def vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def test_matrix_represents_the_source_table_exactly():
    rows = load_matrix()
    got = [(r.cann, r.torch, r.torch_npu) for r in rows]
    assert len(got) == len(set(got)), "duplicate rows"
    assert set(got) == source_pairings()


def test_every_row_parses_and_torch_equals_torch_npu_base():
    for r in load_matrix():
        assert cann_release(r.cann) == r.cann, f"{r.cann} is not a canonical CANN release"
        assert re.fullmatch(r"\d+\.\d+\.\d+", r.torch), r
        assert re.fullmatch(r"\d+\.\d+\.\d+(\.post\d+)?", r.torch_npu), r
        assert re.sub(r"\.post\d+$", "", r.torch_npu) == r.torch, r


def test_one_recommended_row_per_cann_and_it_has_the_newest_torch():
    for cann in known_cann_versions():
        rows = rows_for(cann)
        rec = [r for r in rows if r.recommended]
        assert len(rec) == 1, cann
        assert vtuple(rec[0].torch) == max(vtuple(r.torch) for r in rows)
        assert pins_for(cann) == rec[0].pins


def test_noxfile_contract_reads_the_packaged_file():
    # The root noxfile reads this path with plain tomllib before pypto_env is installed.
    path = Path(pypto_env.__file__).parent / "cann-matrix.toml"
    rows = tomllib.loads(path.read_text())["row"]
    assert {row["cann"] for row in rows} == set(known_cann_versions())
    assert resources.files("pypto_env").joinpath("cann-matrix.toml").read_text() == path.read_text()
    p = pins_for("8.5.0")
    assert (p.torch, p.torch_npu) == ("2.9.0", "2.9.0")


def test_undocumented_torch_npu_releases_are_not_rows():
    unpaired = {u.torch_npu for u in load_unpaired()}
    assert unpaired == {"2.13.0", "2.14.0"}
    assert not unpaired & {r.torch_npu for r in load_matrix()}
    assert cann_for_torch("2.13.0") == []


@pytest.mark.parametrize(
    ("asked", "release"),
    [
        ("8.3.RC1", "8.3.RC1"),
        ("8.3.rc1", "8.3.RC1"),
        ("8.3.RC1.alpha002", "8.3.RC1"),
        ("9.1.0.1", "9.1.0"),
        (" 9.0.0 ", "9.0.0"),
    ],
)
def test_pins_for_maps_builds_to_their_release(asked, release):
    assert pins_for(asked) == pins_for(release)
    assert pins_for(asked).cann == release


@pytest.mark.parametrize("bad", ["8.3.RC2", "8.0.0", "9.1", "garbage", ""])
def test_pins_for_unknown_names_the_known_versions(bad):
    with pytest.raises(UnknownCannVersionError) as info:
        pins_for(bad)
    assert info.value.known == known_cann_versions()
    assert "8.3.RC1" in str(info.value)
    assert "9.1.0" in str(info.value)


def test_torch_versions_for_and_reverse():
    assert torch_versions_for("9.1.0") == ["2.12.0", "2.11.0", "2.10.0", "2.9.0", "2.7.1"]
    assert torch_versions_for("8.1.RC1") == ["2.5.1"]
    assert cann_for_torch("2.7.1+cpu") == ["9.1.0", "9.0.0", "8.5.0", "8.3.RC1"]
    assert cann_for_torch("2.5.1") == ["8.2.RC1", "8.1.RC1"]
    # The reverse map agrees with the forward one for every row.
    for r in load_matrix():
        assert r.cann in cann_for_torch(r.torch)
        assert r.torch in torch_versions_for(r.cann)


def test_cann_versions_sort_by_release_with_rc_before_final():
    assert known_cann_versions() == ["9.1.0", "9.0.0", "8.5.0", "8.3.RC1", "8.2.RC1", "8.1.RC1"]
    assert cann_sort_key("8.3.RC1") < cann_sort_key("8.3.RC2") < cann_sort_key("8.3.0")
    assert cann_release("not-a-version") is None


def test_pip_command_is_exactly_pinned():
    assert pins_for("9.0.0").pip_command() == "pip install torch==2.9.0 torch-npu==2.9.0.post2"


def test_malformed_matrix_files_raise_matrix_error(tmp_path):
    missing = tmp_path / "missing-field.toml"
    missing.write_text('[[row]]\ncann = "9.1.0"\ntorch = "2.12.0"\n')
    with pytest.raises(MatrixError, match="torch_npu"):
        load_matrix(missing)
    broken = tmp_path / "broken.toml"
    broken.write_text("[[row]\ncann = ")
    with pytest.raises(MatrixError, match="TOML"):
        load_matrix(broken)
    empty = tmp_path / "empty.toml"
    empty.write_text("# nothing\n")
    with pytest.raises(MatrixError, match="no"):
        load_matrix(empty)
