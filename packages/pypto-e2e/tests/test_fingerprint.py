"""The model-folder fingerprint: every file counts, cheaply, and only model content counts."""

from __future__ import annotations

import hashlib
import json
import os

from pypto_e2e import fingerprint_folder


def _folder(tmp_path, name="m"):
    root = tmp_path / name
    root.mkdir()
    (root / "config.json").write_text('{"model_type": "llama"}')
    (root / "model-00001.safetensors").write_bytes(b"A" * 4096)
    (root / "sub").mkdir()
    (root / "sub" / "extra.bin").write_bytes(b"B" * 100)
    return root


def test_every_file_counts_not_only_config_json(tmp_path):
    root = _folder(tmp_path)
    before = fingerprint_folder(root)
    assert set(before.files) == {"config.json", "model-00001.safetensors", "sub/extra.bin"}
    (root / "sub" / "extra.bin").unlink()
    assert fingerprint_folder(root).digest != before.digest


def test_a_same_size_swap_changes_the_digest_small_and_large(tmp_path):
    root = _folder(tmp_path)
    weights = root / "model-00001.safetensors"
    for small in (1 << 20, 16):  # content hash, then the large-file identity path
        cache: dict = {}
        before = fingerprint_folder(root, cache=cache, small_file_bytes=small)
        st = weights.stat()
        replacement = root / "swap.tmp"
        replacement.write_bytes(b"Z" * st.st_size)
        os.replace(replacement, weights)
        after = fingerprint_folder(root, cache=cache, small_file_bytes=small)
        assert weights.stat().st_size == st.st_size
        assert after.files["model-00001.safetensors"] != before.files["model-00001.safetensors"]


def test_an_unchanged_file_is_not_read_again(tmp_path):
    """The fast path: same size, mtime_ns and inode -> the recorded digest, no hashing."""
    root = _folder(tmp_path)
    cache: dict = {}
    first = fingerprint_folder(root, cache=cache)
    real = os.path.realpath(root / "model-00001.safetensors")
    cache[real]["digest"] = "sha256:recorded"
    again = fingerprint_folder(root, previous=cache, cache={})
    assert again.files["model-00001.safetensors"] == "sha256:recorded"
    assert again.files["config.json"] == first.files["config.json"]


def test_tool_bookkeeping_is_not_model_content(tmp_path):
    root = _folder(tmp_path)
    before = fingerprint_folder(root).digest
    (root / ".cache" / "huggingface").mkdir(parents=True)
    (root / ".cache" / "huggingface" / "x.metadata").write_text("1")
    (root / ".pypto_patch.json").write_text("{}")
    (root / "config.json.pypto_orig").write_text("{}")
    assert fingerprint_folder(root).digest == before


def test_links_are_followed_as_an_overlay_needs(tmp_path):
    root = _folder(tmp_path)
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    for entry in os.listdir(root):
        os.symlink(root / entry, overlay / entry)
    assert fingerprint_folder(overlay).files == fingerprint_folder(root).files
    os.symlink(overlay, overlay / "sub" / "loop")  # a cycle is walked once, not forever
    assert "sub/extra.bin" in fingerprint_folder(overlay).files


def _download_manifest(root, rel, data):
    digest = hashlib.sha256(data).hexdigest()
    st = (root / rel).stat()
    state = root / ".cache" / "pypto-download"
    state.mkdir(parents=True, exist_ok=True)
    (state / "manifest.json").write_text(
        json.dumps(
            {
                "format": 1,
                "files": {rel: {"path": rel, "size": len(data), "sha256": digest}},
                "verified": {
                    rel: {"digest": digest, "mtime_ns": st.st_mtime_ns, "size": st.st_size}
                },
            }
        )
    )
    return digest


def test_a_verified_download_vouches_for_a_refetched_file(tmp_path):
    """Same content fetched again (new inode and mtime) keeps its digest: nothing re-runs."""
    root = _folder(tmp_path)
    rel = "model-00001.safetensors"
    data = (root / rel).read_bytes()
    digest = _download_manifest(root, rel, data)
    cache: dict = {}
    first = fingerprint_folder(root, cache=cache, small_file_bytes=16)
    assert first.files[rel] == f"hub:{digest}"
    (root / rel).unlink()
    (root / rel).write_bytes(data)  # what pypto-download does when it re-fetches
    _download_manifest(root, rel, data)
    again = fingerprint_folder(root, previous=cache, cache={}, small_file_bytes=16)
    assert again.digest == first.digest


def test_a_download_record_does_not_vouch_for_a_file_changed_after_it(tmp_path):
    root = _folder(tmp_path)
    rel = "model-00001.safetensors"
    _download_manifest(root, rel, (root / rel).read_bytes())
    first = fingerprint_folder(root, small_file_bytes=16)
    (root / rel).write_bytes(b"Q" * 4096)  # same size, new mtime: the record no longer matches
    os.utime(root / rel, ns=(1, 1))
    assert fingerprint_folder(root, small_file_bytes=16).files[rel] != first.files[rel]
