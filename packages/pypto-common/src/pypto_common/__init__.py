"""What every pypto tool does the same way at its edge, in one place.

Secrets are redacted by one helper (so a fix reaches every tool at once), exit codes
come from one project-wide table of ranges (so e2e can pass a step's failure on without
two tools meaning different things by 12), shell lines are quoted one way, and CLI
logging keeps third-party chatter at WARNING. Standard library only.
"""

from .exitcodes import (
    COMMON_CODES,
    ENVIRONMENT,
    EXIT_RANGES,
    EXTRA_EXIT_RANGES,
    FAILED,
    OK,
    USAGE,
    ExitCode,
    ExitCodeTable,
)
from .files import (
    MAX_INT_DIGITS,
    MAX_JSON_DEPTH,
    UntrustedFileError,
    atomic_write,
    atomic_write_bytes,
    atomic_write_text,
    json_depth,
    loads_bounded,
    read_regular_file,
)
from .folder import (
    DOWNLOAD_STATE_DIR,
    PATCH_JOURNAL,
    PATCH_LOCK,
    PATCH_MANIFEST,
    PATCH_OVERLAY_MARKER,
    PATCH_SUFFIXES,
    RESERVED_NAMES,
    tool_owned_reason,
)
from .logs import THIRD_PARTY_LOGGERS, add_verbosity_flags, cli_logging, configure_cli_logging
from .npu_api import NpuApi, NpuName, parse_table, parse_version
from .redact import (
    MASK,
    SECRET_ENV_VARS,
    SECRET_FLAGS,
    RedactingFilter,
    known_secrets,
    redact,
    redact_argv,
    redact_obj,
    redact_url,
    secret_forms,
)
from .shell import export_line

__version__ = "0.1.0"

__all__ = [
    "COMMON_CODES",
    "DOWNLOAD_STATE_DIR",
    "ENVIRONMENT",
    "EXIT_RANGES",
    "EXTRA_EXIT_RANGES",
    "FAILED",
    "MASK",
    "MAX_INT_DIGITS",
    "MAX_JSON_DEPTH",
    "OK",
    "PATCH_JOURNAL",
    "PATCH_LOCK",
    "PATCH_MANIFEST",
    "PATCH_OVERLAY_MARKER",
    "PATCH_SUFFIXES",
    "RESERVED_NAMES",
    "SECRET_ENV_VARS",
    "SECRET_FLAGS",
    "THIRD_PARTY_LOGGERS",
    "USAGE",
    "ExitCode",
    "ExitCodeTable",
    "NpuApi",
    "NpuName",
    "RedactingFilter",
    "UntrustedFileError",
    "__version__",
    "add_verbosity_flags",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_text",
    "cli_logging",
    "configure_cli_logging",
    "export_line",
    "json_depth",
    "known_secrets",
    "loads_bounded",
    "parse_table",
    "parse_version",
    "read_regular_file",
    "redact",
    "redact_argv",
    "redact_obj",
    "redact_url",
    "secret_forms",
    "tool_owned_reason",
]
