"""The compiled decode step (issues 24 and 28): one graph per batch bucket for a whole run, whatever the prompt
lengths, token caps and sampling settings; compiled tokens equal eager ones; and the step's memory traffic follows
what it reads, not the cache's capacity."""

from __future__ import annotations

import pytest
import torch

from test_engine_helpers import tiny_engine
from lorapop.engine import SamplingParams, batching

# Varied calls: row counts across buckets (2 slots: buckets 1 and 2), prompt lengths from 3 to 250 tokens, caps
# from 3 to 70 tokens, greedy, min_new_tokens, temperatures and top-p cuts.
CALLS = [
    ([[1, 5, 9, 13, 17, 21], [1, 7, 8], [1, 40, 41, 42, 43, 44], [1, 3]], [0, 1, -1, 2],
     SamplingParams(max_new_tokens=6, greedy=True), None),
    ([[1, 5, 9] * 30, [1, 7]], [1, 2], SamplingParams(max_new_tokens=20, temperature=0.7, top_p=0.9,
                                                       min_new_tokens=5), [3, 4]),
    ([[1, 8, 9, 10]] * 5, [0, 1, 2, 0, -1], SamplingParams(max_new_tokens=3, temperature=1.0), list(range(5))),
    ([[1, 2, 3, 4, 5] * 50], [2], SamplingParams(max_new_tokens=70, temperature=1.3, top_p=0.5), [9]),
]


def _run(eager, compiled):
    """Run CALLS on both engines; returns (the (batch bucket, nucleus) pairs decoded, dynamo's unique graphs)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    buckets = set()
    orig = batching.ContinuousBatcher._buckets

    def recording(self, k):
        nb, kv = orig(self, k)
        if self.compiled:  # a graph per bucket and nucleus setting (a call cutting one compiles its own)
            buckets.add((nb, self.branches[1]))
        return nb, kv

    batching.ContinuousBatcher._buckets = recording
    try:
        for prompts, ids, p, seeds in CALLS:
            want = [c.token_ids for c in eager.generate(prompts, ids, p, seeds)]
            assert [c.token_ids for c in compiled.generate(prompts, ids, p, seeds)] == want
            assert counters["stats"]["unique_graphs"] <= len(buckets)
    finally:
        batching.ContinuousBatcher._buckets = orig
    assert compiled.kv_cache_allocations == 1
    return buckets, counters["stats"]["unique_graphs"]


@pytest.mark.slow
def test_compiled_decode_equals_eager_decode_token_for_token():
    """Issue 24: one compiled graph per batch bucket over calls of varied prompt lengths, caps, sampling settings
    and row counts (dynamo's unique_graphs), and the compiled step (dense LoRA path, inductor) gives the eager
    step's tokens (grouped LoRA path), greedy and seeded sampling, mixed adapters and base rows. On the tiny Llama
    (two inductor compiles, ~1-2 min on 2 cores); the embedded model is checked greedily in
    test_engine_integration."""
    eager = tiny_engine(gen_batch_size=2, max_model_len=320)
    compiled = tiny_engine(gen_batch_size=2, max_model_len=320, compile=True)
    buckets, graphs = _run(eager, compiled)
    assert graphs <= len(buckets) and compiled._compiled_step is not None and eager._compiled_step is None


@pytest.mark.slow
def test_compiled_step_writes_only_the_new_positions():
    """Issue 28.1: inductor's code for the decode step has no loop over the cache's capacity. A K/V write into a
    slice of the cache (``kc[:b].scatter_``) compiled to a copy of the whole slice and a copy back, loops of
    ``b x n_kv x capacity x head_dim``; an ``index_put_`` on the whole tensor writes ``b`` positions, and the reads
    cover the symbolic attention length. The capacity, 1009 positions, is prime, so a loop whose extent it divides
    runs over the capacity and nothing else."""
    import re

    from torch._inductor.utils import run_and_get_code

    from lorapop.engine.decode import StaticKVCache

    eng = tiny_engine(compile=True)
    dec = eng._decoder()
    dec.refresh_dense()
    b, kv = 4, 32
    cache = StaticKVCache(dec.n_layers, b, dec.n_kv, dec.head_dim, 1008, torch.float32, eng.device)
    zeros = torch.zeros(b, dtype=torch.long)
    step = torch.compile(dec.decode_step, dynamic=False)
    _, code = run_and_get_code(step, cache, zeros, torch.full((b,), 10), zeros, zeros, zeros, cache.span(kv),
                               eng._vocab_key, None, zeros, torch.ones(b), torch.ones(b), True, (True, True))
    extents = [int(n) for c in code for n in re.findall(r"<\s*static_cast<int64_t>\((\d+)L?\)", c)]
    assert extents  # the pattern still finds inductor's loops
    assert not [n for n in extents if n % (cache.max_len + 1) == 0]
    assert cache.k[0][:, :, 10].abs().sum() > 0  # the step did write its position, in place


def test_cpu_inductor_cache_is_per_cpu_capability(monkeypatch, tmp_path):
    """Inductor's cache key leaves out the CPU capability: AVX-512 kernels reused under ATEN_CPU_CAPABILITY=avx2
    decoded token 0 everywhere. CPU compiles get one cache directory per capability (unless the user set one)."""
    import os

    from lorapop.engine.torch_engine import inductor_cache_dir

    a, b = inductor_cache_dir("AVX2"), inductor_cache_dir("AVX512")
    assert a != b and a.endswith("cpu-avx2") and os.path.dirname(a) == os.path.dirname(b)
    assert inductor_cache_dir().endswith("cpu-" + torch.backends.cpu.get_cpu_capability().lower())
    from lorapop.engine.torch_engine import use_inductor_cache_per_capability

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
