"""LocalHub against the real huggingface_hub client (whatever version is installed)."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import time
from pathlib import Path

import pytest

huggingface_hub = pytest.importorskip("huggingface_hub")
from huggingface_hub import HfApi, hf_hub_download, snapshot_download  # noqa: E402

from pypto_testing.hub import LocalHub, git_blob_sha1  # noqa: E402

WEIGHTS = bytes(range(256)) * 1200  # 307200 bytes, LFS by suffix


def _files() -> dict[str, bytes]:
    files = {f"cfg/f{i:02d}.json": json.dumps({"i": i}).encode() for i in range(7)}
    files["config.json"] = b'{"model_type": "llama"}'
    files["model.safetensors"] = WEIGHTS
    return files


@pytest.fixture
def hub():
    with LocalHub(page_size=3) as h:
        yield h


def _raw(hub: LocalHub, method: str, path: str, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=10)
    conn.request(method, path, headers=headers or {})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp, body


def test_snapshot_download_real_client(hub, tmp_path):
    sha = hub.add_repo("org/tiny", _files())
    out = snapshot_download("org/tiny", endpoint=hub.endpoint, local_dir=tmp_path / "out")
    for rel, data in _files().items():
        assert (Path(out) / rel).read_bytes() == data
    # pagination was followed: 10 files + 1 folder = 11 entries at 3 per page
    tree_calls = [r for r in hub.requests if "/tree/" in r.path]
    assert len(tree_calls) in (0, 4)  # 0.x lists siblings from the info call instead
    assert all(sha in r.path for r in tree_calls)
    assert hub.wait_idle()
    assert hub.bytes_sent(method="GET", file_path="model.safetensors") == len(WEIGHTS)


def test_hf_hub_download_revisions_and_tags(hub, tmp_path):
    first = hub.add_repo("org/rev", {"a.txt": b"one"}, tags=("v1",))
    second = hub.add_repo("org/rev", {"a.txt": b"two"})
    hub.add_repo("org/rev", {"a.txt": b"dev"}, revision="dev")
    assert first != second
    get = lambda rev, d: Path(  # noqa: E731
        hf_hub_download(
            "org/rev", "a.txt", revision=rev, endpoint=hub.endpoint, local_dir=tmp_path / d
        )
    ).read_bytes()
    assert get("main", "m") == b"two"
    assert get("v1", "t") == b"one"
    assert get("dev", "d") == b"dev"
    assert get(first, "c") == b"one"
    info = HfApi(endpoint=hub.endpoint).model_info("org/rev", revision="v1")
    assert info.sha == first


def test_listing_metadata(hub):
    hub.add_repo("org/tiny", _files())
    api = HfApi(endpoint=hub.endpoint)
    info = api.model_info("org/tiny", files_metadata=True)
    sib = {s.rfilename: s for s in info.siblings}
    assert sib["model.safetensors"].lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest()
    assert sib["config.json"].lfs is None
    assert sib["config.json"].size == len(_files()["config.json"])
    tree = list(api.list_repo_tree("org/tiny", recursive=True))
    files = {e.path: e for e in tree if type(e).__name__ == "RepoFile"}
    assert set(files) == set(_files())
    assert files["config.json"].blob_id == git_blob_sha1(_files()["config.json"])
    top = [e.path for e in api.list_repo_tree("org/tiny")]
    assert "cfg" in top
    assert "cfg/f00.json" not in top
    sub = [e.path for e in api.list_repo_tree("org/tiny", path_in_repo="cfg")]
    assert len(sub) == 7


def test_resolve_headers_and_ranges(hub):
    sha = hub.add_repo("org/tiny", _files())
    resp, _ = _raw(hub, "HEAD", "/org/tiny/resolve/main/model.safetensors")
    assert resp.status == 200
    assert resp.getheader("X-Repo-Commit") == sha
    digest = hashlib.sha256(WEIGHTS).hexdigest()
    assert resp.getheader("ETag") == f'"{digest}"' == resp.getheader("X-Linked-Etag")
    assert resp.getheader("X-Linked-Size") == str(len(WEIGHTS))
    assert resp.getheader("Accept-Ranges") == "bytes"
    assert not [h for h in resp.headers if h.lower().startswith("x-xet")]
    resp, _ = _raw(hub, "HEAD", "/org/tiny/resolve/main/config.json")
    assert resp.getheader("ETag") == f'"{git_blob_sha1(_files()["config.json"])}"'
    assert resp.getheader("X-Linked-Etag") is None
    resp, body = _raw(
        hub, "GET", "/org/tiny/resolve/main/model.safetensors", {"Range": "bytes=100-199"}
    )
    assert resp.status == 206
    assert body == WEIGHTS[100:200]
    assert resp.getheader("Content-Range") == f"bytes 100-199/{len(WEIGHTS)}"
    resp, body = _raw(
        hub, "GET", "/org/tiny/resolve/main/model.safetensors", {"Range": "bytes=307000-"}
    )
    assert resp.status == 206
    assert body == WEIGHTS[307000:]
    resp, body = _raw(
        hub, "GET", "/org/tiny/resolve/main/model.safetensors", {"Range": "bytes=-10"}
    )
    assert body == WEIGHTS[-10:]
    resp, _ = _raw(
        hub, "GET", "/org/tiny/resolve/main/model.safetensors", {"Range": f"bytes={len(WEIGHTS)}-"}
    )
    assert resp.status == 416


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/api/models/org/none/revision/main", 404, "RepoNotFound"),
        ("/api/models/org/tiny/revision/nope", 404, "RevisionNotFound"),
        ("/org/tiny/resolve/main/missing.bin", 404, "EntryNotFound"),
        ("/org/none/resolve/main/config.json", 404, "RepoNotFound"),
        ("/api/models/org/tiny/tree/nope", 404, "RevisionNotFound"),
    ],
)
def test_error_codes(hub, path, status, code):
    hub.add_repo("org/tiny", _files())
    resp, _ = _raw(hub, "GET", path)
    assert resp.status == status
    assert resp.getheader("X-Error-Code") == code
    assert resp.getheader("X-Error-Message")


def test_error_codes_map_to_client_exceptions(hub, tmp_path):
    from huggingface_hub import errors

    hub.add_repo("org/tiny", _files())
    api = HfApi(endpoint=hub.endpoint)
    with pytest.raises(errors.RepositoryNotFoundError):
        api.model_info("org/none")
    with pytest.raises(errors.RevisionNotFoundError):
        api.model_info("org/tiny", revision="nope")
    with pytest.raises(errors.EntryNotFoundError):
        hf_hub_download("org/tiny", "missing.bin", endpoint=hub.endpoint, local_dir=tmp_path)


def test_gated_repo(hub, tmp_path):
    hub.add_repo("org/gated", _files(), gated=True, token="hf_right")
    info = HfApi(endpoint=hub.endpoint).model_info("org/gated")  # metadata is public, as on the Hub
    assert info.gated == "manual"
    resp, _ = _raw(hub, "HEAD", "/org/gated/resolve/main/config.json")
    assert (resp.status, resp.getheader("X-Error-Code")) == (401, "GatedRepo")
    resp, _ = _raw(
        hub, "HEAD", "/org/gated/resolve/main/config.json", {"Authorization": "Bearer hf_wrong"}
    )
    assert (resp.status, resp.getheader("X-Error-Code")) == (403, "GatedRepo")
    from huggingface_hub import errors

    with pytest.raises(errors.GatedRepoError):
        hf_hub_download(
            "org/gated", "config.json", endpoint=hub.endpoint, local_dir=tmp_path, token="hf_wrong"
        )
    path = hf_hub_download(
        "org/gated", "config.json", endpoint=hub.endpoint, local_dir=tmp_path, token="hf_right"
    )
    assert Path(path).read_bytes() == _files()["config.json"]
    assert any(r.authorized for r in hub.requests)


def test_drop_after_then_resume_sends_the_rest_only(hub, tmp_path):
    hub.add_repo("org/tiny", _files())
    hub.drop_after("model.safetensors", 100_000)
    resp, _body = _raw(hub, "GET", "/org/tiny/resolve/main/config.json")
    assert resp.status == 200  # other files unaffected
    conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=10)
    conn.request("GET", "/org/tiny/resolve/main/model.safetensors")
    resp = conn.getresponse()
    assert resp.getheader("Content-Length") == str(len(WEIGHTS))
    with pytest.raises(http.client.IncompleteRead) as info:
        resp.read()
    got = info.value.partial
    assert got == WEIGHTS[:100_000]
    conn.close()
    resp, rest = _raw(
        hub, "GET", "/org/tiny/resolve/main/model.safetensors", {"Range": f"bytes={len(got)}-"}
    )
    assert got + rest == WEIGHTS
    assert hub.wait_idle()
    assert hub.bytes_sent(file_path="model.safetensors") == len(WEIGHTS)  # nothing sent twice


def test_drop_after_with_real_client_bounded_bytes(hub, tmp_path):
    hub.add_repo("org/tiny", _files())
    hub.drop_after("model.safetensors", 100_000)
    out = tmp_path / "out"
    try:  # 2.x resumes by itself; 0.36 raises and a second call resumes
        hf_hub_download("org/tiny", "model.safetensors", endpoint=hub.endpoint, local_dir=out)
    except Exception:
        hf_hub_download("org/tiny", "model.safetensors", endpoint=hub.endpoint, local_dir=out)
    assert (out / "model.safetensors").read_bytes() == WEIGHTS
    assert hub.wait_idle()
    assert (
        len(WEIGHTS)
        <= hub.bytes_sent(file_path="model.safetensors", method="GET")
        <= len(WEIGHTS) + 100_000
    )


def test_corrupt_flips_one_byte_once(hub):
    hub.add_repo("org/tiny", _files())
    hub.corrupt("model.safetensors", offset=5)
    _, bad = _raw(hub, "GET", "/org/tiny/resolve/main/model.safetensors")
    assert len(bad) == len(WEIGHTS)
    assert bad != WEIGHTS
    assert [i for i in range(len(bad)) if bad[i] != WEIGHTS[i]] == [5]
    _, good = _raw(hub, "GET", "/org/tiny/resolve/main/model.safetensors")
    assert good == WEIGHTS


def test_fail_next_and_request_log(hub):
    hub.add_repo("org/tiny", _files())
    hub.fail_next(2, status=503, path_contains="/api/")
    assert _raw(hub, "GET", "/org/tiny/resolve/main/config.json")[0].status == 200
    assert _raw(hub, "GET", "/api/models/org/tiny")[0].status == 503
    assert _raw(hub, "GET", "/api/models/org/tiny")[0].status == 503
    assert _raw(hub, "GET", "/api/models/org/tiny")[0].status == 200
    assert [r.status for r in hub.requests] == [200, 503, 503, 200]
    assert hub.requests[0].file_path == "config.json"
    assert hub.requests[0].bytes_sent == len(_files()["config.json"])


def test_offline_and_restart_same_port(hub, tmp_path):
    hub.add_repo("org/tiny", _files())
    port = hub.port
    with hub.offline(), pytest.raises(OSError):
        _raw(hub, "GET", "/api/models/org/tiny")
    assert hub.port == port
    assert _raw(hub, "GET", "/api/models/org/tiny")[0].status == 200


def test_add_repo_from_folder_and_root(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "w.bin").write_bytes(os.urandom(1000))
    (src / "README.md").write_text("hi")
    with LocalHub(root=tmp_path / "hubroot") as hub:
        hub.add_repo("solo", src)  # a legacy one-segment id
        files = hub.files("solo")
        assert set(files) == {"sub/w.bin", "README.md"}
        assert files["sub/w.bin"].lfs
        assert not files["README.md"].lfs
        out = snapshot_download("solo", endpoint=hub.endpoint, local_dir=tmp_path / "out")
        assert (Path(out) / "sub" / "w.bin").read_bytes() == (src / "sub" / "w.bin").read_bytes()
    assert (tmp_path / "hubroot").is_dir()  # a root we were given is not deleted


def test_hang_after_releases_on_stop(tmp_path):
    hub = LocalHub().start()
    hub.add_repo("org/tiny", _files())
    hub.hang_after("model.safetensors", 1000)
    conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=10)
    conn.request("GET", "/org/tiny/resolve/main/model.safetensors")
    resp = conn.getresponse()
    assert resp.read(1000) == WEIGHTS[:1000]
    hub.close()  # must not block on the stalled handler
    with pytest.raises((http.client.IncompleteRead, OSError)):
        resp.read()
    assert not hub.root.exists()


def test_trickle_sends_slower_than_a_read_timeout(hub):
    hub.add_repo("org/tiny", _files())
    hub.trickle("model.safetensors", nbytes=10, interval=0.5)
    conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=0.2)
    conn.request("GET", "/org/tiny/resolve/main/model.safetensors")
    resp = conn.getresponse()
    assert resp.getheader("Content-Length") == str(len(WEIGHTS))  # it promises everything
    with pytest.raises(TimeoutError):
        resp.read(1)  # ... and then sends nothing within the client's timeout
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=5)
    conn.request("GET", "/org/tiny/resolve/main/model.safetensors", headers={"Range": "bytes=0-19"})
    t0 = time.monotonic()
    assert conn.getresponse().read() == WEIGHTS[:20]  # once only (times=1): a normal answer
    assert time.monotonic() - t0 < 0.5
    conn.close()


def test_trickle_and_stall_give_up_when_the_hub_stops(tmp_path):
    hub = LocalHub().start()
    hub.add_repo("org/tiny", _files())
    hub.trickle("model.safetensors", nbytes=1, interval=30, times=None)
    hub.stall(30, path_contains="/api/", times=None)
    conn = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=10)
    conn.request("GET", "/org/tiny/resolve/main/model.safetensors")
    resp = conn.getresponse()
    t0 = time.monotonic()
    hub.close()  # must not wait 30 s for the trickling handler
    assert time.monotonic() - t0 < 5
    with pytest.raises((http.client.IncompleteRead, OSError)):
        resp.read()


def test_stall_delays_the_answer(hub):
    hub.add_repo("org/tiny", _files())
    hub.stall(0.6, path_contains="/revision/")
    t0 = time.monotonic()
    assert _raw(hub, "GET", "/api/models/org/tiny/revision/main")[0].status == 200
    assert time.monotonic() - t0 >= 0.6
    t0 = time.monotonic()
    assert _raw(hub, "GET", "/api/models/org/tiny/revision/main")[0].status == 200
    assert time.monotonic() - t0 < 0.5  # times=1


def test_truncate_answers_a_short_body_cleanly(hub):
    hub.add_repo("org/tiny", _files())
    hub.truncate("model.safetensors", 1000, times=2)
    resp, _ = _raw(hub, "HEAD", "/org/tiny/resolve/main/model.safetensors")
    assert resp.getheader("Content-Length") == str(len(WEIGHTS))  # HEAD still says all of it
    for _ in range(2):
        resp, body = _raw(hub, "GET", "/org/tiny/resolve/main/model.safetensors")
        assert resp.status == 200
        assert resp.getheader("Content-Length") == "1000"
        assert body == WEIGHTS[:1000]
    assert _raw(hub, "GET", "/org/tiny/resolve/main/model.safetensors")[1] == WEIGHTS


def test_fail_next_with_retry_after_and_echoed_credentials(hub):
    hub.add_repo("org/tiny", _files())
    hub.echo_auth = True
    hub.fail_next(1, status=429, path_contains="/tree/", retry_after=7)
    resp, body = _raw(
        hub, "GET", "/api/models/org/tiny/tree/main", {"Authorization": "Bearer hf_echo"}
    )
    assert resp.status == 429
    assert resp.getheader("Retry-After") == "7"
    assert "Authorization: Bearer hf_echo" in json.loads(body)["error"]
    assert "Authorization: Bearer hf_echo" in resp.getheader("X-Error-Message")
    resp, body = _raw(hub, "GET", "/api/models/org/none/revision/main")
    assert resp.status == 404
    assert "Authorization: -" in json.loads(body)["error"]  # echoes what it got: nothing
    assert resp.getheader("X-Error-Code") == "RepoNotFound"


def test_unsafe_paths_are_refused_unless_asked_for(hub):
    with pytest.raises(ValueError):
        hub.add_repo("org/bad", {"../x": b"x"})
    hub.add_repo(
        "org/bad", {"../x": b"x", "/abs/y": b"y", "ok.txt": b"ok"}, allow_unsafe_paths=True
    )
    paths, url = set(), "/api/models/org/bad/tree/main?recursive=true"
    while url:
        resp, body = _raw(hub, "GET", url)
        paths |= {e["path"] for e in json.loads(body) if e["type"] == "file"}
        link = resp.getheader("Link")
        url = link.split(">")[0].split(str(hub.port), 1)[1] if link else None
    assert paths == {"../x", "/abs/y", "ok.txt"}
