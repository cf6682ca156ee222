"""Open a page in a real headless Chromium and report what a reader would meet.

The report pages promise to open offline from a file:// URL with no error: the only
honest check is a real browser. :func:`open_page` runs Chromium headless on the page's
file:// URL, with every connection it makes pointed at a loopback proxy this module
runs (so a request the page makes, to any host, loopback included, is *counted*, not
just failed), and returns the console's complaints, the requests, a screenshot and the
DOM after the page's scripts ran.

What Chromium 156 prints (checked on Debian's package): with ``--enable-logging=stderr``
every console message is a log line ``[pid:tid:date:INFO:CONSOLE:LINE] "text", source:
URL (LINE)`` at level INFO whatever the console level (``console.log`` and
``console.error`` read the same); uncaught exceptions are console lines starting
``Uncaught``; a Content-Security-Policy refusal is a console line saying the load
"violates the following Content Security Policy directive". So :attr:`PageCheck.console_errors`
holds *every* console message: the report pages print nothing to the console, and a
message there is an error, a refused load or a script the page should not have.

Chromium also makes requests of its own at startup, before the page loads, that no flag
turns off in 156: the sign-in service lists the profile's Google accounts
(``accounts.google.com``, chromiumembedded/cef#4276) and the component updater asks for
the on-device model manifest (``update.googleapis.com``) despite
``--disable-component-update``. Chromium 150 (Debian bookworm's package in December
2026) also preconnects to the default search engine (``www.google.com``) at startup:
``--disable-features=PreconnectToSearch`` cut it from five connections to one on a blank
page, never to none. Those (:data:`BROWSER_HOSTS`) are kept apart in
:attr:`PageCheck.browser_requests`; every other connection is the page's. A page's own
load from one of those hosts is still caught: the report pages carry a
Content-Security-Policy that refuses every network load, and a refusal is a console line
(:attr:`PageCheck.console_errors`).

``--headless=new`` accepts ``--screenshot`` and ``--dump-dom`` in one run (both after
the load event); when a Chromium does not (an older headless shell), the missing one is
taken in a second run.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "BROWSER_HOSTS",
    "CHROMIUM_NAMES",
    "PageCheck",
    "chromium_path",
    "open_page",
    "request_host",
    "skip_reason",
]

#: Executable names tried in order (Debian's package is ``chromium``).
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

#: Hosts Chromium's own services call whatever the page does (sign-in, component and
#: network-time updates): a connection to one is the browser's, not the page's.
BROWSER_HOSTS = (
    "accounts.google.com",
    "update.googleapis.com",
    "clients2.google.com",
    "redirector.gvt1.com",
    "edgedl.me.gvt1.com",
    "optimizationguide-pa.googleapis.com",
    "www.google.com",  # the default search engine's preconnect (Chromium 150)
)

_CONSOLE = re.compile(r":CONSOLE[:(]|\bUncaught\b|Content Security Policy|Refused to ")


def chromium_path() -> str | None:
    """The first Chromium on PATH (``$PYPTO_CHROMIUM`` wins when set), else None."""
    own = os.environ.get("PYPTO_CHROMIUM")
    if own:
        return shutil.which(own)
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def skip_reason() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    if chromium_path() is None:
        return (
            "no Chromium on PATH (tried " + ", ".join(CHROMIUM_NAMES) + "): the browser checks "
            "need it (Debian: apt-get install chromium; CI's .ci/run installs it)"
        )
    return None


@dataclass
class PageCheck:
    """What opening a page in Chromium showed."""

    #: Every console message Chromium logged (see the module docstring: errors, uncaught
    #: exceptions, CSP refusals; Chromium 156 does not log the level).
    console_errors: list[str]
    #: The request line of every connection the page made (``GET http://host/x
    #: HTTP/1.1``, ``CONNECT host:443 HTTP/1.1``): empty when it used no network.
    requests: list[str]
    screenshot: Path
    #: (width, height) of the screenshot, read from its PNG header.
    screenshot_size: tuple[int, int]
    #: The DOM after the page's scripts ran (``--dump-dom``).
    dom: str
    #: Connections of Chromium's own services (:data:`BROWSER_HOSTS`), not the page's.
    browser_requests: list[str] = field(default_factory=list)
    #: Chromium's stderr, both runs, for a failing test's message.
    log: str = field(default="", repr=False)


def request_host(request_line: str) -> str:
    """The host a proxy request line names (``CONNECT h:443``, ``GET http://h:80/x``)."""
    parts = request_line.split()
    target = parts[1] if len(parts) > 1 else ""
    if "://" in target:
        target = target.split("://", 1)[1]
    return target.split("/", 1)[0].rsplit(":", 1)[0].lower()


class _Proxy:
    """A loopback TCP server that records the first line of every connection and closes it."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.requests: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="pypto-page-proxy", daemon=True)

    def __enter__(self) -> _Proxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        # Connections still in the backlog (made just before Chromium exited) count too.
        self.sock.settimeout(0.05)
        while True:
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                break
            self._record(conn)
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self._record(conn)

    def _record(self, conn: socket.socket) -> None:
        """Keep the connection's first line; answer 502 and close."""
        with conn:
            conn.settimeout(1.0)
            data = b""
            try:
                while b"\n" not in data and len(data) < 8192:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            except OSError:
                pass
            line = data.split(b"\n", 1)[0].decode("latin-1").strip() or "<connection>"
            with self._lock:
                self.requests.append(line)
            try:
                conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            except OSError:
                pass


def _png_size(path: Path) -> tuple[int, int]:
    with path.open("rb") as fh:
        head = fh.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG (Chromium wrote no screenshot?)")
    width, height = struct.unpack(">II", head[16:24])
    return int(width), int(height)


def _run(argv: list[str], timeout: float) -> tuple[int, str, str]:
    """Run Chromium in its own process group; the whole group ends before this returns."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        text=True,
        errors="replace",
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        raise TimeoutError(
            f"Chromium did not finish within {timeout:g} s ({' '.join(argv[:2])} ...); "
            f"its log ends: {err[-500:]}"
        ) from None
    finally:
        _kill_group(proc)
    return proc.returncode, out, err


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """End Chromium's process group (renderer, GPU and zygote processes included)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def open_page(
    path: str | os.PathLike[str],
    *,
    width: int = 1280,
    height: int = 2000,
    timeout: float = 60.0,
    screenshot: str | os.PathLike[str] | None = None,
) -> PageCheck:
    """Open ``path`` (a local HTML file) in headless Chromium; see :class:`PageCheck`.

    The screenshot is of the viewport (``width`` x ``height``), written to ``screenshot``
    (default: beside the page, ``<name>.screenshot.png``). Raises ``FileNotFoundError``
    without Chromium (check :func:`skip_reason` first), ``TimeoutError`` when a run
    exceeds ``timeout`` seconds, ``RuntimeError`` when Chromium fails.
    """
    exe = chromium_path()
    if exe is None:
        raise FileNotFoundError(skip_reason())
    url = Path(path).resolve().as_uri()
    work = Path(tempfile.mkdtemp(prefix="pypto-page-"))
    shot = work / "shot.png"
    try:
        with _Proxy() as proxy:
            base = [
                exe,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                f"--user-data-dir={work / 'profile'}",
                f"--window-size={width},{height}",
                "--hide-scrollbars",
                "--enable-logging=stderr",
                "--v=0",
                f"--proxy-server=http://127.0.0.1:{proxy.port}",
                # Loopback too goes through the proxy: a page must not reach a local server.
                "--proxy-bypass-list=<-loopback>",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--disable-default-apps",
                "--metrics-recording-only",
                "--disable-features=NetworkTimeServiceQuerying,PreconnectToSearch",
            ]
            deadline = time.monotonic() + timeout
            code, dom, log = _run([*base, f"--screenshot={shot}", "--dump-dom", url], timeout)
            if code != 0 and not shot.is_file():
                raise RuntimeError(f"Chromium exited {code} on {url}: {log.strip()[-800:]}")
            if not shot.is_file():  # a headless shell that does one thing per run
                left = max(deadline - time.monotonic(), 5.0)
                _, _, more = _run([*base, f"--screenshot={shot}", url], left)
                log += more
            if not dom.strip():
                left = max(deadline - time.monotonic(), 5.0)
                _, dom, more = _run([*base, "--dump-dom", url], left)
                log += more
        seen = list(proxy.requests)  # after the proxy closed: its backlog drained
        if not shot.is_file():
            raise RuntimeError(f"Chromium wrote no screenshot of {url}: {log.strip()[-800:]}")
        page_path = Path(path)
        kept = (
            Path(screenshot)
            if screenshot is not None
            else page_path.with_name(page_path.name + ".screenshot.png")
        )
        shutil.move(str(shot), kept)
        return PageCheck(
            console_errors=[line for line in log.splitlines() if _CONSOLE.search(line)],
            requests=[r for r in seen if request_host(r) not in BROWSER_HOSTS],
            browser_requests=[r for r in seen if request_host(r) in BROWSER_HOSTS],
            screenshot=kept,
            screenshot_size=_png_size(kept),
            dom=dom,
            log=log,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
