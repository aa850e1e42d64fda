"""The decode path: chunked prefill, continuous batching, prefix sharing, per-seed sampling, the KV budget,
activation checkpointing, the compiled step, and the operators on CUDA tensors."""

from __future__ import annotations

import pytest
import torch

from floattol import assert_close_sums
from test_engine_helpers import K_TINY, K_TINY_GRAD, assert_greedy_agrees, engine_logits, logit_atol, tiny_engine
from lorapop.engine import SamplingParams, TrainSample
from lorapop.engine.kvsize import PAGE, token_bytes
from lorapop.engine.paged import PagedKVCache

PROMPTS = [[1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41], [1, 7, 8], [1, 40, 41, 42, 43, 44], [1, 3]]


def _hidden(eng, prompt, chunk):
    """Final hidden states of ``prompt`` prefilled into slot 0 of a fresh cache, ``chunk`` positions at a time."""
    dec = eng.decoder()
    cache = PagedKVCache(dec.n_layers, 2, dec.n_kv, dec.head_dim, 64, 8, torch.float32, eng.device)
    cache.set_rows([1], [[5, 2, 7, 0]])  # slot 1's pages, out of order
    eng._ctx.set(torch.tensor([1]))
    outs = []
    try:
        with torch.no_grad():
            for s in range(0, len(prompt), chunk):
                piece = prompt[s:s + chunk]
                pos = torch.arange(s, s + len(piece))[None]
                outs.append(dec.forward(cache, torch.tensor([piece]), pos, pos, s + len(piece),
                                        torch.tensor([1]), None))
    finally:
        eng._ctx.set(None)
    return torch.cat(outs, dim=1)[0], cache


def test_chunked_prefill_gives_the_logits_of_one_prefill_and_of_hf():
    eng = tiny_engine()
    prompt = PROMPTS[0]
    one, c1 = _hidden(eng, prompt, 64)
    chunked, c3 = _hidden(eng, prompt, 3)
    dec = eng._dec
    torch.testing.assert_close(dec.logits(chunked), dec.logits(one), atol=logit_atol(), rtol=0)
    at = (c1.table[1, torch.arange(len(prompt)) // PAGE] * PAGE + torch.arange(len(prompt)) % PAGE)
    mine = torch.zeros(c1.k[0].shape[0], dtype=torch.bool)
    mine[at] = True
    for a, b in zip(c1.k + c1.v, c3.k + c3.v):  # a layer's keys and values: at most a logit's path
        assert_close_sums(a[at], b[at], K_TINY)
        assert torch.count_nonzero(a[~mine]) == 0  # nothing else written: rows write only their own pages
    torch.testing.assert_close(dec.logits(one), engine_logits(eng, prompt, 1), atol=logit_atol(), rtol=0)


def test_greedy_matches_hf_generate_per_adapter():
    eng = tiny_engine()
    out = eng.generate(PROMPTS, [0, 1, -1, 2], SamplingParams(max_new_tokens=6, greedy=True, min_new_tokens=6))
    for prompt, a, c in zip(PROMPTS, [0, 1, -1, 2], out):
        eng._ctx.set(torch.tensor([a]))
        try:
            ref = eng.model.generate(torch.tensor([prompt]), max_new_tokens=6, min_new_tokens=6, do_sample=False)
        finally:
            eng._ctx.set(None)
        assert_greedy_agrees(c.token_ids, ref[0, len(prompt):].tolist(), eng, prompt, a)


def test_a_rows_sample_depends_only_on_its_seed():
    eng = tiny_engine()
    p = SamplingParams(max_new_tokens=8, temperature=1.0)
    together = eng.generate(PROMPTS, [0, 1, 2, 0], p, seeds=[11, 12, 13, 14])
    alone = eng.generate([PROMPTS[2]], [2], p, seeds=[13])[0]
    shuffled = eng.generate(PROMPTS[::-1], [0, 2, 1, 0], p, seeds=[14, 13, 12, 11])
    assert together[2].token_ids == alone.token_ids == shuffled[1].token_ids
    other = eng.generate(PROMPTS, [0, 1, 2, 0], p, seeds=[11, 12, 99, 14])
    assert other[2].token_ids != together[2].token_ids  # the seed really drives the sample
    assert [c.token_ids for i, c in enumerate(other) if i != 2] == [c.token_ids for i, c in enumerate(together)
                                                                    if i != 2]


@pytest.mark.parametrize("interval", [1, 3])
def test_refilled_slots_give_the_tokens_of_a_fresh_batch(interval):
    prompts = PROMPTS * 3
    ids = [0, 1, 2, -1, 1, 2, 0, 0, 2, 1, -1, 0]
    p = SamplingParams(max_new_tokens=9, temperature=1.0)
    fresh = tiny_engine(gen_batch_size=64).generate(prompts, ids, p, seeds=list(range(12)))
    eng = tiny_engine(gen_batch_size=3, stop_check_interval=interval)
    eng.eos_ids = sorted(set(eng.eos_ids) | {t for c in fresh[:4] for t in c.token_ids[2:3]})  # early stops
    fresh = tiny_engine(gen_batch_size=64)
    fresh.eos_ids = eng.eos_ids
    want = fresh.generate(prompts, ids, p, seeds=list(range(12)))
    got = eng.generate(prompts, ids, p, seeds=list(range(12)))
    assert eng.kv.cache.n_slots == 3
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert [c.finish_reason for c in got] == [c.finish_reason for c in want]
    assert {c.finish_reason for c in want} == {"eos", "length"}  # rows really stopped at different lengths


def test_answers_to_one_prompt_share_one_prefill():
    eng = tiny_engine(gen_batch_size=4)
    dec = eng.decoder()
    calls = []
    orig = dec.forward

    def counting(cache, tokens, *a, **k):
        if tokens.shape[1] > 1:  # a prefill forward
            calls.append(tokens.shape[0])
        return orig(cache, tokens, *a, **k)

    dec.forward = counting
    p = SamplingParams(max_new_tokens=5, temperature=1.0)
    shared = eng.generate([PROMPTS[0]] * 6, [1] * 6, p, seeds=list(range(6)))
    assert sum(calls) == 1  # six answers (over two fills of 4 slots): one prefilled row
    calls.clear()
    eng.generate([PROMPTS[0]] * 2, [1, 2], p)
    assert sum(calls) == 2  # another adapter's K/V differ: no sharing across adapters
    dec.forward = orig
    alone = [tiny_engine().generate([PROMPTS[0]], [1], p, seeds=[k])[0].token_ids for k in range(6)]
    assert [c.token_ids for c in shared] == alone


def test_kv_budget_bounds_the_pages_and_says_when_a_row_cannot_fit():
    eng = tiny_engine(gen_batch_size=64)
    dims, dtype = eng.cache_dims()
    per = PAGE * token_bytes(*dims, dtype)
    eng.cfg.kv_cache_gib = (512 // PAGE * 2.5 + 1) * per / 2**30  # two and a half rows of the capacity, 512
    p = SamplingParams(max_new_tokens=4, greedy=True)
    out = eng.generate(PROMPTS, [0, 1, 2, 0], p)
    assert eng.kv.cache.n_pages == 512 // PAGE * 5 // 2 and eng.kv.plan.full_rows == 2
    assert [c.token_ids for c in out] == [c.token_ids for c in tiny_engine().generate(PROMPTS, [0, 1, 2, 0], p)]
    eng.kv.release()
    eng.cfg.kv_cache_gib = 0.5 * 512 * per / PAGE / 2**30
    with pytest.raises(RuntimeError, match="KV cache budget"):
        eng.generate(PROMPTS, [0, 1, 2, 0], p)


def test_activation_checkpointing_gives_the_same_gradients(monkeypatch):
    """Checkpointing every layer, or one in two, recomputes those layers' forwards in backward and leaves the
    gradients as they are without it."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    from lorapop.engine.lora import MultiLoRALinear

    samples = [TrainSample(PROMPTS[k % 4], [5, 6, 7, 8, 9][: 2 + k % 3], k % 3, 1.0 - 0.5 * k) for k in range(6)]
    grads, calls = [], {}
    forward = MultiLoRALinear.forward
    arms = ((False, 1), (True, 1), (True, 2))
    for on, every in arms:
        eng = tiny_engine(gradient_checkpointing=on, gradient_checkpointing_every=every, train_micro_batch_size=3)
        calls[on, every] = 0

        def counting(self, x, arm=(on, every)):
            calls[arm] += 1
            return forward(self, x)

        monkeypatch.setattr(MultiLoRALinear, "forward", counting)
        eng.optimizer.zero_grad()
        eng.accumulate_gradients(samples)
        monkeypatch.setattr(MultiLoRALinear, "forward", forward)
        grads.append([p.grad.clone() for p in eng._params])
        assert not any(m.training for m in eng.model.modules())  # flags restored
    for g in grads[1:]:
        for a, b in zip(grads[0], g):
            assert_close_sums(a, b, K_TINY_GRAD, scale=float(b.abs().max()))
    n = sum(isinstance(m, GradientCheckpointingLayer) for m in eng.model.modules())
    assert n >= 2
    assert calls[True, 1] == 2 * calls[False, 1]  # every layer recomputed in backward: checkpointing really ran
    assert calls[True, 2] * n == calls[False, 1] * (n + -(-n // 2))  # layers 0, 2, ... recomputed


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_operators_on_cuda_adapters_in_the_thread_pool():
    from lorapop.evolve.operators import make_child

    g = torch.Generator().manual_seed(0)
    parents = [{f"m{i}": (torch.randn(8, 64, generator=g).cuda(), torch.randn(48, 8, generator=g).cuda())
                for i in range(12)} for _ in range(2)]
    torch.set_num_threads(max(2, torch.get_num_threads()))
    for op in ("svd_merge", "average"):
        child, _ = make_child(op, parents, generator=torch.Generator(device="cuda").manual_seed(1), scaling=2.0,
                              fitness=[1.0, 0.0])
        assert all(a.is_cuda and b.is_cuda for a, b in child.values())


def test_one_cache_per_run_even_when_the_budget_holds_fewer_than_gen_batch_size():
    """Six calls of varied row counts and prompt lengths under a budget of 3 rows at the capacity (gen_batch_size 8)
    allocate one cache, whose shape (a compiled step's guard) never changes."""
    eng = tiny_engine(gen_batch_size=8, max_model_len=200)
    dims, dtype = eng.cache_dims()
    eng.cfg.kv_cache_gib = (3.5 * 256 / PAGE + 1) * PAGE * token_bytes(*dims, dtype) / 2**30
    p = SamplingParams(max_new_tokens=5, temperature=1.0)
    for n_rows, plen in ((1, 3), (5, 11), (12, 60), (3, 7), (9, 120), (2, 30)):
        prompts = [[1] + [(7 * k + j) % 50 + 3 for j in range(plen - 1)] for k in range(n_rows)]
        out = eng.generate(prompts, [k % 3 for k in range(n_rows)], p)
        assert len(out) == n_rows and all(1 <= len(c.token_ids) <= 5 for c in out)
        assert (eng.kv.cache.n_slots, eng.kv.cache.max_len, eng.kv.cache.n_pages) == (8, 256, 56)
    assert eng.kv.allocations == 1
