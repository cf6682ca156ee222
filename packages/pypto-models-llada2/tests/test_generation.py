"""Block-diffusion generation: the published algorithm, its cache, its captured step."""

import math

import pytest
import torch

from pypto_models_llada2 import (
    GenerationInputError,
    block_diffusion_generate,
    prepare_step,
    select_commits,
    steps_per_block_for,
    transfer_schedule,
)

MASK = 259  # the tiny tokenizer's <|mask|>


def _prompt(batch, length, seed=0):
    return torch.randint(3, 250, (batch, length), generator=torch.Generator().manual_seed(seed))


def _published_greedy(model, prompt, *, gen_length, block_length, steps, threshold, minimal_topk=1):
    """A literal, batch-1 transcription of the published generate(): full-prefix recompute
    with the float ``log(tril)`` block mask, ``confidence[0] > threshold``, ``topk(min(quota,
    masked))``; only the sampling is argmax (the documented temperature-0 deviation)."""
    steps = min(steps, gen_length // minimal_topk)
    prompt_length = prompt.shape[1]
    num_blocks = (prompt_length + gen_length + block_length - 1) // block_length
    total_length = num_blocks * block_length
    block_mask = torch.tril(torch.ones(num_blocks, num_blocks))
    attn = block_mask.repeat_interleave(block_length, 0).repeat_interleave(block_length, 1)
    attn = attn.unsqueeze(0).unsqueeze(0).log()
    position_ids = torch.arange(total_length).unsqueeze(0)
    x = torch.full((1, total_length), MASK, dtype=torch.long)
    x[:, :prompt_length] = prompt
    base, rem = divmod(block_length, steps)
    schedule = [base + (1 if i < rem else 0) for i in range(steps)]
    nfe = 0
    for num_block in range(prompt_length // block_length, num_blocks):
        end = (num_block + 1) * block_length
        cur_x = x[:, :end]
        for step in range(steps):
            active = cur_x[:, -block_length:] == MASK
            if active.sum() == 0:
                break
            logits = model(
                cur_x, attention_mask=attn[:, :, :end, :end], position_ids=position_ids[:, :end]
            ).logits
            probs = torch.softmax(logits[:, -block_length:].float(), dim=-1)
            x0_p, x0 = probs.max(dim=-1)
            nfe += 1
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            confidence = torch.where(active, x0_p, -torch.inf)
            high = confidence[0] > threshold
            if high.sum().item() >= schedule[step]:
                transfer[0] = high
            else:
                _, idx = torch.topk(confidence[0], k=min(schedule[step], int(active.sum().item())))
                transfer[0, idx] = True
            cur_x[:, -block_length:][transfer] = x0[transfer]
    return x[:, prompt_length : prompt_length + gen_length], nfe


@pytest.mark.parametrize(
    ("prompt_len", "steps", "threshold"),
    [(5, 8, 0.95), (16, 8, 0.95), (21, 4, 0.1), (3, 3, 0.3)],
    ids=["mid-block", "block-aligned", "threshold-commits", "uneven-quota"],
)
def test_greedy_equals_the_published_algorithm_with_and_without_cache(
    tiny_model, prompt_len, steps, threshold
):
    prompt = _prompt(1, prompt_len, seed=prompt_len)
    kw = {"gen_length": 29, "block_length": 8, "threshold": threshold}
    with torch.no_grad():
        expected, nfe = _published_greedy(tiny_model, prompt.clone(), steps=steps, **kw)
    for use_cache in (False, True):
        out = block_diffusion_generate(
            tiny_model,
            prompt,
            steps_per_block=steps,
            use_cache=use_cache,
            eos_early_stop=False,
            **kw,
        )
        assert torch.equal(out.generated(), expected), use_cache
        assert out.num_denoising_steps == nfe == sum(out.steps_per_block)
        assert len(set(expected[0].tolist())) > 5  # a real comparison, not one token repeated
    blocks = math.ceil((prompt_len + 29) / 8) - prompt_len // 8
    assert len(out.steps_per_block) == blocks
    # the cache costs one forward per prompt block and per finished (not last) block
    assert out.num_forward_passes == nfe + prompt_len // 8 + blocks - 1


def test_batched_rows_match_their_single_row_runs(tiny_model):
    prompt = _prompt(2, 11, seed=5)
    kw = {
        "gen_length": 20,
        "block_length": 8,
        "steps_per_block": 4,
        "threshold": 0.2,
        "eos_early_stop": False,
    }
    both = block_diffusion_generate(tiny_model, prompt, **kw).generated()
    for row in range(2):
        alone = block_diffusion_generate(tiny_model, prompt[row : row + 1], **kw).generated()
        assert torch.equal(both[row : row + 1], alone)


def test_temperature_zero_is_argmax_and_draws_no_random_numbers(tiny_model):
    prompt = _prompt(1, 7)
    kw = {"gen_length": 16, "block_length": 8, "steps_per_block": 8, "temperature": 0.0}
    torch.manual_seed(1)
    state = torch.get_rng_state()
    first = block_diffusion_generate(tiny_model, prompt, **kw)
    assert torch.equal(torch.get_rng_state(), state)  # the published code samples here
    torch.manual_seed(2)
    second = block_diffusion_generate(tiny_model, prompt, **kw)
    assert torch.equal(first.sequences, second.sequences)
    assert first.steps_per_block == second.steps_per_block


def test_seeded_sampling_is_reproducible(tiny_model):
    prompt = _prompt(1, 7)
    kw = {"gen_length": 24, "block_length": 8, "steps_per_block": 8, "temperature": 1.0}
    state = torch.get_rng_state()
    a = block_diffusion_generate(tiny_model, prompt, seed=11, **kw)
    b = block_diffusion_generate(tiny_model, prompt, seed=11, **kw)
    c = block_diffusion_generate(tiny_model, prompt, seed=12, **kw)
    assert torch.equal(torch.get_rng_state(), state)  # a seeded run leaves the global RNG alone
    assert torch.equal(a.sequences, b.sequences)
    assert not torch.equal(a.sequences, c.sequences)
    greedy = block_diffusion_generate(tiny_model, prompt, **{**kw, "temperature": 0.0})
    assert not torch.equal(a.sequences, greedy.sequences)


def test_stops_after_the_block_holding_eos_and_answers_up_to_it(tiny_model):
    prompt = _prompt(1, 4, seed=9)
    kw = {"gen_length": 40, "block_length": 8, "steps_per_block": 8}
    full = block_diffusion_generate(tiny_model, prompt, eos_early_stop=False, **kw)
    tokens = full.generated()[0].tolist()
    # a token whose first appearance lies in the third block of the generation (positions 4..)
    pos = next(i for i, t in enumerate(tokens) if 4 + i >= 16 and t not in tokens[:i])
    eos = tokens[pos]
    out = block_diffusion_generate(tiny_model, prompt, eos_id=eos, **kw)
    block_of_eos = (4 + pos) // 8
    assert len(out.steps_per_block) == block_of_eos + 1  # blocks 0..block_of_eos ran, no more
    assert out.tokens_per_row() == [pos + 1]
    assert out.answer()[0].tolist() == tokens[: pos + 1]
    assert torch.equal(
        out.generated()[0, : (block_of_eos + 1) * 8 - 4],
        full.generated()[0, : (block_of_eos + 1) * 8 - 4],
    )
    assert (out.generated()[0, (block_of_eos + 1) * 8 - 4 :] == MASK).all()  # never generated
    # the published entry point: generated ids up to and including EOS
    answer = tiny_model.generate(inputs=prompt, gen_length=40, block_length=8, steps=8, eos_id=eos)
    assert answer[0].tolist() == tokens[: pos + 1]


def test_select_commits_follows_the_published_rule():
    m = MASK
    block = torch.tensor([[m, m, 7, m, m]])
    tokens = torch.tensor([[10, 11, 12, 13, 14]])
    conf = torch.tensor([[0.99, 0.2, 0.999, 0.97, 0.5]])
    # two masked positions pass 0.95 and the quota is 2: both, nothing else
    assert select_commits(block, tokens, conf, mask_id=m, quota=2, threshold=0.95).tolist() == [
        [10, m, 7, 13, m]
    ]
    # quota 3 > passing: the three most confident masked positions; 7 is never re-masked
    assert select_commits(block, tokens, conf, mask_id=m, quota=3, threshold=0.95).tolist() == [
        [10, m, 7, 13, 14]
    ]
    # a quota beyond the masked positions takes what is masked
    assert select_commits(block, tokens, conf, mask_id=m, quota=5, threshold=0.95).tolist() == [
        [10, 11, 7, 13, 14]
    ]
    # quota 0 (more steps than positions): only the confident ones
    assert select_commits(block, tokens, conf, mask_id=m, quota=0, threshold=0.98).tolist() == [
        [10, m, 7, m, m]
    ]


def test_the_step_schedule():
    assert transfer_schedule(32, 32) == [1] * 32
    assert transfer_schedule(32, 5) == [7, 7, 6, 6, 6]
    assert transfer_schedule(4, 6) == [1, 1, 1, 1, 0, 0]
    assert steps_per_block_for(16, 64, 32, None) == 32  # the published default
    assert steps_per_block_for(16, 64, 32, 64) == 21  # 3 blocks hold generated positions
    assert steps_per_block_for(0, 64, 32, 64) == 32


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"gen_length": 0}, "gen_length must be >= 1"),
        ({"block_length": 0}, "block_length must be >= 1"),
        ({"steps_per_block": 0}, "steps must be >= 1"),
        ({"minimal_topk": 50}, "minimal_topk 50 exceeds gen_length"),
        ({"threshold": float("nan")}, "threshold must be a finite number"),
        ({"temperature": -1.0}, "temperature must be >= 0"),
        ({"input_ids": torch.tensor([[5, MASK, 6]])}, "prompt contains the mask token id 259"),
        ({"input_ids": torch.zeros(1, 0, dtype=torch.long)}, "non-empty [batch, prompt_len]"),
        ({"input_ids": torch.ones(1, 3)}, "integer ids"),
    ],
)
def test_bad_generation_inputs_are_one_line(tiny_model, kwargs, needle):
    args = {"input_ids": _prompt(1, 4), "gen_length": 16, **kwargs}
    with pytest.raises(GenerationInputError) as info:
        block_diffusion_generate(tiny_model, args.pop("input_ids"), **args)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


class _CountingBackend:
    """pypto-capture's compile backend, counting captures."""

    def __init__(self):
        from pypto_capture import make_backend

        self.inner = make_backend("compile", "cpu")
        self.name = self.inner.name
        self.captures = 0

    def capture(self, fn, *, warmup=3):
        self.captures += 1
        return self.inner.capture(fn, warmup=warmup)


@pytest.mark.slow
def test_the_step_is_captured_once_and_gives_the_eager_tokens(tiny_model):
    prompt = _prompt(2, 13, seed=3)
    kw = {
        "gen_length": 27,
        "block_length": 8,
        "steps_per_block": 4,
        "threshold": 0.3,
        "eos_early_stop": False,
    }
    eager = block_diffusion_generate(tiny_model, prompt, **kw)
    backend = _CountingBackend()
    runner = prepare_step(  # capture ahead of time, outside any timing
        tiny_model,
        batch_size=2,
        prompt_length=13,
        gen_length=27,
        block_length=8,
        step_backend=backend,
    )
    assert backend.captures == 1
    assert runner.capture_s > 0
    first = block_diffusion_generate(tiny_model, prompt, step_backend=backend, **kw)
    second = block_diffusion_generate(tiny_model, prompt, step_backend=backend, **kw)
    assert backend.captures == 1  # one capture serves every step of every block, and the next call
    assert torch.equal(first.sequences, eager.sequences)
    assert torch.equal(second.sequences, eager.sequences)
    assert first.path == "block-cache, captured step (compile)"
    assert eager.path == "block-cache, eager step"
    assert first.steps_per_block == eager.steps_per_block


def test_pypto_capture_exact_moe_drives_the_experts_unchanged(tiny_model):
    """pypto-bench's graph arm installs pypto-capture's exact MoE: the router stays LLaDA2's
    (grouped top-k, sigmoid + bias, scaling); only the experts' schedule is replaced."""
    from pypto_capture import apply_exact_moe, find_experts

    assert [e.name for e in find_experts(tiny_model)] == [
        "model.layers.1.mlp.experts",
        "model.layers.2.mlp.experts",
    ]
    prompt = _prompt(2, 9, seed=4)
    kw = {
        "gen_length": 20,
        "block_length": 8,
        "steps_per_block": 4,
        "threshold": 0.3,
        "eos_early_stop": False,
    }
    own = block_diffusion_generate(tiny_model, prompt, **kw)
    with apply_exact_moe(tiny_model) as handle:
        assert len(handle.modules) == 2
        theirs = block_diffusion_generate(tiny_model, prompt, **kw)
    assert torch.equal(own.sequences, theirs.sequences)
