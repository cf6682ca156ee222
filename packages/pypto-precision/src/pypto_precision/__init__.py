"""pypto-precision: is the port numerically right?

Dump every module's outputs of one forward pass (:class:`Recorder`), compare a target dump
with a trusted reference (:func:`compare_dumps`) judging each entry against the error the
target's dtype has on a trusted device (the noise floor, :class:`Rule`), and name the first
module that diverges. Teacher-forced logits (:func:`logit_metrics`, :func:`judge_logits`)
are the standard a fast arm is held to. Dumps in msprobe's layout are read as either side
of a compare, and ours are written in its layout for ``msprobe compare``
(:func:`write_msprobe`).

The library needs torch and pypto-common only; the ``pypto-precision`` command's ``dump``
and ``check`` come from pypto-bench (it loads models and runs arms).
"""

from .codes import EXIT
from .compare import Comparison, Row, compare_dumps
from .dump import DEFAULT_MAX_BYTES, MODES, Entry, Recorder
from .errors import BadDumpError, DumpTooLargeError, NotComparableError, PrecisionError
from .load import read_dump
from .logits import LogitCheck, LogitMetrics, judge_logits, logit_metrics
from .metrics import stats_metrics, tensor_metrics
from .msprobe import write_msprobe
from .reader import Dump
from .replay import replay_local_errors
from .report import render_html, render_markdown, summary_line, write_reports
from .rule import DEFAULT_ALLOWED, DEFAULT_K, MIN_ALLOWED, Rule, Verdict
from .stats import tensor_stats

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_ALLOWED",
    "DEFAULT_K",
    "DEFAULT_MAX_BYTES",
    "EXIT",
    "MIN_ALLOWED",
    "MODES",
    "BadDumpError",
    "Comparison",
    "Dump",
    "DumpTooLargeError",
    "Entry",
    "LogitCheck",
    "LogitMetrics",
    "NotComparableError",
    "PrecisionError",
    "Recorder",
    "Row",
    "Rule",
    "Verdict",
    "compare_dumps",
    "judge_logits",
    "logit_metrics",
    "read_dump",
    "render_html",
    "render_markdown",
    "replay_local_errors",
    "stats_metrics",
    "summary_line",
    "tensor_metrics",
    "tensor_stats",
    "write_msprobe",
    "write_reports",
]
