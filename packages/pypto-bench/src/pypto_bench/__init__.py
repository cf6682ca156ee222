"""pypto-bench: smoke gate and eager / graph / pypto+graph throughput bench.

Library first; the ``pypto-bench`` CLI is a thin layer over these functions.
"""

from .args import add_bench_arguments, bench_config_from_args
from .bench import BenchSession, open_session, run_bench, run_sweep
from .coherence import coherence_score, degenerate_reason
from .compare import Comparison, compare, plot
from .config import ARMS, GRAPH_BACKENDS, REGIMES, Arm, BenchConfig, Regime
from .errors import (
    EXIT,
    BadInputError,
    BenchError,
    CompareMismatchError,
    DegenerateOutputError,
    EnvironmentMissingError,
    GenerationError,
    ModelLoadError,
    ModelNotFoundError,
    NoTensorParallelPlanError,
    PluginError,
    RankFailedError,
    RegimeNotSupportedError,
    ReportPathError,
    ReportWriteError,
    TooManyRanksError,
)
from .html_report import report_to_html, write_html
from .measure import (
    RssPeak,
    count_tokens,
    measure_bandwidth,
    measure_matmul_peak,
    summarize,
    summarize_seconds,
    timed,
)
from .multi import run_distributed
from .plugins import applicable_plugins, discover_plugins, register_plugin, unregister_plugin
from .report import (
    SCHEMA_VERSION,
    ArmResult,
    Report,
    format_table,
    load_report,
    report_to_markdown,
    schema,
    validate_report,
    write_report,
)
from .smoke import SmokeResult, smoke

__version__ = "0.1.0"

# The diffusion module imports torch and transformers at import time; keeping it lazy
# lets the CLI set NPU environment variables before torch is first imported.
_LAZY = {"DiffusionOutput", "diffusion_generate", "supports_diffusion"}


def __getattr__(name: str):
    if name in _LAZY:
        from . import diffusion

        return getattr(diffusion, name)
    raise AttributeError(f"module 'pypto_bench' has no attribute {name!r}")


__all__ = [
    "ARMS",
    "EXIT",
    "GRAPH_BACKENDS",
    "REGIMES",
    "SCHEMA_VERSION",
    "Arm",
    "ArmResult",
    "BadInputError",
    "BenchConfig",
    "BenchError",
    "BenchSession",
    "CompareMismatchError",
    "Comparison",
    "DegenerateOutputError",
    "DiffusionOutput",
    "EnvironmentMissingError",
    "GenerationError",
    "ModelLoadError",
    "ModelNotFoundError",
    "NoTensorParallelPlanError",
    "PluginError",
    "RankFailedError",
    "Regime",
    "RegimeNotSupportedError",
    "Report",
    "ReportPathError",
    "ReportWriteError",
    "RssPeak",
    "SmokeResult",
    "TooManyRanksError",
    "add_bench_arguments",
    "applicable_plugins",
    "bench_config_from_args",
    "coherence_score",
    "compare",
    "count_tokens",
    "degenerate_reason",
    "diffusion_generate",
    "discover_plugins",
    "format_table",
    "load_report",
    "measure_bandwidth",
    "measure_matmul_peak",
    "open_session",
    "plot",
    "register_plugin",
    "report_to_html",
    "report_to_markdown",
    "run_bench",
    "run_distributed",
    "run_sweep",
    "schema",
    "smoke",
    "summarize",
    "summarize_seconds",
    "supports_diffusion",
    "timed",
    "unregister_plugin",
    "validate_report",
    "write_html",
    "write_report",
]
