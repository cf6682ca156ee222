"""Tiny model folders for the --nproc tests that pypto_testing does not make (yet)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def prefill_config(folder: Path, **overrides: Any) -> Any:
    """The --nproc tests' run: 2 ranks, CPU, prefill seq 8, eager, one iteration, fp32."""
    from pypto_bench import BenchConfig

    values: dict[str, Any] = {
        "model_path": str(folder),
        "device": "cpu",
        "regime": "prefill",
        "seq": 8,
        "arms": ("eager",),
        "warmup": 0,
        "iters": 1,
        "dtype": "float32",
        "measure_bandwidth": False,
        "nproc": 2,
    }
    return BenchConfig(**{**values, **overrides})


def make_folder(path: Path, model_type: str, **config: Any) -> Path:
    """A real, loadable folder of ``model_type`` with seeded random fp32 weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from pypto_testing.models import write_byte_tokenizer

    vocab = write_byte_tokenizer(path)
    cfg = AutoConfig.for_model(
        model_type,
        vocab_size=vocab,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        **config,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config.pad_token_id = 0
    model.save_pretrained(str(path), safe_serialization=True)
    return path.resolve()


def make_tiny_qwen3_moe(path: Path) -> Path:
    return make_folder(
        path,
        "qwen3_moe",
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        decoder_sparse_step=1,
        norm_topk_prob=True,
    )


def make_tiny_gpt2(path: Path) -> Path:
    """GPT-2 has no tensor-parallel plan in transformers."""
    return make_folder(path, "gpt2", n_embd=64, n_layer=2, n_head=4)


def reference_logits(folder: Path, ids: Any, *, trust_remote_code: bool = False) -> Any:
    """The single-process prefill logits, computed here, independently of the bench."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(folder), local_files_only=True, trust_remote_code=trust_remote_code
    )
    with torch.inference_mode():
        return model(input_ids=ids, use_cache=False).logits.float()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its exit status is left


def group_members(pgid: int) -> list[int]:
    """Live processes of the launcher's process group (the agent and the ranks)."""
    live = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                rest = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(rest[2]) == pgid and rest[0] != "Z":
                live.append(int(entry.name))
    return live


def descendants(root: int) -> set[int]:
    """Every live process under ``root`` (a /proc walk of parent pids)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            rest = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        children.setdefault(int(rest[1]), []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            if pid not in found:
                found.add(pid)
                todo.append(pid)
    return found
