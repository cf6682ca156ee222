"""What a bench run is asked to do: :class:`BenchConfig`, its vocabularies and every rule.

The one home of the run's words (regimes, arms, dtypes, graph backends, MoE routings,
placements) and of the rules a request must pass before anything is loaded or written:
``BenchConfig.validate`` runs them all, once, for the single process and for ``--nproc``
(the tensor-parallel and pipeline placements included). No torch import here: a CLI builds
its parser and validates before choosing device environment variables.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .errors import BadInputError

__all__ = [
    "ARMS",
    "DEFAULT_RANK_TIMEOUT",
    "DISTRIBUTED_ARMS",
    "DISTRIBUTED_REGIMES",
    "DTYPES",
    "GRAPH_ARMS",
    "GRAPH_BACKENDS",
    "MAX_RANK_TIMEOUT",
    "MOE_ROUTINGS",
    "PEER_ARM",
    "PEER_REGIMES",
    "PLACEMENTS",
    "REGIMES",
    "SCHEDULES",
    "Arm",
    "BenchConfig",
    "Placement",
    "Regime",
    "Schedule",
    "check_host",
    "check_rank_timeout",
    "parse_endpoint",
    "validate_placement",
]


class Regime(StrEnum):
    """What one measured iteration is (``--regime``)."""

    PREFILL = "prefill"
    DECODE = "decode"
    DIFFUSION = "diffusion-generate"


class Arm(StrEnum):
    """How the model runs (``--arms``): the reference, two captured paths, the peer."""

    EAGER = "eager"
    GRAPH = "graph"
    PYPTO_GRAPH = "pypto+graph"
    #: transformers' own static-cache + torch.compile recipe (pypto_bench.peer): the fast
    #: path a user would pick instead of this project, measured by the same protocol.
    HF_COMPILE = "hf-compile"


class Schedule(StrEnum):
    """In what order the arms' timed iterations run (``--schedule``)."""

    #: Every arm built first, then one timed iteration per arm per round, the order
    #: reversed every other round (A B B A ...): slow drift cancels in the paired ratios.
    INTERLEAVED = "interleaved"
    #: One arm's iterations after the other's (the order before 1.4, for comparison).
    SEQUENTIAL = "sequential"


SCHEDULES: tuple[str, ...] = tuple(s.value for s in Schedule)


class Placement(StrEnum):
    """How ``--nproc N > 1`` spreads the model (``--placement``)."""

    TENSOR = "tensor"
    PIPELINE = "pipeline"


REGIMES: tuple[str, ...] = tuple(r.value for r in Regime)
ARMS: tuple[str, ...] = tuple(a.value for a in Arm)
#: The arm's name in ``--arms`` and in reports (``pypto_bench.peer``'s recipe).
PEER_ARM: str = Arm.HF_COMPILE.value
#: Regimes the peer recipe exists in (transformers has no diffusion generate to compile).
PEER_REGIMES: tuple[str, ...] = (Regime.DECODE.value, Regime.PREFILL.value)
#: The arms that capture the model (a failure of theirs on an image prompt gets a note).
GRAPH_ARMS: tuple[str, ...] = (Arm.GRAPH.value, Arm.PYPTO_GRAPH.value)
DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")
GRAPH_BACKENDS: tuple[str, ...] = ("auto", "compile", "cudagraph", "npugraph", "fused", "eager")
#: How the graph arms run an MoE model's experts (pypto_capture.MOE_ROUTINGS, spelled here
#: so building the CLI parser does not import torch).
MOE_ROUTINGS: tuple[str, ...] = ("exact", "static")
PLACEMENTS: tuple[str, ...] = tuple(p.value for p in Placement)
#: Regimes and arms measured across ranks (``--nproc N > 1``; see pypto_bench.multi).
DISTRIBUTED_REGIMES: tuple[str, ...] = (Regime.PREFILL.value, Regime.DECODE.value)
DISTRIBUTED_ARMS: tuple[str, ...] = (Arm.EAGER.value, Arm.GRAPH.value)
#: ``--rank-timeout``'s default: seconds without progress on any rank before a hung run ends.
DEFAULT_RANK_TIMEOUT = 600.0
#: Largest ``--rank-timeout`` accepted (a week): beyond it the collectives' timeout and the
#: rendezvous' overflow, and no step legitimately makes no progress for longer.
MAX_RANK_TIMEOUT = 7 * 24 * 3600.0


@dataclass
class BenchConfig:
    """Everything a run depends on; defaults match the seed harness.

    ``model_path`` has no environment default: the library reads no environment
    variable behind its caller's back (pypto-e2e fingerprints this config, and a hidden
    ``MODEL_PATH`` would make two identical-looking configs differ). The ``pypto-bench``
    CLI uses ``$MODEL_PATH`` as the default of ``--model-path``.
    """

    model_path: str | None = None
    device: str = "0"
    regime: str = Regime.DECODE.value
    seq: int = 16
    gen: int = 128
    batch: int = 1
    # The batch sweep (``--batch 1,8,32``): every batch measured in one run, the model
    # loaded once; ``batch`` is its first entry (the report's headline arms). Empty: one
    # batch, ``batch``.
    batches: tuple[int, ...] = ()
    arms: tuple[str, ...] = (Arm.EAGER.value, Arm.GRAPH.value)
    warmup: int = 2
    iters: int = 3
    dtype: str = "auto"
    graph_backend: str = "auto"
    # torch.compile mode of the compile/fused backends: None lets pypto-capture choose
    # (decode on CPU: "max-autotune-no-cudagraphs" for models with >= 256 MiB of weights,
    # which reaches the bandwidth ceiling; inductor's default otherwise).
    compile_mode: str | None = None
    seed: int = 0
    attn_implementation: str | None = None
    trust_remote_code: bool = False
    ignore_eos: bool = False
    # ``--allow-inaccurate``: an arm the numerical gate fails (pypto_bench.numerics) is
    # still marked on every surface, but the run exits 0 and says the user allowed it.
    allow_inaccurate: bool = False
    # ``--reference DEVICE`` (pypto_bench.reference): the eager arm's logits against the
    # same folder on DEVICE (float64 under 1 GB of weights, else float32), teacher-forced.
    reference: str | None = None
    diffusion_steps: int | None = None
    block_length: int | None = None
    report_file: str | None = None
    # ``--history DB``: the SQLite results history the CLI records the report in
    # (pypto_bench.history); like report_file, not part of what is measured (to_dict).
    history: str | None = None
    measure_bandwidth: bool = True
    # MoE models only: "exact" (the model's routing, capture-safe: pypto_capture.
    # apply_exact_moe) or "static" (the seed's fixed-expert proxy; outputs differ by design).
    moe_routing: str = "exact"
    # Ranks (pypto_bench.multi): 1 is the single-process run; N > 1 launches N ranks
    # with torch's elastic launcher, the model sharded by its tensor-parallel plan.
    nproc: int = 1
    # --nproc > 1: seconds without progress on any rank before the run is ended as hung.
    rank_timeout: float = DEFAULT_RANK_TIMEOUT
    # --nproc > 1: run the whole model on one device first (the speedup's and the agreement's
    # reference). False (--no-baseline), or a model that does not fit one device: skipped.
    nproc_baseline: bool = True
    # --nproc > 1: "tensor" (each rank a shard of every layer, the family's TP plan) or
    # "pipeline" (one process, layers split over the devices; prefill, eager: the fallback
    # for a family without a plan).
    placement: str = Placement.TENSOR.value
    # Multi-node runs with this tool's own launcher (torchrun's names): nnodes hosts each
    # run this command with --nproc ranks (per node), joined by torch's c10d rendezvous at
    # rdzv_endpoint (HOST:PORT, the same on every node) under rdzv_id; node_rank is
    # recorded (the rendezvous assigns ranks; the node holding rank 0 writes the report).
    nnodes: int = 1
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    # Ranks only (set by ``pypto-tune profile --nproc``): a folder where every rank keeps
    # the profiled step it measures communication on, per arm, in the layout the field's
    # cluster tools read (pypto_bench.multi.comm). Like report_file, not part of what is
    # measured (to_dict).
    rank_profiles: str | None = None
    # A vision-language model's prefill on an image + text prompt (``--image FILE``): the
    # whole model, vision tower included, on inputs the folder's processor builds. None:
    # text prompts (a VL model's language model). pypto_bench.vision reads the file.
    image: str | None = None
    # The order of the timed iterations (pypto_bench.rounds): interleaved rounds (default)
    # or one arm after the other.
    schedule: str = Schedule.INTERLEAVED.value
    # --target-ci PCT: keep adding rounds until every ratio's 95% interval has a relative
    # half-width <= PCT percent, bounded by max_iters rounds and max_seconds of timed work.
    target_ci: float | None = None
    max_iters: int = 200
    max_seconds: float = 600.0
    command_line: list[str] | None = None

    def validate(self) -> None:
        """Reject bad requests before anything is loaded or written (every rule, once)."""
        if self.regime not in REGIMES:
            raise BadInputError(
                f"unknown regime {self.regime!r}: choose one of {', '.join(REGIMES)}"
            )
        self._validate_arms()
        if self.gen < 1:
            raise BadInputError(f"--gen must be >= 1 (got {self.gen})")
        if self.regime == Regime.DECODE and self.gen < 2:
            raise BadInputError(
                "the decode regime needs --gen >= 2 (the first token comes from prefill)"
            )
        for name in ("seq", "batch", "iters"):
            if getattr(self, name) < 1:
                raise BadInputError(f"--{name} must be >= 1 (got {getattr(self, name)})")
        if self.warmup < 0:
            raise BadInputError(f"--warmup must be >= 0 (got {self.warmup})")
        self._validate_batches()
        if self.dtype not in DTYPES:
            raise BadInputError(f"unknown dtype {self.dtype!r}: choose one of {', '.join(DTYPES)}")
        if self.graph_backend not in GRAPH_BACKENDS:
            raise BadInputError(
                f"unknown graph backend {self.graph_backend!r}: choose one of {', '.join(GRAPH_BACKENDS)}"
            )
        if self.moe_routing not in MOE_ROUTINGS:
            raise BadInputError(
                f"unknown MoE routing {self.moe_routing!r}: choose one of {', '.join(MOE_ROUTINGS)}"
            )
        if self.multi_device_requested:
            validate_placement(self)
        self._validate_schedule()
        if self.diffusion_steps is not None and self.diffusion_steps < 1:
            raise BadInputError(f"--diffusion-steps must be >= 1 (got {self.diffusion_steps})")
        if self.image is not None:
            self._validate_image()
        if self.reference is not None:
            self._validate_reference()
        if self.block_length is not None and (
            self.block_length < 1 or self.gen % self.block_length
        ):
            raise BadInputError(
                f"--block-length must divide --gen ({self.gen}); got {self.block_length}"
            )

    def _validate_schedule(self) -> None:
        if self.schedule not in SCHEDULES:
            raise BadInputError(
                f"unknown schedule {self.schedule!r}: choose one of {', '.join(SCHEDULES)}"
            )
        if self.target_ci is not None:
            value = self.target_ci
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise BadInputError(
                    f"--target-ci must be a percentage (got {value!r}): pass e.g. --target-ci 5"
                )
            if not math.isfinite(value) or not 0 < value < 100:
                raise BadInputError(
                    f"--target-ci must be a finite percentage in (0, 100), got {value!r}: "
                    "pass e.g. --target-ci 5"
                )
        if isinstance(self.max_iters, bool) or not isinstance(self.max_iters, int):
            raise BadInputError(f"--max-iters must be a whole number (got {self.max_iters!r})")
        # Only --target-ci adds rounds: without it --iters alone decides (a long fixed run
        # such as --iters 3000 is not bounded by --max-iters' default).
        if self.target_ci is not None and self.max_iters < self.iters:
            raise BadInputError(
                f"--max-iters must be >= --iters ({self.iters}), got {self.max_iters}: it bounds "
                "the rounds --target-ci adds"
            )
        value = self.max_seconds
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadInputError(f"--max-seconds must be a number of seconds (got {value!r})")
        if not math.isfinite(value) or value <= 0:
            raise BadInputError(
                f"--max-seconds must be finite and > 0, got {value!r}: pass e.g. --max-seconds 600"
            )

    @property
    def multi_device_requested(self) -> bool:
        """Any ``--nproc`` flag away from its single-process default (its rules then run)."""
        return (
            self.nproc != 1
            or self.nnodes != 1
            or self.node_rank is not None
            or self.rdzv_endpoint is not None
            or self.rdzv_id is not None
            or self.rank_timeout != DEFAULT_RANK_TIMEOUT
            or not self.nproc_baseline
            or self.placement != Placement.TENSOR
        )

    def _validate_arms(self) -> None:
        arms = tuple(self.arms)
        if not arms:
            raise BadInputError(
                "no arms requested: pass --arms eager,graph (any of eager, graph, pypto+graph)"
            )
        for arm in arms:
            if arm not in ARMS:
                raise BadInputError(f"unknown arm {arm!r}: choose from {', '.join(ARMS)}")
        if len(set(arms)) != len(arms):
            raise BadInputError(f"arm listed twice in {','.join(arms)}: list each arm once")
        if PEER_ARM in arms and self.regime not in PEER_REGIMES:
            raise BadInputError(
                f"the {PEER_ARM} arm runs in the {' and '.join(PEER_REGIMES)} regimes only "
                f"(transformers has no compiled {self.regime} path): drop it from --arms"
            )

    def _validate_reference(self) -> None:
        if not isinstance(self.reference, str) or not self.reference.strip():
            raise BadInputError("--reference needs a device: pass e.g. --reference cpu")
        if self.regime not in (Regime.DECODE, Regime.PREFILL):
            raise BadInputError(
                f"--reference compares decode and prefill logits (the {self.regime} regime's "
                "are not compared with a reference): drop --reference or pass --regime decode"
            )
        if self.multi_device_requested:
            raise BadInputError(
                "--reference runs in one process: check the 1-rank run with --reference, "
                "then run --nproc (its ranks are judged against that 1-rank run)"
            )
        if self.image is not None:
            raise BadInputError("--reference compares text runs: drop --image or --reference")

    def _validate_image(self) -> None:
        from .vision import check_image_file

        if self.regime != Regime.PREFILL:
            raise BadInputError(
                f"--image runs in the prefill regime only (the {self.regime} regime benches a "
                "vision-language model's language model on text prompts): pass --regime "
                "prefill or drop --image"
            )
        if self.nproc != 1 or self.placement != Placement.TENSOR:
            raise BadInputError(
                "--image runs in one process: drop --nproc / --placement or drop --image"
            )
        check_image_file(self.image or "")

    def _validate_batches(self) -> None:
        batches = tuple(self.batches)
        bad = [b for b in batches if not isinstance(b, int) or isinstance(b, bool) or b < 1]
        if bad:
            raise BadInputError(
                f"--batch entries must be integers >= 1 (got {bad[0]!r}): e.g. --batch 1,8,32"
            )
        if len(set(batches)) != len(batches):
            raise BadInputError(
                f"batch listed twice in --batch {','.join(map(str, batches))}: list each once"
            )
        if batches and self.batch != batches[0]:
            raise BadInputError(
                f"batch {self.batch} is not the first of batches {','.join(map(str, batches))}: "
                "set batch to batches[0] (or use run_sweep(config, batches))"
            )

    @property
    def sweep(self) -> tuple[int, ...]:
        """The batches this config measures, in order (one entry without a sweep)."""
        return tuple(self.batches) or (self.batch,)

    def to_dict(self) -> dict[str, Any]:
        """Every setting that changes what is measured, JSON-able; callers fingerprint it.

        Where the report goes (``report_file``) and how the run was invoked
        (``command_line``) do not change the measurement and are left out.
        """
        return {
            "model_path": str(self.model_path) if self.model_path else None,
            "device": str(self.device),
            "regime": self.regime,
            "seq": self.seq,
            "gen": self.gen,
            "batch": self.batch,
            # Only for a sweep: a single batch's description (e2e's fingerprint) is unchanged.
            **({"batches": list(self.batches)} if len(self.batches) > 1 else {}),
            "arms": list(self.arms),
            "warmup": self.warmup,
            "iters": self.iters,
            "dtype": self.dtype,
            "graph_backend": self.graph_backend,
            "compile_mode": self.compile_mode,
            "seed": self.seed,
            "attn_implementation": self.attn_implementation,
            "trust_remote_code": self.trust_remote_code,
            "ignore_eos": self.ignore_eos,
            **({"allow_inaccurate": True} if self.allow_inaccurate else {}),
            **({"reference": self.reference} if self.reference else {}),
            "diffusion_steps": self.effective_diffusion_steps,
            "block_length": self.block_length,
            "measure_bandwidth": self.measure_bandwidth,
            "moe_routing": self.moe_routing,
            # Only for a multi-rank run: a single process's description is unchanged.
            **({"nproc": self.nproc} if self.nproc != 1 else {}),
            **({"nnodes": self.nnodes} if self.nnodes != 1 else {}),
            **({"nproc_baseline": False} if not self.nproc_baseline else {}),
            **({"placement": self.placement} if self.placement != Placement.TENSOR else {}),
            # Only with --image: a text run's description (e2e's fingerprint) is unchanged.
            **({"image": str(self.image)} if self.image is not None else {}),
            # Only away from the default schedule: a default run's description is unchanged.
            **({"schedule": self.schedule} if self.schedule != Schedule.INTERLEAVED else {}),
            **(
                {
                    "target_ci": self.target_ci,
                    "max_iters": self.max_iters,
                    "max_seconds": self.max_seconds,
                }
                if self.target_ci is not None
                else {}
            ),
        }

    def load_options(self) -> dict[str, Any]:
        """``loading.load_model``'s options of this run (every arm and rank loads alike)."""
        return {
            "dtype": self.dtype,
            "trust_remote_code": self.trust_remote_code,
            "attn_implementation": self.attn_implementation,
        }

    @property
    def effective_diffusion_steps(self) -> int | None:
        if self.regime != Regime.DIFFUSION:
            return None
        return self.diffusion_steps or self.gen


def check_rank_timeout(value: Any) -> float:
    """``--rank-timeout`` as seconds: a finite number in (0, ``MAX_RANK_TIMEOUT``], else a
    one-line ``BadInputError`` (inf, nan or 1e300 would launch and fail inside the ranks)."""
    fix = f"pass a number of seconds such as --rank-timeout {DEFAULT_RANK_TIMEOUT:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadInputError(f"--rank-timeout must be a number of seconds (got {value!r}): {fix}")
    if not math.isfinite(value) or not 0 < value <= MAX_RANK_TIMEOUT:
        raise BadInputError(
            f"--rank-timeout must be finite, > 0 and <= {MAX_RANK_TIMEOUT:g} seconds (a week), "
            f"got {value!r}: {fix}"
        )
    return float(value)


def validate_placement(config: BenchConfig) -> None:
    """The rules of ``--nproc`` / ``--placement`` / ``--rank-timeout`` / ``--no-baseline``
    (no torch): part of ``BenchConfig.validate``, which runs them when any of those flags
    leaves its default."""
    n = config.nproc
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise BadInputError(f"--nproc must be an integer >= 1 (got {n!r})")
    _validate_nodes(config)
    n = n * config.nnodes  # the world: every rule below is about all the ranks
    if config.placement not in PLACEMENTS:
        raise BadInputError(
            f"unknown --placement {config.placement!r}: choose one of {', '.join(PLACEMENTS)}"
        )
    check_rank_timeout(config.rank_timeout)
    if config.placement == Placement.PIPELINE:
        _validate_pipeline(config)
    if n == 1:
        if not config.nproc_baseline:
            raise BadInputError(
                "--no-baseline skips the 1-rank run of --nproc N > 1: drop it, or pass --nproc N"
            )
        return
    if config.regime not in DISTRIBUTED_REGIMES:
        raise BadInputError(
            f"--nproc {n} runs the {' and '.join(DISTRIBUTED_REGIMES)} regimes only, not "
            f"{config.regime}: pass --regime prefill or --nproc 1"
        )
    extra = [a for a in config.arms if a not in DISTRIBUTED_ARMS]
    if extra:
        raise BadInputError(
            f"--nproc {n} measures the eager and graph arms only, got {', '.join(extra)}: "
            "pass --arms eager (or eager,graph with --regime decode)"
        )
    if Arm.GRAPH in config.arms and config.regime != Regime.DECODE:
        raise BadInputError(
            f"--nproc {n} measures the graph arm in the decode regime only, not "
            f"{config.regime}: pass --arms eager or --regime decode"
        )
    if len(config.batches) > 1:
        raise BadInputError(f"--nproc {n} takes one --batch, not a sweep: pass a single size")
    if config.target_ci is not None:
        # Each rank would decide from its own samples when to stop adding rounds, and
        # ranks that decide differently wait for each other's collectives forever.
        raise BadInputError(
            f"--target-ci runs one process's rounds; --nproc {n} runs a fixed number: "
            "drop --target-ci and pass --iters N"
        )
    if config.rank_profiles is not None and config.placement != Placement.TENSOR:
        raise BadInputError(
            "per-rank profiles are of tensor-parallel ranks; --placement pipeline runs one "
            "process: profile it without --nproc"
        )


_HOST_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def check_host(host: str, what: str, fix: str) -> str:
    """``host`` (stripped) when it is an IP address or a DNS host name (labels of letters,
    digits, ``-`` and ``_``, at most 253 characters); a one-line BadInputError naming
    ``what`` and ``fix`` otherwise. Checked before anything waits on the host: a bad one
    used to fail later as a rendezvous timeout (exit 48) or an unexpected UnicodeError."""
    if not host.strip():
        raise BadInputError(f"{what} is empty: {fix}")
    if host != host.strip() or any(c.isspace() for c in host):
        # The launch uses the value as given: a trailing newline or space is not stripped
        # there, so it is refused here rather than waited on until the rank timeout.
        raise BadInputError(f"{what}={host[:60]!r} holds white space: {fix}")
    inner = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if "[" in inner or "]" in inner:
        raise BadInputError(f"{what}={host[:60]!r} has unbalanced brackets: {fix}")
    try:
        ipaddress.ip_address(inner)
        return host
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    if len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        raise BadInputError(
            f"{what}={host[:60]!r}{'...' if len(host) > 60 else ''} is not a host name "
            f"or an IP address: {fix}"
        )
    return host


def parse_endpoint(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port); a one-line error otherwise
    (a URL, an unclosed bracket, a port outside 1-65535, a host that is no host)."""
    fix = "pass the address of the node that hosts the rendezvous and a free port, e.g. node0:29500"
    bad = BadInputError(f"--rdzv-endpoint {text[:80]!r} is not HOST:PORT: {fix}")
    t = text.strip()
    if "/" in t or "@" in t:
        raise bad  # a URL (http://host:port) or a path: HOST:PORT only
    if t.startswith("["):
        close = t.find("]")
        if close < 0 or t[close + 1 : close + 2] != ":":
            raise bad
        host, port = t[1:close], t[close + 2 :]
        try:
            if ipaddress.ip_address(host).version != 6:
                raise bad
        except ValueError:
            raise bad from None
    else:
        host, sep, port = t.rpartition(":")
        if not sep or not host or "[" in host or "]" in host:
            raise bad
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise bad
    return check_host(host, "--rdzv-endpoint host", fix), int(port)


def _validate_nodes(config: BenchConfig) -> None:
    """``--nnodes`` / ``--node-rank`` / ``--rdzv-endpoint`` / ``--rdzv-id``."""
    nn = config.nnodes
    if isinstance(nn, bool) or not isinstance(nn, int) or nn < 1:
        raise BadInputError(f"--nnodes must be an integer >= 1 (got {nn!r})")
    if nn == 1:
        extra = [
            flag
            for flag, value in (
                ("--node-rank", config.node_rank),
                ("--rdzv-endpoint", config.rdzv_endpoint),
                ("--rdzv-id", config.rdzv_id),
            )
            if value is not None
        ]
        if extra:
            raise BadInputError(
                f"{', '.join(extra)} belong to a multi-node run: pass --nnodes N > 1, or drop them"
            )
        return
    if config.rdzv_endpoint is None:
        raise BadInputError(
            f"--nnodes {nn} needs --rdzv-endpoint HOST:PORT (the same on every node): where "
            "the nodes meet"
        )
    parse_endpoint(config.rdzv_endpoint)
    r = config.node_rank
    if r is not None and (isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < nn):
        raise BadInputError(f"--node-rank must be 0..{nn - 1} for --nnodes {nn} (got {r!r})")
    if config.placement != Placement.TENSOR:
        raise BadInputError(
            "--placement pipeline runs in one process: a multi-node run is --placement tensor"
        )
    rid = config.rdzv_id
    if rid is not None and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", rid):
        raise BadInputError(
            f"--rdzv-id {rid[:80]!r}: use 1-64 letters, digits, '.', '_' or '-', the same on "
            "every node"
        )


def _validate_pipeline(config: BenchConfig) -> None:
    """What ``--placement pipeline`` measures: prefill, the eager arm, one batch, N >= 2."""
    if config.nproc < 2:
        raise BadInputError(
            "--placement pipeline splits the model over --nproc N >= 2 devices: pass --nproc"
        )
    if config.regime != Regime.PREFILL:
        raise BadInputError(
            f"--placement pipeline measures the prefill regime only, not {config.regime}: "
            "pass --regime prefill (or --placement tensor)"
        )
    if tuple(config.arms) != (Arm.EAGER,):
        raise BadInputError(
            f"--placement pipeline measures the eager arm only, got {','.join(config.arms)}: "
            "pass --arms eager"
        )
