"""The paged KV cache (the one cache kind): each row's tokens whatever the rows beside it, capacity that follows the
rows' real lengths, recompute preemption when the pages run out, shared prefix pages, the fit rule, and a decode
step that reads each row's own length, deterministically."""

from __future__ import annotations

import random

import pytest
import torch

from floattol import sum_tol
from test_engine_helpers import K_TINY, logprob_atol, tiny_engine
from lorapop.engine import SamplingParams
from lorapop.engine.kvsize import PAGE, token_bytes
from lorapop.engine.paged import PagedKVCache


def _rows(seed: int, n: int, shared: int = 3):
    """``n`` requests: prompts of 2 to 40 tokens, every ``shared``-th one repeated (a task's answers), on adapters
    -1..2, with per-row caps from 1 to 60 tokens."""
    rng = random.Random(seed)
    prompts, ids, caps = [], [], []
    for k in range(n):
        if k % shared == 1:
            prompts.append(list(prompts[-1]))
            ids.append(ids[-1])
        else:
            prompts.append([1] + [rng.randint(3, 900) for _ in range(rng.randint(1, 39))])
            ids.append(rng.choice([-1, 0, 1, 2]))
        caps.append(rng.choice([1, 3, 8, 20, 60]))
    return prompts, ids, caps


def _budget(eng, pages: int) -> float:
    """``engine.kv_cache_gib`` that holds ``pages`` pages (the trash page on top)."""
    dec, dtype = eng.decoder(), getattr(torch, eng.cfg.dtype)
    return (pages + 1) * PAGE * token_bytes(dec.n_layers, dec.n_kv, dec.head_dim, dtype) / 2**30


@pytest.mark.parametrize("greedy", [True, False])
def test_a_rows_tokens_do_not_depend_on_the_rows_beside_it(greedy):
    """24 requests through 5 slots (rows refill slots, stop at EOS and at their caps, two of every three share
    their prompt pages) give each row the tokens, finish reason and log-probs (within float32 rounding) it gets
    alone in the cache: a decode step reads each row's own chunks (split-KV), whatever the batch around it."""
    prompts, ids, caps = _rows(0, 24)
    p = SamplingParams(max_new_tokens=60, greedy=greedy, temperature=1.0, min_new_tokens=1)
    alone = tiny_engine(gen_batch_size=1, max_model_len=128)
    batched = tiny_engine(gen_batch_size=5, max_model_len=128)
    first = batched.generate(prompts, ids, p, list(range(24)), max_new_tokens=caps)
    eos = sorted(set(batched.eos_ids) | {t for c in first[:6] for t in c.token_ids[1:2]})  # early stops
    alone.eos_ids = batched.eos_ids = eos
    got = batched.generate(prompts, ids, p, list(range(24)), max_new_tokens=caps)
    want = [alone.generate([q], [a], p, [k], max_new_tokens=[c])[0]
            for k, (q, a, c) in enumerate(zip(prompts, ids, caps))]
    assert batched.kv.cache.n_slots == 5 and batched.kv_preemptions == 0
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert [c.finish_reason for c in got] == [c.finish_reason for c in want]
    assert {c.finish_reason for c in want} == {"eos", "length"}
    for a, b in zip(got, want):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=logprob_atol(), rtol=0)


def test_capacity_follows_real_lengths_and_a_row_that_outgrows_the_pool_is_recomputed():
    """A budget of 24 pages (384 positions) and rows of up to 256 positions: one row of the full length fits, and
    the pool holds as many rows as their real lengths allow (up to gen_batch_size 8). Short rows run many at once;
    long ones outgrow the free pages, so the youngest is preempted, requeued with its tokens and prefilled again,
    and finishes with the tokens it makes in a pool where nothing is preempted, at the length it was asked for.
    float64: the recomputed history's rounding (a chunked prefill vs one-token steps) is ~1e-15, so a token differs
    only at a near-exact tie, and the log-probs agree within float64's summation tolerance."""
    rng = random.Random(3)
    prompts = [[1] + [rng.randint(3, 900) for _ in range(rng.randint(4, 30))] for _ in range(12)]
    ids = [k % 3 for k in range(12)]
    caps = [8, 5, 200, 12, 3, 150, 9, 7, 180, 4, 6, 11]
    p = SamplingParams(max_new_tokens=200, temperature=1.0)
    seeds = list(range(100, 112))
    paged = tiny_engine(gen_batch_size=8, max_model_len=256, dtype="float64")
    paged.cfg.kv_cache_gib = _budget(paged, 24)
    got = paged.generate(prompts, ids, p, seeds, max_new_tokens=caps)
    assert paged.kv.cache.n_pages == 24 and paged.kv.cache.n_slots == 8
    assert paged.kv_preemptions > 0
    assert [len(c.token_ids) for c in got] == caps  # never dropped, never cut
    assert paged.row_tokens / paged.decode_steps > 1.0  # more rows than one full-length row decode at once

    roomy = tiny_engine(gen_batch_size=8, max_model_len=256, dtype="float64")
    want = roomy.generate(prompts, ids, p, seeds, max_new_tokens=caps)
    assert roomy.kv_preemptions == 0
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    for a, b in zip(got, want):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0,
                                   atol=sum_tol(torch.float64, K_TINY, 10.0))


def test_answers_to_one_task_share_their_prompt_pages():
    """Six answers to one 40-token prompt (two full pages and a partial one) take 2 shared pages and one page each,
    and are prefilled once; their tokens are those of each answer alone."""
    prompt = [1] + list(range(3, 42))
    eng = tiny_engine(gen_batch_size=6, max_model_len=128)
    dec = eng.decoder()
    calls, tables = [], []
    orig = dec.forward

    def counting(cache, tokens, *a, **k):
        if tokens.shape[1] > 1:  # a prefill forward
            calls.append(tokens.shape[0])
        elif not tables:  # the first decode step: every answer admitted
            tables.append(cache.table[:6, :3].tolist())  # the pages of positions 0..47
        return orig(cache, tokens, *a, **k)

    dec.forward = counting
    p = SamplingParams(max_new_tokens=5, temperature=1.0)
    got = eng.generate([prompt] * 6, [1] * 6, p, list(range(6)))
    dec.forward = orig
    assert calls == [1]
    table = tables[0]
    assert len({r[0] for r in table}) == len({r[1] for r in table}) == 1  # pages 0 and 1 shared
    assert len({r[2] for r in table}) == 6  # the partial page copied
    alone = [tiny_engine(max_model_len=128, gen_batch_size=1).generate([prompt], [1], p, [k])[0].token_ids
             for k in range(6)]
    assert [c.token_ids for c in got] == alone


def test_paged_budget_must_hold_one_longest_row():
    eng = tiny_engine(gen_batch_size=8, max_model_len=256)
    eng.cfg.kv_cache_gib = _budget(eng, 256 // PAGE - 1)
    with pytest.raises(RuntimeError, match="KV cache budget .* cannot hold one row of 256 tokens"):
        eng.generate([[1, 2, 3]], [0], SamplingParams(max_new_tokens=4))
    eng.cfg.kv_cache_gib = _budget(eng, 256 // PAGE)
    assert len(eng.generate([[1, 2, 3]], [0], SamplingParams(max_new_tokens=4))[0].token_ids) == 4


def test_kv_cache_setting_is_checked_at_load():
    from lorapop.engine import EngineConfig

    with pytest.raises(ValueError, match="engine.kv_cache: 'pages' is not one of auto, paged"):
        EngineConfig(kv_cache="pages").validate()
    with pytest.raises(ValueError, match="static is gone: the one KV cache is paged"):
        EngineConfig(kv_cache="static").validate()


def test_one_cache_for_the_run_sized_from_max_model_len_whatever_the_call():
    """The cache is sized once, from engine.max_model_len (unset: the model's max_position_embeddings, as vLLM) and
    the budget, never from a call's prompts or caps: a 200-token prompt with max_new_tokens 60 and a row cap of 4
    under max_model_len 256 keeps the first call's cache (it once made a second, of 512 positions); a row over the
    length is refused."""
    p = SamplingParams(max_new_tokens=60, greedy=True)
    eng = tiny_engine(gen_batch_size=4, max_model_len=256)
    eng.generate([[1, 2, 3]], [0], p)
    cache = eng.kv.cache
    assert isinstance(cache, PagedKVCache) and (cache.n_slots, cache.max_len) == (4, 256)
    eng.generate([[1] + [5] * 199, [1, 2]], [0, 1], p, max_new_tokens=[4, 60])
    assert eng.kv.cache is cache and eng.kv.allocations == 1
    with pytest.raises(ValueError, match="over engine.max_model_len=256"):
        eng.generate([[1] + [5] * 199], [0], p)
    unset = tiny_engine(gen_batch_size=2)
    assert unset.cfg.max_model_len == unset.model.config.max_position_embeddings == 512
    unset.generate([[1, 2, 3]], [0], p)
    assert unset.kv.cache.max_len == 512 and unset.kv.plan.kind == "paged"


@pytest.mark.parametrize("rows", [False, True], ids=["pairs", "row_by_row"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_kv_attention_is_the_dense_attention_over_each_rows_own_length(dtype, rows):
    """A decode step over a paged cache reads each row's own chunks (lorapop/engine/splitkv.py): on seeded K/V in
    shuffled pages, rows of ragged lengths (1 position, a chunk's edge on both sides, many chunks), grouped queries,
    a free slot and padding pairs, the merged partial softmaxes equal SDPA over the longest row's span with each row
    masked at its length, within float32 rounding of the reordered sums (plus one rounding to ``dtype``). The same
    for the eager CPU step's row-by-row read (each row's own positions, one SDPA call a row)."""
    from lorapop.engine.decode import attend
    from lorapop.engine.splitkv import CHUNK

    g = torch.Generator().manual_seed(0)
    h, n_kv, d, max_len = 6, 2, 16, 512
    lens = [1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 7, 0]  # the last slot is free
    b = len(lens)
    per = [-(-n // PAGE) for n in lens]
    cache = PagedKVCache(1, b, n_kv, d, max_len, max_len // PAGE, dtype, torch.device("cpu"))
    pages = torch.randperm(max_len // PAGE, generator=g).tolist()
    starts = [sum(per[:k]) for k in range(b)]
    cache.set_rows(list(range(b)), [pages[a:a + m] for a, m in zip(starts, per)])
    for t in (cache.k[0], cache.v[0]):
        t.copy_(torch.randn(t.shape, generator=g).to(dtype))
    pos = torch.tensor([max(n - 1, 0) for n in lens[:-1]] + [cache.trash])
    q = torch.randn((b, h, 1, d), generator=g).to(dtype)
    pairs = cache.reads(b, lens, False)
    n_real = sum(-(-n // CHUNK) for n in lens)
    assert pairs.shape[0] > n_real and (pairs[n_real:, 0] == b).all()  # padded to the bucket with dump pairs
    cache.row_by_row = lambda: rows  # the eager CPU step reads row by row; compiled and CUDA steps, pairs
    _, at = cache.locate(None, b, pos[:, None], pairs)
    assert isinstance(at, list) == rows
    got = cache.attend_pairs(0, q, at, None)
    assert got.dtype == dtype
    assert torch.equal(got, cache.attend_pairs(0, q, at, None))  # the merge adds in one fixed order
    span = cache.span(max(lens))
    _, r_at = cache.locate(None, b, pos[:, None], span)
    keys, vals = cache.load(0, r_at, b, span.shape[0])
    allowed = span[None, None, None, :] <= pos[:, None, None, None]
    want = attend(q.float(), keys.float(), vals.float(), allowed, None)
    live = b - 1
    atol = sum_tol(torch.float32, d + max(lens), float(vals.abs().max())) + torch.finfo(dtype).eps * float(
        want.abs().max())
    torch.testing.assert_close(got[:live].float(), want[:live], atol=atol, rtol=0)
    assert torch.isfinite(got).all() and (got[live] == 0).all()  # a free slot reads nothing


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_split_kv_reads_the_pool_in_its_dtype_and_equals_eager(dtype):
    """The compiled read (lorapop/engine/splitkv.py, ``_scores_values``' fused form: the pool read where it lies, in
    its dtype, products and sums in float32) equals the eager gather's within float32 rounding of the reordered
    sums, and two compiled runs give the same bits."""
    from lorapop.engine import splitkv

    g = torch.Generator().manual_seed(1)
    n, n_kv, grp, d, pool = 40, 2, 3, 16, 64 * 16
    kc = torch.randn((pool, n_kv, d), generator=g).to(dtype)
    vc = torch.randn((pool, n_kv, d), generator=g).to(dtype)
    addr = torch.randint(0, pool, (n, splitkv.CHUNK), generator=g)
    qp = torch.randn((n, n_kv, grp, d), generator=g)
    p = torch.rand((n, n_kv, grp, splitkv.CHUNK), generator=g)

    def run(q, k, v, a, w, fused):
        s, weigh = splitkv._scores_values(q, k, v, a, torch.float32, fused)
        return s, weigh(w)

    want = run(qp, kc, vc, addr, p, False)
    fn = torch.compile(run, dynamic=False)
    got = fn(qp, kc, vc, addr, p, True)
    again = fn(qp, kc, vc, addr, p, True)
    for a, b, c, k in zip(got, want, again, (d, splitkv.CHUNK)):
        assert a.dtype == torch.float32 and torch.equal(a, c)
        torch.testing.assert_close(a, b, rtol=0, atol=sum_tol(torch.float32, k, float(b.abs().max())))
