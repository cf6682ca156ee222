"""pypto-tune: profile the step pypto-bench measures, diagnose it, advise, verify.

Library first; the ``pypto-tune`` CLI is a thin layer over these functions.
"""

from .advise import advise
from .collect import LEVELS, ModuleScopes
from .compare import compare_profiles, comparison_markdown
from .detect import Thresholds, diagnose
from .errors import (
    EXIT,
    BadInputError,
    EnvironmentMissingError,
    NotComparableError,
    OutputWriteError,
    ProfileFailedError,
    ProfileFormatError,
    SearchFailedError,
    TuneError,
)
from .html_report import profile_to_html
from .microbench import kv_layout_times
from .model import profile, profile_model, profile_step
from .outputs import (
    chrome_trace,
    load_profile,
    plot_blocks,
    to_markdown,
    write_chrome_trace,
    write_outputs,
    write_profile,
)
from .records import BLOCK_TYPES, SCHEMA_VERSION, OpEvent, OpStat, Profile, RawTrace, Span
from .summary import summarize
from .tiles import TileSearchResult, discover_tunables, tile_search

__version__ = "0.1.0"

__all__ = [
    "BLOCK_TYPES",
    "EXIT",
    "LEVELS",
    "SCHEMA_VERSION",
    "BadInputError",
    "EnvironmentMissingError",
    "ModuleScopes",
    "NotComparableError",
    "OpEvent",
    "OpStat",
    "OutputWriteError",
    "Profile",
    "ProfileFailedError",
    "ProfileFormatError",
    "RawTrace",
    "SearchFailedError",
    "Span",
    "Thresholds",
    "TileSearchResult",
    "TuneError",
    "__version__",
    "advise",
    "chrome_trace",
    "compare_profiles",
    "comparison_markdown",
    "diagnose",
    "discover_tunables",
    "kv_layout_times",
    "load_profile",
    "plot_blocks",
    "profile",
    "profile_model",
    "profile_step",
    "profile_to_html",
    "summarize",
    "tile_search",
    "to_markdown",
    "write_chrome_trace",
    "write_outputs",
    "write_profile",
]
