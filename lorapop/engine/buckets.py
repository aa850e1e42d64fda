"""Size buckets of the compiled decode step's symbolic sizes (batch rows, attention length, split-KV pairs): powers
of two, and the declared values a warm-up meets. A leaf both compiled.py and splitkv.py read."""

from __future__ import annotations


def pow2_at_least(n: int, lo: int = 1) -> int:
    p = lo
    while p < n:
        p *= 2
    return p


def size_buckets(least: int, lo: int, most: int, cuda_graphs: bool) -> list[int]:
    """A symbolic size's declared values up to ``most``: under CUDA graphs the powers of two from ``lo`` and
    ``most``; otherwise the smallest (``least``) and the largest stand for every value between."""
    if not cuda_graphs:
        return sorted({least, most})
    out, p = [], lo
    while p < most:
        out.append(p)
        p *= 2
    return out + [most]
