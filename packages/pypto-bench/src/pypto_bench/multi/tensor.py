"""The tensor placement's model: a plan applied, or transformers' own placement loaded.

Two ways a rank gets its shard of every layer (``--nproc N``, ``--placement tensor``):

* an in-repo family (a pinned folder whose config class declares ``pypto_tp_plan``): the
  whole model loaded on the host by the standard strict loader, then cut here
  (:func:`shard_model`, :func:`load_own_plan`);
* any other family: transformers' own tensor parallelism (``from_pretrained(
  distributed_config=DistributedConfig(tp_plan="auto"))``, the family's
  ``base_model_tp_plan``) through :func:`load_placed`, which the pipeline placement also
  uses with a ``device_map``.

Tensor parallelism for the in-repo families: their ``pypto_tp_plan``, applied with torch only.

Why not transformers' own TP for these: the in-repo families load through their own
strict loaders (MiniMax) or carry a layout transformers' styles cannot split (LLaDA2's
fused ``query_key_value`` packs q, k and v at different widths), and transformers' TP
machinery changed completely inside the supported range (forward hooks in 5.8, DTensor
placeholders in 5.24). A family package therefore declares its plan as data on its config
class (``pypto_tp_plan``: module or parameter name pattern -> style, the same spelling as
transformers' ``base_model_tp_plan``), and this module applies it to a model that was loaded
whole on the host: every matched tensor is cut to this rank's slice (the full one is
dropped), and the collectives the styles need run in forward hooks with the plain
``torch.distributed`` calls, which torch.compile traces (as functional collectives) and
CUDA graphs capture (NCCL).

Styles (``W`` a Linear weight ``[out, in]`` or a stacked expert tensor ``[E, out, in]``):

* ``colwise``: ``W`` split on its output dim (bias too); the output stays this rank's slice.
* ``colwise_gather_output``: ``colwise``, then the slices are gathered (full output).
* ``rowwise``: ``W`` split on its input dim; a Linear's output is summed over ranks
  (all-reduce; its bias is added once). On a stacked expert tensor: only the split.
* ``rowwise_split_input``: ``rowwise`` on a Linear whose input is whole: it takes its slice.
* ``packed_colwise[:a,b,...]``: ``W``'s output dim is parts packed one after another (sizes
  in proportion to ``a, b, ...``: integers or config attribute names; default two equal
  halves, gate|up); each part is split and this rank keeps its slice of every part, in
  the same order. LLaDA2's q|k|v: ``packed_colwise:num_attention_heads,
  num_key_value_heads,num_key_value_heads``.
* ``moe_tp_experts``: the module's output is summed over ranks (experts whose matrices are
  split ``packed_colwise`` / ``rowwise``).
* ``local_heads:attr,...``: the module's integer attributes (head counts its forward reads)
  become this rank's share.
* ``replicate``: nothing (stated, for a reader of the plan).

A pattern names a module or parameter path; ``*`` stands for one layer index, and it
matches the end of a name (``layers.*.attention.dense`` matches
``model.layers.3.attention.dense``), as transformers' plans are written relative to the
base model.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ModelLoadError, NoTensorParallelPlanError
from ._shared import Beat

if TYPE_CHECKING:
    from ..config import BenchConfig

__all__ = [
    "PYPTO_PLAN_PREFIX",
    "STYLES",
    "Rule",
    "ShardReport",
    "check_plan",
    "load_own_plan",
    "load_placed",
    "load_sharded",
    "parse_plan",
    "plan_of",
    "shard_model",
]

log = logging.getLogger(__name__)

#: How a spec's ``plan`` names an in-repo family's ``pypto_tp_plan`` (applied here; every
#: other plan is transformers').
PYPTO_PLAN_PREFIX = "pypto_tp_plan"

STYLES = (
    "colwise",
    "colwise_gather_output",
    "rowwise",
    "rowwise_split_input",
    "packed_colwise",
    "moe_tp_experts",
    "local_heads",
    "replicate",
)
#: Styles that need the named object to be a module (they install a hook or set attributes).
_MODULE_ONLY = ("colwise_gather_output", "rowwise_split_input", "moe_tp_experts", "local_heads")


@dataclass(frozen=True)
class Rule:
    """One plan entry, parsed."""

    pattern: str
    style: str
    args: tuple[str, ...] = ()
    regex: re.Pattern[str] = field(compare=False, default=re.compile(""))


@dataclass
class ShardReport:
    """What ``shard_model`` did on this rank (for the report and the tests)."""

    rank: int
    world: int
    sharded: dict[str, str] = field(default_factory=dict)  # name -> style
    hooks: int = 0
    full_parameters: int = 0  # the whole model's parameter count, before the cut
    unmatched: list[str] = field(default_factory=list)  # plan patterns that matched nothing


def plan_of(config: Any) -> dict[str, str] | None:
    """The in-repo family's plan (``pypto_tp_plan`` on its config *class*), or None.

    Read from the class, never the instance: transformers copies every unknown key of a
    folder's config.json onto the config object, so a stranger's config.json could
    otherwise hand this module a plan of its choosing.
    """
    plan = getattr(type(config), "pypto_tp_plan", None)
    return dict(plan) if isinstance(plan, Mapping) and plan else None


def parse_plan(plan: Mapping[str, str]) -> list[Rule]:
    """Plan entries as rules; an unknown style is one line naming it (before launching)."""
    rules = []
    for pattern, spec in plan.items():
        style, _, rest = str(spec).partition(":")
        if style not in STYLES:
            raise NoTensorParallelPlanError(
                f"tensor-parallel plan entry {pattern!r}: style {style!r} is not one of "
                f"{', '.join(STYLES)}: fix the family's pypto_tp_plan"
            )
        args = tuple(a.strip() for a in rest.split(",") if a.strip())
        body = r"\.".join(r"\d+" if part == "*" else re.escape(part) for part in pattern.split("."))
        rules.append(Rule(pattern, style, args, re.compile(rf"(?:^|\.){body}$")))
    return rules


def _sizes(args: tuple[str, ...], config: Any) -> list[int]:
    out = []
    for a in args or ("1", "1"):
        value = int(a) if a.isascii() and a.isdigit() else getattr(config, a, None)
        if not isinstance(value, int) or value <= 0:
            raise NoTensorParallelPlanError(
                f"packed_colwise part {a!r} is not a positive integer or config attribute: "
                "fix the family's pypto_tp_plan"
            )
        out.append(value)
    return out


def check_plan(plan: Mapping[str, str], config: Any, world: int) -> None:
    """Refuse, before launching, what the plan cannot split over ``world`` ranks."""
    for rule in parse_plan(plan):
        if rule.style == "packed_colwise":
            for part, size in zip(rule.args, _sizes(rule.args, config), strict=False):
                if size % world:
                    raise NoTensorParallelPlanError(
                        f"{part} = {size} is not divisible by --nproc {world}: pick an "
                        "--nproc that divides it"
                    )
        if rule.style == "local_heads":
            for attr in rule.args:
                value = getattr(config, attr, None)
                if isinstance(value, int) and value % world:
                    raise NoTensorParallelPlanError(
                        f"{attr} = {value} is not divisible by --nproc {world}: pick an "
                        "--nproc that divides it"
                    )


def _chunk(t: Any, dim: int, rank: int, world: int, name: str) -> Any:
    size = t.shape[dim]
    if size % world:
        raise NoTensorParallelPlanError(
            f"{name} has {size} along the split dimension, not divisible by --nproc {world}: "
            "pick an --nproc that divides it"
        )
    step = size // world
    return t.narrow(dim, rank * step, step).clone()


def _packed(t: Any, dim: int, parts: list[int], rank: int, world: int, name: str) -> Any:
    import torch

    total = sum(parts)
    if t.shape[dim] % total:
        raise NoTensorParallelPlanError(
            f"{name}: {t.shape[dim]} rows do not pack parts in proportion {parts}: the plan "
            "does not fit this checkpoint"
        )
    unit = t.shape[dim] // total
    pieces = torch.split(t, [p * unit for p in parts], dim=dim)
    return torch.cat(
        [_chunk(p, dim, rank, world, f"{name} part {i}") for i, p in enumerate(pieces)], dim=dim
    )


def _replace(module: Any, attr: str, value: Any) -> None:
    import torch

    old = getattr(module, attr)
    setattr(module, attr, torch.nn.Parameter(value, requires_grad=old.requires_grad))


def _split_tensor(owner: Any, attr: str, style: str, args: tuple[str, ...], ctx: _Ctx) -> None:
    """Cut ``owner.attr`` (a weight, bias or stacked expert tensor) to this rank's slice."""
    t = getattr(owner, attr).data
    name = f"{ctx.name}.{attr}" if ctx.name else attr
    col = style in ("colwise", "colwise_gather_output")
    if style == "packed_colwise":
        dim = -2 if t.dim() > 1 else 0
        _replace(owner, attr, _packed(t, dim, _sizes(args, ctx.config), ctx.rank, ctx.world, name))
    elif col:
        _replace(owner, attr, _chunk(t, -2 if t.dim() > 1 else 0, ctx.rank, ctx.world, name))
    else:  # rowwise: the input dim
        _replace(owner, attr, _chunk(t, -1, ctx.rank, ctx.world, name))


@dataclass
class _Ctx:
    rank: int
    world: int
    config: Any
    group: Any
    name: str = ""


def _all_reduce_hook(group: Any) -> Any:
    def hook(module: Any, args: Any, output: Any) -> Any:
        import torch.distributed as dist

        dist.all_reduce(output, group=group)
        bias = getattr(module, "pypto_tp_bias", None)
        return output if bias is None else output + bias

    return hook


def _gather_hook(world: int, group: Any) -> Any:
    def hook(module: Any, args: Any, output: Any) -> Any:
        import torch
        import torch.distributed as dist

        local = output.contiguous()
        parts = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(parts, local, group=group)
        return torch.cat(parts, dim=-1)

    return hook


def _split_input_hook(rank: int, world: int) -> Any:
    def hook(module: Any, args: Any) -> Any:
        x = args[0]
        step = x.shape[-1] // world
        return (x.narrow(-1, rank * step, step), *args[1:])

    return hook


def _apply(module: Any, rule: Rule, ctx: _Ctx, report: ShardReport) -> None:
    import torch

    style = rule.style
    if style == "replicate":
        return
    if style == "local_heads":
        for attr in rule.args:
            value = getattr(module, attr, None)
            if not isinstance(value, int) or value % ctx.world:
                raise NoTensorParallelPlanError(
                    f"{ctx.name}.{attr} = {value!r} cannot be split over --nproc {ctx.world}: "
                    "pick an --nproc that divides it"
                )
            setattr(module, attr, value // ctx.world)
        return
    if style == "moe_tp_experts":
        module.register_forward_hook(_all_reduce_hook(ctx.group))
        report.hooks += 1
        return
    if not isinstance(module, torch.nn.Linear):
        raise NoTensorParallelPlanError(
            f"{ctx.name} is a {type(module).__name__}, not a Linear: style {style!r} shards "
            "Linear layers or named weight tensors; fix the family's pypto_tp_plan"
        )
    _split_tensor(module, "weight", style, rule.args, ctx)
    if style in ("rowwise", "rowwise_split_input"):
        if module.bias is not None:  # added once, after the partial sums are reduced
            module.register_buffer("pypto_tp_bias", module.bias.data.clone())
            module.register_parameter("bias", None)
        if style == "rowwise_split_input":
            module.register_forward_pre_hook(_split_input_hook(ctx.rank, ctx.world))
            report.hooks += 1
        module.register_forward_hook(_all_reduce_hook(ctx.group))
        report.hooks += 1
    else:
        if module.bias is not None:
            _split_tensor(module, "bias", style, rule.args, ctx)
        if style == "colwise_gather_output":
            module.register_forward_hook(_gather_hook(ctx.world, ctx.group))
            report.hooks += 1
    module.in_features, module.out_features = module.weight.shape[1], module.weight.shape[0]


def shard_model(
    model: Any, plan: Mapping[str, str], *, rank: int, world: int, group: Any = None
) -> ShardReport:
    """Cut ``model`` (loaded whole) to rank ``rank``'s shard of ``plan`` and hook its collectives.

    Names are matched against every module and parameter path; a parameter entry is only
    split (the collective is its module's, e.g. ``moe_tp_experts``), a module entry is
    split and hooked. A plan entry that matches nothing is logged (a plan written for a
    bigger config may name layers this one lacks) and listed in the report.
    """
    rules = parse_plan(plan)
    config: Any = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    report = ShardReport(rank=rank, world=world)
    report.full_parameters = sum(p.numel() for p in model.parameters())
    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    for rule in rules:
        hit = False
        for name, module in modules.items():
            if name and rule.regex.search(name):
                _apply(module, rule, _Ctx(rank, world, config, group, name), report)
                report.sharded[name] = rule.style
                hit = True
        for name in params:
            if rule.regex.search(name) and name not in report.sharded:
                if rule.style in _MODULE_ONLY:
                    raise NoTensorParallelPlanError(
                        f"{name} is a tensor: style {rule.style!r} applies to modules; fix "
                        "the family's pypto_tp_plan"
                    )
                owner_name, _, attr = name.rpartition(".")
                owner = modules[owner_name]
                _split_tensor(
                    owner, attr, rule.style, rule.args, _Ctx(rank, world, config, group, owner_name)
                )
                report.sharded[name] = rule.style
                hit = True
        if not hit:
            report.unmatched.append(rule.pattern)
            log.info("tensor-parallel plan entry %r matches nothing in this model", rule.pattern)
    return report


# --- loading a rank's shard --------------------------------------------------------------


def load_own_plan(
    config: BenchConfig, world: int, device: Any, beat: Beat | None = None
) -> tuple[Any, Any, float]:
    """An in-repo family: the standard (strict) load on the host, cut to this rank's shard
    by the family's ``pypto_tp_plan``, then moved to the rank's device.

    Ranks take turns (rank r loads after rank r-1 has dropped what is not its shard), so
    the host holds one whole copy at a time, not one per rank. Every finished turn is
    progress for the watchdog: ``--rank-timeout`` bounds one rank's load, not all N.
    """
    import torch.distributed as dist

    from ..loading import load_model

    rank = dist.get_rank()
    start = time.perf_counter()
    model = tokenizer = None
    for turn in range(world):
        if turn == rank:
            loaded = load_model(config.model_path, device="cpu", **config.load_options())
            model, tokenizer = loaded.model, loaded.tokenizer
            plan = plan_of(model.config) or plan_of(model.config.get_text_config())
            if not plan:
                raise ModelLoadError(
                    f"{type(model).__name__} loaded from {config.model_path} carries no "
                    "pypto_tp_plan although its config class declares one: rerun with -v"
                )
            done = shard_model(model, plan, rank=rank, world=world)
            model.pypto_tp_shard = done  # the report's global parameter count and rules
            log.info(
                "rank %d: %d tensors/modules sharded, %d collective hooks",
                rank,
                len(done.sharded),
                done.hooks,
            )
            model.to(device)
            del loaded
        dist.barrier()
        if beat is not None:
            beat.advance(f"loading the sharded model: rank {turn} of {world} loaded")
    return model, tokenizer, time.perf_counter() - start


def load_sharded(
    config: BenchConfig, world: int, device: Any, plan: str = "", beat: Beat | None = None
) -> tuple[Any, Any, float]:
    """This rank's shard of the model: ``plan`` (what the launcher's checks named) says
    whether it is an in-repo family's plan or transformers' own; (model, tokenizer, s)."""
    if plan.startswith(PYPTO_PLAN_PREFIX):
        return load_own_plan(config, world, device, beat)
    from transformers.distributed.configuration_utils import DistributedConfig

    from ..loading import check_model_folder, read_model_config

    path = check_model_folder(config.model_path)
    extra = {"distributed_config": DistributedConfig(tp_plan="auto", tp_size=world)}
    return load_placed(config, path, read_model_config(path), extra, f"sharded over {world} ranks")


def load_placed(
    config: BenchConfig, path: Path, raw: dict[str, Any], extra: dict[str, Any], how: str
) -> tuple[Any, Any, float]:
    """Tokenizer and model through transformers' own placement (``extra``: a
    ``distributed_config`` or a ``device_map``, both of which need accelerate), in eval
    mode; (model, tokenizer, seconds). ``how`` names the placement in errors. The load
    itself is :func:`pypto_bench.loading.load_pretrained` (its one-line errors)."""
    import torch

    from ..loading import auto_class_name, load_pretrained, ready_for_inference, torch_dtype

    torch.manual_seed(config.seed)
    start = time.perf_counter()
    model, tokenizer = load_pretrained(
        path,
        auto_class_name(raw),
        trust_remote_code=config.trust_remote_code,
        dtype=torch_dtype(config.dtype),
        attn_implementation=config.attn_implementation,
        extra=extra,
        how=how,
        needs_accelerate=True,
    )
    ready_for_inference(model, tokenizer)
    return model, tokenizer, time.perf_counter() - start
