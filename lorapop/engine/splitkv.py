"""Decode attention over a paged cache in which each row reads its own length: split-KV over (row, chunk) pairs.

A dense decode step attends every row up to the longest live row's position: one 8k-token row among 47 short ones
makes every row read 8k positions, so the step's cost follows rows x longest. Here, as in flash-decoding's split-KV
(FlashAttention's ``num_splits``, vLLM's paged-attention v2 partitions), a row's history is cut into *chunks* of
:data:`CHUNK` positions (whole pages), and the step is given the list of live (row, chunk) pairs, as many as the
rows' real lengths need (``sum(ceil(len / CHUNK))``). Each pair gathers its chunk's K/V through the block table and
computes a partial softmax against it (max, sum of exponentials, weighted sum of values), masked past its row's
position; the partials of a row are then merged by log-sum-exp (a scatter max, exact in any order, and a fixed tree
of additions over the row's chunks: no atomics, so two runs give the same sums). The cost follows the sum of the
rows' lengths, not rows x longest.

The pair list is built on the host (the batcher knows each row's length) and padded to a bucket, so a compiled step
sees one symbolic length (and under CUDA graphs one graph per power of two of pairs, as the dense path per
attention length); padding pairs name row ``b`` (one past the batch), which no query reads: their partials go to a
dump row that is dropped. K/V are read in the cache's dtype and the scores and sums computed in float32 (SDPA's
CPU and CUDA kernels accumulate in float32 too), so the merged result matches the dense one within float32 rounding
of the reordered sums.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .buckets import pow2_at_least, size_buckets

CHUNK = 64  # positions per chunk: 4 pages; a row reads at most CHUNK - 1 positions past its own length
PAIR_STEP = 16  # pair counts off CUDA graphs are multiples of this (symbolic: no graph per count)
PAIR_GRAPH_MIN = 64  # under CUDA graphs pair counts are powers of two from this


def pair_bucket(n: int, most: int, cuda_graphs: bool) -> int:
    """The pairs a step computes when its rows need ``n``: powers of two under CUDA graphs (each count a recorded
    graph), else multiples of :data:`PAIR_STEP`; at most ``most`` (every slot at the cache's capacity)."""
    if cuda_graphs:
        return min(pow2_at_least(n, PAIR_GRAPH_MIN), most)
    return min(-(-max(n, 1) // PAIR_STEP) * PAIR_STEP, most)


def pair_buckets(n_slots: int, max_len: int, cuda_graphs: bool, rows: int | None = None) -> list[int]:
    """Pair counts a warm-up must meet for a batch of ``rows`` rows (default: every slot): every CUDA-graph bucket
    up to the pairs of ``rows`` rows at the capacity (no more can occur); off CUDA graphs the count is symbolic and
    the smallest and largest stand for all."""
    most = max_pairs(n_slots, max_len)
    reach = pair_bucket(max_pairs(n_slots if rows is None else rows, max_len), most, cuda_graphs)
    return size_buckets(pair_bucket(1, most, False), PAIR_GRAPH_MIN, reach, cuda_graphs)


def max_pairs(n_slots: int, max_len: int) -> int:
    """Pairs of every slot at the cache's capacity, at least :data:`PAIR_STEP` (a count of 1 would be specialised)."""
    return max(n_slots * (max_len // CHUNK), PAIR_STEP)


def chunk_pairs(needs: list[int], b: int, n_slots: int, max_len: int, cuda_graphs: bool, device) -> torch.Tensor:
    """``[N, 2]`` (row, chunk) pairs for rows ``0..len(needs)-1`` attending to ``needs[r]`` positions each (their
    last step's position plus one), padded with pairs of row ``b`` (the dump row) to the bucket, in a cache of
    ``n_slots`` x ``max_len``."""
    rows, chunks = [], []
    for r, need in enumerate(needs):
        n = min(-(-need // CHUNK), max_len // CHUNK)
        rows += [r] * n
        chunks += range(n)
    n_bucket = pair_bucket(len(rows), max_pairs(n_slots, max_len), cuda_graphs)
    pad = n_bucket - len(rows)
    out = torch.tensor([rows + [b] * pad, chunks + [0] * pad], dtype=torch.long).T.contiguous()
    out = out.to(device)
    torch._dynamo.maybe_mark_dynamic(out, 0)
    return out


def pad_pairs(n: int, b: int, device) -> torch.Tensor:
    """``n`` padding pairs for a batch of ``b`` rows (a warm-up step)."""
    out = torch.zeros((n, 2), dtype=torch.long, device=device)
    out[:, 0] = b
    torch._dynamo.maybe_mark_dynamic(out, 0)
    return out


def locate_pairs(table: torch.Tensor, page: int, pairs: torch.Tensor, pos: torch.Tensor):
    """Per pair, the physical addresses ``[N, CHUNK]`` of its chunk, its row ``[N]`` (``b`` for a padding pair),
    that row clamped to the batch, the positions it may read ``[N, CHUNK]`` (``<= pos`` of its row, none for a
    padding pair) and its chunk ``[N]``. Once per forward."""
    b = pos.shape[0]
    row, chunk = pairs[:, 0], pairs[:, 1]
    row_c = row.clamp(max=b - 1)
    per = CHUNK // page
    logical = chunk[:, None] * per + torch.arange(per, device=pairs.device)[None, :]  # [N, per] logical pages
    phys = table[row_c[:, None], logical]
    addr = (phys[:, :, None] * page + torch.arange(page, device=pairs.device)).reshape(-1, CHUNK)
    posn = chunk[:, None] * CHUNK + torch.arange(CHUNK, device=pairs.device)[None, :]
    allowed = (posn <= pos[row_c][:, None]) & (row < b)[:, None]
    return addr, row, row_c, allowed, chunk


def locate_rows(table: torch.Tensor, page: int, pos: torch.Tensor, max_len: int) -> list[torch.Tensor | None]:
    """Per row, the physical addresses of its positions ``0..pos`` (exactly its own length), or None for a free slot
    (``pos`` at the trash position). The eager step's form of :func:`locate_pairs`; once per forward."""
    within = torch.arange(page, device=table.device)
    out: list[torch.Tensor | None] = []
    for r, p in enumerate(pos.tolist()):
        if p >= max_len:
            out.append(None)
            continue
        n = p // page + 1
        out.append((table[r, :n, None] * page + within).reshape(-1)[:p + 1])
    return out


def attend_rows(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, at: list, scale: float | None) -> torch.Tensor:
    """Decode attention ``q [b, H, 1, d]`` over the pool ``kc, vc [P, n_kv, d]``, row by row, each reading exactly
    its own positions (``at``, :func:`locate_rows`); a free slot gets 0. The eager step on CPU: a row's K/V are
    gathered (a few hundred KB at the demo's lengths, still in cache when SDPA reads them) and attended by one SDPA
    call with the query group folded into the query length (every position is allowed: no mask). The pair form
    gathered every pair's chunk at once (tens of MB a layer, written to memory, then copied again for the batched
    matmul) and measured 7x this at the demo's 64 rows of 400-900 positions (docs/RESULTS.md, the engine
    re-cut)."""
    b, h, _, d = q.shape
    n_kv = kc.shape[1]
    out = q.new_zeros(b, h, 1, d)
    for r, addr in enumerate(at):
        if addr is None:
            continue
        keys = kc.index_select(0, addr).transpose(0, 1)[None].to(q.dtype)  # [1, n_kv, len, d]
        vals = vc.index_select(0, addr).transpose(0, 1)[None].to(q.dtype)
        qr = q[r:r + 1].reshape(1, n_kv, h // n_kv, d)
        out[r] = F.scaled_dot_product_attention(qr, keys, vals, scale=scale).reshape(h, 1, d)
    return out


def _scores_values(qp: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, addr: torch.Tensor, dt, fused: bool):
    """Each pair's chunk of K/V read from the pool, in the cache's dtype, with float32 (``dt``) products and sums:
    ``(scores [N, n_kv, g, CHUNK], a function of the weights [N, n_kv, g, CHUNK] giving [N, n_kv, g, d])``.

    ``fused`` (the compiled step on CUDA): the read is written as a product and a sum over the gathered pool, which
    inductor fuses into one kernel that loads each key and value where it lies, in bf16, and accumulates in float32:
    no copy of the chunk is made. Otherwise (eager, the plan's fake tensors, and the compiled step on CPU, which keeps
    the batched matmul its BLAS runs; the fused form is for the GPU, where the bytes a decode step reads bound its
    time) the chunk is gathered once in the cache's dtype and multiplied in float32: the same sums in another
    order."""
    n = addr.shape[0]
    n_kv, d = kc.shape[1], kc.shape[2]
    if fused:
        keys, vals = kc[addr], vc[addr]  # [N, CHUNK, n_kv, d], cache dtype: fused into the reductions below
        s = (qp[:, :, :, None, :] * keys.permute(0, 2, 1, 3)[:, :, None].to(dt)).sum(-1)
        return s, lambda p: (p[..., None] * vals.permute(0, 2, 1, 3)[:, :, None].to(dt)).sum(-2)
    flat = addr.reshape(-1)
    keys = kc.index_select(0, flat).view(n, CHUNK, n_kv, d).to(dt)
    vals = vc.index_select(0, flat).view(n, CHUNK, n_kv, d).to(dt)
    return torch.einsum("nkgd,nckd->nkgc", qp, keys), lambda p: torch.einsum("nkgc,nckd->nkgd", p, vals)


def _merge_rows(x: torch.Tensor, row: torch.Tensor, chunk: torch.Tensor, b: int, levels: int) -> torch.Tensor:
    """Sum each row's pair values ``x [N, ...]`` into ``[b + 1, ...]`` (the dump row last), deterministically: the
    pairs of a row lie together in chunk order, so a tree of ``levels`` halvings adds chunk ``c + s`` into chunk
    ``c`` (``c`` a multiple of ``2s``), the same additions in the same order on every run (an ``index_add`` would
    add with atomics on CUDA, in any order), and each row's sum lands on its chunk 0."""
    n = x.shape[0]
    s = 1
    for _ in range(levels):
        # shifted by s through a tail of s padding rows, sliced to [s, s + n): no comparison of n with s, which a
        # compiled step would turn into a guard (at n == s the slice x[s:] is empty, and dynamo fixed n there)
        nxt = torch.cat([x, x.new_zeros((s,) + tuple(x.shape[1:]))])[s:s + n]
        same = torch.cat([row, row.new_full((s,), -1)])[s:s + n] == row
        take = same & (chunk % (2 * s) == 0)
        x = x + torch.where(take.view(-1, *([1] * (x.dim() - 1))), nxt, torch.zeros_like(nxt))
        s *= 2
    target = torch.where(chunk == 0, row, torch.full_like(row, b))  # one chunk 0 per row; the rest to the dump row
    out = x.new_zeros((b + 1,) + tuple(x.shape[1:]))
    return out.index_put((target,), x)


def attend_pairs(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, at, scale: float | None,
                 max_len: int) -> torch.Tensor:
    """Decode attention ``q [b, H, 1, d]`` over the pool ``kc, vc [P, n_kv, d]`` through the pairs ``at`` (see
    :func:`locate_pairs`) in a cache whose rows reach ``max_len`` positions, returning ``[b, H, 1, d]`` in ``q``'s
    dtype."""
    addr, row, row_c, allowed, chunk = at
    b, h, _, d = q.shape
    n_kv = kc.shape[1]
    g = h // n_kv
    scale = d ** -0.5 if scale is None else scale
    dt = torch.promote_types(q.dtype, torch.float32)  # bf16 up to float32; float64 kept
    qp = q.reshape(b, n_kv, g, d).to(dt)[row_c]  # [N, n_kv, g, d]
    s, weigh = _scores_values(qp, kc, vc, addr, dt, kc.is_cuda and torch.compiler.is_compiling())
    s = (s * scale).masked_fill(~allowed[:, None, None, :], float("-inf"))
    m = s.amax(-1)  # [N, n_kv, g]; -inf where the pair reads nothing
    empty = torch.isinf(m)
    p = torch.exp(s - torch.where(empty, torch.zeros_like(m), m)[..., None])
    part_sum = p.sum(-1)
    part_out = weigh(p)
    # merge: each pair's partial weighed by exp(its max - its row's max); a max is exact in any order
    top = torch.full((b + 1, n_kv, g), float("-inf"), device=q.device, dtype=m.dtype)
    top = top.scatter_reduce(0, row[:, None, None].expand_as(m), m, "amax")
    w = torch.where(empty, torch.zeros_like(m), torch.exp(m - top[row]))
    both = torch.cat([part_out * w[..., None], (part_sum * w)[..., None]], -1)  # [N, n_kv, g, d + 1]
    levels = max(0, (max_len // CHUNK - 1).bit_length())
    merged = _merge_rows(both, row, chunk, b, levels)
    num, den = merged[:b, ..., :d], merged[:b, ..., d]
    out = num / den.clamp_min(torch.finfo(den.dtype).tiny)[..., None]  # a free slot (no pair) gets 0
    return out.reshape(b, h, 1, d).to(q.dtype)
