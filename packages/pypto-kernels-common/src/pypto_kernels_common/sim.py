"""Everything needed to run PyPTO 0.2.0 kernels *numerically* on a CPU, in one place.

PyPTO's SIM run mode only drives the cost model; the numbers come from the
precision tool (``enable_pass_verify``), which executes the kernel's tensor graph
with torch. In 0.2.0 the jit wrapper hands that tool its inputs through
``pypto_impl.CopyToHost``, a no-op in a build without CANN, so the tool computes on
zeros. :func:`install` replaces that one step so the tool sees the real inputs, and
caches the calculator library (otherwise rebuilt with cmake, ~23 s, in every
process). Everything here touches PyPTO internals, so it is gated to exactly the
version it was written against (:data:`SUPPORTED_VERSION`); a newer PyPTO is
reported as "CPU path unavailable" instead of being patched blindly.

Every kernels package shares this one shim (and so one calculator cache): a second
copy would patch the same upstream class twice and build the library twice.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import logging
import os
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "CACHE_ENV",
    "INSTALL_HINT",
    "KEEP_OUTPUT_ENV",
    "RUN_FOLDERS",
    "SUPPORTED_VERSION",
    "SimUnavailableError",
    "availability",
    "cache_root",
    "calculator_folder",
    "check_compiler",
    "check_toolchain",
    "cost_options",
    "discard_run_outputs",
    "flush_c_stdio",
    "import_pypto",
    "install",
    "installed_version",
    "keep_outputs",
    "load_calculator",
    "prepare_environment",
    "run_output_names",
    "sim_options",
    "use_run_folders",
]

log = logging.getLogger(__name__)

SUPPORTED_VERSION = "0.2.0"
#: Where build products and PyPTO's run files go; the second name is the one
#: pypto-kernels-gutenocr used before this package existed, still honoured.
CACHE_ENV = ("PYPTO_KERNELS_CACHE", "PYPTO_GUTENOCR_CACHE")
#: ``=1`` keeps PyPTO's per-call output folders (cost-model traces) for inspection.
KEEP_OUTPUT_ENV = ("PYPTO_KERNELS_KEEP_OUTPUT", "PYPTO_GUTENOCR_KEEP_OUTPUT")
INSTALL_HINT = "pip install 'pypto-kernels-common[pypto]'"

_installed = False


class SimUnavailableError(RuntimeError):
    """The CPU SIM + verify path cannot run here (reason in the message)."""


def cache_root() -> Path:
    """``$PYPTO_KERNELS_CACHE`` (else ``$PYPTO_GUTENOCR_CACHE``, else the user cache).

    Always absolute: the paths derived from it (PyPTO's config, the calculator) are handed
    to child processes that run in folders of their own (the cost-model worker), where a
    relative path names another folder (PyPTO then fails with "ReadJsonFile failed").
    """
    for var in CACHE_ENV:
        env = os.environ.get(var)
        if env:
            return Path(env).expanduser().absolute()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return (Path(base).expanduser() / "pypto-kernels").absolute()


def installed_version() -> str | None:
    try:
        return metadata.version("pypto")
    except metadata.PackageNotFoundError:
        return None


def prepare_environment() -> Path:
    """Point PyPTO's output, log and home folders into the cache (before import).

    PyPTO reads these when its libraries load, so this must run before the first
    ``import pypto``; values the user already set win.
    """
    if "pypto" in sys.modules and "TILEFWK_CONFIG_PATH" not in os.environ:
        # Loaded without any config of ours: said once (the variable is set below).
        log.warning(
            "pypto was imported before pypto_kernels_common.sim.prepare_environment(): its "
            "quiet cost-model config cannot take effect now (small SIM calls will draw "
            "swim-lane PNGs); call prepare_environment() before the first import of pypto"
        )
    root = cache_root()
    run = use_run_folders(root / "run")
    if "TILEFWK_CONFIG_PATH" not in os.environ:
        cfg = _quiet_config(root)
        if cfg is not None:
            os.environ["TILEFWK_CONFIG_PATH"] = str(cfg)
    return run


#: PyPTO's per-call output, its log folder (real compile errors appear only there) and
#: its home, each a subfolder of one run folder.
RUN_FOLDERS = {
    "TILE_FWK_OUTPUT_DIR": "output",
    "ASCEND_PROCESS_LOG_PATH": "log",
    "PYPTO_HOME": "home",
}


def use_run_folders(run: Path) -> Path:
    """Default PyPTO's run folders to subfolders of ``run`` (created); values already set win.

    Test suites call it at conftest import with a temporary folder, before PyPTO loads.
    """
    for var, sub in RUN_FOLDERS.items():
        (run / sub).mkdir(parents=True, exist_ok=True)
        os.environ.setdefault(var, str(run / sub))
    return run


def _quiet_config(root: Path) -> Path | None:
    """A copy of PyPTO's config that does not draw swimlane PNGs on every call."""
    try:
        dist = metadata.distribution("pypto")
    except metadata.PackageNotFoundError:
        return None
    src = Path(str(dist.locate_file("pypto"))) / "lib" / "configs" / "tile_fwk_config.json"
    if not src.is_file():
        return None
    data = json.loads(src.read_text())
    sim = data.get("global", {}).get("simulation")
    if not isinstance(sim, dict):
        return None
    sim["draw_function_graph"] = False
    args = sim.setdefault("args", [])
    if "Model.drawPngThresholdCycle=0" not in args:
        args.append("Model.drawPngThresholdCycle=0")
    dst = root / f"tile_fwk_config-{dist.version}.json"
    root.mkdir(parents=True, exist_ok=True)
    from pypto_common import atomic_write_text

    # A unique temp file + rename: two processes may write it at once, a link is replaced.
    atomic_write_text(dst, json.dumps(data, indent=2))
    return dst


def import_pypto(install_hint: str = INSTALL_HINT) -> ModuleType:
    """Import torch then pypto with the environment prepared.

    ``install_hint`` is the caller's own install command, so the error names the
    package the user installed.
    """
    import torch  # noqa: F401  (pypto needs torch imported first)

    if installed_version() is None:
        raise SimUnavailableError(f"pypto is not installed ({install_hint})")
    prepare_environment()
    import pypto

    return pypto


def check_compiler() -> None:
    """SIM compiles every call with g++ (the cost model alone needs no cmake)."""
    if shutil.which("g++") is None:
        raise SimUnavailableError(
            "g++ is not on PATH; PyPTO's SIM mode compiles every kernel call with it (install g++)"
        )


def check_toolchain() -> None:
    """g++ compiles every SIM call; cmake and make build the calculator library."""
    missing = [t for t in ("g++", "cmake", "make") if shutil.which(t) is None]
    if missing:
        raise SimUnavailableError(f"missing build tools for PyPTO's CPU path: {', '.join(missing)}")


def availability(install_hint: str = INSTALL_HINT) -> str | None:
    """None when the SIM cost model can run here, else one line saying why and the fix."""
    version = installed_version()
    if version is None:
        return f"pypto is not installed ({install_hint})"
    if version != SUPPORTED_VERSION:
        return (
            f"the cost model path supports pypto=={SUPPORTED_VERSION} only, found"
            f" {version} ({install_hint})"
        )
    try:
        check_compiler()
    except SimUnavailableError as err:
        return str(err)
    return None


def install(install_hint: str = INSTALL_HINT) -> ModuleType:
    """Make PyPTO's SIM + verify path compute on real inputs; returns the pypto module.

    Idempotent. Raises :class:`SimUnavailableError` when the installed PyPTO is not the
    version this shim was written for, or the toolchain is missing.
    """
    global _installed
    version = installed_version()
    if version != SUPPORTED_VERSION:
        raise SimUnavailableError(
            f"the CPU SIM shim supports pypto=={SUPPORTED_VERSION} only, found {version}"
            f" ({install_hint})"
        )
    check_toolchain()
    pypto = import_pypto(install_hint)
    if _installed:
        return pypto
    from pypto.frontend.parser import entry

    wrapper_cls = entry.JitCallableWrapper
    if not hasattr(wrapper_cls, "_setup_verify_data"):
        raise SimUnavailableError("pypto changed: JitCallableWrapper._setup_verify_data is gone")
    load_calculator()

    def _setup_verify_data(pto_tensors: Any) -> None:
        # Upstream copies inputs with CopyToHost (a no-op without CANN); hand the
        # precision tool the host tensors themselves instead.
        if not pypto.get_verify_options().get("enable_pass_verify"):
            return
        load_calculator()
        entry.pypto_impl.SetVerifyData(
            entry._pto_to_tensor_data(pto_tensors), [], entry._pto_verify_datas.get_data()
        )

    wrapper_cls._setup_verify_data = staticmethod(_setup_verify_data)
    _installed = True
    log.info("PyPTO %s CPU SIM+verify shim installed", version)
    return pypto


def calculator_folder() -> Path:
    """The cache folder of the calculator build for this (pypto, torch, C++ ABI)."""
    import torch

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    key = f"pypto{installed_version()}-torch{torch.__version__}-abi{abi}".replace("+", "_")
    return cache_root() / "calculator" / key


def load_calculator() -> None:
    """Build the verify calculator once per (pypto, torch, ABI) into the cache, then load it.

    A file lock serialises concurrent first builds (pytest-xdist, two tools at once);
    the library is copied into place atomically, so a reader never loads half a file.
    """
    import torch
    from pypto._utils import BuildOnlineManager

    mgr = BuildOnlineManager()
    if mgr.calculator_loaded:
        return
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    folder = calculator_folder()
    lib = folder / "install" / "lib" / "libtile_fwk_calculator.so"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not lib.is_file():
            log.info("building PyPTO's verify calculator into %s (once)", folder)
            cmake = BuildOnlineManager._CMakeContext()
            with tempfile.TemporaryDirectory(dir=folder) as tmp:
                ctx = BuildOnlineManager._CMakeContext.CompileContext(
                    src_dir=Path(mgr.pkg_lib_dir, "calculator"), tmp_dir=Path(tmp)
                )
                ctx.cfg_cmd_ext = (
                    f"-DPY3_MOD_TORCH_VERSION={torch.__version__}"
                    f" -DPY3_MOD_TORCH_ROOT_PATH={Path(torch.__file__).parent}"
                    f" -DPY3_MOD_TORCH_C_GLIBCXX_USE_CXX11_ABI={abi}"
                )
                built = cmake.compile(ctx=ctx) / "lib" / "libtile_fwk_calculator.so"
                if not built.is_file():
                    raise SimUnavailableError(f"calculator build produced no {built.name}")
                lib.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(built, lib.with_suffix(".tmp"))
                lib.with_suffix(".tmp").replace(lib)
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    mgr.calculator_loaded = True


def sim_options(pypto: ModuleType) -> dict[str, Any]:
    """``@pypto.frontend.jit`` keyword options for the CPU SIM + verify path.

    ``pass_verify_save_tensor`` stays off: at real shapes it writes tens of GB.
    """
    return {
        "runtime_options": {"run_mode": pypto.RunMode.SIM},
        "verify_options": {
            "enable_pass_verify": True,
            "pass_verify_save_tensor": False,
            "pass_verify_pass_filter": [],
        },
    }


def cost_options(pypto: ModuleType) -> dict[str, Any]:
    """``@pypto.frontend.jit`` options for the cost model alone (no precision tool)."""
    return {"runtime_options": {"run_mode": pypto.RunMode.SIM}}


def keep_outputs() -> bool:
    return any(os.environ.get(var) == "1" for var in KEEP_OUTPUT_ENV)


def run_output_names() -> set[str]:
    root = os.environ.get("TILE_FWK_OUTPUT_DIR")
    return set(os.listdir(root)) if root and os.path.isdir(root) else set()


def discard_run_outputs(before: set[str]) -> None:
    """Delete this process's per-call output folders created since ``before``.

    Every SIM call writes a 1-170 MB folder (cost-model traces); a model forward
    makes dozens of calls. Set ``PYPTO_KERNELS_KEEP_OUTPUT=1`` to keep them.
    """
    if keep_outputs():
        return
    root = os.environ.get("TILE_FWK_OUTPUT_DIR")
    if not root or not os.path.isdir(root):
        return
    tag = f"_{os.getpid()}_"
    for name in set(os.listdir(root)) - before:
        if tag in name:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def flush_c_stdio() -> None:
    """PyPTO writes its verify CSV through C stdio, flushed only at exit otherwise."""
    ctypes.CDLL(None).fflush(None)
