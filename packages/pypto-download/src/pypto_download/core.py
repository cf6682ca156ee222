"""The download itself: check, list, lock, fetch (resumable, retried), verify, record.

Design choices (the reasons; the details live with each module):

- Every argument is checked first (:mod:`.inputs`), then the listing is fetched and
  checked (:mod:`.listing`) at the resolved *commit*, so files, sizes and hashes all
  describe one immutable snapshot even if the branch moves, and a hostile listing is
  refused before anything touches the disk.
- Files are fetched with ``hf_hub_download(local_dir=...)`` one by one in a thread
  pool, not with ``snapshot_download``: that keeps the hub library's own local_dir
  resume metadata while letting us retry (:mod:`.retry`), verify (:mod:`.integrity`)
  and classify errors (:mod:`.classify`) per file. ``snapshot_download`` in 0.36
  silently returns a half-filled folder when the server is unreachable.
- One writer per folder (:mod:`.folder`), and names other tools own are respected:
  repo files with pypto tool names are skipped, files pypto-patch pinned in place are
  kept.
- ``HF_ENDPOINT``, ``HF_TOKEN`` and ``HF_HUB_OFFLINE`` are read at call time (the hub
  library reads them once at import), and the endpoint and token are passed to every
  call explicitly. Endpoint credentials and tokens never reach a message, the
  manifest or the result: the endpoint is shown masked, and every error is redacted.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import huggingface_hub
from huggingface_hub import hf_hub_download
from huggingface_hub.utils import filter_repo_objects

from pypto_common import PATCH_MANIFEST

from .classify import Context
from .errors import (
    AuthError,
    DownloadError,
    IntegrityError,
    NoMatchingFilesError,
    OfflineIncompleteError,
    OutputPathError,
)
from .folder import (
    FolderLock,
    cleanup_after_failure,
    escaping_link,
    files_in,
    kept_note,
    make_dirs,
    patch_state,
    reserved_reason,
)
from .inputs import (
    DEFAULT_ENDPOINT,
    DEFAULT_MAX_RETRY_WAIT,
    DEFAULT_READ_TIMEOUT,
    Options,
    check_options,
    check_output_dir,
    endpoint_secrets,
    offline_requested,
    resolve_endpoint,
    validate_model_id,
)
from .integrity import MANIFEST_FORMAT, Verifier, read_manifest, write_manifest
from .listing import Lister, unsafe_path_reason
from .progress import TotalBar, hub_progress, hub_settings, supports
from .result import DownloadResult, RemoteFile, SkippedFile
from .resume import HUB_META_DIR, continue_partial, leftover_partial, local_state
from .retry import retrying

logger = logging.getLogger("pypto_download")

__all__ = [
    "DEFAULT_ENDPOINT",
    "DEFAULT_MAX_RETRY_WAIT",
    "DEFAULT_READ_TIMEOUT",
    "DownloadResult",
    "RemoteFile",
    "SkippedFile",
    "download",
    "fetch",
    "resolve_endpoint",
    "validate_model_id",
]


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
    read_timeout: float = DEFAULT_READ_TIMEOUT,
    max_retry_wait: float = DEFAULT_MAX_RETRY_WAIT,
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
    exponential ``backoff`` seconds (longer when the hub sends ``Retry-After``, at most
    ``max_retry_wait``); a request that receives nothing for ``read_timeout`` seconds
    fails. Raises a :class:`~pypto_download.errors.DownloadError` subclass (one-line
    message, secrets masked, distinct ``exit_code``) for every expected failure.
    """
    try:
        opts = check_options(
            model_id,
            output_dir,
            revision=revision,
            token=token,
            allow_patterns=allow_patterns,
            ignore_patterns=ignore_patterns,
            endpoint=endpoint,
            max_workers=max_workers,
            retries=retries,
            backoff=backoff,
            read_timeout=read_timeout,
            max_retry_wait=max_retry_wait,
            chunk_size=chunk_size,
        )
    except DownloadError as err:
        err.redacted([token, *endpoint_secrets(endpoint or "")])
        raise
    try:
        return _fetch(opts, dry_run=dry_run, progress=progress, offline=offline)
    except DownloadError as err:
        err.redacted(opts.secrets)
        raise
    except Exception as err:
        # Unexpected, but still one redacted line: callers record str(err) (pypto-e2e
        # does), and a hub's error text may echo the token.
        raise DownloadError(
            f"unexpected {type(err).__name__}: {err} (re-run with -vv for details)"
        ).redacted(opts.secrets) from err


def _fetch(opts: Options, *, dry_run: bool, progress: bool, offline: bool | None) -> DownloadResult:
    out = opts.out
    ctx = Context(
        opts.model_id,
        opts.revision,
        opts.endpoint_shown,
        opts.token is not None,
        read_timeout=opts.read_timeout,
        retries=opts.retries,
    )
    check_output_dir(out)
    if offline_requested(offline):
        return _offline_result(opts, dry_run)

    # ---- listing (no disk change yet)
    lister = Lister(
        opts.endpoint,
        opts.token,
        ctx,
        retries=opts.retries,
        backoff=opts.backoff,
        max_wait=opts.max_retry_wait,
        timeout=opts.read_timeout,
    )
    info = lister.revision(opts.model_id, opts.revision)
    if info.gated and opts.token is None and not _stored_token():
        raise AuthError(ctx.auth_message(gated=True, status=None))
    all_files = lister.tree(opts.model_id, info.commit)
    files, skipped = _select(opts, all_files)
    for f in files:
        link = escaping_link(out, f.path)
        if link is not None:
            raise OutputPathError(
                f"{link} is a symbolic link out of {out}: writing {f.path} through it would change "
                "files elsewhere; remove the link or choose another --output-dir"
            )

    result = DownloadResult(
        path=out,
        repo_id=opts.model_id,
        revision=opts.revision,
        commit=info.commit,
        endpoint=opts.endpoint_shown,
        files=files,
        dry_run=dry_run,
        skipped=skipped,
    )
    for s in skipped:
        _warn(result, f"skipped {s.path} from the repo: {s.reason} (a repo must not ship it)")

    if dry_run:
        _plan(result, out, _patch_guard(result, out))
        return result

    # ---- download (from here on we may change the disk; undo if we leave nothing useful)
    created = make_dirs(out)
    cache_existed = (out / ".cache").exists()
    lock = FolderLock(out)
    lock.acquire()  # a busy folder is someone else's: no cleanup on that failure
    try:
        before = files_in(out)
        try:
            verifier = _plan(result, out, _patch_guard(result, out))
            _download_files(result, out, verifier, ctx, opts, progress=progress)
            try:
                write_manifest(
                    out,
                    {
                        "format": MANIFEST_FORMAT,
                        "repo_id": opts.model_id,
                        "revision": opts.revision,
                        "commit": info.commit,
                        "endpoint": opts.endpoint_shown,
                        "files": {
                            f.path: f.to_dict() for f in all_files if not reserved_reason(f.path)
                        },
                        "verified": verifier.verified,
                        "skipped": [s.to_dict() for s in skipped],
                        "patched": result.patched,
                    },
                )
            except OSError as err:
                typed = ctx.classify(err)
                raise (
                    typed or OutputPathError(f"cannot write the manifest in {out}: {err.strerror}")
                ) from err
        except BaseException as exc:
            note = kept_note(out, before)
            cleanup_after_failure(out, created, cache_existed, keep=note is not None)
            if isinstance(exc, DownloadError) and note:
                exc.args = (f"{exc.message} ({note})",)
            raise
    finally:
        lock.release()
    return result


def _select(
    opts: Options, all_files: list[RemoteFile]
) -> tuple[list[RemoteFile], list[SkippedFile]]:
    """The files the patterns pick, less those whose names the pypto tools own."""
    wanted_paths = set(
        filter_repo_objects(
            [f.path for f in all_files], allow_patterns=opts.allow, ignore_patterns=opts.ignore
        )
    )
    wanted = [f for f in all_files if f.path in wanted_paths]
    where = f"{opts.model_id}@{opts.revision}"
    if not wanted:
        if all_files:
            raise NoMatchingFilesError(
                f"no file of {where} matches allow={opts.allow or '*'} ignore={opts.ignore or '-'}: "
                f"the repo has e.g. {', '.join(f.path for f in all_files[:5])}"
            )
        raise NoMatchingFilesError(f"{where} has no files")
    files: list[RemoteFile] = []
    skipped: list[SkippedFile] = []
    for f in wanted:
        reason = reserved_reason(f.path)
        if reason is None:
            files.append(f)
        else:
            skipped.append(SkippedFile(f.path, reason))
    if not files:
        raise NoMatchingFilesError(
            f"every file of {where} that the patterns pick is a name the pypto tools own "
            f"(e.g. {skipped[0].path}): nothing to download"
        )
    return files, skipped


def _warn(result: DownloadResult, message: str) -> None:
    result.warnings.append(message)
    logger.warning("%s", message)


def _patch_guard(result: DownloadResult, out: Path) -> frozenset[str]:
    """The files pypto-patch changed in this folder, which we keep instead of re-fetching."""
    state = patch_state(out) if out.is_dir() else None
    if state is None:
        return frozenset()
    if state.mode == "overlay":
        raise OutputPathError(
            f"{out} is a pypto-patch overlay of {state.source or 'another folder'} (its entries link there): "
            "download into that folder instead, then rebuild the overlay with pypto-patch apply --output-dir"
        )
    listed = {f.path for f in result.files}
    kept = sorted(state.changed & listed)
    if kept:
        why = "" if state.readable else f" (its {PATCH_MANIFEST} is unreadable)"
        _warn(
            result,
            f"{out} is patched in place by pypto-patch{why}: kept its {', '.join(kept)} instead of "
            f"re-fetching; see `pypto-patch status --model-path {out}`, and `pypto-patch restore` to undo the pin",
        )
    return frozenset(kept)


def _plan(result: DownloadResult, out: Path, pinned: frozenset[str]) -> Verifier:
    """Each file's state now (complete / partial / missing / patched)."""
    previous = read_manifest(out) if out.is_dir() else None
    commit = result.commit or ""
    verifier = Verifier(
        out, commit, previous if previous and previous.get("commit") == commit else None
    )
    result.patched = sorted(pinned)
    for f in result.files:
        if f.path in pinned:
            verifier.forget(f.path)  # its bytes are pypto-patch's now, not the hub's
            result.state[f.path] = "patched"
        else:
            result.state[f.path] = local_state(out, f, verifier, commit)
    return verifier


def _stored_token() -> bool:
    get_token = getattr(huggingface_hub, "get_token", None)
    try:
        return bool(get_token()) if get_token is not None else False
    except Exception:  # a broken token file is not our problem here
        return False


def _download_files(
    result: DownloadResult,
    out: Path,
    verifier: Verifier,
    ctx: Context,
    opts: Options,
    *,
    progress: bool,
) -> None:
    files = [f for f in result.files if result.state.get(f.path) != "patched"]
    done_bytes = sum(f.size for f in files if result.state.get(f.path) == "complete")
    total = TotalBar(sum(f.size for f in files), done_bytes, progress, len(files))
    file_bar = total.file_bar_class() if supports(hf_hub_download, "tqdm_class") else None
    stop = threading.Event()
    lock = threading.Lock()
    commit = result.commit or ""

    def again(what: str, call: Any) -> Any:
        return retrying(
            what,
            call,
            retries=opts.retries,
            backoff=opts.backoff,
            max_wait=opts.max_retry_wait,
            ctx=ctx,
            stop=stop,
        )

    def hub_get(f: RemoteFile, force: bool) -> None:
        kwargs: dict[str, Any] = {
            "revision": commit,
            "local_dir": str(out),
            "endpoint": opts.endpoint,
            "token": opts.token,
            "force_download": force,
            "etag_timeout": opts.read_timeout,
        }
        if file_bar is not None:
            kwargs["tqdm_class"] = file_bar
        again(f"downloading {f.path}", lambda: hf_hub_download(ctx.repo_id, f.path, **kwargs))

    def one(f: RemoteFile) -> None:
        if stop.is_set():
            return
        already = result.state.get(f.path) == "complete"
        partial = None if already else leftover_partial(out, f)
        if partial is not None and f.lfs and commit:
            again(
                f"resuming {f.path}",
                lambda: continue_partial(
                    partial,
                    out,
                    f,
                    repo_id=ctx.repo_id,
                    commit=commit,
                    endpoint=opts.endpoint,
                    token=opts.token,
                ),
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
                    (out / HUB_META_DIR / "download" / f"{f.path}.metadata").unlink()
                raise IntegrityError(
                    f"{f.path} of {ctx.repo_id}@{commit[:12] or '?'} failed its integrity "
                    f"check twice ({problem}): the server or a proxy serves corrupted data; the bad file was removed"
                )
        if not already:
            with lock:
                result.fetched.append(f.path)
            if file_bar is None:
                total.update(f.size)
        result.state[f.path] = "complete"

    try:
        with (
            hub_progress(progress),
            hub_settings(chunk_size=opts.chunk_size, read_timeout=opts.read_timeout),
        ):
            pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=opts.max_workers, thread_name_prefix="pypto-download"
            )
            try:
                futures = [pool.submit(one, f) for f in files]
                errors: list[BaseException] = []
                for fut in concurrent.futures.as_completed(futures):
                    if fut.cancelled():  # queued behind a failure: it has no error of its own
                        continue
                    exc = fut.exception()
                    if exc is None:
                        continue
                    if not errors:
                        stop.set()
                        for other in futures:
                            other.cancel()
                    errors.append(exc)
                if errors:
                    # The first typed error says what went wrong; later ones are often
                    # consequences of stopping.
                    raise next((e for e in errors if isinstance(e, DownloadError)), errors[0])
            except KeyboardInterrupt:
                stop.set()
                raise
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
    finally:
        total.close()
    result.fetched.sort()
    result.refetched.sort()


def _offline_result(opts: Options, dry_run: bool) -> DownloadResult:
    """HF_HUB_OFFLINE: serve a previous complete download, checked against its manifest."""
    out, model_id, rev = opts.out, opts.model_id, opts.revision
    manifest = read_manifest(out) if out.is_dir() else None
    how = "unset HF_HUB_OFFLINE and run once with network access"
    if manifest is None or manifest.get("repo_id") != model_id:
        raise OfflineIncompleteError(
            f"offline mode (HF_HUB_OFFLINE) and {out} holds no download of {model_id}: {how}"
        )
    if rev not in (manifest.get("revision"), manifest.get("commit")):
        raise OfflineIncompleteError(
            f"offline mode and {out} holds {model_id}@{manifest.get('revision')}, not {rev}: {how}"
        )
    commit = str(manifest.get("commit") or "")
    all_files: list[RemoteFile] = []
    raw_files = manifest.get("files")
    for d in raw_files.values() if isinstance(raw_files, dict) else ():
        with contextlib.suppress(TypeError, KeyError, AttributeError):
            f = RemoteFile(
                path=d["path"],
                size=int(d["size"]),
                sha256=d.get("sha256"),
                blob_id=d.get("blob_id"),
            )
            if unsafe_path_reason(f.path) is None and reserved_reason(f.path) is None:
                all_files.append(f)
    wanted = set(
        filter_repo_objects(
            [f.path for f in all_files], allow_patterns=opts.allow, ignore_patterns=opts.ignore
        )
    )
    files = sorted((f for f in all_files if f.path in wanted), key=lambda f: f.path)
    result = DownloadResult(
        path=out,
        repo_id=model_id,
        revision=rev,
        commit=commit,
        endpoint=opts.endpoint_shown,
        files=files,
        dry_run=dry_run,
        offline=True,
    )
    pinned = _patch_guard(result, out)
    result.patched = sorted(pinned)
    verifier = Verifier(out, commit, manifest)
    bad = []
    for f in files:
        if f.path in pinned:
            result.state[f.path] = "patched"
            continue
        problem = verifier.check(f)
        result.state[f.path] = "complete" if problem is None else "missing"
        if problem is not None:
            bad.append(f"{f.path} ({problem})")
    if bad and not dry_run:
        raise OfflineIncompleteError(
            f"offline mode and {len(bad)} file(s) of {model_id} in {out} are missing or damaged, e.g. {bad[0]}: {how}"
        )
    return result
