"""The run's KV cache sized by one module, for the engine and for `lorapop plan`: the positions a row may reach,
the bytes a position takes, and the pages a budget holds.

There is one cache kind, paged (:mod:`.paged`), as in vLLM and nano-vllm: a pool of pages of :data:`PAGE` positions
that rows take as they grow, each decode step reading each live row's own length. TorchEngine allocates it once, on
its first generate, from :func:`kv_cache_plan` over the memory a new allocation can use at that moment (on CUDA,
:mod:`.cudamem`), after the resident state the plan counts (base, adapters with their AdamW moments and gradients,
the inference copies) is in place; `lorapop plan` calls the same function with the memory the engine will find free
then on a card of the planned size (:func:`free_at_first_generate`). Its capacity is ``engine.max_model_len``
(resolved, when unset, to the model's ``max_position_embeddings`` as vLLM does: :func:`model_len`), so no call,
whatever its prompts and caps, sizes it again: a longer row is refused (TorchEngine.generate) and the trainer cuts
its prompts to fit before proposing (lorapop/train/stages.py, ``prompt_budget``).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
PAGE = 16  # positions per page (vLLM's default block size); divides KV_ROUND, so a capacity is whole pages
KV_ROUND = 256  # capacities are multiples of this
# Memory a CUDA process holds outside its tensors when it first generates: the CUDA context and the kernels' modules
# (about 0.5 GiB on an H100 with torch's kernels loaded), cuBLAS workspaces and the caching allocator's rounding of
# the resident tensors. An allowance, not a measurement: the engine sizes its cache from what it finds free, so this
# only moves the plan's figure by the fraction of it.
CUDA_RESERVED_BYTES = GIB


def kv_capacity(tokens: int, max_model_len: int = 0) -> int:
    """Positions a row may reach in a cache for rows of up to ``tokens`` positions: ``max(tokens,
    max_model_len)`` rounded up to :data:`KV_ROUND`."""
    return -(-max(int(tokens), int(max_model_len)) // KV_ROUND) * KV_ROUND


def model_len(max_model_len: int, max_position_embeddings: int | None) -> int:
    """``engine.max_model_len`` as the engine uses it: the configured value, or when unset (0) the model's
    ``max_position_embeddings`` (vLLM's default), or 2048 for a model that states none."""
    if int(max_model_len) > 0:
        return int(max_model_len)
    return int(max_position_embeddings or 2048)


def element_bytes(dtype) -> int:
    import torch

    return torch.empty((), dtype=dtype).element_size()


def token_bytes(n_layers: int, n_kv: int, head_dim: int, dtype) -> int:
    """Bytes of one position's K and V over every layer."""
    return 2 * n_layers * n_kv * head_dim * element_bytes(dtype)


def cache_bytes(dims: tuple[int, int, int], dtype, n_pages: int) -> int:
    """Bytes of a pool of ``n_pages`` pages and its trash page."""
    return (n_pages + 1) * PAGE * token_bytes(*dims, dtype)


@dataclass(frozen=True)
class KVCachePlan:
    """The cache a run allocates: ``n_slots`` rows decoded at once at most (``engine.gen_batch_size``),
    ``capacity`` positions a row may reach (``engine.max_model_len`` rounded up), ``n_pages`` pages of
    :data:`PAGE` positions, ``budget`` the bytes it was sized under, ``nbytes`` what it takes. ``kind`` is always
    paged (bench/gpu.py and the plan print it)."""
    kind: str
    n_slots: int
    capacity: int
    n_pages: int
    budget: int
    nbytes: int

    @property
    def full_rows(self) -> int:
        """Rows it holds at once at the full capacity (whole rows of pages)."""
        return min(self.n_slots, self.n_pages // (self.capacity // PAGE))

    def describe(self) -> str:
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
    state (base weights, adapters with their AdamW moments and gradients, the inference copies: all allocated before
    the cache is sized) and :data:`CUDA_RESERVED_BYTES`. The compiled step's CUDA graphs are recorded after the
    cache, over it."""
    return max(0, int(gpu_bytes) - int(resident_bytes) - CUDA_RESERVED_BYTES)


def kv_cache_plan(cfg, dims: tuple[int, int, int], dtype, budget: int) -> KVCachePlan:
    """The run's cache for ``cfg`` (its ``max_model_len`` resolved, see :func:`model_len`) under ``budget`` bytes
    (:func:`kv_budget`): ``gen_batch_size`` slots and as many pages as the budget holds, no more than every slot at
    the full capacity. Raises RuntimeError, naming what to change, when the budget holds no row at the capacity
    (the oldest row must always fit, so a row is never dropped)."""
    capacity = kv_capacity(0, cfg.max_model_len)
    n_slots = max(1, int(cfg.gen_batch_size))
    per_page = PAGE * token_bytes(*dims, dtype)
    n_pages = min(int(budget) // per_page - 1, n_slots * capacity // PAGE)  # the trash page counts
    if n_pages < capacity // PAGE:
        row = (capacity // PAGE + 1) * per_page
        raise RuntimeError(
            f"the KV cache budget ({budget / GIB:.2f} GiB) cannot hold one row of {capacity} tokens "
            f"({row / GIB:.2f} GiB): raise engine.kv_cache_gib / engine.kv_cache_memory_fraction or "
            "shorten engine.max_model_len")
    return KVCachePlan("paged", n_slots, capacity, n_pages, int(budget), cache_bytes(dims, dtype, n_pages))
