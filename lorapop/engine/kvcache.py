"""The run's one KV cache over its lifetime: sized once (:mod:`.kvsize` decides its size), reused by every generate
call, its pages handed back to the OS between calls where that is safe, dropped only on request.

One cache per run matters because the compiled decode step's CUDA graphs read the cache in place: a new cache is a
new address, which the graphs would record again in a warm-up of their own. So the size depends on nothing a call
brings: the capacity is ``engine.max_model_len`` (resolved at the engine's start), the pages what the budget holds
once the resident state the plan counts is in place, and a row longer than the capacity is refused, not grown into.
"""

from __future__ import annotations

from typing import Any

import torch

from lorapop.hostmem import drop_pages

from .cudamem import allocatable_bytes
from .kvsize import KVCachePlan, kv_budget, kv_cache_plan
from .paged import PagedKVCache


class KVCacheKeeper:
    """Holds the run's cache for an engine of config ``cfg`` on ``device``; ``dims`` is the model's (layers, KV
    heads, head dim) and ``dtype`` the cache's, given on each call (the decoder that knows them is built lazily)."""

    def __init__(self, cfg: Any, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        self.cache: PagedKVCache | None = None
        self.plan: KVCachePlan | None = None  # the run's cache as kvsize.kv_cache_plan decided it
        self.allocations = 0  # caches allocated so far (bench/gpu.py reports it; one per run)

    def budget_bytes(self) -> int:
        """Bytes the KV cache may take now: on CUDA a fraction of what a new allocation can use (the allocator's
        unused blocks outside CUDA-graph pools and the current cache count as free, see :mod:`.cudamem`),
        elsewhere ``kv_cache_gib``."""
        if self.device.type == "cuda":
            free = allocatable_bytes(self.device)
            if self.cache is not None:
                free += sum(t.numel() * t.element_size() for t in self.cache.k + self.cache.v)
            return kv_budget(self.cfg, "cuda", free)
        return kv_budget(self.cfg, self.device.type, 0)

    def plan_for(self, dims: tuple[int, int, int], dtype: torch.dtype) -> KVCachePlan:
        """The cache :meth:`get` would allocate now: the function `lorapop plan` sizes it with
        (lorapop/engine/kvsize.py), over this engine's budget."""
        return kv_cache_plan(self.cfg, dims, dtype, self.budget_bytes())

    def get(self, dims: tuple[int, int, int], dtype: torch.dtype) -> PagedKVCache:
        """The run's cache, allocated on the first call (``gen_batch_size`` slots of ``max_model_len`` positions
        and as many pages as the budget holds) and returned as it is by every later one."""
        if self.cache is not None:
            return self.cache
        self.plan = plan = self.plan_for(dims, dtype)
        n_layers, n_kv, head_dim = dims
        self.cache = PagedKVCache(n_layers, plan.n_slots, n_kv, head_dim, plan.capacity, plan.n_pages, dtype,
                                  self.device)
        self.allocations += 1
        return self.cache

    def check_model_len(self, prompts: list[list[int]], max_new: int, caps: list[int] | None) -> None:
        """The run's cache holds rows of ``engine.max_model_len`` positions and never grows (a new cache would sit
        at a new address, which the compiled step's CUDA graphs would record again in a warm-up of their own): a
        longer row (prompt + its own max_new_tokens) is refused here, as vLLM refuses a request over its
        max_model_len; the trainer cuts its prompts to the budget before proposing (lorapop/train/stages.py)."""
        limit = int(self.cfg.max_model_len)
        for k, p in enumerate(prompts):
            n = len(p) + (max_new if caps is None else min(max_new, int(caps[k])))
            if n > limit:
                raise ValueError(f"row {k}: a prompt of {len(p)} tokens + {n - len(p)} new tokens is over "
                                 f"engine.max_model_len={limit} (the KV cache is sized once for the run): shorten the "
                                 "prompt or max_new_tokens, or raise engine.max_model_len")

    def per_call(self) -> bool:
        """Eager on CPU the KV cache holds memory for one generate call only: its pages are resident only where that
        call's rows wrote them (decode.cache_zeros) and go back to the OS when it returns (:meth:`drop_pages`), so
        neither the update nor the next call holds them. The compiled step keeps its cache's pages (one cache for
        the run, and on CUDA one address, for its graphs)."""
        return self.device.type == "cpu" and not self.cfg.compile

    def drop_pages(self) -> None:
        """The cache's pages back to the OS, the cache kept (all zeros again, at the same addresses); where the OS
        cannot do that, the cache itself is dropped (the next call allocates it again)."""
        if self.cache is not None and not all(drop_pages(t) for t in self.cache.k + self.cache.v):
            self.release()

    def release(self) -> None:
        """Drop the KV cache (the next ``generate`` allocates it again): for benches and tests that size another
        cache. A run never calls it: a new cache is a new address, whose CUDA graphs the compiled step records
        again."""
        self.cache = None
