"""The run's KV cache: its kind and size, decided by one function for the engine and for `lorapop plan`.

TorchEngine allocates its cache once, on its first generate, from :func:`kv_cache_plan` over the memory a new
allocation can use at that moment (on CUDA, :mod:`.cudamem`); `lorapop plan` calls the same function with the memory
the engine will find free at that moment on a card of the planned size (:func:`free_at_first_generate`: the card
less the resident state the plan measured and :data:`CUDA_RESERVED_BYTES`). The engine keeps that cache for the
whole run (the update runs beside it), so the cache the plan prints and the configs' headers quote is the one the
run holds, at one address, from its first generate to its last.
"""

from __future__ import annotations

from dataclasses import dataclass

from .paged import PAGE, cache_bytes, kv_shape

GIB = 2**30
# Memory a CUDA process holds outside its tensors when it first generates: the CUDA context and the kernels' modules
# (about 0.5 GiB on an H100 with torch's kernels loaded), cuBLAS workspaces and the caching allocator's rounding of
# the resident tensors. An allowance, not a measurement: the engine sizes its cache from what it finds free, so this
# only moves the plan's figure by the fraction of it.
CUDA_RESERVED_BYTES = GIB


@dataclass(frozen=True)
class KVCachePlan:
    """The cache a run allocates: ``kind`` static or paged, ``n_slots`` rows decoded at once at most, ``capacity``
    positions a row may reach (``engine.max_model_len`` rounded up), ``n_pages`` pages of :data:`.paged.PAGE`
    positions (0 for the static cache), ``budget`` the bytes it was sized under, ``nbytes`` what it takes."""
    kind: str
    n_slots: int
    capacity: int
    n_pages: int
    budget: int
    nbytes: int

    @property
    def shape(self) -> tuple[int, int, int, str]:
        return self.n_slots, self.capacity, self.n_pages, self.kind

    @property
    def full_rows(self) -> int:
        """Rows it holds at once at the full capacity (static: every slot; paged: whole rows of pages)."""
        return self.n_slots if self.kind == "static" else min(self.n_slots, self.n_pages // (self.capacity // PAGE))

    def describe(self) -> str:
        if self.kind == "static":
            return f"static, {self.n_slots} rows x {self.capacity} positions, {self.nbytes / GIB:.2f} GiB"
        return (f"paged, {self.n_pages * PAGE} positions ({self.full_rows} rows of {self.capacity}), up to "
                f"{self.n_slots} rows at once, {self.nbytes / GIB:.2f} GiB")


def kv_budget(cfg, device_type: str, free_bytes: int) -> int:
    """Bytes the cache may take: on CUDA ``engine.kv_cache_memory_fraction`` of ``free_bytes`` (what a new
    allocation can use when the cache is made), elsewhere ``engine.kv_cache_gib``."""
    if device_type == "cuda":
        return int(cfg.kv_cache_memory_fraction * max(0, int(free_bytes)))
    return int(cfg.kv_cache_gib * GIB)


def free_at_first_generate(gpu_bytes: int, resident_bytes: int) -> int:
    """What the engine finds free when it allocates its cache on a card of ``gpu_bytes``: the card less the resident
    state (base weights, adapters and their optimizer state, the inference copies) and :data:`CUDA_RESERVED_BYTES`.
    Nothing else is allocated then: the compiled step's CUDA graphs are recorded after the cache, over it."""
    return max(0, int(gpu_bytes) - int(resident_bytes) - CUDA_RESERVED_BYTES)


def kv_cache_plan(cfg, dims: tuple[int, int, int], dtype, tokens: int, budget: int,
                  prev: tuple | None = None, remake: bool = False) -> KVCachePlan:
    """The cache for rows of up to ``tokens`` positions (``engine.max_model_len`` when set) under ``budget`` bytes
    (:func:`kv_budget`): ``engine.kv_cache`` auto picks static when the budget holds ``gen_batch_size`` rows at the
    full capacity, else paged (:func:`.paged.kv_shape` has the rule). Raises RuntimeError, naming what to change,
    when the budget holds no row at the full capacity."""
    n_slots, capacity, n_pages, kind = kv_shape(cfg.kv_cache, dims, dtype, tokens, cfg, prev, remake, budget)
    shape = (n_slots, capacity, n_pages)
    return KVCachePlan(kind, n_slots, capacity, n_pages, int(budget), cache_bytes(kind, dims, dtype, shape))
