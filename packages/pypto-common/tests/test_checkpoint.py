"""pypto_common.checkpoint: a folder's safetensors layout read strictly, without torch.

Real safetensors files (8-byte little-endian header length, JSON header, data) are
written here byte by byte; every refusal is one line naming the tensor and the shard,
and nothing on disk changes.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from pypto_common.checkpoint import (
    FETCH_OPTIONS,
    CheckpointError,
    read_checkpoint,
    split_load_options,
)
from pypto_testing.checkpoints import safetensors_bytes
from pypto_testing.folders import folder_bytes


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    path.write_bytes(safetensors_bytes(tensors))


def make_folder(root: Path, shards: dict[str, dict[str, tuple[str, list[int]]]]) -> Path:
    root.mkdir(parents=True)
    weight_map = {}
    for shard, tensors in shards.items():
        write_safetensors(root / shard, tensors)
        weight_map.update(dict.fromkeys(tensors, shard))
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return root


A, B = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
GOOD = {
    A: {
        "embed.weight": ("BF16", [8, 4]),
        "q.weight": ("F8_E4M3", [4, 4]),
        "q.weight_scale_inv": ("F32", [1, 1]),
    },
    B: {"lm_head.weight": ("BF16", [8, 4]), "norm.weight": ("F32", [4])},
}


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "model", GOOD)


def test_the_indexed_shards_are_read_and_a_stray_file_is_ignored(good: Path):
    write_safetensors(good / "stray.safetensors", {"embed.weight": ("F32", [1000])})
    (good / "junk.safetensors").write_bytes(b"\xff" * 3)  # unreadable, but not indexed
    ckpt = read_checkpoint(good)
    assert list(ckpt.shards) == [A, B]
    assert ckpt.indexed
    entry = ckpt.tensors["embed.weight"]
    assert (entry.shard, entry.dtype, entry.shape, entry.nbytes) == (A, "BF16", (8, 4), 64)
    assert sum(e.nbytes for e in ckpt.tensors.values()) == 64 + 16 + 4 + 64 + 16
    assert [e.name for e in ckpt.by_shard()[B]] == ["lm_head.weight", "norm.weight"]


def _dup_across_shards(folder: Path) -> None:
    write_safetensors(folder / B, {**GOOD[B], "embed.weight": ("BF16", [8, 4])})


def _dup_in_one_header(folder: Path) -> None:
    raw = (folder / B).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = raw[8 : 8 + n].decode()
    entry = '"norm.weight": {"dtype": "F32", "shape": [4], "data_offsets": [64, 80]}'
    twice = header.replace(entry, entry + ", " + entry)
    assert twice != header
    (folder / B).write_bytes(struct.pack("<Q", len(twice)) + twice.encode() + raw[8 + n :])


def _scale_beside_bf16(folder: Path) -> None:
    write_safetensors(folder / B, {**GOOD[B], "lm_head.weight_scale_inv": ("F32", [1, 1])})


def _integer_scale(folder: Path) -> None:
    write_safetensors(folder / A, {**GOOD[A], "q.weight_scale_inv": ("I32", [1, 1])})


def _fp8_without_scale(folder: Path) -> None:
    tensors = dict(GOOD[A])
    del tensors["q.weight_scale_inv"]
    write_safetensors(folder / A, tensors)


def _scale_without_weight(folder: Path) -> None:
    write_safetensors(folder / B, {**GOOD[B], "k.weight_scale_inv": ("F32", [1, 1])})


def _escaping_index(folder: Path) -> None:
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"x": "../outside.safetensors"}})
    )


def _missing_shard(folder: Path) -> None:
    (folder / B).unlink()


def _fifo_shard(folder: Path) -> None:
    (folder / B).unlink()
    os.mkfifo(folder / B)


def _planted_link(folder: Path) -> None:
    outside = folder.parent / "elsewhere.safetensors"
    os.replace(folder / B, outside)
    (folder / B).symlink_to(outside)


def _huge_header(folder: Path) -> None:
    (folder / B).write_bytes(struct.pack("<Q", 2**60) + b"{}")


def _data_past_the_end(folder: Path) -> None:
    raw = (folder / B).read_bytes()
    (folder / B).write_bytes(raw[:-8])  # norm.weight's data cut short


def _wrong_byte_count(folder: Path) -> None:
    raw = (folder / B).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = raw[8 : 8 + n].replace(b'"shape": [4]', b'"shape": [5]')
    (folder / B).write_bytes(struct.pack("<Q", len(header)) + header + raw[8 + n :])


def _deep_index(folder: Path) -> None:
    (folder / "model.safetensors.index.json").write_text("[" * 100_000 + "]" * 100_000)


HOSTILE = [
    (_dup_across_shards, f"weight embed.weight is stored twice (in {A} and {B})"),
    (_dup_in_one_header, f"weight norm.weight is stored twice in {B}"),
    (_scale_beside_bf16, f"lm_head.weight_scale_inv in {B} scales lm_head.weight (in {B}), which is stored in BF16, not FP8"),
    (_integer_scale, f"q.weight_scale_inv in {A} is stored as I32, not a float"),
    (_fp8_without_scale, f"q.weight in {A} is stored in F8_E4M3 without its weight_scale_inv"),
    (_scale_without_weight, f"has k.weight_scale_inv (in {B}) but no k.weight"),
    (_escaping_index, "names shard '../outside.safetensors' outside the folder"),
    (_missing_shard, "is missing: the download is incomplete"),
    (_fifo_shard, "is not a regular file"),
    (_planted_link, "is a symbolic link no pypto-patch overlay of this folder records"),
    (_huge_header, f"{B} is not a readable safetensors file (its header claims"),
    (_data_past_the_end, f"{B} is not a readable safetensors file (tensor norm.weight has a malformed"),
    (_wrong_byte_count, f"{B} is not a readable safetensors file (tensor norm.weight is [5] F32 but holds 16 bytes)"),
    (_deep_index, "model.safetensors.index.json is unreadable (RecursionError)"),
]  # fmt: skip


@pytest.mark.parametrize(("breaker", "problem"), HOSTILE, ids=[h[0].__name__ for h in HOSTILE])
def test_a_hostile_folder_is_one_line_naming_tensor_and_shard(good: Path, breaker, problem):
    breaker(good)
    before = {p.name: p.is_fifo() or p.read_bytes() for p in good.iterdir()}
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(good)
    message = str(info.value)
    assert problem in message
    assert "\n" not in message
    assert any(fix in message for fix in ("re-download", "put the real file", "download"))
    assert {p.name: p.is_fifo() or p.read_bytes() for p in good.iterdir()} == before


def test_a_link_is_followed_only_where_the_caller_recorded_it(good: Path, tmp_path: Path):
    """An overlay's shards are links into its source: followed when vouched for (the
    recorded target, exactly), refused otherwise."""
    source = good
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    for entry in source.iterdir():
        (overlay / entry.name).symlink_to(entry)
    links = {p.name: str(source / p.name) for p in source.iterdir()}
    before = folder_bytes(source)
    ckpt = read_checkpoint(overlay, links=links)
    assert ckpt.shards[A] == source / A
    assert {k: (v.shard, v.nbytes) for k, v in ckpt.tensors.items()} == {
        k: (v.shard, v.nbytes) for k, v in read_checkpoint(source).tensors.items()
    }
    with pytest.raises(CheckpointError, match="no pypto-patch overlay of this folder records"):
        read_checkpoint(overlay)  # nobody vouched for the links
    (overlay / B).unlink()
    other = tmp_path / "other.safetensors"
    write_safetensors(other, GOOD[B])
    (overlay / B).symlink_to(other)  # planted: not where the overlay recorded it
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(overlay, links=links)
    assert f"shard {B} in {overlay} is a symbolic link" in str(info.value)
    assert folder_bytes(source) == before


def test_single_file_and_no_weights(tmp_path: Path):
    single = tmp_path / "single"
    single.mkdir()
    write_safetensors(single / "model.safetensors", {"w": ("F32", [2, 2])})
    write_safetensors(single / "extra.safetensors", {"w": ("F32", [2, 2])})  # not read
    assert list(read_checkpoint(single).shards) == ["model.safetensors"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="holds no safetensors weights"):
        read_checkpoint(empty)


def test_from_pretrained_options_are_sorted_once():
    opts = split_load_options(
        {
            "dtype": "bfloat16",
            "revision": "main",
            "device_map": "cpu",
            "output_loading_info": True,
            "quantization_config": {},
            "load_in_8bit": True,
        }
    )
    assert opts.dtype == {"dtype": "bfloat16"}
    assert opts.device_map == "cpu"
    assert opts.output_loading_info is True
    assert opts.unsupported == ["load_in_8bit", "quantization_config"]
    assert "revision" in FETCH_OPTIONS
