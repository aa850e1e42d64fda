"""The GPU path's memory and stop-token checks that a CPU can run (issue 28 items 4 and 6)."""

from __future__ import annotations

import torch

from test_engine_helpers import tiny_engine

GIB = 2**30


def _fake_cuda(monkeypatch, *, free, segments, cache=None):
    """torch.cuda's memory functions as a GPU with ``free`` bytes unused by the driver and the allocator holding
    ``segments`` would report them (reserved/allocated derived from the same segments, as the allocator does)."""
    reserved = sum(s["total_size"] for s in segments)
    allocated = sum(s["allocated_size"] for s in segments)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated)
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda *a, **k: segments)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_kv_budget_leaves_out_cuda_graph_pool_memory(monkeypatch):
    """A reduce-overhead graph's private pool is reserved but unallocated between replays; it cannot back a new
    cache, so it must not enter the budget (the old reserved - allocated figure counted its 20 GiB)."""
    eng = tiny_engine()
    eng.cfg.kv_cache_memory_fraction = 0.5
    segments = [
        # default pool: 8 GiB cached, 2 GiB of it in use -> 6 GiB a new tensor can reuse
        {"device": 0, "segment_pool_id": (0, 0), "total_size": 8 * GIB, "allocated_size": 2 * GIB},
        # a CUDA graph's private pool: 20 GiB reserved, 1 GiB live between replays
        {"device": 0, "segment_pool_id": (1, 0), "total_size": 20 * GIB, "allocated_size": 1 * GIB},
        # another device's segment never counts
        {"device": 1, "segment_pool_id": (0, 0), "total_size": 30 * GIB, "allocated_size": 0},
    ]
    _fake_cuda(monkeypatch, free=10 * GIB, segments=segments)
    eng.device = torch.device("cuda", 0)
    try:
        assert eng.kv_budget_bytes() == int(0.5 * (10 + 6) * GIB)
    finally:
        eng.device = torch.device("cpu")


def test_kv_budget_counts_the_current_cache_as_free(monkeypatch):
    eng = tiny_engine()
    eng.cfg.kv_cache_memory_fraction = 1.0
    dec = eng._decoder()
    eng._kv_cache(2, 40)
    held = sum(t.numel() * t.element_size() for t in eng._cache.k + eng._cache.v)
    segments = [{"device": 0, "segment_pool_id": (0, 0), "total_size": 4 * GIB, "allocated_size": 4 * GIB}]
    _fake_cuda(monkeypatch, free=GIB, segments=segments)
    eng.device = torch.device("cuda", 0)
    try:
        assert eng.kv_budget_bytes() == GIB + held  # its bytes are freed before the new cache is allocated
    finally:
        eng.device = torch.device("cpu")
    assert dec is eng._dec
