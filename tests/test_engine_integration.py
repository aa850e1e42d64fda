"""TorchEngine on the real embedded SmolLM2-135M-Instruct (slow). The engine wraps modules in place, so this module
loads its own copy of the model instead of touching the shared session fixture."""

from __future__ import annotations

import pytest
import torch

from lorapop.engine import EngineConfig, SamplingParams, TorchEngine, TrainSample
from floattol import sum_tol
from test_engine_helpers import K_REAL, K_REAL_GRAD, REAL_LOGIT_SCALE, assert_greedy_agrees, randomize_adapters

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def eng():
    from lorapop.model import load_base_model

    model, tok = load_base_model("embedded")
    e = TorchEngine(model, tok, 3, EngineConfig(device="cpu", lr=1e-3, train_micro_batch_size=8), seed=0)
    randomize_adapters(e, seed=2, scale=0.05, slots=[0, 1])  # slot 2 stays fresh (B = 0)
    yield e
    e.close()


@pytest.fixture(scope="module")
def eng64():
    """The same engine in float64, the numerical reference: an identity checked here is not buried under float32
    rounding through 30 layers (in float32 the mixed-vs-alone difference reached 1.08x its tolerance on an AVX2
    EPYC while passing on AVX-512 and AMX Xeons: a tolerance fitted to one CPU's rounding)."""
    from lorapop.model import load_base_model

    model, tok = load_base_model("embedded", dtype="float64")
    e = TorchEngine(model, tok, 3, EngineConfig(device="cpu", dtype="float64", lr=1e-3, train_micro_batch_size=8),
                    seed=0)
    randomize_adapters(e, seed=2, scale=0.05, slots=[0, 1])  # slot 2 stays fresh (B = 0)
    yield e
    e.close()


@pytest.mark.parametrize("equal_runs", [False, True])
def test_real_mixed_batch_gradient_equals_each_adapter_alone(eng64, equal_runs):
    eng = eng64
    assert all(p.dtype == torch.float64 for p in eng._params)  # master weights follow the float64 base
    p1, p2 = eng.chat_prompt("Hi"), [1, 504, 3458, 28, 601]
    samples = [TrainSample(p1, [504, 3458, 28], 0, 1.0), TrainSample(p2, [601, 1010, 45, 11, 7], 1, -0.7),
               TrainSample(p2[:3], [28, 29], 0, 0.4), TrainSample(p1[:9], [5, 6, 7, 8], 2, 1.3)]
    if equal_runs:  # two rows per adapter: the micro-batch takes the [G, L * t, d] bmm path of lora.py
        samples += [TrainSample(p1[:5], [9, 10], 1, 0.5), TrainSample(p2, [3, 4, 5], 2, -0.2)]

    def grads(ss):
        eng.optimizer.zero_grad()
        eng.accumulate_gradients(ss)
        out = [p.grad.clone() for p in eng._params]
        eng.optimizer.zero_grad()
        return out

    mixed = grads(samples)
    # Equal up to float64 summation order over the gradient's reduction length (tests/floattol.py), relative to its
    # scale: about 3e-12 of the largest entry, where a normalisation or cross-adapter bug is O(1).
    rel = sum_tol(torch.float64, K_REAL_GRAD)
    for a in range(3):
        alone = grads([s for s in samples if s.adapter_id == a])
        nonzero = 0
        for gm, ga in zip(mixed, alone):
            assert gm.dtype == torch.float64
            scale = max(float(gm[a].abs().max()), 1e-300)
            assert float((gm[a] - ga[a]).abs().max()) <= rel * scale
            assert float((gm[a] - ga[a]).norm()) <= rel * max(float(ga[a].norm()), 1e-300)
            nonzero += int(torch.count_nonzero(ga[a]))
        assert nonzero > 0


def test_real_generation_base_rows_and_fresh_adapter_equal_hf_greedy(eng):
    prompt = eng.chat_prompt("Write a Python function that reverses a string.")
    short = eng.chat_prompt("Hi")
    p = SamplingParams(max_new_tokens=8, greedy=True)
    out = eng.generate([prompt, short, prompt, prompt], [0, 1, -1, 2], p)
    eng._ctx.set(None)
    ref = eng.model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=8, do_sample=False)
    want = ref[0, len(prompt):].tolist()
    # a -1 row inside a mixed, left-padded batch == plain HF greedy (other batch shapes: up to a near-tie)
    assert_greedy_agrees(out[2].token_ids, want, eng, prompt, -1, atol=sum_tol(torch.float32, K_REAL,
                                                                             REAL_LOGIT_SCALE))
    assert out[3].token_ids == out[2].token_ids  # a fresh adapter (B = 0) adds exact zeros: bitwise the base row
    assert out[2].text == eng.tokenizer.decode(out[2].token_ids, skip_special_tokens=True)


def test_real_sampling_is_reproducible_per_seed(eng):
    prompt = eng.chat_prompt("Name a fruit.")
    p = SamplingParams(max_new_tokens=6, temperature=0.9, top_p=0.95)
    a = eng.generate([prompt, prompt, prompt], [0, 1, -1], p, seeds=[1, 2, 3])
    b = eng.generate([prompt], [1], p, seeds=[2])
    assert a[1].token_ids == b[0].token_ids


def test_real_chat_model_stops_at_im_end(eng):
    assert eng.tokenizer.convert_tokens_to_ids("<|im_end|>") in eng.eos_ids
    prompts = [eng.chat_prompt("What is 2+2? Answer with a number only."), eng.chat_prompt("hi")]
    out = eng.generate(prompts, [-1, -1], SamplingParams(max_new_tokens=16, greedy=True))
    assert all(o.finish_reason == "eos" and o.token_ids[-1] in eng.eos_ids for o in out)
    assert "4" in out[0].text and "<|im_end|>" not in out[0].text
    assert len(out[0].token_ids) != len(out[1].token_ids)  # one row left the batch before the other


def test_real_train_step_moves_only_its_adapter(eng):
    prompt, comp = eng.chat_prompt("Say a number."), [33, 34, 35]
    before = eng.token_logprobs([prompt] * 3, [comp] * 3, [0, 1, 2])
    for _ in range(2):
        stats = eng.train_step([TrainSample(prompt, comp, 2, 1.0)])
    after = eng.token_logprobs([prompt] * 3, [comp] * 3, [0, 1, 2])
    assert sum(after[2]) > sum(before[2]) + 1e-3
    assert after[0] == before[0] and after[1] == before[1]
    assert stats[2]["n_tokens"] == 3 and stats[2]["grad_norm"] > 0


def test_real_compiled_greedy_decode_equals_eager():
    """The compiled step (inductor, dense LoRA path) on the embedded model gives the eager step's greedy
    tokens, for an adapted row and a base row (the first generate compiles the declared set: 1 graph, since
    ``engine.compile_nucleus`` is off), and a sampled call that cuts a nucleus decodes eagerly on the
    compiled engine (the eager engine's tokens), compiling nothing.
    Kept to 8 tokens, and to the embedded model's
    first 4 of 30 layers (its weights, hidden size, 9 query / 3 KV heads and vocabulary): inductor lowers every layer
    with the same code, so the other 26 compile the same kernels again; the whole model's compile took about 5 min
    on a 2-core AVX2 EPYC, most of the suite's longest tests. More buckets or tokens would test the same code again."""
    from torch._dynamo.utils import counters

    from lorapop.model import load_base_model

    model, tok = load_base_model("embedded")
    model.model.layers = model.model.layers[:4]
    model.config.num_hidden_layers = 4
    eng = TorchEngine(model, tok, 3, EngineConfig(device="cpu", lr=1e-3), seed=0)
    randomize_adapters(eng, seed=2, scale=0.05, slots=[0, 1])
    prompts = [eng.chat_prompt("Write a Python function that reverses a list."), eng.chat_prompt("Name a fruit.")]
    p = SamplingParams(max_new_tokens=8, min_new_tokens=8, greedy=True)  # rows end together: one bucket
    cut = SamplingParams(max_new_tokens=8, temperature=0.9, top_p=0.9)
    want = [c.token_ids for c in eng.generate(prompts, [0, -1], p)]
    want_cut = [c.token_ids for c in eng.generate(prompts, [0, -1], cut, seeds=[5, 6])]
    torch._dynamo.reset()
    counters.clear()
    eng.cfg.compile = True
    try:
        got = [c.token_ids for c in eng.generate(prompts, [0, -1], p)]
        got_cut = [c.token_ids for c in eng.generate(prompts, [0, -1], cut, seeds=[5, 6])]
        assert eng.decode_compile.after_warmup == 0 and eng.decode_shapes().graphs == 1
    finally:
        eng.close()
    assert got == want and got_cut == want_cut
    assert counters["stats"]["unique_graphs"] == 1  # the declared set: no nucleus branch, and no compile after it
