"""The download itself: list, fetch (resumable, retried), verify, record.

Design choices (the reasons):

- The listing comes from the hub's tree API at the *resolved commit*, not from the
  branch name, so files, sizes and hashes all describe one immutable snapshot even
  if the branch moves mid-download.
- Files are fetched with ``hf_hub_download(local_dir=...)`` one by one in a thread
  pool, not with ``snapshot_download``: that keeps the hub library's own local_dir
  resume metadata (``.cache/huggingface/download/*.metadata`` and ``*.incomplete``
  files resumed with Range requests) while letting us retry, verify and classify
  errors per file. ``snapshot_download`` in 0.36 silently returns a half-filled
  folder when the server is unreachable.
- Integrity: sizes always; the sha256 of LFS files and the git blob sha1 of the
  others. Verified files are recorded (size + mtime) in our manifest so a re-run
  does not hash gigabytes again.
- The hub library reads the network in 10 MiB chunks and only writes whole chunks,
  so a killed process loses up to 10 MiB per file in flight. We lower that chunk
  to 1 MiB for the duration of a download so a resume re-sends little (no measurable
  cost in tools/bench_download.py).
- huggingface_hub >= 1.x writes each download to a per-process temp file and never
  reads another process's again; we continue a killed run's partial LFS file with a
  Range request through the library's own ``http_get`` before handing the file back
  to ``hf_hub_download`` (which then only records its metadata).
- ``HF_ENDPOINT``, ``HF_TOKEN`` and ``HF_HUB_OFFLINE`` are read at call time (the hub
  library reads them once at import), and the endpoint and token are passed to every
  call explicitly.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import hashlib
import inspect
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import huggingface_hub
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub import constants as hf_constants
from huggingface_hub.utils import (
    are_progress_bars_disabled,
    disable_progress_bars,
    enable_progress_bars,
    filter_repo_objects,
)

from .errors import (
    AuthError,
    BadInputError,
    DiskFullError,
    DownloadError,
    HubServerError,
    HubUnreachableError,
    IntegrityError,
    InvalidModelIdError,
    NoMatchingFilesError,
    OfflineIncompleteError,
    OutputPathError,
    RepoNotFoundError,
    RevisionNotFoundError,
)

try:  # the 0.36 .. 2.x homes of the error classes
    from huggingface_hub import errors as _hf_errors
except ImportError:  # pragma: no cover - very old hub
    from huggingface_hub import utils as _hf_errors  # type: ignore[no-redef]

logger = logging.getLogger("pypto_download")

__all__ = [
    "DEFAULT_ENDPOINT",
    "DownloadResult",
    "RemoteFile",
    "download",
    "fetch",
    "resolve_endpoint",
    "validate_model_id",
]

DEFAULT_ENDPOINT = "https://huggingface.co"
MANIFEST_RELPATH = Path(".cache") / "pypto-download" / "manifest.json"
_HUB_META_DIR = Path(".cache") / "huggingface"
_TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
# A repo id is "name" or "namespace/name": letters, digits, "-", "_", "."; no "--"
# or ".." and no leading/trailing "-" or "." (the Hub's own rules), at most 96 chars.
_NAME = r"(?![-.])[A-Za-z0-9_.-]{1,96}(?<![-.])"
_MODEL_ID_RE = re.compile(rf"^(?:{_NAME}/)?{_NAME}$")


def _transient_exceptions() -> tuple[type[BaseException], ...]:
    """Network-level failures of whichever HTTP stack this hub version uses."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    with contextlib.suppress(ImportError):
        import requests  # huggingface_hub 0.x

        found += [
            requests.ConnectionError,
            requests.Timeout,
            requests.exceptions.ChunkedEncodingError,
        ]
    with contextlib.suppress(ImportError):
        import urllib3

        found += [urllib3.exceptions.ProtocolError, urllib3.exceptions.HTTPError]
    for mod in ("httpx", "httpx2"):  # huggingface_hub 1.x uses httpx, 2.x httpx2
        with contextlib.suppress(ImportError):
            http = __import__(mod)
            found.append(http.TransportError)
    return tuple(found)


_TRANSIENT = _transient_exceptions()
_HfHubHTTPError = getattr(_hf_errors, "HfHubHTTPError", None)
_GatedRepoError = getattr(_hf_errors, "GatedRepoError", None)
_RepoNotFound = getattr(_hf_errors, "RepositoryNotFoundError", None)
_RevisionNotFound = getattr(_hf_errors, "RevisionNotFoundError", None)
_EntryNotFound = getattr(_hf_errors, "EntryNotFoundError", None)


@dataclass(frozen=True)
class RemoteFile:
    """One file of the resolved commit, as the hub lists it."""

    path: str
    size: int
    sha256: str | None  # LFS files only
    blob_id: str | None  # git blob sha1

    @property
    def lfs(self) -> bool:
        return self.sha256 is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "sha256": self.sha256,
            "blob_id": self.blob_id,
        }


@dataclass
class DownloadResult:
    """What a call did; ``to_dict()`` is what ``--json`` prints."""

    path: Path
    repo_id: str
    revision: str
    commit: str | None
    endpoint: str
    files: list[RemoteFile]
    state: dict[str, str] = field(default_factory=dict)  # path -> complete|partial|missing
    fetched: list[str] = field(default_factory=list)
    refetched: list[str] = field(default_factory=list)
    dry_run: bool = False
    offline: bool = False

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def bytes_to_fetch(self) -> int:
        return sum(f.size for f in self.files if self.state.get(f.path) != "complete")

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_path": str(self.path),
            "model_id": self.repo_id,
            "revision": self.revision,
            "commit": self.commit,
            "endpoint": self.endpoint,
            "dry_run": self.dry_run,
            "offline": self.offline,
            "total_bytes": self.total_bytes,
            "bytes_to_fetch": self.bytes_to_fetch,
            "files": [
                dict(f.to_dict(), state=self.state.get(f.path, "missing")) for f in self.files
            ],
            "fetched": self.fetched,
            "refetched": self.refetched,
        }


# ---------------------------------------------------------------------- inputs
def validate_model_id(model_id: str) -> str:
    """Reject ids the Hub would reject, before any network call or disk change."""
    if (
        not isinstance(model_id, str)
        or not _MODEL_ID_RE.match(model_id)
        or "--" in model_id
        or ".." in model_id
    ):
        raise InvalidModelIdError(
            f"malformed model id {model_id!r}: expected ORG/REPO (letters, digits, '-', '_', '.'), "
            "e.g. Qwen/Qwen3-0.6B"
        )
    return model_id


def resolve_endpoint(endpoint: str | None = None) -> str:
    """``endpoint`` > ``$HF_ENDPOINT`` (read now, not at import) > huggingface.co."""
    value = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).strip().rstrip("/")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BadInputError(
            f"endpoint {value!r} is not an http(s) URL: pass e.g. --endpoint https://hf-mirror.com"
        )
    return value


def _resolve_token(token: str | None) -> str | None:
    if token:
        return token
    env = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    return env or None


def _offline_requested(offline: bool | None) -> bool:
    if offline is not None:
        return offline
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _check_output_dir(out: Path) -> Path | None:
    """Refuse an unusable destination before touching anything.

    Returns the first missing ancestor (what we would create), or None when the
    folder exists. Writability is probed for real (a temp file), because as root
    ``os.access`` says yes even on a read-only mount.
    """
    if out.exists() and not out.is_dir():
        raise OutputPathError(
            f"output path {out} exists and is not a folder: pass a folder path to --output-dir"
        )
    probe_dir = out
    first_missing: Path | None = None
    while not probe_dir.exists():
        first_missing = probe_dir
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir():
        raise OutputPathError(f"cannot create {out}: {probe_dir} is a file, not a folder")
    try:
        fd, name = tempfile.mkstemp(prefix=".pypto-download-probe-", dir=probe_dir)
        os.close(fd)
        os.unlink(name)
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(
                f"no space left on the device holding {probe_dir}: free some space"
            ) from None
        raise OutputPathError(
            f"output folder {probe_dir} is not writable ({err.strerror}): choose another --output-dir"
        ) from None
    return first_missing


# ---------------------------------------------------------------------- errors
def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [x for x in (e.__cause__, e.__context__) if x is not None]


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _is_transient(exc: BaseException) -> bool:
    for e in _chain(exc):
        if isinstance(e, _TRANSIENT):
            return True
        if (
            _HfHubHTTPError is not None
            and isinstance(e, _HfHubHTTPError)
            and _status(e) in _TRANSIENT_STATUS
        ):
            return True
    return False


def _is_network_down(exc: BaseException) -> bool:
    return any(isinstance(e, _TRANSIENT) for e in _chain(exc))


class _Context:
    """What error messages need to name (never the token)."""

    def __init__(self, repo_id: str, revision: str, endpoint: str, has_token: bool) -> None:
        self.repo_id, self.revision, self.endpoint, self.has_token = (
            repo_id,
            revision,
            endpoint,
            has_token,
        )

    def classify(self, exc: BaseException) -> DownloadError | None:
        """Map a hub/OS exception to our typed error; None if it is not one we know."""
        for e in _chain(exc):
            if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
                return DiskFullError(
                    f"no space left on device while downloading {self.repo_id}: free some space and re-run (completed files are kept)"
                )
        for e in _chain(exc):
            if _GatedRepoError is not None and isinstance(e, _GatedRepoError):
                return AuthError(self._auth_message(gated=True, status=_status(e)))
        for e in _chain(exc):
            if _RevisionNotFound is not None and isinstance(e, _RevisionNotFound):
                return RevisionNotFoundError(
                    f"revision {self.revision!r} not found in {self.repo_id} on {self.endpoint}: "
                    "pass an existing branch, tag or commit to --revision"
                )
        for e in _chain(exc):
            if _RepoNotFound is not None and isinstance(e, _RepoNotFound):
                hint = (
                    " (or your token has no access to it)"
                    if self.has_token
                    else ("; if it is private or gated, pass a token with --token or HF_TOKEN")
                )
                return RepoNotFoundError(
                    f"repository {self.repo_id} not found on {self.endpoint}{hint}"
                )
        for e in _chain(exc):
            if (
                _HfHubHTTPError is not None
                and isinstance(e, _HfHubHTTPError)
                and _status(e) in (401, 403)
            ):
                return AuthError(self._auth_message(gated=False, status=_status(e)))
        if _is_network_down(exc):
            return HubUnreachableError(
                f"cannot reach the hub at {self.endpoint} ({type(_root(exc)).__name__}): check the network, "
                "or point --endpoint / HF_ENDPOINT at a reachable mirror"
            )
        if _is_transient(exc):
            return HubServerError(
                f"the hub at {self.endpoint} kept failing ({_describe_status(exc)}) after all retries: "
                "try again later or raise --retries"
            )
        return None

    def _auth_message(self, *, gated: bool, status: int | None) -> str:
        what = "gated repository" if gated else "repository"
        code = f" (HTTP {status})" if status else ""
        if self.has_token:
            return (
                f"access to {what} {self.repo_id} refused{code}: the token given has no access; "
                "request access on the model page, then pass a token that has it with --token or HF_TOKEN"
            )
        return f"{what} {self.repo_id} needs authentication{code}: pass a token with --token TOKEN or set HF_TOKEN"


def _root(exc: BaseException) -> BaseException:
    last = exc
    for e in _chain(exc):
        if isinstance(e, _TRANSIENT):
            last = e
    return last


def _describe_status(exc: BaseException) -> str:
    for e in _chain(exc):
        status = _status(e)
        if status is not None:
            return f"HTTP {status}"
    return type(exc).__name__


def _retrying(
    what: str,
    call: Callable[[], Any],
    *,
    retries: int,
    backoff: float,
    ctx: _Context,
    stop: threading.Event | None = None,
) -> Any:
    """Run ``call``; retry transient failures ``retries`` times with exponential backoff.

    Non-transient failures are raised at once, typed; the last transient one is
    raised typed too (unreachable vs server error).
    """
    attempt = 0
    while True:
        try:
            return call()
        except DownloadError:
            raise
        except Exception as exc:
            typed = ctx.classify(exc)
            transient = _is_transient(exc) and not isinstance(typed, (DiskFullError, AuthError))
            if transient and attempt < retries and not (stop is not None and stop.is_set()):
                delay = min(backoff * (2**attempt), 30.0)
                attempt += 1
                logger.warning(
                    "%s failed (%s); retry %d/%d in %.1fs",
                    what,
                    _describe(exc),
                    attempt,
                    retries,
                    delay,
                )
                time.sleep(delay)
                continue
            if typed is not None:
                raise typed from exc
            raise


def _describe(exc: BaseException) -> str:
    status = _describe_status(exc)
    return status if status.startswith("HTTP") else type(_root(exc)).__name__


# ---------------------------------------------------------------------- hashing / manifest
def _file_digest(path: Path, lfs: bool) -> str:
    """sha256 (LFS) or git blob sha1 (others): what the hub lists for the file."""
    size = path.stat().st_size
    h = hashlib.sha256() if lfs else hashlib.sha1(usedforsecurity=False)
    if not lfs:
        h.update(b"blob %d\0" % size)
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _read_manifest(out: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((out / MANIFEST_RELPATH).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == 1 else None


def _write_manifest(out: Path, data: dict[str, Any]) -> None:
    target = out / MANIFEST_RELPATH
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, target)


class _Verifier:
    """Checks files against the listing, remembering what it already hashed."""

    def __init__(self, out: Path, commit: str, previous: dict[str, Any] | None) -> None:
        self.out = out
        self.commit = commit
        self._lock = threading.Lock()
        prev = previous.get("verified", {}) if previous else {}
        self.verified: dict[str, dict[str, Any]] = dict(prev) if isinstance(prev, dict) else {}

    def check(self, f: RemoteFile) -> str | None:
        """None if the local file matches; else why not."""
        path = self.out / f.path
        try:
            st = path.stat()
        except FileNotFoundError:
            return "missing"
        if st.st_size != f.size:
            return f"size {st.st_size} != {f.size}"
        expected = f.sha256 or f.blob_id
        if expected is None:
            return None
        with self._lock:
            rec = self.verified.get(f.path)
        if (
            rec
            and rec.get("digest") == expected
            and rec.get("mtime_ns") == st.st_mtime_ns
            and rec.get("size") == st.st_size
        ):
            return None
        actual = _file_digest(path, f.lfs)
        if actual != expected:
            return f"{'sha256' if f.lfs else 'git sha1'} {actual[:12]}.. != {expected[:12]}.."
        with self._lock:
            self.verified[f.path] = {
                "digest": expected,
                "mtime_ns": st.st_mtime_ns,
                "size": st.st_size,
            }
        return None

    def forget(self, path: str) -> None:
        with self._lock:
            self.verified.pop(path, None)


# ---------------------------------------------------------------------- progress
def _supports(func: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


@contextlib.contextmanager
def _hub_progress(enabled: bool) -> Iterator[None]:
    """Turn the hub library's own bars off for the duration (quiet mode)."""
    was_disabled = are_progress_bars_disabled()
    if not enabled and not was_disabled:
        disable_progress_bars()
    try:
        yield
    finally:
        if not enabled and not was_disabled:
            enable_progress_bars()


@contextlib.contextmanager
def _chunk_size(limit: int | None) -> Iterator[None]:
    """Lower the hub library's read chunk while we download (see module docstring)."""
    current = getattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", None)
    if not limit or not isinstance(current, int) or current <= limit:
        yield
        return
    hf_constants.DOWNLOAD_CHUNK_SIZE = limit
    try:
        yield
    finally:
        hf_constants.DOWNLOAD_CHUNK_SIZE = current


class _TotalBar:
    """One bar for the whole download on stderr, fed by the per-file bars."""

    def __init__(self, total: int, initial: int, enabled: bool, nfiles: int) -> None:
        self._bar = None
        self._lock = threading.Lock()
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total,
                initial=initial,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=f"total ({nfiles} files)",
                position=0,
                leave=True,
            )

    def update(self, n: float) -> None:
        if self._bar is not None and n:
            with self._lock:
                self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def file_bar_class(self) -> type | None:
        """A tqdm subclass for hf_hub_download (2.x) that also advances the total."""
        if self._bar is None:
            return None
        from huggingface_hub.utils import tqdm as hf_tqdm

        total = self

        class _FileBar(hf_tqdm):  # type: ignore[misc, valid-type]
            def update(self, n: float | None = 1) -> bool | None:
                total.update(n or 0)
                return super().update(n)

        return _FileBar


# ---------------------------------------------------------------------- cleanup
def _files_in(out: Path) -> set[str]:
    if not out.is_dir():
        return set()
    return {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}


def _has_downloaded_data(out: Path, before: set[str] = frozenset()) -> bool:  # type: ignore[assignment]
    """Anything we wrote worth keeping for a resume: a file that was not there
    before, or a non-empty partial one."""
    for rel in _files_in(out) - before:
        if not rel.startswith(".cache/"):
            return True
        if rel.endswith(".incomplete") and (out / rel).stat().st_size > 0:
            return True
    return False


# ---------------------------------------------------------------------- main entry
def download(
    model_id: str,
    output_dir: str | os.PathLike[str],
    *,
    revision: str | None = None,
    token: str | None = None,
    allow_patterns: Sequence[str] | str | None = None,
    ignore_patterns: Sequence[str] | str | None = None,
    endpoint: str | None = None,
    **kwargs: Any,
) -> Path:
    """Download ``model_id`` into ``output_dir`` and return its absolute path.

    See :func:`fetch` for the other keyword arguments and the errors raised.
    """
    return fetch(
        model_id,
        output_dir,
        revision=revision,
        token=token,
        allow_patterns=allow_patterns,
        ignore_patterns=ignore_patterns,
        endpoint=endpoint,
        **kwargs,
    ).path


def fetch(
    model_id: str,
    output_dir: str | os.PathLike[str],
    *,
    revision: str | None = None,
    token: str | None = None,
    allow_patterns: Sequence[str] | str | None = None,
    ignore_patterns: Sequence[str] | str | None = None,
    endpoint: str | None = None,
    max_workers: int = 8,
    retries: int = 3,
    backoff: float = 1.0,
    dry_run: bool = False,
    progress: bool = True,
    offline: bool | None = None,
    chunk_size: int | None = 1024 * 1024,
) -> DownloadResult:
    """Download (or, with ``dry_run``, plan) a model repository into a folder.

    ``token`` falls back to ``$HF_TOKEN``; ``endpoint`` to ``$HF_ENDPOINT`` (both
    read at call time); ``offline`` to ``$HF_HUB_OFFLINE``, in which case nothing
    touches the network and the folder must already hold a complete verified copy.
    Transient network errors are retried ``retries`` times per request with
    exponential ``backoff`` seconds. Raises a :class:`~pypto_download.errors.DownloadError`
    subclass (one-line message, distinct ``exit_code``) for every expected failure.
    """
    validate_model_id(model_id)
    if revision is not None and not revision.strip():
        raise BadInputError("empty --revision: pass a branch, tag or commit, or omit it for 'main'")
    if max_workers < 1:
        raise BadInputError(f"--max-workers must be at least 1, not {max_workers}")
    if retries < 0:
        raise BadInputError(f"--retries must be 0 or more, not {retries}")
    endpoint_url = resolve_endpoint(endpoint)
    token_value = _resolve_token(token)
    out = Path(output_dir).expanduser().absolute()
    allow = (
        [allow_patterns]
        if isinstance(allow_patterns, str)
        else (list(allow_patterns) if allow_patterns else None)
    )
    ignore = (
        [ignore_patterns]
        if isinstance(ignore_patterns, str)
        else (list(ignore_patterns) if ignore_patterns else None)
    )
    rev = revision or "main"
    ctx = _Context(model_id, rev, endpoint_url, token_value is not None)

    first_missing = _check_output_dir(out)

    if _offline_requested(offline):
        return _offline_result(model_id, rev, endpoint_url, out, allow, ignore, dry_run)

    # ---- listing (no disk change yet)
    api = HfApi(endpoint=endpoint_url, token=token_value)
    info = _retrying(
        f"listing {model_id}",
        lambda: api.model_info(model_id, revision=rev),
        retries=retries,
        backoff=backoff,
        ctx=ctx,
    )
    commit = info.sha
    if not commit:
        raise HubServerError(f"the hub at {endpoint_url} returned no commit for {model_id}@{rev}")
    if info.gated and token_value is None and not _stored_token():
        raise AuthError(ctx._auth_message(gated=True, status=None))

    def _list() -> list[RemoteFile]:
        entries = api.list_repo_tree(model_id, revision=commit, recursive=True)
        files = []
        for e in entries:
            if not hasattr(e, "size") or type(e).__name__ != "RepoFile":
                continue
            lfs = getattr(e, "lfs", None)
            sha = lfs.sha256 if lfs is not None else None
            files.append(
                RemoteFile(
                    path=e.path, size=int(e.size), sha256=sha, blob_id=getattr(e, "blob_id", None)
                )
            )
        return files

    all_files = _retrying(
        f"listing files of {model_id}", _list, retries=retries, backoff=backoff, ctx=ctx
    )
    all_files.sort(key=lambda f: f.path)
    wanted_paths = set(
        filter_repo_objects(
            [f.path for f in all_files], allow_patterns=allow, ignore_patterns=ignore
        )
    )
    files = [f for f in all_files if f.path in wanted_paths]
    if not files:
        if all_files:
            raise NoMatchingFilesError(
                f"no file of {model_id}@{rev} matches allow={allow or '*'} ignore={ignore or '-'}: "
                f"the repo has e.g. {', '.join(f.path for f in all_files[:5])}"
            )
        raise NoMatchingFilesError(f"{model_id}@{rev} has no files")

    previous = _read_manifest(out) if out.is_dir() else None
    verifier = _Verifier(
        out, commit, previous if previous and previous.get("commit") == commit else None
    )
    result = DownloadResult(
        path=out,
        repo_id=model_id,
        revision=rev,
        commit=commit,
        endpoint=endpoint_url,
        files=files,
        dry_run=dry_run,
    )
    for f in files:
        result.state[f.path] = _local_state(out, f, verifier, commit)

    if dry_run:
        return result

    # ---- download (from here on we may change the disk; undo if we leave nothing useful)
    cache_existed = (out / ".cache").exists()
    before = _files_in(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputPathError(
            f"cannot create {out} ({err.strerror}): choose another --output-dir"
        ) from None
    try:
        _download_files(
            result,
            out,
            verifier,
            ctx,
            token_value,
            max_workers=max_workers,
            retries=retries,
            backoff=backoff,
            progress=progress,
            chunk_size=chunk_size,
        )
        try:
            _write_manifest(
                out,
                {
                    "format": 1,
                    "repo_id": model_id,
                    "revision": rev,
                    "commit": commit,
                    "endpoint": endpoint_url,
                    "files": {f.path: f.to_dict() for f in all_files},
                    "verified": verifier.verified,
                },
            )
        except OSError as err:
            typed = ctx.classify(err)
            raise (
                typed or OutputPathError(f"cannot write the manifest in {out}: {err.strerror}")
            ) from err
    except BaseException as exc:
        kept = _has_downloaded_data(out, before)
        _cleanup_after_failure(out, first_missing, cache_existed, kept)
        if isinstance(exc, DownloadError) and kept:
            exc.args = (
                f"{exc.args[0]} (partial download kept in {out}: re-run the same command to resume)",
            )
        raise
    return result


def _stored_token() -> bool:
    get_token = getattr(huggingface_hub, "get_token", None)
    try:
        return bool(get_token()) if get_token is not None else False
    except Exception:  # a broken token file is not our problem here
        return False


def _local_state(out: Path, f: RemoteFile, verifier: _Verifier, commit: str) -> str:
    path = out / f.path
    if path.is_file() and path.stat().st_size == f.size:
        rec = verifier.verified.get(f.path)
        if rec and rec.get("mtime_ns") == path.stat().st_mtime_ns:
            return "complete"
        meta = out / _HUB_META_DIR / "download" / f"{f.path}.metadata"
        with contextlib.suppress(OSError):
            if meta.read_text().splitlines()[0].strip() == commit:
                return "complete"
    partial_dir = (out / _HUB_META_DIR / "download" / f.path).parent
    if partial_dir.is_dir() and any(
        p.name.endswith(".incomplete") and p.stat().st_size > 0
        for p in partial_dir.iterdir()
        if p.is_file()
    ):
        return "partial"
    return "missing"


# huggingface_hub >= 1.x downloads into a per-process ``<hash>.<etag>.<8 hex>.incomplete``
# and never looks at another process's file again, so a killed run's partial bytes would
# be fetched anew. 0.x uses ``<hash>.<etag>.incomplete`` and resumes it itself.
_UNIQUE_PARTIAL = re.compile(r"\.[0-9a-f]{8}\.incomplete$")


def _leftover_partial(out: Path, f: RemoteFile) -> Path | None:
    """The largest partial file a killed huggingface_hub >= 1.x run left for ``f``."""
    etag = f.sha256 or f.blob_id
    partial_dir = (out / _HUB_META_DIR / "download" / f.path).parent
    if not etag or not partial_dir.is_dir():
        return None
    found = [
        p
        for p in partial_dir.iterdir()
        if p.is_file() and f".{etag}." in p.name and _UNIQUE_PARTIAL.search(p.name)
    ]
    if not found:
        return None
    found.sort(key=lambda p: p.stat().st_size)
    for stale in found[:-1]:
        with contextlib.suppress(OSError):
            stale.unlink()
    best = found[-1]
    if not 0 < best.stat().st_size <= f.size:
        with contextlib.suppress(OSError):
            best.unlink()
        return None
    return best


def _continue_partial(
    partial: Path, out: Path, f: RemoteFile, commit: str, ctx: _Context, token: str | None
) -> None:
    """Fetch the rest of ``partial`` with a Range request and move it into place.

    huggingface_hub's own ``http_get`` does the transfer (it speaks Range, retries and
    follows the hub's redirects the same way a normal download does); the hub then sees
    a complete file whose sha256 equals its etag and only records its metadata.
    """
    from huggingface_hub import hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    done = partial.stat().st_size
    url = hf_hub_url(ctx.repo_id, f.path, revision=commit, endpoint=ctx.endpoint)
    with open(partial, "r+b") as fh:  # not "ab": a 200 answer makes http_get seek back to 0
        fh.seek(done)
        http_get(
            url, fh, resume_size=done, headers=build_hf_headers(token=token), expected_size=f.size
        )
    if partial.stat().st_size != f.size:
        partial.unlink()
        return
    dest = out / f.path
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, dest)
    logger.info("resumed %s from byte %d of a previous run", f.path, done)


def _download_files(
    result: DownloadResult,
    out: Path,
    verifier: _Verifier,
    ctx: _Context,
    token: str | None,
    *,
    max_workers: int,
    retries: int,
    backoff: float,
    progress: bool,
    chunk_size: int | None,
) -> None:
    files = result.files
    done_bytes = sum(f.size for f in files if result.state.get(f.path) == "complete")
    total = _TotalBar(sum(f.size for f in files), done_bytes, progress, len(files))
    file_bar = total.file_bar_class() if _supports(hf_hub_download, "tqdm_class") else None
    stop = threading.Event()
    lock = threading.Lock()

    def hub_get(f: RemoteFile, force: bool) -> None:
        kwargs: dict[str, Any] = {
            "revision": result.commit,
            "local_dir": str(out),
            "endpoint": ctx.endpoint,
            "token": token,
            "force_download": force,
        }
        if file_bar is not None:
            kwargs["tqdm_class"] = file_bar
        _retrying(
            f"downloading {f.path}",
            lambda: hf_hub_download(ctx.repo_id, f.path, **kwargs),
            retries=retries,
            backoff=backoff,
            ctx=ctx,
            stop=stop,
        )

    def one(f: RemoteFile) -> None:
        if stop.is_set():
            return
        already = result.state.get(f.path) == "complete"
        partial = None if already else _leftover_partial(out, f)
        if partial is not None and f.lfs and result.commit:
            _retrying(
                f"resuming {f.path}",
                lambda: _continue_partial(partial, out, f, result.commit, ctx, token),
                retries=retries,
                backoff=backoff,
                ctx=ctx,
                stop=stop,
            )
        hub_get(f, force=False)
        problem = verifier.check(f)
        if problem is not None:
            logger.warning("%s failed its check (%s); fetching it again", f.path, problem)
            verifier.forget(f.path)
            with lock:
                result.refetched.append(f.path)
            hub_get(f, force=True)
            problem = verifier.check(f)
            if problem is not None:
                with contextlib.suppress(OSError):
                    (out / f.path).unlink()
                with contextlib.suppress(OSError):
                    (out / _HUB_META_DIR / "download" / f"{f.path}.metadata").unlink()
                raise IntegrityError(
                    f"{f.path} of {ctx.repo_id}@{result.commit[:12] if result.commit else '?'} failed its integrity "
                    f"check twice ({problem}): the server or a proxy serves corrupted data; the bad file was removed"
                )
        if not already:
            with lock:
                result.fetched.append(f.path)
            if file_bar is None:
                total.update(f.size)
        result.state[f.path] = "complete"

    try:
        with _hub_progress(progress), _chunk_size(chunk_size):
            pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=max_workers, thread_name_prefix="pypto-download"
            )
            try:
                futures = [pool.submit(one, f) for f in files]
                first_error: BaseException | None = None
                for fut in concurrent.futures.as_completed(futures):
                    exc = fut.exception()
                    if exc is not None and first_error is None:
                        first_error = exc
                        stop.set()
                        for other in futures:
                            other.cancel()
                if first_error is not None:
                    raise first_error
            except KeyboardInterrupt:
                stop.set()
                raise
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
    finally:
        total.close()
    result.fetched.sort()
    result.refetched.sort()


def _cleanup_after_failure(
    out: Path, first_missing: Path | None, cache_existed: bool, kept: bool
) -> None:
    """Leave no empty folder behind: remove what we created if it holds nothing useful.

    A folder that existed before keeps all its content; only a ``.cache`` folder we
    created there, with no partial data in it, goes.
    """
    try:
        if kept:
            return
        if first_missing is not None:
            shutil.rmtree(first_missing, ignore_errors=True)
        elif not cache_existed:
            shutil.rmtree(out / ".cache", ignore_errors=True)
    except OSError as err:  # cleanup must never hide the real error
        logger.debug("cleanup of %s failed: %s", out, err)


def _offline_result(
    model_id: str,
    rev: str,
    endpoint: str,
    out: Path,
    allow: list[str] | None,
    ignore: list[str] | None,
    dry_run: bool,
) -> DownloadResult:
    """HF_HUB_OFFLINE: serve a previous complete download, checked against its manifest."""
    manifest = _read_manifest(out) if out.is_dir() else None
    how = "unset HF_HUB_OFFLINE and run once with network access"
    if manifest is None or manifest.get("repo_id") != model_id:
        raise OfflineIncompleteError(
            f"offline mode (HF_HUB_OFFLINE) and {out} holds no download of {model_id}: {how}"
        )
    if rev not in (manifest.get("revision"), manifest.get("commit")):
        raise OfflineIncompleteError(
            f"offline mode and {out} holds {model_id}@{manifest.get('revision')}, not {rev}: {how}"
        )
    commit = manifest["commit"]
    all_files = [RemoteFile(**d) for d in manifest.get("files", {}).values()]
    wanted = set(
        filter_repo_objects(
            [f.path for f in all_files], allow_patterns=allow, ignore_patterns=ignore
        )
    )
    files = sorted((f for f in all_files if f.path in wanted), key=lambda f: f.path)
    verifier = _Verifier(out, commit, manifest)
    result = DownloadResult(
        path=out,
        repo_id=model_id,
        revision=rev,
        commit=commit,
        endpoint=endpoint,
        files=files,
        dry_run=dry_run,
        offline=True,
    )
    bad = []
    for f in files:
        problem = verifier.check(f)
        result.state[f.path] = "complete" if problem is None else "missing"
        if problem is not None:
            bad.append(f"{f.path} ({problem})")
    if bad and not dry_run:
        raise OfflineIncompleteError(
            f"offline mode and {len(bad)} file(s) of {model_id} in {out} are missing or damaged, e.g. {bad[0]}: {how}"
        )
    return result
