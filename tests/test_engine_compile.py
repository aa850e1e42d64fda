"""The compiled decode step: compiled once, over a declared set of shapes, before the first
decode step, then never again whatever the rows, lengths, caps, sampling settings and adapters of a run; compiled
tokens equal eager ones; and the step's memory traffic follows what it reads, not the cache's capacity."""

from __future__ import annotations

import random

import pytest
import torch

from test_engine_helpers import tiny_engine
from lorapop.engine import SamplingParams, TrainSample


def _run_shaped_calls(seed: int = 0, n_slots: int = 8):
    """Calls shaped like a run's: 1..n_slots + 4 rows (every batch bucket, and more rows than slots), prompt lengths
    from 3 to 250 tokens, caps from 3 to 40, greedy and sampled, top_p 1 and < 1, min_new_tokens, every row on one
    adapter and mixed (base rows included)."""
    rng = random.Random(seed)
    calls = []
    for i, n in enumerate([1, 2, 3, 5, 8, n_slots + 4, 4, 7]):
        lens = [3, 250] + [rng.randint(3, 120) for _ in range(n)]
        prompts = [[1] + [rng.randint(3, 900) for _ in range(lens[k] - 1)] for k in range(n)]
        ids = [i % 3] * n if i % 2 else [rng.choice([-1, 0, 1, 2]) for _ in range(n)]
        greedy = i % 4 == 0
        p = SamplingParams(max_new_tokens=rng.randint(3, 40), greedy=greedy, temperature=rng.choice([0.7, 1.0, 1.3]),
                           top_p=1.0 if greedy or i % 3 else 0.9, min_new_tokens=rng.choice([0, 2]))
        calls.append((prompts, ids, p, [rng.randint(0, 2**40) for _ in range(n)]))
    return calls


@pytest.mark.slow
def test_compiled_once_before_the_first_step_then_never_again():
    """The first generate warms the compiled step over its declared set (batch buckets up to the cache's
    slots, the pair counts each can read, both sampling branches with ``engine.compile_nucleus``) and
    compiles exactly the set's graphs (dynamo's count and the engine's perf/graphs agree); the rest of a run-shaped
    sequence of calls compiles nothing. EOS falls at random points (ids the rows really produce are made EOS). The
    compiled step (dense LoRA path, inductor) gives the eager step's tokens (grouped LoRA path), greedy and seeded
    sampling. Then generate/train_step rounds with mixed prompts and per-row caps: the cache is allocated once
    (``kv.allocations`` 1, one address), no round warms up or compiles, and a row over max_model_len is refused,
    never grown into. On the tiny Llama: two inductor compiles with symbolic shapes, ~1-3 min on 2 shared cores
    with inductor's cache cold."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager = tiny_engine(gen_batch_size=8, max_model_len=512)
    compiled = tiny_engine(gen_batch_size=8, max_model_len=512, compile=True, compile_nucleus=True)
    assert compiled.pop_metrics() == {"perf/compile_s": 0.0, "perf/graphs": 0, "perf/cuda_graphs": 0,
                                      "perf/warmups": 0}
    rng, n_eos = random.Random(1), 0
    for k, (prompts, ids, p, seeds) in enumerate(_run_shaped_calls()):
        want = eager.generate(prompts, ids, p, seeds)
        n_eos += sum(c.finish_reason == "eos" for c in want)
        assert [c.token_ids for c in compiled.generate(prompts, ids, p, seeds)] == [c.token_ids for c in want]
        shapes = compiled.decode_shapes()
        assert shapes is not None and shapes.n_slots == 8 and shapes.max_len == 512
        m = compiled.pop_metrics()
        assert m["perf/graphs"] == shapes.graphs == counters["stats"]["unique_graphs"] == 2, (k, m)
        assert compiled.decode_compile.after_warmup == 0 and m["perf/compile_s"] > 0
        if k == 0:
            first_compile_s = m["perf/compile_s"]
        assert m["perf/compile_s"] == first_compile_s  # all of it in the first call's warm-up
        # EOS at random points of the next calls: ids the rows produced mid-way
        made = [t for c in want for t in c.token_ids[1:-1]]
        if made:
            eos = set(rng.sample(made, min(2, len(made))))
            eager.eos_ids = compiled.eos_ids = sorted(set(eager.eos_ids) | eos)
    assert n_eos > 0  # EOS did stop rows
    assert compiled.kv.allocations == 1
    # branches x (batch 2: 16 pairs; 4: 16, 32; 8: 16, 64): only the counts a batch can read
    assert len(shapes.shapes) == 2 * 5
    # Rounds of a run: generate with mixed prompts and per-row caps (a long prompt whose own cap keeps it inside
    # max_model_len while max_new_tokens would not), then train_step on what it made, again: the update runs beside
    # the run's one cache (same tensors, same address), so nothing is allocated, warmed up, compiled or recorded
    # after the first round
    cache, ptr = compiled.kv.cache, compiled.kv.cache.k[0].data_ptr()
    before = compiled.pop_metrics()
    assert before["perf/warmups"] == compiled.decode_compile.warm_ups == 1
    for prompts, ids, p, seeds in _run_shaped_calls(seed=1)[:3]:
        prompts = prompts + [[1] + [rng.randint(3, 900) for _ in range(480)]]
        ids, seeds = ids + [0], seeds + [7]
        caps = [rng.randint(1, p.max_new_tokens) for _ in prompts[:-1]] + [4]
        p = SamplingParams(max_new_tokens=60, greedy=p.greedy, temperature=p.temperature, top_p=p.top_p)
        outs = compiled.generate(prompts, ids, p, seeds, max_new_tokens=caps)
        assert [len(c.token_ids) <= m for c, m in zip(outs, caps)] == [True] * len(caps)
        compiled.train_step([TrainSample(c.prompt_ids, c.token_ids, max(a, 0), 1.0 - 2 * (j % 2))
                             for j, (c, a) in enumerate(zip(outs, ids))])
        assert compiled.pop_metrics() == before and compiled.decode_compile.after_warmup == 0
        assert compiled.kv.cache is cache and cache.k[0].data_ptr() == ptr and compiled.kv.allocations == 1
    # A row over engine.max_model_len is refused: the cache never grows in a run
    long = [[1] + [rng.randint(3, 900) for _ in range(600)]]
    p = SamplingParams(max_new_tokens=8, greedy=True)
    with pytest.raises(ValueError, match="over engine.max_model_len=512"):
        compiled.generate(long, [1], p)
    assert compiled.kv.allocations == 1 and compiled.pop_metrics() == before
    # A paged pool of 40 pages (640 positions) for 6 rows of ~190: rows are preempted and prefilled again, and the
    # step, over a pool of another size (a bench's cache: a run never makes one), compiles nothing; the rows are
    # those the eager engine makes in the same pool (the same preemptions: every row runs to its full length)
    from lorapop.engine.kvsize import PAGE, token_bytes

    dims, dtype = compiled.cache_dims()
    for i in range(compiled.n_adapters):  # the rounds above trained the compiled engine's adapters
        eager.set_adapter(i, compiled.get_adapter(i))
    for e in (compiled, eager):
        e.kv.release()
        e.cfg.kv_cache_gib = 41 * PAGE * token_bytes(*dims, dtype) / 2**30
    prompts = [[1] + [rng.randint(3, 900) for _ in range(rng.randint(10, 40))] for _ in range(6)]
    p = SamplingParams(max_new_tokens=150, temperature=1.0, min_new_tokens=150)
    got = compiled.generate(prompts, [0, 1, 2, 0, 1, 2], p, list(range(6)))
    assert compiled.kv.cache.n_pages == 40 and compiled.kv_preemptions > 0
    want = eager.generate(prompts, [0, 1, 2, 0, 1, 2], p, list(range(6)))
    assert eager.kv_preemptions == compiled.kv_preemptions
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert compiled.pop_metrics()["perf/graphs"] == counters["stats"]["unique_graphs"] == 2
    assert compiled.decode_compile.after_warmup == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs are recorded only on a GPU")
def test_rounds_record_no_cuda_graph_after_the_first_on_cuda():
    """On CUDA the compiled step's graphs read the KV cache at its address: over generate/train_step rounds the cache
    stays, so the first round's warm-up records the declared set and no later round warms up or records again."""
    from test_engine_helpers import tiny_llama

    from lorapop.engine import EngineConfig, TorchEngine

    model, tok = tiny_llama(0)
    eng = TorchEngine(model, tok, 3, EngineConfig(rank=4, lora_alpha=8, device="cuda", dtype="float32",
                                                  gen_batch_size=4, max_model_len=512, compile=True), seed=0)
    for k, (prompts, ids, p, seeds) in enumerate(_run_shaped_calls(n_slots=4)[:4]):
        outs = eng.generate(prompts, ids, p, seeds)
        eng.train_step([TrainSample(c.prompt_ids, c.token_ids, max(a, 0), 1.0 - 2 * (j % 2))
                        for j, (c, a) in enumerate(zip(outs, ids))])
        m = eng.pop_metrics()
        if k == 0:
            first = m
            assert m["perf/cuda_graphs"] == eng.decode_shapes().recorded > 0 and m["perf/warmups"] == 1
        assert m == first and eng.decode_compile.after_warmup == 0 and eng.kv.allocations == 1


def test_declared_set_covers_every_pair_count_a_step_can_read_and_no_other():
    """A decode step's sizes are its batch bucket and the (row, chunk) pairs it reads (lorapop/engine/splitkv.py):
    every count the scheduler can pad to lies in the declared set for its batch, for any live rows and lengths, on
    CPU and under CUDA graphs (one graph per doubling), never fewer pairs than the rows' chunks; and the set holds no
    count its batch cannot reach (a batch of 2 rows never reads 1024 pairs at a capacity of 14336)."""
    from lorapop.engine.compiled import DecodeShapes, batch_bucket
    from lorapop.engine.splitkv import CHUNK, PAIR_STEP, chunk_pairs, pair_bucket

    one, both = DecodeShapes(8, 512, False), DecodeShapes(8, 512, False, nucleus=True)  # engine.compile_nucleus
    assert (one.graphs, both.graphs) == (1, 2) and {n for n, _, _ in one.shapes} == {False}
    assert len(both.shapes) == 2 * len(one.shapes) and set(one.shapes) < set(both.shapes)
    assert (False, 2, 1024) not in DecodeShapes(48, 14336, True).shapes
    rng = random.Random(0)
    for n_slots in (1, 3, 8, 48):
        for max_len in (64, 320, 14336):
            for cuda in (False, True):
                shapes = DecodeShapes(n_slots, max_len, cuda)
                nbs = {nb for _, nb, _ in shapes.shapes}
                assert {batch_bucket(n, n_slots) for n in range(1, n_slots + 1)} == nbs
                assert 1 not in nbs or n_slots == 1  # a size of 1 would be specialised: its own graph
                most = max(n_slots * (max_len // CHUNK), PAIR_STEP)
                counts = {nb: {n for _, b, n in shapes.shapes if b == nb} for nb in nbs}
                for nb, got in counts.items():
                    assert len(got) <= (10 if cuda else 2)  # one CUDA graph per doubling, not per count
                    assert max(got) <= pair_bucket(max(nb * (max_len // CHUNK), PAIR_STEP), most, cuda)
                for _ in range(30):
                    live = rng.randint(1, n_slots)
                    nb = batch_bucket(live, n_slots)
                    needs = [rng.randint(1, max_len + 8) for _ in range(live)] + [0] * (nb - live)
                    pairs = chunk_pairs(needs, nb, n_slots, max_len, cuda, "cpu")
                    real = sum(min(-(-n // CHUNK), max_len // CHUNK) for n in needs)
                    n = pairs.shape[0]
                    if cuda:  # each count a recorded graph
                        assert n in counts[nb]
                    else:  # symbolic: the warm-up's smallest and largest stand for every multiple between
                        assert (n % PAIR_STEP == 0 or n == max(counts[nb])) and \
                            min(counts[nb]) <= n <= max(counts[nb])
                    assert n >= max(real, 2)
                    assert (pairs[:real, 0] < live).all() and (pairs[real:, 0] == nb).all()


def test_recompile_limit_warning_names_engine_compile():
    """Torch's recompile limit, if ever reached, is a warning that names engine.compile (a real dynamo compile with
    the eager backend: a function recompiled for static shapes past a limit of 1)."""
    from lorapop.engine.compiled import compile_stats

    stats = compile_stats()
    fn = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=1, automatic_dynamic_shapes=False), \
            pytest.warns(RuntimeWarning, match="engine.compile"):
        for n in (2, 3, 4):
            fn(torch.ones(n))
    assert stats.limit_hits >= 1


def test_merge_compiles_one_graph_for_pair_counts_at_and_below_its_shifts():
    """The split-KV merge adds chunk c + s into chunk c for shifts s = 1, 2, .. up to half a row's chunks (64 at
    8192 positions, the embedded model's rows). A pair count equal to a shift (the smallest bucket, 16) once made
    the shifted slice empty, and dynamo fixed the symbolic count at its first value: the embedded model's step
    compiled a second graph in its warm-up. Here the merge over every such count is one graph (inductor) and equals
    the eager merge bit for bit."""
    from torch._dynamo.utils import counters

    from lorapop.engine.splitkv import _merge_rows

    torch._dynamo.reset()
    counters.clear()
    merge = torch.compile(_merge_rows, dynamic=False)
    gen = torch.Generator().manual_seed(0)
    for n in (16, 256, 32, 64, 4096):  # 16..64 equal a shift of the 7-level tree; 256 and 4096 exceed them all
        row, chunk = torch.arange(n) // 8, torch.arange(n) % 8
        x = torch.randn(n, 3, 5, generator=gen)
        for t in (x, row, chunk):
            torch._dynamo.maybe_mark_dynamic(t, 0)
        assert torch.equal(merge(x, row, chunk, 600, 7), _merge_rows(x, row, chunk, 600, 7))
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.slow
def test_compiled_step_writes_only_the_new_positions():
    """Inductor's code for the decode step has no loop over the page pool. A K/V write into a slice of the cache
    (``kc[:b].scatter_``) compiled to a copy of the whole slice and a copy back, loops over the pool; an
    ``index_put_`` on the whole tensor writes ``b`` positions, and the reads cover the step's (row, chunk) pairs.
    The pool, 67 pages of 16 positions with the trash page, is 16 x a prime, so a loop whose extent it divides runs
    over the pool and nothing else. Compiled greedy-only (``branches`` (False, False)): the K/V write is
    the same in every branch, and the greedy branch, without the Gumbel noise and the nucleus sort, compiles
    fastest with a cold inductor cache (docs/RESULTS.md, "Cold inductor caches in the suite")."""
    import re

    from torch._inductor.utils import run_and_get_code

    from lorapop.engine.paged import PagedKVCache

    eng = tiny_engine(compile=True)
    dec = eng.decoder()
    dec.refresh_dense()
    b, kv = 4, 32
    cache = PagedKVCache(dec.n_layers, b, dec.n_kv, dec.head_dim, 256, 66, torch.float32, eng.device)
    cache.set_rows(list(range(b)), [[k] for k in range(b)])
    zeros = torch.zeros(b, dtype=torch.long)
    step = torch.compile(dec.decode_step, dynamic=False)
    _, code = run_and_get_code(step, cache, zeros, torch.full((b,), 10), zeros, zeros, zeros,
                               cache.reads(b, [kv] * b, False), eng._vocab_key, None, zeros, torch.ones(b),
                               torch.ones(b), True, (False, False))
    extents = [int(n) for c in code for n in re.findall(r"<\s*static_cast<int64_t>\((\d+)L?\)", c)]
    assert extents  # the pattern still finds inductor's loops
    assert not [n for n in extents if n % cache.k[0].shape[0] == 0]
    assert cache.k[0][10].abs().sum() > 0  # the step did write its position (row 0's page 0), in place


def test_cpu_inductor_cache_is_per_cpu_capability(monkeypatch, tmp_path):
    """Inductor's cache key leaves out the CPU capability: AVX-512 kernels reused under ATEN_CPU_CAPABILITY=avx2
    decoded token 0 everywhere. CPU compiles get one cache directory per capability (unless the user set one)."""
    import os

    from lorapop.engine.compiled import inductor_cache_dir

    a, b = inductor_cache_dir("AVX2"), inductor_cache_dir("AVX512")
    assert a != b and a.endswith("cpu-avx2") and os.path.dirname(a) == os.path.dirname(b)
    assert inductor_cache_dir().endswith("cpu-" + torch.backends.cpu.get_cpu_capability().lower())
    from lorapop.engine.compiled import use_inductor_cache_per_capability

    for unset_or_default in (None, os.path.dirname(a)):  # inductor writes its default itself when it first looks
        if unset_or_default is None:
            monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        else:
            monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", unset_or_default)
        use_inductor_cache_per_capability()
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == inductor_cache_dir()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # the user's choice stays
    use_inductor_cache_per_capability()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path)


def test_compile_counts_survive_a_dynamo_reset():
    """torch._dynamo.reset() clears every compile callback; the engine's counter re-attaches its own before each
    call, so compiles after someone's reset are still counted (in the full suite an earlier test's reset made the
    run-shaped test above read 0 graphs)."""
    from lorapop.engine.compiled import compile_stats

    compile_stats()
    torch._dynamo.reset()
    before = compile_stats().snapshot()
    fn = torch.compile(lambda x: x * 2 + 1, backend="eager", dynamic=False)
    fn(torch.ones(3))
    after = compile_stats().snapshot()
    assert after[1] - before[1] == 1
