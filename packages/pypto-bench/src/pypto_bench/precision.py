"""``pypto-precision dump`` and ``pypto-precision check``: the model-level commands.

pypto-precision's library compares dumps and judges logits; loading a model folder (offline,
never running its code unless asked) is this package's, so these two commands live here and
are added to the ``pypto-precision`` command through the ``pypto_precision.commands``
entry-point group (the arrow points down: pypto-bench -> pypto-precision).

``check`` answers the porting engineer's question in one command: the target (device,
dtype) against a trusted reference (default: CPU, float64 for models under 1 GB of weights,
else float32), teacher-forced over ``--gen`` steps of the reference's own greedy tokens,
judged against the noise floor (the target's dtype on the reference device, measured in the
same run). When the logits fail, every module of the target, the reference and the floor is
dumped on the prompt and compared, and the first diverging module is named.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from pypto_common import atomic_write_text
from pypto_precision import (
    DEFAULT_K,
    DEFAULT_MAX_BYTES,
    EXIT,
    MODES,
    PrecisionError,
    Recorder,
    Rule,
    compare_dumps,
    judge_logits,
    logit_metrics,
    read_dump,
    replay_local_errors,
    summary_line,
    write_reports,
)
from pypto_precision.cli import k_type

from .errors import BadInputError, BenchError, EnvironmentMissingError
from .reference import loaded_in, reference_dtype

__all__ = [
    "CHECK",
    "DUMP",
    "CheckCommand",
    "DumpCommand",
    "check_line",
    "reference_does_not_fit",
    "run_check",
]

log = logging.getLogger(__name__)


def _precision_error(err: BenchError) -> PrecisionError:
    """A bench failure in this command's own codes (usage 2, environment 3, else 1)."""
    out = PrecisionError(str(err))
    if isinstance(err, BadInputError):
        out.exit_code = EXIT.USAGE
    elif isinstance(err, EnvironmentMissingError):
        out.exit_code = EXIT.ENVIRONMENT
    return out


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 < value <= 1 << 40:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-path", required=True, type=Path, help="the model folder")
    p.add_argument("--seq", type=_positive, default=16, help="prompt tokens (default 16)")
    p.add_argument("--prompt", help="a text prompt (tokenized; else --seq seeded token ids)")
    p.add_argument("--seed", type=int, default=0, help="seed of the token ids (default 0)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let transformers run the folder's own Python code")  # fmt: skip


@contextmanager
def _loaded(args: argparse.Namespace, path: Path, device: str, dtype: str) -> Iterator[Any]:
    """``path`` loaded and freed by pypto_bench.reference.loaded_in; a load or device error
    becomes the one-line PrecisionError (errors of the caller's block pass unchanged)."""
    from pypto_capture import resolve_device

    with ExitStack() as stack:
        try:
            loaded = stack.enter_context(
                loaded_in(
                    path, resolve_device(device), dtype, trust_remote_code=args.trust_remote_code
                )
            )
        except BenchError as err:
            raise _precision_error(err) from err
        except Exception as err:  # pypto_capture's device errors
            raise PrecisionError(f"device {device!r}: {' '.join(str(err).split())[:200]}") from err
        yield loaded


@contextmanager
def _kernels(enabled: bool, loaded: Any) -> Iterator[list[str]]:
    """With ``--kernels``: every applicable ``pypto.kernels`` plug-in switched on around the
    target (the pypto+graph arm's kernels, run eagerly: no capture to blame)."""
    if not enabled:
        yield []
        return
    from .plugins import applicable_plugins

    try:
        plugins = applicable_plugins(loaded.model)
    except BenchError as err:
        raise _precision_error(err) from err
    with ExitStack() as stack:
        for plugin in plugins:
            stack.enter_context(plugin.enable(loaded.model))
        yield [str(p.name) for p in plugins]


def _input_ids(args: argparse.Namespace, loaded: Any) -> list[int]:
    """The prompt's token ids: the tokenized ``--prompt``, else ``--seq`` seeded ids."""
    import torch

    if args.prompt:
        ids = loaded.tokenizer(args.prompt, return_tensors="pt").input_ids[0].tolist()
        if not ids:
            raise PrecisionError("--prompt tokenizes to nothing: pass a longer prompt")
        return [int(i) for i in ids]
    vocab = int(loaded.model.get_input_embeddings().weight.shape[0])
    gen = torch.Generator().manual_seed(args.seed)
    low = min(3, vocab - 1)  # past the usual special ids
    return torch.randint(low, vocab, (args.seq,), generator=gen).tolist()


def _fingerprint(loaded: Any) -> dict[str, Any]:
    cfg = loaded.config
    return {"path": str(loaded.path), "model_type": cfg.get("model_type"),
            "class": type(loaded.model).__name__,
            "parameters": sum(p.numel() for p in loaded.model.parameters())}  # fmt: skip


def _dump(loaded: Any, ids: list[int], out: Path, mode: str, with_inputs: bool,
          max_bytes: int, extra: dict[str, Any]) -> None:  # fmt: skip
    import torch

    device = next(loaded.model.parameters()).device
    meta = {"input_ids": [ids], "model": _fingerprint(loaded), "arm": "eager", **extra}
    x = torch.tensor([ids], device=device)
    with torch.no_grad(), Recorder(loaded.model, out, mode=mode, with_inputs=with_inputs,
                                   max_bytes=max_bytes, meta=meta):  # fmt: skip
        loaded.model(input_ids=x, use_cache=False)


class DumpCommand:
    """``pypto-precision dump``: one eager forward pass of the prompt, every module recorded."""

    name = "dump"
    help = "run the model's eager forward on a prompt and record every module's outputs"

    def configure(self, p: argparse.ArgumentParser) -> None:
        p.description = (
            "Load --model-path on --device in --dtype, run one eager forward pass of the "
            "prompt and record every module's outputs (and inputs with --with-inputs) into "
            "--out. Hooks do not fire inside a captured graph: compare the graph arm with "
            "`check` or pypto-bench's numerical gate (teacher-forced logits)."
        )
        _common(p)
        p.add_argument("--out", required=True, type=Path, help="the dump folder (must not exist)")
        p.add_argument("--device", default="cpu", help="cpu, cuda:N, npu:N or auto")
        p.add_argument("--dtype", default="float32", help="float32, bfloat16, float16, float64")
        p.add_argument("--mode", choices=MODES, default="statistics",
                       help="statistics (default), md5, or tensor (safetensors shards)")  # fmt: skip
        p.add_argument("--with-inputs", action="store_true", help="record inputs too")
        p.add_argument("--max-bytes", type=_positive, default=DEFAULT_MAX_BYTES,
                       help=f"tensor mode refuses past this (default {DEFAULT_MAX_BYTES})")  # fmt: skip

    def run(self, args: argparse.Namespace) -> int:
        if args.out.exists():
            raise PrecisionError(f"{args.out}: already exists: pass a new folder for the dump")
        with _loaded(args, args.model_path, args.device, args.dtype) as loaded:
            ids = _input_ids(args, loaded)
            _dump(loaded, ids, args.out, args.mode, args.with_inputs, args.max_bytes,
                  {"seed": args.seed, "requested_dtype": args.dtype})  # fmt: skip
        print(json.dumps({"dump": str(args.out), "tokens": len(ids)}))
        return EXIT.OK


def _check(args: argparse.Namespace) -> dict[str, Any]:
    """check.json's document for ``args`` (written with check.md into ``args.out``)."""
    import torch

    if args.out.exists() and any(args.out.iterdir()):
        raise PrecisionError(f"{args.out}: exists and is not empty: pass a new --out")
    ref_path = args.reference_model_path or args.model_path
    ref_dtype = args.reference_dtype
    if ref_dtype == "auto":
        try:
            ref_dtype = reference_dtype(ref_path)
        except BenchError as err:
            raise _precision_error(err) from err
    # 1. the reference: its greedy tokens, then its logits over prompt + tokens
    with _loaded(args, ref_path, args.reference_device, ref_dtype) as ref:
        ids = _input_ids(args, ref)
        device = next(ref.model.parameters()).device
        with torch.no_grad():
            out = ref.model.generate(
                torch.tensor([ids], device=device), max_new_tokens=args.gen,
                do_sample=False, min_new_tokens=args.gen,
            )  # fmt: skip
        full = out[0].tolist()
        ref_logits = _logits(ref, full, len(ids))
    # 2. the target, and 3. the floor (the target's dtype on the reference device)
    with (
        _loaded(args, args.model_path, args.device, args.dtype) as target,
        _kernels(args.kernels, target) as kernels,
    ):
        tgt_logits = _logits(target, full, len(ids))
        if args.dtype == "auto":  # the folder's own dtype, named from here on
            args.dtype = str(next(target.model.parameters()).dtype).replace("torch.", "")
    # The floor is the *trusted* model in the target's dtype on the reference device:
    # the reference folder, never the target's (a wrong target would excuse itself).
    same_place = (
        args.reference_device == args.device and ref_path == args.model_path and not kernels
    )
    if same_place:
        floor_logits = tgt_logits
    else:
        with _loaded(args, ref_path, args.reference_device, args.dtype) as floor:
            floor_logits = _logits(floor, full, len(ids))
    metrics = logit_metrics(tgt_logits, ref_logits)
    floor_metrics = logit_metrics(floor_logits, ref_logits)
    verdict = judge_logits(metrics, args.dtype, floor=floor_metrics, k=args.k)
    report: dict[str, Any] = {
        "format": "pypto-precision-check", "version": 1, "ok": verdict.ok,
        "target": {"model": str(args.model_path), "device": args.device, "dtype": args.dtype,
                   "kernels": kernels},
        "reference": {"model": str(ref_path), "device": args.reference_device,
                      "dtype": ref_dtype},
        "floor": {"model": str(ref_path), "device": args.reference_device,
                  "dtype": args.dtype, "same_as_target": same_place},
        "input_ids": ids, "teacher_tokens": full[len(ids):],
        "logits": verdict.to_dict(), "floor_logits": floor_metrics.to_dict(),
        "first_divergent": None,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    if not verdict.ok or args.locate or args.replay_inputs:
        report["first_divergent"], report["module_compare"], local = _locate(
            args, ref_path, ref_dtype, ids
        )
        if local is not None:
            report["first_wrong_on_its_own"], report["local_compare"] = local
    atomic_write_text(args.out / "check.json", json.dumps(report, indent=1, allow_nan=False))
    atomic_write_text(args.out / "check.md", _markdown(report))
    return report


def reference_does_not_fit(model_path: str | Path, reference_device: str = "cpu") -> str | None:
    """Why a check of ``model_path`` would not fit ``reference_device``'s free memory (its
    reference, float64 under 1 GB else float32, held with half as much again while the
    next side loads), or None when it fits or cannot be told."""
    from pypto_capture.device import free_bytes

    from .multi.fit import checkpoint_bytes

    try:
        dtype = reference_dtype(Path(model_path))
        need = checkpoint_bytes(Path(model_path), "float32")
    except BenchError:
        return None
    if not need:
        return None
    need = need * (2 if dtype == "float64" else 1)
    free = free_bytes(reference_device)
    if free is None or need * 1.5 <= free:
        return None
    return (
        f"the {reference_device} {dtype} reference needs {need / 2**30:.1f} GiB, "
        f"{free / 2**30:.1f} GiB free there: run `pypto-precision check` on a larger host"
    )


def check_line(report: dict[str, Any]) -> str:
    """The one line a check ends with: the verdict, its numbers, and the module."""
    line = ("pass: " if report["ok"] else "DIVERGED: ") + str(report["logits"]["why"])
    first = report.get("first_divergent")
    if first:
        line += f"; first diverging module: {first}"
    if report.get("first_wrong_on_its_own"):
        line += f"; wrong on its own: {report['first_wrong_on_its_own']}"
    elif first and "local_compare" in report:
        line += f"; no replayed leaf module is wrong on its own: look in {first}'s own code"
    return line


def run_check(
    model_path: str | Path,
    *,
    out: str | Path,
    device: str = "cpu",
    dtype: str = "float32",
    gen: int = 8,
    seq: int = 16,
    prompt: str | None = None,
    seed: int = 0,
    reference_device: str = "cpu",
    reference_dtype: str = "auto",
    reference_model_path: str | Path | None = None,
    k: float = DEFAULT_K,
    locate: bool = False,
    replay_inputs: bool = False,
    kernels: bool = False,
    trust_remote_code: bool = False,
) -> dict[str, Any]:
    """``pypto-precision check`` as a library call (pypto-e2e's precision step): the check's
    document (check.json and check.md are written into ``out``, which must not hold files).
    ``dtype="auto"``: the folder's own dtype. Raises ``PrecisionError`` for bad input."""
    args = argparse.Namespace(
        model_path=Path(model_path), out=Path(out), device=device, dtype=dtype, gen=gen,
        seq=seq, prompt=prompt, seed=seed, reference_device=reference_device,
        reference_dtype=reference_dtype,
        reference_model_path=Path(reference_model_path) if reference_model_path else None,
        k=k, locate=locate, replay_inputs=replay_inputs, kernels=kernels,
        trust_remote_code=trust_remote_code,
    )  # fmt: skip
    return _check(args)


class CheckCommand:
    """``pypto-precision check``: target vs reference logits, teacher-forced, and the first
    diverging module when they fail."""

    name = "check"
    help = "target device/dtype vs a trusted reference: teacher-forced logits and the module"

    def configure(self, p: argparse.ArgumentParser) -> None:
        p.description = (
            "Compare the target (--device, --dtype) with a trusted reference (default: CPU, "
            "float64 under 1 GB of weights, else float32), teacher-forced over --gen steps of "
            "the reference's greedy tokens, judged against the noise floor (the target's "
            "dtype on the reference device). On a failure, every module is dumped and the "
            "first diverging one named. Exit 0 pass, 100 diverged."
        )
        _common(p)
        p.add_argument("--device", default="cpu", help="the target device")
        p.add_argument("--dtype", default="float32", help="the target dtype")
        p.add_argument("--gen", type=_positive, default=8, help="teacher-forced steps (default 8)")
        p.add_argument("--reference-device", default="cpu")
        p.add_argument("--reference-dtype", default="auto", help="auto: float64 under 1 GB")
        p.add_argument("--reference-model-path", type=Path,
                       help="another folder with the same weights (e.g. the original code)")  # fmt: skip
        p.add_argument("--k", type=k_type, default=DEFAULT_K, help="pass within k x the floor")
        p.add_argument("--out", type=Path, default=Path("precision-check"),
                       help="where check.json, check.md and the module compare go")  # fmt: skip
        p.add_argument("--locate", action="store_true",
                       help="dump and compare every module even when the logits pass")  # fmt: skip
        p.add_argument("--replay-inputs", action="store_true",
                       help="also re-run each leaf module of the reference on the target's "
                       "own inputs: the module wrong on its own, not only where error "
                       "accumulates")  # fmt: skip
        p.add_argument("--kernels", action="store_true",
                       help="switch on every applicable pypto.kernels plug-in on the target "
                       "(the pypto+graph arm's kernels, run eagerly)")  # fmt: skip
        p.add_argument("--json", action="store_true", help="print check.json on stdout")

    def run(self, args: argparse.Namespace) -> int:
        report = _check(args)
        if args.json:
            print(json.dumps(report, indent=1, allow_nan=False))
        print(f"pypto-precision: {check_line(report)}", file=sys.stderr)
        return EXIT.OK if report["ok"] else EXIT.DIVERGED


def _locate(args: argparse.Namespace, ref_path: Path, ref_dtype: str,
            ids: list[int]) -> tuple[str | None, str, tuple[str | None, str] | None]:  # fmt: skip
    """Dump target, reference and floor (tensor mode, the prompt) and compare them; with
    ``--replay-inputs`` also replay the reference's leaf modules on the target's inputs."""
    dumps = args.out / "dumps"
    sides = {
        "reference": (ref_path, args.reference_device, ref_dtype),
        "target": (args.model_path, args.device, args.dtype),
        "floor": (ref_path, args.reference_device, args.dtype),
    }
    for name, (path, device, dtype) in sides.items():
        with (
            _loaded(args, path, device, dtype) as loaded,
            _kernels(name == "target" and args.kernels, loaded),
        ):
            # Inputs always: the locator tells a module fed wrong numbers from one
            # making them (pypto_precision.Comparison.first_divergent).
            _dump(loaded, ids, dumps / name, "tensor", True,
                  DEFAULT_MAX_BYTES, {"seed": args.seed, "side": name})  # fmt: skip
    result = compare_dumps(read_dump(dumps / "target"), read_dump(dumps / "reference"),
                           floor=read_dump(dumps / "floor"), rule=Rule(k=args.k))  # fmt: skip
    write_reports(result, args.out / "modules")
    log.info("modules: %s", summary_line(result))
    first = result.first_divergent
    local = None
    if args.replay_inputs:
        with _loaded(args, ref_path, args.reference_device, ref_dtype) as ref:
            replayed = replay_local_errors(ref.model, read_dump(dumps / "target"),
                                           floor=read_dump(dumps / "floor"),
                                           rule=Rule(k=args.k))  # fmt: skip
        write_reports(replayed, args.out / "local")
        log.info("local (replayed inputs): %s", summary_line(replayed))
        wrong = replayed.first_divergent
        local = (wrong.module if wrong else None), str(args.out / "local" / "compare.md")
    return (first.module if first else None), str(args.out / "modules" / "compare.md"), local


def _logits(loaded: Any, full: list[int], prompt: int) -> Any:
    """Logits predicting each teacher token: positions prompt-1 .. len(full)-2, float32."""
    import torch

    device = next(loaded.model.parameters()).device
    with torch.no_grad():
        out = loaded.model(input_ids=torch.tensor([full], device=device), use_cache=False)
    return out.logits[0, prompt - 1 : len(full) - 1].float().cpu()


def _markdown(report: dict[str, Any]) -> str:
    lg = report["logits"]
    m = lg["metrics"]
    lines = [
        "# pypto-precision check",
        "",
        f"**{'pass' if report['ok'] else 'DIVERGED'}**: {lg['why']}",
        "",
        f"- target: {report['target']}",
        f"- reference: {report['reference']}",
        f"- noise floor: {report['floor']} (KL max {report['floor_logits']['kl_max']})",
        f"- teacher-forced steps: {m['steps']}; KL mean {m['kl_mean']}, p99 {m['kl_p99']}, max "
        f"{m['kl_max']}; top-1 agreement {m['top1_agreement']:.1%}; max |delta log-prob| "
        f"{m['max_abs_dlogprob']}; greedy prefix {m['greedy_prefix']}",
    ]
    if "local_compare" in report:
        lines.append(f"- first module wrong on its own (replayed on the target's inputs): "
                     f"{report.get('first_wrong_on_its_own')} (see {report['local_compare']})")  # fmt: skip
    if report.get("first_divergent") is not None or report.get("module_compare"):
        lines.append(f"- first diverging module: {report.get('first_divergent')} "
                     f"(see {report.get('module_compare')})")  # fmt: skip
    return "\n".join(lines) + "\n"


DUMP = DumpCommand()
CHECK = CheckCommand()
