"""The profile JSON's schema, checked once when a profile is loaded.

Every field a later stage reads (the detectors, advice, compare, the Markdown) is
declared here with its type, so a profile that passes :func:`validate_profile` cannot
raise a TypeError, KeyError or AttributeError later: a hostile or hand-edited file is
refused at the door, with the path of the first wrong field. Fields not declared are
kept as they are (a newer minor version may add some) and read by nobody.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PROFILE_SCHEMA", "SchemaError", "validate", "validate_profile"]


class SchemaError(ValueError):
    """A document that does not match its schema; ``str()`` names the field and why."""


@dataclass(frozen=True)
class Spec:
    """One node of a schema: ``kind`` is num/int/str/bool/any/list/dict/obj."""

    kind: str
    optional: bool = False  # null allowed
    item: Spec | None = None  # list / dict values
    keys: dict[str, Spec] = field(default_factory=dict)  # obj: declared keys
    required: tuple[str, ...] = ()  # obj: keys that must be present


def _s(kind: str, **kw: Any) -> Spec:
    return Spec(kind, **kw)


NUM, INT, STR, ANY = _s("num"), _s("int"), _s("str"), _s("any")
ONUM, OINT, OSTR = _s("num", optional=True), _s("int", optional=True), _s("str", optional=True)


def _obj(keys: dict[str, Spec], required: tuple[str, ...] = (), optional: bool = False) -> Spec:
    return Spec("obj", optional=optional, keys=keys, required=required)


def _list(item: Spec, optional: bool = False) -> Spec:
    return Spec("list", optional=optional, item=item)


def _dict(item: Spec, optional: bool = False) -> Spec:
    return Spec("dict", optional=optional, item=item)


_BREAKS = _obj(
    {
        "graph_break_count": ONUM,
        "graph_breaks": _dict(ANY),
        "graphs_compiled": ONUM,
        "frames_traced": ONUM,
    }
)

#: The profile JSON (schema ``pypto-tune.profile`` 1.x) as its readers use it.
PROFILE_SCHEMA = _obj(
    {
        "schema": STR,
        "schema_version": STR,
        "meta": _obj(
            {
                **{
                    k: OSTR
                    for k in (
                        "regime",
                        "arm",
                        "device",
                        "device_type",
                        "dtype",
                        "profiler",
                        "level",
                        "profiler_output",
                    )
                },
                **{k: OINT for k in ("batch", "seq", "gen", "iters", "warmup")},
                "model": _obj({"class": OSTR, "parameters": ONUM}, optional=True),
                "bench_config": _obj(
                    {"arms": _list(STR, optional=True), "model_path": OSTR},
                    optional=True,
                ),
                "kernel_plugins": _list(
                    _obj({"name": STR, "tunables": _dict(_list(STR), optional=True)}, ("name",)),
                    optional=True,
                ),
                "model_shapes": _dict(INT, optional=True),
                # How a graph arm's operators got their modules (schema 1.1).
                "attribution": _obj(
                    {
                        "status": OSTR,
                        "why": OSTR,
                        "source": OSTR,
                        "calls": OINT,
                        "kernels_matched": OINT,
                        "fused_across": OINT,
                    },
                    optional=True,
                ),
                "thresholds": _dict(NUM, optional=True),
                "command_line": _list(STR, optional=True),
            }
        ),
        "peaks": _obj(
            {
                "matmul_flops_per_s": ONUM,
                "bandwidth_bytes_per_s": ONUM,
                "op_launch_us": ONUM,
                "replay": _obj({"us": ONUM}, optional=True),
            }
        ),
        "step": _obj(
            {
                "count": ONUM,
                "unit": OSTR,
                "time_us": _obj(
                    {
                        **{k: ONUM for k in ("mean", "median", "min", "max", "stdev")},
                        "samples": _list(NUM, optional=True),
                    }
                ),
                **{
                    k: ONUM
                    for k in (
                        "device_busy_us",
                        "host_gap_us",
                        "utilisation",
                        "host_syncs",
                        "launch_us",
                        "compiled_regions",
                    )
                },
                "critical_path": _obj({"bound": OSTR}, optional=True),
            }
        ),
        "blocks": _dict(_obj({"us": NUM, "share": NUM}, ("us", "share"))),
        "ops": _list(
            _obj(
                {
                    "name": STR,
                    "module": OSTR,
                    "block": STR,
                    "layer": OINT,
                    **{k: NUM for k in ("calls", "host_us", "self_us", "device_us")},
                    "kind": STR,
                    "core": OSTR,
                    "shapes": _list(ANY, optional=True),
                    "dtypes": _list(ANY, optional=True),
                    "flops": ONUM,
                    "bytes": ONUM,
                },
                ("name", "module", "block", "layer", "calls", "host_us", "self_us", "device_us"),
            )
        ),
        "call_graph": _list(
            _obj(
                {
                    "module": STR,
                    "block": STR,
                    "us": NUM,
                    "calls": NUM,
                    "class": OSTR,
                    "parent": OSTR,
                    "layer": OINT,
                },
                ("module", "block", "us", "calls"),
            )
        ),
        "counters": _obj({**_BREAKS.keys, "warmup": _BREAKS}),
        "memory": _obj({"kind": OSTR, "per_iter": _list(ONUM, optional=True), "growth": ONUM}),
        "microbench": _obj({"kv_layout": _obj({"head_major_speedup": ONUM}, optional=True)}),
        "findings": _list(_obj({"id": OSTR, "share": ONUM, "title": OSTR})),
        "recommendations": _list(
            _obj(
                {
                    "id": STR,
                    "title": OSTR,
                    "estimated_speedup": ONUM,
                    "applies_when": _obj(
                        {"arm": _list(STR), "attn_implementation": OSTR}, optional=True
                    ),
                },
                ("id",),
            )
        ),
        "warnings": _list(STR),
    },
    ("schema", "schema_version"),
)

_NAMES = {
    "num": "a number",
    "int": "an integer",
    "str": "a string",
    "bool": "true or false",
    "list": "a list",
    "dict": "an object",
    "obj": "an object",
}


def _is(kind: str, value: Any) -> bool:
    if kind == "any":
        return True
    if kind == "num":
        return type(value) in (int, float) and math.isfinite(value)
    if kind == "int":
        return type(value) is int
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "list":
        return isinstance(value, list)
    return isinstance(value, dict)


def validate(value: Any, spec: Spec, where: str = "") -> None:
    """Raise :class:`SchemaError` naming the first field of ``value`` not matching ``spec``.

    Iterative (an explicit stack), so a deep document cannot exhaust Python's stack.
    """
    stack = [(value, spec, where)]
    while stack:
        val, sp, at = stack.pop()
        if val is None and sp.optional:
            continue
        if not _is(sp.kind, val):
            got = "null" if val is None else type(val).__name__
            if sp.kind == "num" and type(val) is float:
                got = repr(val)
            raise SchemaError(
                f"wrong type for {at or 'the document'}: {got}, expected {_NAMES[sp.kind]}"
            )
        if sp.kind == "list" and sp.item is not None:
            stack.extend((v, sp.item, f"{at}[{i}]") for i, v in enumerate(val))
        elif sp.kind == "dict" and sp.item is not None:
            stack.extend((v, sp.item, f"{at}.{k}" if at else k) for k, v in val.items())
        elif sp.kind == "obj":
            missing = [k for k in sp.required if k not in val]
            if missing:
                raise SchemaError(f"{at or 'the document'} lacks {', '.join(missing)}")
            for k, sub in sp.keys.items():
                if k in val:
                    stack.append((val[k], sub, f"{at}.{k}" if at else k))


def validate_profile(data: Any) -> None:
    """:func:`validate` against :data:`PROFILE_SCHEMA`."""
    validate(data, PROFILE_SCHEMA)
