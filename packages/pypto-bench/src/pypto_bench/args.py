"""The bench's command-line flags, defined once for every tool that runs the bench.

Why a public module: pypto-e2e runs the same bench inside its pipeline. When it copied
the flags, the two drifted (a flag added here never reached e2e, a default differed), and
a run "with the same flags" measured something else. Both tools now add the flags with
:func:`add_bench_arguments` and build the config with :func:`bench_config_from_args`,
so a flag exists, is spelled and defaults the same everywhere.

Each flag's ``dest`` is the :class:`~pypto_bench.config.BenchConfig` field it sets. No
torch import here: a CLI builds its parser before choosing device environment variables.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from .config import (
    ARMS,
    DTYPES,
    GRAPH_BACKENDS,
    MOE_ROUTINGS,
    PLACEMENTS,
    REGIMES,
    SCHEDULES,
    BenchConfig,
)

__all__ = [
    "FLAG_FOR",
    "NOT_FLAGS",
    "add_bench_arguments",
    "bench_config_from_args",
    "parse_arms",
    "parse_batches",
    "parse_percent",
]

# BenchConfig fields that are not user flags: the recorded command line is set by the
# program that runs the bench (already redacted there), never typed by the user; the
# per-rank profile folder is set by pypto-tune profile --nproc from its --out.
NOT_FLAGS = frozenset({"command_line", "batches", "rank_profiles"})
#: ``--batch 1,8,32`` sets both ``batch`` (the first) and ``batches`` (the sweep).
_BATCH_LIST = re.compile(r"[+-]?[0-9]+")


def parse_arms(text: str | Iterable[str]) -> tuple[str, ...]:
    """``"eager, graph"`` -> ``("eager", "graph")``; validation is BenchConfig.validate's job."""
    items = text.split(",") if isinstance(text, str) else list(text)
    return tuple(a.strip() for a in items if a.strip())


def parse_batches(text: str | int | Iterable[int]) -> tuple[int, ...]:
    """``"1,8,32"`` -> ``(1, 8, 32)``; ``4`` -> ``(4,)``. The --batch flag's type.

    A malformed list raises ``argparse.ArgumentTypeError`` naming the entry and the fix
    (argparse turns it into a usage error, exit 2, before anything runs); ranges (>= 1,
    no duplicates) are ``BenchConfig.validate``'s job.
    """
    if isinstance(text, int):
        return (text,)
    if not isinstance(text, str):
        return tuple(int(b) for b in text)
    example = "pass one batch size or a comma list such as --batch 1,8,32"
    items = [t.strip() for t in text.split(",")]
    if any(not t for t in items):
        raise argparse.ArgumentTypeError(f"--batch {text!r} has an empty entry: {example}")
    for t in items:
        if not _BATCH_LIST.fullmatch(t):
            raise argparse.ArgumentTypeError(f"--batch entry {t!r} is not an integer: {example}")
    return tuple(int(t) for t in items)


def parse_percent(text: str) -> float:
    """``--target-ci`` as a number of percent: ``5`` or ``5%`` (range checked by
    ``BenchConfig.validate``, so nan and negatives get its one-line error)."""
    try:
        return float(str(text).strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--target-ci {text!r} is not a percentage: pass e.g. --target-ci 5"
        ) from None


@dataclass(frozen=True)
class _Flag:
    dest: str
    flag: str
    help: str
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    action: str | None = None  # "store_true" / "store_false"
    metavar: str | None = None
    aliases: tuple[str, ...] = ()  # other spellings (torchrun's names)


_DEFAULTS = BenchConfig()

# Order = order in --help. Help texts stay short: the README explains each in full.
_FLAGS: tuple[_Flag, ...] = (
    _Flag(
        "model_path",
        "--model-path",
        "model folder (the pypto-bench CLI defaults to $MODEL_PATH)",
        metavar="DIR",
    ),
    _Flag("device", "--device", "0 -> npu:0, cuda:0 or cpu; or cpu, cuda:1, npu:0 ..."),
    _Flag("dtype", "--dtype", "weights' dtype (auto: the folder's)", choices=DTYPES),
    _Flag(
        "trust_remote_code",
        "--trust-remote-code",
        "allow the model folder's own code to run",
        action="store_true",
    ),
    _Flag(
        "attn_implementation",
        "--attn-implementation",
        "attention implementation, e.g. eager, sdpa (default: transformers' choice)",
    ),
    _Flag("regime", "--regime", " | ".join(REGIMES), metavar="REGIME"),
    _Flag(
        "arms",
        "--arms",
        "comma list of " + ", ".join(ARMS),
        type=parse_arms,
        metavar="ARM[,ARM...]",
    ),
    _Flag("seq", "--seq", "prompt length in tokens", type=int, metavar="N"),
    _Flag("gen", "--gen", "tokens (or diffusion positions) to generate", type=int, metavar="N"),
    _Flag(
        "batch",
        "--batch",
        "rows per call; a comma list (1,8,32) sweeps every batch in one run",
        type=parse_batches,
        metavar="N[,N...]",
    ),
    _Flag("warmup", "--warmup", "untimed iterations per arm", type=int, metavar="N"),
    _Flag("iters", "--iters", "timed iterations (samples) per arm", type=int, metavar="N"),
    _Flag(
        "schedule",
        "--schedule",
        "interleaved: every arm built first, then timed rounds in A B B A order (drift "
        "cancels in the ratios); sequential: one arm after the other",
        choices=SCHEDULES,
    ),
    _Flag(
        "target_ci",
        "--target-ci",
        "keep adding rounds until every ratio's 95%% interval half-width is <= PCT%% of its "
        "median (bounded by --max-iters and --max-seconds)",
        type=parse_percent,
        metavar="PCT",
    ),
    _Flag(
        "max_iters",
        "--max-iters",
        "most timed rounds per arm --target-ci may run",
        type=int,
        metavar="N",
    ),
    _Flag(
        "max_seconds",
        "--max-seconds",
        "most seconds of timed rounds --target-ci may run",
        type=float,
        metavar="S",
    ),
    _Flag("graph_backend", "--graph-backend", " | ".join(GRAPH_BACKENDS), metavar="BACKEND"),
    _Flag(
        "compile_mode",
        "--compile-mode",
        "torch.compile mode for the compile backend (CPU), e.g. max-autotune-no-cudagraphs",
        metavar="MODE",
    ),
    _Flag(
        "moe_routing",
        "--moe-routing",
        "MoE experts in the graph arms: exact (the model's outputs, capture-safe) or static "
        "(fixed experts: a throughput proxy whose outputs differ by design)",
        choices=MOE_ROUTINGS,
    ),
    _Flag("seed", "--seed", "torch seed set before loading", type=int, metavar="N"),
    _Flag(
        "ignore_eos",
        "--ignore-eos",
        "always generate --gen tokens (eager: min_new_tokens)",
        action="store_true",
    ),
    _Flag(
        "allow_inaccurate",
        "--allow-inaccurate",
        "run: exit 0 even when an arm fails the numerical gate (its logits differ from "
        "eager's beyond the dtype's allowance); the arm stays marked 'numerics: fail' and "
        "its ratios 'not comparable' on every surface",
        action="store_true",
    ),
    _Flag(
        "reference",
        "--reference",
        "run: also check the eager arm's logits against the same folder on DEVICE (e.g. "
        "cpu; float64 under 1 GB of weights, else float32), teacher-forced, judged against "
        "the noise floor; a failure names the first diverging module and exits like a "
        "numerics failure",
        metavar="DEVICE",
    ),
    _Flag(
        "diffusion_steps",
        "--diffusion-steps",
        "denoising steps (default --gen)",
        type=int,
        metavar="N",
    ),
    _Flag(
        "block_length",
        "--block-length",
        "diffusion block length, divides --gen (default --gen)",
        type=int,
        metavar="N",
    ),
    _Flag(
        "measure_bandwidth",
        "--no-bandwidth",
        "skip the bandwidth measurement (no roofline ceiling)",
        action="store_false",
    ),
    _Flag(
        "nproc",
        "--nproc",
        "ranks (one device each, CPU: one core's share): N > 1 shards the model with its "
        "tensor-parallel plan over N processes (prefill/decode, eager arm); per node with "
        "--nnodes",
        type=int,
        metavar="N",
        aliases=("--nproc-per-node",),
    ),
    _Flag(
        "nnodes",
        "--nnodes",
        "hosts of a multi-node run: each runs this command with --nproc ranks (per node), "
        "joined at --rdzv-endpoint",
        type=int,
        metavar="N",
    ),
    _Flag(
        "node_rank",
        "--node-rank",
        "--nnodes N: this node's index, recorded (the rendezvous assigns ranks; the node "
        "holding rank 0 writes the report)",
        type=int,
        metavar="R",
    ),
    _Flag(
        "rdzv_endpoint",
        "--rdzv-endpoint",
        "--nnodes N: HOST:PORT where the nodes meet (torch's c10d rendezvous), the same on "
        "every node",
        metavar="HOST:PORT",
    ),
    _Flag(
        "rdzv_id",
        "--rdzv-id",
        "--nnodes N: the run's id, the same on every node (default: pypto-bench)",
        metavar="ID",
    ),
    _Flag(
        "rank_timeout",
        "--rank-timeout",
        "--nproc > 1: end the run when no rank progresses for this many seconds",
        type=float,
        metavar="S",
    ),
    _Flag(
        "placement",
        "--placement",
        "--nproc > 1: tensor (shards of every layer, one process per device) or pipeline "
        "(layers split over the devices in one process; prefill, eager arm)",
        choices=PLACEMENTS,
    ),
    _Flag(
        "nproc_baseline",
        "--no-baseline",
        "--nproc > 1: skip the whole model on one device (no speedup or agreement figures); "
        "skipped anyway when the weights do not fit one device",
        action="store_false",
    ),
    _Flag(
        "image",
        "--image",
        "vision-language model: run the whole model on this image + a text prompt built "
        "with the folder's processor (prefill regime; pypto-bench smoke: one more forward)",
        metavar="FILE",
    ),
    _Flag("report_file", "--report-file", "write the JSON report here", metavar="FILE"),
    _Flag(
        "history",
        "--history",
        "also record the report in this SQLite results history (see `pypto-bench history`)",
        metavar="DB",
    ),
)

#: BenchConfig field -> its flag (``--model-path`` ...), for messages and tests.
FLAG_FOR: dict[str, str] = {f.dest: f.flag for f in _FLAGS}


def _dest(name: str) -> str:
    """Accept a field name, a flag or a flag without dashes: ``--block-length`` -> block_length."""
    dest = name.lstrip("-").replace("-", "_")
    if dest == "no_bandwidth":
        return "measure_bandwidth"
    return dest


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def add_bench_arguments(
    parser_or_group: Any,
    *,
    defaults: Mapping[str, Any] | None = None,
    exclude: Iterable[str] = (),
) -> list[str]:
    """Add every bench flag to an ``ArgumentParser`` or argument group; return their dests.

    ``defaults`` maps field names (or flags) to the default a program wants, e.g.
    ``{"model_path": os.environ.get("MODEL_PATH")}`` for ``pypto-bench run``; fields not
    named keep ``BenchConfig``'s default. ``exclude`` names flags the caller defines
    itself (field names or flags). Unknown names in either raise ``ValueError``: a
    typo there would silently drop a flag.
    """
    known = {f.dest for f in _FLAGS}
    wanted = {_dest(k): v for k, v in (defaults or {}).items()}
    skip = {_dest(n) for n in exclude}
    unknown = sorted((set(wanted) | skip) - known)
    if unknown:
        raise ValueError(
            f"not bench flags: {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )
    added: list[str] = []
    for f in _FLAGS:
        if f.dest in skip:
            continue
        default = wanted.get(f.dest, getattr(_DEFAULTS, f.dest))
        kwargs: dict[str, Any] = {"dest": f.dest, "default": default}
        if f.action == "store_true":
            kwargs["action"] = "store_true"
            help_text = f.help
        elif f.action == "store_false":
            kwargs["action"] = "store_false"
            help_text = f.help
        else:
            if f.type is not None:
                kwargs["type"] = f.type
            if f.choices is not None:
                kwargs["choices"] = f.choices
            if f.metavar is not None:
                kwargs["metavar"] = f.metavar
            help_text = f.help if default is None else f"{f.help} (default: {_show(default)})"
        parser_or_group.add_argument(f.flag, *f.aliases, help=help_text, **kwargs)
        added.append(f.dest)
    return added


def bench_config_from_args(namespace: argparse.Namespace, **overrides: Any) -> BenchConfig:
    """The ``BenchConfig`` a parsed namespace asks for; ``overrides`` win over it.

    Fields whose flag was excluded (absent from the namespace) keep BenchConfig's
    default. The config is not validated here: call ``validate()`` where a bad request
    should stop the program (``run_bench`` validates again).
    """
    names = {f.name for f in fields(BenchConfig)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise TypeError(f"BenchConfig has no field(s) {', '.join(unknown)}")
    values: dict[str, Any] = {}
    for name in names:
        if name in overrides:
            values[name] = overrides[name]
        elif name not in NOT_FLAGS and hasattr(namespace, name):
            values[name] = getattr(namespace, name)
    if "arms" in values and not isinstance(values["arms"], tuple):
        values["arms"] = parse_arms(values["arms"])
    if "batch" in values:
        batches = parse_batches(values["batch"])
        values["batch"] = batches[0] if batches else 0
        if "batches" not in overrides:
            values["batches"] = batches if len(batches) > 1 else ()
    return BenchConfig(**values)
