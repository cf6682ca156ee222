"""One definition of the bench flags: add_bench_arguments / bench_config_from_args."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from pypto_bench import BenchConfig, add_bench_arguments, bench_config_from_args
from pypto_bench.args import FLAG_FOR, NOT_FLAGS
from pypto_bench.cli import _parser

# A config with every user-settable field away from its default.
_ALL_SET = BenchConfig(
    model_path="/models/x",
    device="cpu",
    regime="diffusion-generate",
    seq=5,
    gen=12,
    batch=3,
    arms=("graph", "pypto+graph"),
    warmup=0,
    iters=7,
    dtype="bfloat16",
    graph_backend="compile",
    compile_mode="max-autotune-no-cudagraphs",
    seed=11,
    attn_implementation="sdpa",
    trust_remote_code=True,
    ignore_eos=True,
    diffusion_steps=6,
    block_length=4,
    report_file="/tmp/r.json",
    measure_bandwidth=False,
    moe_routing="static",
    schedule="sequential",
    target_ci=2.5,
    max_iters=50,
    max_seconds=30.0,
)


def _argv_for(config: BenchConfig) -> list[str]:
    argv: list[str] = []
    for f in fields(BenchConfig):
        if f.name in NOT_FLAGS:
            continue
        value = getattr(config, f.name)
        flag = FLAG_FOR[f.name]
        if f.name in ("measure_bandwidth", "nproc_baseline"):  # store_false flags
            argv += [] if value else [flag]
        elif isinstance(value, bool):
            argv += [flag] if value else []
        elif isinstance(value, tuple):
            argv += [flag, ",".join(value)]
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def test_every_user_settable_field_has_a_flag_in_pypto_bench_run():
    settable = {f.name for f in fields(BenchConfig)} - NOT_FLAGS
    assert set(FLAG_FOR) == settable
    run = _parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    dests = {a.dest for a in run._actions}
    assert settable <= dests
    help_text = run.format_help()
    for flag in FLAG_FOR.values():
        assert flag in help_text


def test_all_fields_round_trip_through_a_parser():
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    ns = parser.parse_args(_argv_for(_ALL_SET))
    assert bench_config_from_args(ns) == _ALL_SET
    assert bench_config_from_args(parser.parse_args([])) == BenchConfig()
    # The canonical description round-trips too (e2e fingerprints it).
    again = bench_config_from_args(parser.parse_args(_argv_for(_ALL_SET)))
    assert again.to_dict() == _ALL_SET.to_dict()


def test_pypto_bench_run_parses_to_the_same_config():
    run_ns = _parser().parse_args(["run", *_argv_for(_ALL_SET)])
    assert bench_config_from_args(run_ns) == _ALL_SET


def test_group_defaults_exclude_and_overrides():
    parser = argparse.ArgumentParser()
    group = parser.add_argument_group("bench")
    parser.add_argument("--model-path", dest="model_path", default="/own")
    added = add_bench_arguments(
        group, defaults={"--iters": 9, "arms": ("eager",)}, exclude=["--model-path", "report_file"]
    )
    assert "model_path" not in added
    assert "report_file" not in added
    ns = parser.parse_args(["--seq", "4"])
    config = bench_config_from_args(ns, command_line=["e2e", "run"], report_file="/w/r.json")
    assert config.iters == 9
    assert config.arms == ("eager",)
    assert config.seq == 4
    assert config.model_path == "/own"  # the caller's own flag, same dest
    assert config.report_file == "/w/r.json"
    assert config.command_line == ["e2e", "run"]
    with pytest.raises(ValueError, match="not bench flags: itres"):
        add_bench_arguments(argparse.ArgumentParser(), defaults={"itres": 1})
    with pytest.raises(TypeError, match="no field"):
        bench_config_from_args(ns, itres=3)


def test_arms_flag_accepts_spaces_and_validate_rejects_unknown():
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    config = bench_config_from_args(parser.parse_args(["--arms", " eager , graph "]))
    assert config.arms == ("eager", "graph")
    bad = bench_config_from_args(parser.parse_args(["--arms", "eager,turbo"]))
    from pypto_bench import BadInputError

    with pytest.raises(BadInputError, match="unknown arm 'turbo'"):
        bad.validate()


def test_library_default_ignores_model_path_env_cli_reads_it(monkeypatch):
    monkeypatch.setenv("MODEL_PATH", "/from/env")
    assert BenchConfig().model_path is None
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    assert bench_config_from_args(parser.parse_args([])).model_path is None
    ns = _parser().parse_args(["run"])
    assert ns.model_path == "/from/env"
    ns = _parser().parse_args(["smoke"])
    assert ns.model_path == "/from/env"
