"""The repo listing at one commit, fetched and checked before anything touches the disk.

Why our own two requests (revision, then the paginated tree) over huggingface_hub's
HTTP session instead of ``HfApi``: each page is retried by our policy (``--retries``,
``Retry-After`` bounded by ``--max-retry-wait``, ``--read-timeout``) the same way in
every hub version (2.x retried the tree five times by itself, honouring any
``Retry-After`` without a bound, and sent the revision request with no timeout at all),
and every entry is checked here: a listing is untrusted input, and a path such as
``../x`` must be refused by name, not crash a writer later.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from . import __version__
from .classify import Context
from .errors import HubServerError, UnsafeListingError
from .result import RemoteFile
from .retry import retrying

__all__ = ["Lister", "RevisionInfo", "unsafe_path_reason"]

_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_DRIVE = re.compile(r"^[A-Za-z]:")
_MAX_PAGES = 100_000


def unsafe_path_reason(path: object) -> str | None:
    """Why a listed repo path cannot be written inside the output folder, or None.

    Stricter than the filesystem: anything that could name a place outside the
    folder, or print as something else (control characters), is refused.
    """
    if not isinstance(path, str) or not path:
        return "not a non-empty string"
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return "it contains a control character"
    if "\\" in path:
        return "it contains a backslash"
    if path.startswith("/") or _DRIVE.match(path):
        return "it is an absolute path"
    parts = path.split("/")
    if ".." in parts:
        return "it climbs out of the folder with '..'"
    if any(p in ("", ".") for p in parts):
        return "it has an empty or '.' segment"
    if len(path.encode()) > 4096 or any(len(p.encode()) > 255 for p in parts):
        return "it is too long for a file name"
    return None


@dataclass(frozen=True)
class RevisionInfo:
    commit: str
    gated: bool


class Lister:
    """Two listing calls, each request retried on its own (a failed page 7 does not
    restart from page 1)."""

    def __init__(
        self,
        endpoint: str,
        token: str | None,
        ctx: Context,
        *,
        retries: int,
        backoff: float,
        max_wait: float,
        timeout: float,
    ) -> None:
        self.endpoint = endpoint
        self.ctx = ctx
        self.retries, self.backoff, self.max_wait, self.timeout = (
            retries,
            backoff,
            max_wait,
            timeout,
        )
        self.headers = build_hf_headers(
            token=token, library_name="pypto-download", library_version=__version__
        )

    def _get(self, what: str, url: str, params: dict[str, str] | None) -> Any:
        def call() -> Any:
            response = get_session().get(
                url, params=params, headers=self.headers, timeout=self.timeout
            )
            hf_raise_for_status(response)
            try:
                body = response.json()
            except ValueError:
                raise UnsafeListingError(
                    f"the hub at {self.ctx.endpoint} answered {what} with something that is not JSON: "
                    "check that --endpoint / HF_ENDPOINT points at a HuggingFace-compatible hub"
                ) from None
            return response, body

        return retrying(
            what,
            call,
            retries=self.retries,
            backoff=self.backoff,
            max_wait=self.max_wait,
            ctx=self.ctx,
        )

    def revision(self, repo_id: str, revision: str) -> RevisionInfo:
        url = f"{self.endpoint}/api/models/{repo_id}/revision/{quote(revision, safe='')}"
        _response, body = self._get(f"listing {repo_id}", url, None)
        sha = body.get("sha") if isinstance(body, dict) else None
        if not sha:
            raise HubServerError(
                f"the hub at {self.ctx.endpoint} returned no commit for {repo_id}@{revision}"
            )
        if not isinstance(sha, str) or not _SHA1.match(sha):
            raise UnsafeListingError(
                f"the hub at {self.ctx.endpoint} returned a malformed commit id {str(sha)[:60]!r} for "
                f"{repo_id}@{revision}: refusing it; check --endpoint"
            )
        return RevisionInfo(commit=sha, gated=bool(body.get("gated")))

    def tree(self, repo_id: str, commit: str) -> list[RemoteFile]:
        """Every file of ``commit``; raises :class:`UnsafeListingError` naming the first
        bad entry, so nothing is written from a hostile listing."""
        url: str | None = f"{self.endpoint}/api/models/{repo_id}/tree/{commit}"
        params: dict[str, str] | None = {"recursive": "true", "expand": "false"}
        seen_pages: set[str] = set()
        files: dict[str, RemoteFile] = {}
        dirs: set[str] = set()
        where = f"{repo_id}@{commit[:12]}"
        while url is not None:
            if url in seen_pages or len(seen_pages) >= _MAX_PAGES:
                raise UnsafeListingError(
                    f"the hub at {self.ctx.endpoint} paginates the listing of {where} in a loop: refusing it"
                )
            seen_pages.add(url)
            response, page = self._get(f"listing files of {repo_id}", url, params)
            params = None  # the next link carries its own query
            if not isinstance(page, list):
                raise UnsafeListingError(
                    f"the hub at {self.ctx.endpoint} answered the file listing of {where} with a "
                    f"{type(page).__name__}, not a list: check --endpoint"
                )
            for entry in page:
                self._take(entry, where, files, dirs)
            url = self._next(response, where)
        for path in files:
            if path in dirs:
                raise self._unsafe(path, where, "it is listed both as a file and as a folder")
            parent = path.rsplit("/", 1)[0] if "/" in path else None
            while parent:
                if parent in files:
                    raise self._unsafe(
                        path, where, f"its folder {parent!r} is also listed as a file"
                    )
                parent = parent.rsplit("/", 1)[0] if "/" in parent else None
        return sorted(files.values(), key=lambda f: f.path)

    def _unsafe(self, path: object, where: str, reason: str) -> UnsafeListingError:
        shown = repr(path)[:200]
        return UnsafeListingError(
            f"the hub at {self.ctx.endpoint} listed an unsafe file path {shown} in {where} ({reason}): "
            "refusing the whole listing, nothing was written; check that --endpoint points at a trusted hub"
        )

    def _take(
        self, entry: object, where: str, files: dict[str, RemoteFile], dirs: set[str]
    ) -> None:
        if not isinstance(entry, dict):
            raise self._unsafe(entry, where, "a listing entry that is not an object")
        path = entry.get("path")
        reason = unsafe_path_reason(path)
        kind = entry.get("type")
        if kind != "file":
            # A folder (or a submodule) is never written as such; a bad one is reported
            # by the name of the file under it, which says more.
            if kind == "directory" and reason is None and isinstance(path, str):
                dirs.add(path)
            return
        if reason is not None:
            raise self._unsafe(path, where, reason)
        assert isinstance(path, str)
        size = entry.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise self._unsafe(path, where, f"its size {size!r} is not a whole number")
        blob = entry.get("oid")
        if blob is not None and (not isinstance(blob, str) or not _SHA1.match(blob)):
            raise self._unsafe(path, where, "its git blob id is malformed")
        sha256 = None
        lfs = entry.get("lfs")
        if lfs:
            sha256 = lfs.get("oid") if isinstance(lfs, dict) else None
            if not isinstance(sha256, str) or not _SHA256.match(sha256):
                raise self._unsafe(path, where, "its LFS sha256 is malformed")
        if path in files:
            raise self._unsafe(path, where, "it is listed twice")
        files[path] = RemoteFile(path=path, size=size, sha256=sha256, blob_id=blob)

    def _next(self, response: Any, where: str) -> str | None:
        """The next page, on the same server only: our credentials go nowhere else."""
        links = getattr(response, "links", None) or {}
        nxt = (links.get("next") or {}).get("url")
        if not nxt:
            return None
        base, target = urlsplit(self.endpoint), urlsplit(str(nxt))
        if (target.scheme, target.hostname, target.port) != (base.scheme, base.hostname, base.port):
            raise UnsafeListingError(
                f"the hub at {self.ctx.endpoint} sent the next page of the listing of {where} to "
                f"another server ({target.scheme}://{target.hostname}): refusing to send credentials there"
            )
        # Keep the endpoint's own netloc (a mirror's user:password) for the next page.
        return urlunsplit((base.scheme, base.netloc, target.path, target.query, ""))
