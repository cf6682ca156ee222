"""A HuggingFace-compatible hub on 127.0.0.1, standard library only.

Why a real server instead of mocks: the packages here must work with every
huggingface_hub from 0.36 (requests) to 2.x (httpx), and the only honest way to
prove that is to let the real client speak real HTTP to something that answers like
the Hub. Tests also need what the real Hub cannot give on demand: a dropped
connection mid-file, a corrupted byte, a burst of 503s, an unreachable server, and
an exact count of the bytes sent (to prove a resume did not start over). And what a
hostile or broken one does: a body that trickles slower than any read timeout
(``trickle``), a clean but short body (``truncate``), an answer that never comes
(``stall``), ``Retry-After`` on errors, error bodies that echo the Authorization header
(``echo_auth``), and listings with paths such as ``../x`` (``allow_unsafe_paths``).

What it speaks (the subset huggingface_hub 0.36 .. 2.x uses to download a model):

- ``GET /api/models/{repo}`` and ``GET /api/models/{repo}/revision/{rev}``:
  ``id``, ``sha``, ``gated``, ``private``, ``siblings`` (``?blobs=true`` adds
  ``size``, ``blobId`` and ``lfs``).
- ``GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=&expand=``: paginated with
  ``Link: <...>; rel="next"`` (``page_size`` entries a page, small by default so
  clients really follow pages).
- ``HEAD``/``GET /{repo}/resolve/{rev}/{path}``: ``X-Repo-Commit``, quoted ``ETag``
  (sha256 for LFS files, git blob sha1 otherwise), ``X-Linked-Etag`` and
  ``X-Linked-Size`` for LFS files, ``Content-Length``, ``Accept-Ranges``, single
  ``Range`` requests (206 + ``Content-Range``, 416 when unsatisfiable).
- Errors carry ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``,
  ``EntryNotFound``, ``GatedRepo``) and ``X-Error-Message``. A gated repo's metadata is
  public (as on the Hub) but its files answer 401 without a token and 403 with a
  wrong one (``Authorization: Bearer <token>``).

It never advertises Xet (no ``X-Xet-*`` headers), so clients use plain HTTP.

Typical use::

    with LocalHub() as hub:
        sha = hub.add_repo("org/tiny", {"config.json": b"{}", "model.safetensors": blob})
        snapshot_download("org/tiny", endpoint=hub.endpoint, local_dir=tmp)
        assert hub.bytes_sent(method="GET") == len(blob) + 2
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

__all__ = [
    "DEFAULT_LFS_SUFFIXES",
    "HubFile",
    "LocalHub",
    "RequestRecord",
    "git_blob_sha1",
]

DEFAULT_LFS_SUFFIXES: tuple[str, ...] = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".gguf",
    ".onnx",
    ".msgpack",
    ".h5",
    ".npz",
    ".model",
)
_CHUNK = 256 * 1024
_LFS_POINTER_SIZE = 134  # size of a git-lfs pointer file for a sha256 oid (informational only)
_SHA_RE = re.compile(r"^[0-9a-f]{40}$")


def git_blob_sha1(data: bytes) -> str:
    """The id git gives a blob: the Hub's ETag for files not stored in LFS."""
    h = hashlib.sha1(usedforsecurity=False)
    h.update(b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()


@dataclass(frozen=True)
class HubFile:
    """One file of one revision, stored once under the hub's root by content."""

    path: str
    size: int
    blob_id: str  # git blob sha1 of the content
    sha256: str
    lfs: bool
    blob_path: Path

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.blob_id


@dataclass
class RequestRecord:
    """One request as the server saw it; ``bytes_sent`` counts body bytes only.

    ``bytes_sent`` grows while a body streams, so a test can watch a download in
    flight (and kill the client at a chosen point).
    """

    method: str
    path: str
    status: int = 0
    bytes_sent: int = 0
    range: str | None = None
    authorized: bool = False
    started: float = field(default_factory=time.monotonic)
    finished: bool = False

    @property
    def file_path(self) -> str | None:
        """The repo file path of a ``/resolve/`` request, else None."""
        parts = urlsplit(self.path).path.split("/resolve/", 1)
        if len(parts) != 2:
            return None
        rest = parts[1].split("/", 1)
        return unquote(rest[1]) if len(rest) == 2 else None


@dataclass
class _Revision:
    sha: str
    files: dict[str, HubFile]
    created: float


@dataclass
class _Repo:
    repo_id: str
    gated: bool
    token: str | None
    refs: dict[str, str] = field(default_factory=dict)  # branch/tag -> sha
    commits: dict[str, _Revision] = field(default_factory=dict)


@dataclass
class _Fault:
    kind: str  # "drop" | "hang" | "corrupt" | "trickle" | "short"
    file_path: str
    repo_id: str | None
    nbytes: int = 0
    offset: int = 0
    times: int | None = 1
    release: threading.Event | None = None
    interval: float = 0.0

    def matches(self, repo_id: str, file_path: str) -> bool:
        return self.file_path == file_path and (self.repo_id is None or self.repo_id == repo_id)


@dataclass
class _Failure:
    remaining: int
    status: int
    path_contains: str | None
    retry_after: str | None = None


@dataclass
class _Stall:
    remaining: int | None
    seconds: float
    path_contains: str | None


class _HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.commit = commit


class LocalHub:
    """A HuggingFace-compatible hub serving in a background thread on 127.0.0.1.

    Content lives on disk under ``root`` (a temporary folder by default, removed on
    ``stop()``), so large repositories (benchmarks) do not sit in memory.
    """

    def __init__(
        self,
        root: Path | str | None = None,
        *,
        page_size: int = 50,
        host: str = "127.0.0.1",
    ) -> None:
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="pypto-hub-")) if root is None else Path(root)
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        self.page_size = page_size
        self.host = host
        self._port = 0
        self._repos: dict[str, _Repo] = {}
        self._lock = threading.RLock()
        self._log: list[RequestRecord] = []
        self._faults: list[_Fault] = []
        self._failures: list[_Failure] = []
        self._stalls: list[_Stall] = []
        # Set while stopped, so a trickling or stalled handler gives up at once.
        self._closing = threading.Event()
        #: When true, every error answer repeats the request's path and Authorization
        #: header in its body and X-Error-Message, as careless servers and proxies do;
        #: clients must not print what comes back.
        self.echo_auth = False
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._commit_counter = 0

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> LocalHub:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        return self._port

    @property
    def endpoint(self) -> str:
        """Base URL to pass as ``endpoint=`` / ``HF_ENDPOINT`` (no trailing slash)."""
        if not self._port:
            raise RuntimeError("LocalHub is not started")
        return f"http://{self.host}:{self._port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> LocalHub:
        """Listen (again). After a first start the same port is reused, so clients
        holding the endpoint reconnect after ``offline()``."""
        if self._server is not None:
            return self
        server = _Server((self.host, self._port), _Handler)
        server.hub = self
        self._closing.clear()
        self._port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="pypto-local-hub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and cut every open connection: clients now see the server
        as unreachable. Repos and content stay, so ``start()`` serves them again on
        the same port."""
        self._shutdown_server()

    def close(self) -> None:
        """Stop and delete the temporary content folder (if the hub made it)."""
        self._shutdown_server()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def _shutdown_server(self) -> None:
        server, self._server = self._server, None
        self._closing.set()
        with self._lock:
            for fault in self._faults:
                if fault.release is not None:
                    fault.release.set()
        if server is None:
            return
        server.shutdown()
        server.server_close()
        server.cut_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._thread = None

    @contextlib.contextmanager
    def offline(self) -> Iterator[None]:
        """The server is unreachable (connection refused) inside the block."""
        self._shutdown_server()
        try:
            yield
        finally:
            self.start()

    # ------------------------------------------------------------------ content
    def add_repo(
        self,
        repo_id: str,
        files: Mapping[str, bytes | str | Path] | Path | str,
        *,
        revision: str = "main",
        gated: bool = False,
        token: str | None = None,
        lfs_suffixes: tuple[str, ...] = DEFAULT_LFS_SUFFIXES,
        tags: tuple[str, ...] = (),
        allow_unsafe_paths: bool = False,
    ) -> str:
        """Publish ``files`` as a new commit on branch ``revision``; return its sha.

        ``files`` maps repo paths to bytes (or a Path whose content is read), or is a
        folder whose files are all published. Calling again for the same repo with
        another ``revision`` adds a branch; with the same one, moves it. ``tags``
        also point at the new commit. ``gated``/``token`` apply to the whole repo:
        its files need ``Authorization: Bearer <token>``. ``allow_unsafe_paths`` keeps
        paths exactly as given (``../x``, ``/etc/x``) so a test can play a hostile hub
        whose listing tries to escape the client's folder.
        """
        if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", repo_id):
            raise ValueError(f"invalid repo id {repo_id!r}")
        if gated and not token:
            raise ValueError("a gated repo needs the token that unlocks it")
        entries = self._collect(files, raw=allow_unsafe_paths)
        stored: dict[str, HubFile] = {}
        for rel, source in sorted(entries.items()):
            stored[rel] = self._store(rel, source, lfs_suffixes)
        with self._lock:
            repo = self._repos.get(repo_id)
            if repo is None:
                repo = self._repos[repo_id] = _Repo(repo_id=repo_id, gated=gated, token=token)
            else:
                repo.gated, repo.token = gated, token
            self._commit_counter += 1
            digest = hashlib.sha1(usedforsecurity=False)
            digest.update(f"{repo_id}\0{revision}\0{self._commit_counter}\0".encode())
            for rel, f in stored.items():
                digest.update(f"{rel}\0{f.blob_id}\0".encode())
            sha = digest.hexdigest()
            repo.commits[sha] = _Revision(sha=sha, files=stored, created=time.time())
            repo.refs[revision] = sha
            for tag in tags:
                repo.refs[tag] = sha
        return sha

    def add_ref(self, repo_id: str, name: str, sha: str) -> None:
        """Point a branch or tag at an existing commit."""
        with self._lock:
            repo = self._repos[repo_id]
            if sha not in repo.commits:
                raise KeyError(f"{repo_id} has no commit {sha}")
            repo.refs[name] = sha

    def files(self, repo_id: str, revision: str = "main") -> dict[str, HubFile]:
        """What a revision serves (for assertions)."""
        with self._lock:
            repo = self._repos[repo_id]
            return dict(repo.commits[repo.refs.get(revision, revision)].files)

    @staticmethod
    def _collect(
        files: Mapping[str, bytes | str | Path] | Path | str, *, raw: bool = False
    ) -> dict[str, bytes | Path]:
        if isinstance(files, (str, Path)):
            folder = Path(files)
            if not folder.is_dir():
                raise ValueError(f"{folder} is not a folder")
            out: dict[str, bytes | Path] = {}
            for p in sorted(folder.rglob("*")):
                rel = p.relative_to(folder).as_posix()
                if p.is_file() and not rel.startswith(".git/") and not rel.startswith(".cache/"):
                    out[rel] = p
            return out
        result: dict[str, bytes | Path] = {}
        for rel, value in files.items():
            if not raw:
                rel = rel.strip("/")
                if not rel or ".." in rel.split("/"):
                    raise ValueError(f"invalid file path {rel!r}")
            result[rel] = value.encode() if isinstance(value, str) else value
        return result

    def _store(self, rel: str, source: bytes | Path, lfs_suffixes: tuple[str, ...]) -> HubFile:
        sha1 = hashlib.sha1(usedforsecurity=False)
        sha256 = hashlib.sha256()
        tmp = tempfile.NamedTemporaryFile(dir=self.root / "blobs", delete=False)  # noqa: SIM115 (closed below)
        size = 0
        try:
            with tmp:
                if isinstance(source, Path):
                    size = source.stat().st_size
                    sha1.update(b"blob %d\0" % size)
                    with open(source, "rb") as fh:
                        while chunk := fh.read(1 << 20):
                            sha1.update(chunk)
                            sha256.update(chunk)
                            tmp.write(chunk)
                else:
                    size = len(source)
                    sha1.update(b"blob %d\0" % size)
                    sha1.update(source)
                    sha256.update(source)
                    tmp.write(source)
            blob = self.root / "blobs" / sha256.hexdigest()
            os.replace(tmp.name, blob)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp.name)
            raise
        return HubFile(
            path=rel,
            size=size,
            blob_id=sha1.hexdigest(),
            sha256=sha256.hexdigest(),
            lfs=rel.lower().endswith(tuple(s.lower() for s in lfs_suffixes)),
            blob_path=blob,
        )

    # ------------------------------------------------------------------ request log
    @property
    def requests(self) -> list[RequestRecord]:
        """A snapshot of every request so far, oldest first."""
        with self._lock:
            return list(self._log)

    def clear_requests(self) -> None:
        with self._lock:
            self._log.clear()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until every logged request has finished on the server side.

        A client can hold the last byte before the handler thread has counted it, so a
        test that reads ``bytes_sent`` right after a response waits here first.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(r.finished for r in self.requests):
                return True
            time.sleep(0.01)
        return False

    def bytes_sent(self, *, file_path: str | None = None, method: str | None = None) -> int:
        """Body bytes sent so far (optionally only for one repo file / one method)."""
        total = 0
        for r in self.requests:
            if method is not None and r.method != method:
                continue
            if file_path is not None and r.file_path != file_path:
                continue
            total += r.bytes_sent
        return total

    # ------------------------------------------------------------------ faults
    def drop_after(
        self, file_path: str, nbytes: int, *, repo_id: str | None = None, times: int = 1
    ) -> None:
        """The next ``times`` GETs of ``file_path`` send ``nbytes`` of the body (the
        headers announce all of it) and then cut the connection."""
        with self._lock:
            self._faults.append(_Fault("drop", file_path, repo_id, nbytes=nbytes, times=times))

    # the name the task sketch used
    drop_after_bytes = drop_after

    def hang_after(
        self, file_path: str, nbytes: int, *, repo_id: str | None = None
    ) -> threading.Event:
        """The next GET of ``file_path`` sends ``nbytes`` and then stalls until the
        returned event is set (or the hub stops), then cuts the connection. Lets a
        test kill a client at a known point of a file."""
        release = threading.Event()
        with self._lock:
            self._faults.append(_Fault("hang", file_path, repo_id, nbytes=nbytes, release=release))
        return release

    def corrupt(
        self, file_path: str, *, offset: int = 0, repo_id: str | None = None, times: int | None = 1
    ) -> None:
        """Flip one byte (at ``offset`` of the file) in the next ``times`` bodies
        served for ``file_path`` (``times=None``: every one). Headers stay truthful,
        so only a content check can notice."""
        with self._lock:
            self._faults.append(_Fault("corrupt", file_path, repo_id, offset=offset, times=times))

    def trickle(
        self,
        file_path: str,
        *,
        nbytes: int = 1,
        interval: float = 1.0,
        repo_id: str | None = None,
        times: int | None = 1,
    ) -> None:
        """The next ``times`` GETs of ``file_path`` (``None``: every one) announce the
        whole body, then send ``nbytes`` every ``interval`` seconds, the first only after
        ``interval``: a server slower than any sane read timeout, which never closes."""
        with self._lock:
            self._faults.append(
                _Fault("trickle", file_path, repo_id, nbytes=nbytes, times=times, interval=interval)
            )

    def truncate(
        self, file_path: str, nbytes: int, *, repo_id: str | None = None, times: int | None = 1
    ) -> None:
        """The next ``times`` GETs of ``file_path`` (``None``: every one) answer a body of
        only ``nbytes`` with a ``Content-Length`` to match, while ``HEAD`` and the listing
        still give the full size: a proxy that cuts transfers cleanly."""
        with self._lock:
            self._faults.append(_Fault("short", file_path, repo_id, nbytes=nbytes, times=times))

    def fail_next(
        self,
        n: int = 1,
        status: int = 503,
        *,
        path_contains: str | None = None,
        retry_after: float | str | None = None,
    ) -> None:
        """The next ``n`` requests (whose path contains ``path_contains``, if given)
        answer ``status`` with a small JSON error body: a transient server error.
        ``retry_after`` adds a ``Retry-After`` header (seconds, or an HTTP date string)."""
        value = None if retry_after is None else str(retry_after)
        with self._lock:
            self._failures.append(
                _Failure(remaining=n, status=status, path_contains=path_contains, retry_after=value)
            )

    def stall(
        self, seconds: float, *, path_contains: str | None = None, times: int | None = 1
    ) -> None:
        """The next ``times`` requests (whose path contains ``path_contains``) wait
        ``seconds`` before answering anything: a server that accepted the connection
        and went quiet."""
        with self._lock:
            self._stalls.append(
                _Stall(remaining=times, seconds=seconds, path_contains=path_contains)
            )

    def clear_faults(self) -> None:
        with self._lock:
            for fault in self._faults:
                if fault.release is not None:
                    fault.release.set()
            self._faults.clear()
            self._failures.clear()
            self._stalls.clear()

    def _take_failure(self, path: str) -> _Failure | None:
        with self._lock:
            for failure in self._failures:
                if failure.remaining > 0 and (
                    failure.path_contains is None or failure.path_contains in path
                ):
                    failure.remaining -= 1
                    self._failures = [f for f in self._failures if f.remaining > 0]
                    return failure
        return None

    def _take_stall(self, path: str) -> float:
        with self._lock:
            for stall in self._stalls:
                if (stall.remaining is None or stall.remaining > 0) and (
                    stall.path_contains is None or stall.path_contains in path
                ):
                    if stall.remaining is not None:
                        stall.remaining -= 1
                    self._stalls = [
                        s for s in self._stalls if s.remaining is None or s.remaining > 0
                    ]
                    return stall.seconds
        return 0.0

    def _take_faults(self, repo_id: str, file_path: str) -> list[_Fault]:
        taken = []
        with self._lock:
            for fault in self._faults:
                if fault.matches(repo_id, file_path) and (fault.times is None or fault.times > 0):
                    if fault.times is not None:
                        fault.times -= 1
                    taken.append(fault)
            self._faults = [f for f in self._faults if f.times is None or f.times > 0]
        return taken

    # ------------------------------------------------------------------ resolution
    def _repo(self, repo_id: str) -> _Repo:
        repo = self._repos.get(repo_id)
        if repo is None:
            raise _HubError(404, "RepoNotFound", f"Repository {repo_id} not found")
        return repo

    def _revision(self, repo: _Repo, revision: str) -> _Revision:
        sha = repo.refs.get(revision)
        if sha is None and _SHA_RE.match(revision) and revision in repo.commits:
            sha = revision
        if sha is None:
            raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return repo.commits[sha]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    hub: LocalHub

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()

    def track(self, conn: socket.socket, add: bool) -> None:
        with self._conns_lock:
            (self._conns.add if add else self._conns.discard)(conn)

    def cut_connections(self) -> None:
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    server_version = "pypto-local-hub/1"

    def log_message(self, format: str, *args: Any) -> None:  # silence stderr
        pass

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, True)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.server.track(self.connection, False)

    @property
    def hub(self) -> LocalHub:
        return self.server.hub

    # -- plumbing
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def _dispatch(self, method: str) -> None:
        record = RequestRecord(
            method=method,
            path=self.path,
            range=self.headers.get("Range"),
            authorized=self.headers.get("Authorization", "").startswith("Bearer "),
        )
        with self.hub._lock:
            self.hub._log.append(record)
        self._record = record
        try:
            delay = self.hub._take_stall(self.path)
            if delay and self.hub._closing.wait(delay):
                self.close_connection = True
                return
            failure = self.hub._take_failure(self.path)
            if failure is not None:
                self._send_error(
                    _HubError(failure.status, None, f"injected {failure.status}"),
                    retry_after=failure.retry_after,
                )
                return
            split = urlsplit(self.path)
            raw_parts = split.path.split("/")[1:]
            query = {k: v[-1] for k, v in parse_qs(split.query).items()}
            if raw_parts[:2] == ["api", "models"]:
                self._api(raw_parts[2:], query)
            elif "resolve" in raw_parts:
                self._resolve(method, raw_parts)
            else:
                self._send_error(_HubError(404, None, "not found"))
        except _HubError as err:
            self._send_error(err)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True
        finally:
            record.finished = True

    def _send_error(self, err: _HubError, *, retry_after: str | None = None) -> None:
        message = err.message
        if self.hub.echo_auth:
            message += (
                f" [request: {self.command} {self.path};"
                f" Authorization: {self.headers.get('Authorization', '-')}]"
            )
        body = json.dumps({"error": message}).encode()
        self._record.status = err.status
        self.send_response(err.status)
        self.send_header("Content-Type", "application/json")
        if err.code:
            self.send_header("X-Error-Code", err.code)
        self.send_header("X-Error-Message", message)
        if err.commit:
            self.send_header("X-Repo-Commit", err.commit)
        if retry_after is not None:
            self.send_header("Retry-After", retry_after)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
            self._record.bytes_sent += len(body)

    def _send_json(self, obj: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(obj).encode()
        self._record.status = 200
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
            self._record.bytes_sent += len(body)

    @staticmethod
    def _split_repo(parts: list[str], marker: str) -> tuple[str, list[str]]:
        """Repo ids are one or two path segments; the marker segment follows them."""
        for n in (2, 1):
            if len(parts) > n and parts[n] == marker:
                return "/".join(unquote(p) for p in parts[:n]), parts[n + 1 :]
        raise _HubError(404, None, "not found")

    # -- /api/models/...
    def _api(self, parts: list[str], query: dict[str, str]) -> None:
        hub = self.hub
        if "tree" in parts:
            repo_id, rest = self._split_repo(parts, "tree")
            if not rest:
                raise _HubError(404, None, "not found")
            with hub._lock:
                repo = hub._repo(repo_id)
                rev = hub._revision(repo, unquote(rest[0]))
            sub = "/".join(unquote(p) for p in rest[1:]).strip("/")
            self._tree(repo_id, rest[0], rev, sub, query)
            return
        if "revision" in parts:
            repo_id, rest = self._split_repo(parts, "revision")
            revision = unquote("/".join(rest))
        else:
            repo_id, revision = "/".join(unquote(p) for p in parts if p), "main"
        with hub._lock:
            repo = hub._repo(repo_id)
            rev = hub._revision(repo, revision)
        blobs = query.get("blobs", "").lower() in ("1", "true")
        siblings = []
        for f in rev.files.values():
            s: dict[str, Any] = {"rfilename": f.path}
            if blobs:
                s["size"] = f.size
                s["blobId"] = f.blob_id
                if f.lfs:
                    s["lfs"] = {
                        "sha256": f.sha256,
                        "size": f.size,
                        "pointerSize": _LFS_POINTER_SIZE,
                    }
            siblings.append(s)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(rev.created))
        self._send_json(
            {
                "_id": hashlib.md5(repo_id.encode(), usedforsecurity=False).hexdigest()[:24],
                "id": repo_id,
                "modelId": repo_id,
                "author": repo_id.split("/")[0] if "/" in repo_id else None,
                "sha": rev.sha,
                "lastModified": stamp,
                "createdAt": stamp,
                "private": False,
                "gated": "manual" if repo.gated else False,
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "siblings": siblings,
            }
        )

    def _tree(
        self, repo_id: str, raw_rev: str, rev: _Revision, sub: str, query: dict[str, str]
    ) -> None:
        recursive = query.get("recursive", "").lower() in ("1", "true")
        prefix = f"{sub}/" if sub else ""
        files = [f for f in rev.files.values() if f.path.startswith(prefix)]
        if sub and not files:
            raise _HubError(
                404, "EntryNotFound", f"{sub} does not exist on {rev.sha}", commit=rev.sha
            )
        entries: dict[str, dict[str, Any]] = {}
        for f in files:
            rel = f.path[len(prefix) :]
            dirs = rel.split("/")[:-1]
            for i in range(len(dirs)):
                if not recursive and i > 0:
                    break
                dpath = prefix + "/".join(dirs[: i + 1])
                entries.setdefault(
                    dpath,
                    {
                        "type": "directory",
                        "oid": hashlib.sha1(
                            f"{rev.sha}:{dpath}".encode(), usedforsecurity=False
                        ).hexdigest(),
                        "size": 0,
                        "path": dpath,
                    },
                )
            if dirs and not recursive:
                continue
            entry: dict[str, Any] = {
                "type": "file",
                "oid": f.blob_id,
                "size": f.size,
                "path": f.path,
            }
            if f.lfs:
                entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": _LFS_POINTER_SIZE}
            entries[f.path] = entry
        ordered = [entries[k] for k in sorted(entries)]
        try:
            start = int(query.get("cursor", "0"))
        except ValueError as err:
            raise _HubError(400, None, "bad cursor") from err
        size = max(1, self.hub.page_size)
        page = ordered[start : start + size]
        headers = {}
        if start + size < len(ordered):
            host = self.headers.get("Host") or f"{self.hub.host}:{self.hub.port}"
            sub_part = "/" + quote(sub, safe="/") if sub else ""
            nxt = (
                f"http://{host}/api/models/{repo_id}/tree/{raw_rev}{sub_part}"
                f"?recursive={str(recursive).lower()}&expand={query.get('expand', 'false')}&cursor={start + size}"
            )
            headers["Link"] = f'<{nxt}>; rel="next"'
        self._send_json(page, headers)

    # -- /{repo}/resolve/{rev}/{path}
    def _resolve(self, method: str, parts: list[str]) -> None:
        hub = self.hub
        repo_id, rest = self._split_repo(parts, "resolve")
        if len(rest) < 2:
            raise _HubError(404, None, "not found")
        with hub._lock:
            repo = hub._repo(repo_id)
            rev = hub._revision(repo, unquote(rest[0]))
            gated, token = repo.gated, repo.token
        file_path = "/".join(unquote(p) for p in rest[1:])
        if gated:
            auth = self.headers.get("Authorization", "")
            if not auth.startswith("Bearer "):
                raise _HubError(
                    401,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted. You must be authenticated.",
                )
            if auth[len("Bearer ") :] != token:
                raise _HubError(
                    403,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted and you are not in the authorized list.",
                )
        f = rev.files.get(file_path)
        if f is None:
            raise _HubError(
                404, "EntryNotFound", f"{file_path} does not exist on {rev.sha}", commit=rev.sha
            )

        start, end = 0, f.size - 1
        status = 200
        range_header = self.headers.get("Range")
        if range_header and method == "GET":
            parsed = _parse_range(range_header, f.size)
            if parsed == "unsatisfiable":
                self._record.status = 416
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{f.size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if isinstance(parsed, tuple):
                start, end = parsed
                status = 206
        length = max(0, end - start + 1)
        faults = hub._take_faults(repo_id, file_path) if method == "GET" else []
        for fault in faults:
            if fault.kind == "short":
                length = min(length, fault.nbytes)
        quoted = f'"{f.etag}"'
        self._record.status = status
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", quoted)
        self.send_header("X-Repo-Commit", rev.sha)
        self.send_header(
            "Content-Disposition", f'inline; filename="{file_path.rsplit("/", 1)[-1]}"'
        )
        if f.lfs:
            self.send_header("X-Linked-Etag", quoted)
            self.send_header("X-Linked-Size", str(f.size))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{f.size}")
        self.end_headers()
        if method == "HEAD":
            return
        self._stream(f, start, length, faults)

    def _stream(self, f: HubFile, start: int, length: int, faults: list[_Fault]) -> None:
        cut_at: int | None = None  # body bytes after which the connection is cut
        hang: threading.Event | None = None
        trickle: _Fault | None = None
        corrupt_offsets = []
        for fault in faults:
            if fault.kind in ("drop", "hang"):
                cut_at = fault.nbytes if cut_at is None else min(cut_at, fault.nbytes)
                if fault.kind == "hang":
                    hang = fault.release
            elif fault.kind == "corrupt":
                corrupt_offsets.append(fault.offset)
            elif fault.kind == "trickle":
                trickle = fault
        sent = 0
        pos = start
        with open(f.blob_path, "rb") as fh:
            fh.seek(start)
            while sent < length:
                want = min(_CHUNK, length - sent)
                if cut_at is not None:
                    want = min(want, cut_at - sent)
                if trickle is not None:
                    self.wfile.flush()
                    if self.hub._closing.wait(trickle.interval):
                        break
                    want = min(want, max(1, trickle.nbytes))
                if want <= 0:
                    break
                chunk = fh.read(want)
                if not chunk:
                    break
                for off in corrupt_offsets:
                    if pos <= off < pos + len(chunk):
                        buf = bytearray(chunk)
                        buf[off - pos] ^= 0xFF
                        chunk = bytes(buf)
                self.wfile.write(chunk)
                sent += len(chunk)
                pos += len(chunk)
                self._record.bytes_sent = sent
        if trickle is not None and sent < length:
            cut_at = sent
        if cut_at is not None and sent < length:
            with contextlib.suppress(OSError):
                self.wfile.flush()
            if hang is not None:
                hang.wait()
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)


def _parse_range(header: str, size: int) -> tuple[int, int] | str | None:
    """One ``bytes=`` range -> inclusive (start, end); "unsatisfiable" (416); or
    None for a header to ignore (malformed, or several ranges: no client here sends
    those, and RFC 9110 lets a server answer 200 with the whole body)."""
    m = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", header)
    if not m or (not m.group(1) and not m.group(2)):
        return None
    if not m.group(1):  # suffix range: the last N bytes
        n = int(m.group(2))
        if n == 0 or size == 0:
            return "unsatisfiable"
        return max(0, size - n), size - 1
    start = int(m.group(1))
    end = int(m.group(2)) if m.group(2) else size - 1
    if start >= size or end < start:
        return "unsatisfiable"
    return start, min(end, size - 1)
