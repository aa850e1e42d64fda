"""What a new CUDA allocation can use: the device's free memory plus the caching allocator's unused blocks in its
default pool, but not the blocks of CUDA-graph private pools.

``memory_reserved() - memory_allocated()`` counts every cached block as free, including those that
``torch.compile(mode="reduce-overhead")`` graphs keep in their private memory pools: that memory is reserved for the
graphs' replays and cannot back another tensor, so a KV cache sized from it fails with out-of-memory when it is
allocated. The allocator's snapshot says which pool each segment belongs to (``segment_pool_id``; ``(0, 0)`` is the
default pool), so only the default pool's unallocated bytes are added to what ``mem_get_info`` reports free.
"""

from __future__ import annotations

import torch

DEFAULT_POOL = (0, 0)


def _segments() -> list[dict]:
    try:
        return torch.cuda.memory_snapshot(include_traces=False)
    except TypeError:  # torch before 2.12 has no include_traces
        return torch.cuda.memory_snapshot()


def allocatable_bytes(device: torch.device) -> int:
    """Bytes a new allocation on ``device`` can take: the driver's free memory plus the unallocated bytes of the
    caching allocator's default-pool segments on that device (CUDA-graph pools excluded)."""
    free, _ = torch.cuda.mem_get_info(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    cached = 0
    for seg in _segments():
        if seg.get("device", index) != index:
            continue
        if tuple(seg.get("segment_pool_id", DEFAULT_POOL)) != DEFAULT_POOL:
            continue  # a graph's private pool: held for its replays
        cached += int(seg["total_size"]) - int(seg["allocated_size"])
    return int(free) + cached
