"""DecodeStepRunner vs model.generate(do_sample=False) on tiny transformers models (fp32).

One real torch.compile (fullgraph, static shapes) per architecture: the captured step is
replayed for two different prompts, so the second prompt also proves the graph is
reused (a recompile during replay raises).
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
models = pytest.importorskip("pypto_testing.models")

import os  # noqa: E402

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from pypto_capture import DecodeStepRunner, PyptoCaptureError  # noqa: E402

ARCHS = ["llama", "qwen2", "qwen3", "gemma3"]
NEW = 14  # > gemma3's sliding window (8) + prompt: the ring buffer wraps
MAX_LEN = 32


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {a: models.make_tiny_model(root / a, a) for a in [*ARCHS, "mistral"]}


def _load(path):
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


def _prompts(seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 250, (2, 9), generator=g)
    am = torch.ones_like(ids)
    ids[1, :3] = 0  # left padding on the second row
    am[1, :3] = 0
    return ids, am


def _reference(model, ids, am, n=NEW):
    # Plain greedy (no min_new_tokens: it would mask EOS logits); generate stops a row at
    # EOS and pads it, so comparisons run up to and including each row's first EOS.
    out = model.generate(ids, attention_mask=am, do_sample=False, max_new_tokens=n, pad_token_id=0)
    return out[:, ids.shape[1] :]


def _assert_same_until_eos(got, ref, what=""):
    eos = 2
    compared = 0
    for b in range(ref.shape[0]):
        row = ref[b].tolist()
        n = row.index(eos) + 1 if eos in row else len(row)
        assert got[b, :n].tolist() == row[:n], f"{what} row {b}:\n{got[b].tolist()}\n{row}"
        compared += n
    assert compared >= ref.shape[1], "prompts degenerate: almost nothing was compared"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("arch", ARCHS)
def test_compiled_decode_matches_generate(model_dirs, arch):
    model = _load(model_dirs[arch])
    runner = DecodeStepRunner(model, batch_size=2, max_cache_len=MAX_LEN, backend="compile")
    assert runner.backend_name == "compile"
    for seed in (0, 1):
        ids, am = _prompts(seed)
        ref = _reference(model, ids, am)
        runner.reset()
        first = runner.prefill(ids, am)
        rest = runner.decode(first, NEW - 1)
        got = torch.cat([first[:, None], rest], dim=1)
        _assert_same_until_eos(got, ref, f"{arch} seed {seed}")
        assert runner.captured
        assert runner.cache.seq_length() == ids.shape[1] + NEW - 1


def test_fused_decode_on_cpu_matches_generate(model_dirs):
    """The fused backend's CPU form (its compile stage; no device graph) keeps the tokens."""
    model = _load(model_dirs["llama"])
    runner = DecodeStepRunner(model, batch_size=2, max_cache_len=MAX_LEN, backend="fused")
    ids, am = _prompts(0)
    got = runner.generate(ids, am, max_new_tokens=NEW)
    _assert_same_until_eos(got, _reference(model, ids, am), "llama fused")
    assert runner.backend_name == "fused (compile)"


@pytest.mark.parametrize("arch", [*ARCHS, "mistral"])
def test_eager_static_cache_path_matches_generate(model_dirs, arch):
    model = _load(model_dirs[arch])
    ids, am = _prompts(3)
    runner = DecodeStepRunner(model, batch_size=2, max_cache_len=MAX_LEN, backend="eager")
    got = runner.generate(ids, am, max_new_tokens=NEW)
    _assert_same_until_eos(got, _reference(model, ids, am), arch)


def test_capture_before_prefill_and_usage_errors(model_dirs):
    model = _load(model_dirs["llama"])
    runner = DecodeStepRunner(model, batch_size=1, max_cache_len=12, backend="eager")
    with pytest.raises(PyptoCaptureError, match="prefill"):
        runner.decode(torch.zeros(1, dtype=torch.long), 2)
    runner.capture()  # sizes the cache with a dummy token, then rewinds
    ids = torch.tensor([[5, 6, 7, 8]])
    got = runner.generate(ids, max_new_tokens=5)
    _assert_same_until_eos(got, _reference(model, ids, torch.ones_like(ids), n=5))
    with pytest.raises(PyptoCaptureError, match="max_cache_len"):
        runner.decode(got[:, -1], 20)
    with pytest.raises(PyptoCaptureError, match="batch_size"):
        runner.prefill(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(PyptoCaptureError, match="left-padded"):
        runner.prefill(ids, torch.tensor([[1, 1, 1, 0]]))


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (none visible to torch)"
)
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize(
    ("backend", "ran"), [("cudagraph", "cudagraph"), ("auto", "fused (compile+cudagraph)")]
)
def test_cudagraph_decode_matches_generate(model_dirs, arch, backend, ran):
    model = _load(model_dirs[arch]).to("cuda")
    runner = DecodeStepRunner(model, batch_size=2, max_cache_len=MAX_LEN, backend=backend)
    for seed in (0, 1):  # the second prompt replays the same graph
        ids, am = _prompts(seed)
        ids, am = ids.cuda(), am.cuda()
        got = runner.generate(ids, am, max_new_tokens=NEW)
        _assert_same_until_eos(
            got.cpu(), _reference(model, ids, am).cpu(), f"{arch} cuda seed {seed}"
        )
        assert runner.backend_name == ran  # auto did not fall back


def _npu_skip_reason():
    from pypto_capture import npu_available

    if npu_available() or os.environ.get("PYPTO_REQUIRE_NPU") == "1":
        return None  # under `nox -s cann` a missing NPU must fail, not skip
    return "needs an Ascend NPU (torch_npu with a visible device)"


@pytest.mark.npu
@pytest.mark.skipif(_npu_skip_reason() is not None, reason=str(_npu_skip_reason()))
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_npugraph_decode_matches_generate(model_dirs, arch):
    from pypto_capture import resolve_device

    dev = resolve_device("npu:0")
    model = _load(model_dirs[arch]).to(dev)
    runner = DecodeStepRunner(model, batch_size=2, max_cache_len=MAX_LEN, backend="auto")
    assert runner.backend_name == "npugraph"
    try:
        ids, am = _prompts(0)
        ids, am = ids.to(dev), am.to(dev)
        got = runner.generate(ids, am, max_new_tokens=NEW)
        _assert_same_until_eos(got.cpu(), _reference(model, ids, am).cpu(), f"{arch} npu")
    finally:
        runner.close()
