"""``engine.kv_cache: paged``: a KV cache whose capacity follows the rows' real lengths.

``engine.kv_cache: auto`` (the default) picks it when the budget cannot hold ``gen_batch_size`` rows at the full
length; when it can, the static cache holds them all and reads them in place, and paging would only add its gather.

The static cache (:class:`.decode.StaticKVCache`) gives every slot room for the longest row the run allows: at the
7B configs' 6144-token prompts and 8096-token replies that is 14336 positions a row, so a budget holds 48 rows
whatever their real lengths, while AZR's replies are mostly far shorter. Here, as in vLLM (PagedAttention) and
nano-vllm, the cache is a pool of pages of :data:`PAGE` positions and each row holds a *block table* of the pages
it has written: a row takes pages as it grows, and a budget holds as many rows as their real lengths allow, up to
``engine.gen_batch_size``.

- Layout: per layer ``k, v: [(n_pages + 1) * PAGE, n_kv, head_dim]`` (vLLM's NHD: one token's heads contiguous);
  the last page is the *trash* page. ``table [n_slots, max_len / PAGE + 1]`` maps a row's logical page to a
  physical one; unallocated entries and the last column (the static cache's trash position ``max_len``) point at
  the trash page, so padding, free slots and the steps a row takes past its end write there, as before.
- The forward computes each row's physical addresses once per call (``locate``): K/V writes are one ``index_put_``
  on the whole pool, as in the static cache (no functionalised copy of a slice). A decode step reads each
  row's own length: it is given the (row, chunk) pairs its rows' lengths need and attends chunk by chunk, merging
  the partial softmaxes (split-KV, :mod:`.splitkv`), so one long row no longer makes every row read its span. A
  prefill chunk reads the positions ``0..kv_len-1`` of its rows (the same symbolic span as the static cache),
  gathered into ``[b, n_kv, kv_len, head_dim]`` for SDPA. Either way the attended history is copied once per layer
  (a gather in plain PyTorch; a paged kernel, vLLM's paged-attention or FlashAttention's ``block_table``, would
  read the pages in place), and nothing else scales with the pool.
- Admission (:class:`PagedBatcher`), as nano-vllm's scheduler: a waiting request takes a free slot when the pool
  has pages for its prompt plus a reserve (one page per live row, so they can grow through the next interval,
  and at least 1% of the pool, vLLM's watermark); before each decode interval every live row is given the pages
  it writes in it. When the pool runs short the youngest row is *preempted*: its pages are freed and it goes
  back to the front of the queue with the tokens it made, to be prefilled again (vLLM's recompute preemption)
  and continue at the same step count. A row is never dropped; the oldest row always fits, since the engine
  refuses a budget whose pool cannot hold one row of the cache's capacity. Moving a row to another slot moves
  its block-table row, not its history, so the live rows are packed into the lowest slots before every interval
  and a step decodes the smallest batch bucket that holds them.
- Prefix sharing: the pages wholly inside a prompt's prefix are shared by reference (counted) between the rows
  with that prefix and adapter (the n_solve answers to a task); the partial last page is copied. A finished row's
  prefix stays in a prefix cache until the pool needs its pages (least recently used first; before any row is
  preempted).

Same tokens: sampling is counter-based on (seed, tokens made), so a row's tokens depend only on its prompt, adapter
and seed, whichever cache holds it. Without preemption the paged and static caches attend over the same keys; a
paged decode step sums them chunk by chunk (split-KV), so its attention equals the static cache's within float
rounding, as a preempted row's history, recomputed by a prefill, matches the decode-made K/V within float rounding
(chunked vs one-token matmuls): the tokens are equal unless two logits tie within that rounding
(tests/test_engine_paged.py).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from .batching import ContinuousBatcher
from .decode import StaticKVCache, cache_zeros, kv_capacity
from .splitkv import attend_pairs, chunk_pairs, locate_pairs, pad_pairs

PAGE = 16  # positions per page (vLLM's default block size); divides KV_ROUND, so a capacity is whole pages


def token_bytes(n_layers: int, n_kv: int, head_dim: int, dtype) -> int:
    """Bytes of one position's K and V over every layer."""
    return 2 * n_layers * n_kv * head_dim * torch.empty((), dtype=dtype).element_size()


class PagedKVCache:
    """``k[l], v[l]: [(n_pages + 1) * page, n_kv, head_dim]`` and ``table [n_slots, max_len / page + 1]`` (see the
    module docstring); ``n_slots`` rows of at most ``max_len`` positions each, ``n_pages`` pages between them."""

    split_kv = True  # a decode step reads each row's own chunks (reads(), :mod:`.splitkv`)

    def __init__(self, n_layers: int, n_slots: int, n_kv: int, head_dim: int, max_len: int, n_pages: int, dtype,
                 device, page: int = PAGE) -> None:
        if max_len % page or n_pages < max_len // page:
            raise ValueError(f"a paged cache of {n_pages} pages of {page} cannot hold one row of {max_len} "
                             "positions (a whole number of pages)")
        shape = ((n_pages + 1) * page, n_kv, head_dim)
        self.k = [cache_zeros(shape, dtype, device) for _ in range(n_layers)]
        self.v = [cache_zeros(shape, dtype, device) for _ in range(n_layers)]
        self.n_slots, self.max_len, self.trash = n_slots, max_len, max_len
        self.page, self.n_pages, self.trash_page = page, n_pages, n_pages
        self.table = torch.full((n_slots, max_len // page + 1), n_pages, dtype=torch.long, device=device)
        self.index = torch.arange(max_len + 1, device=device)
        # Pool, rows and capacity symbolic for a compiled step, as the static cache's (one graph for any budget).
        for t in self.k + self.v:
            torch._dynamo.maybe_mark_dynamic(t, 0)
        torch._dynamo.maybe_mark_dynamic(self.table, 0)
        torch._dynamo.maybe_mark_dynamic(self.table, 1)
        torch._dynamo.maybe_mark_dynamic(self.index, 0)
        if torch.device(device).type == "cuda":  # read and written in place by the CUDA graphs
            for t in self.k + self.v + [self.table]:
                torch._dynamo.mark_static_address(t)

    span = StaticKVCache.span

    # ---------------------------------------------------------------- the forward's cache operations
    def locate(self, slots: torch.Tensor | None, b: int, write: torch.Tensor, span: torch.Tensor):
        """Physical addresses ``[b, T]`` of the positions the rows write and ``[b, kv_len]`` of those they read."""
        rows = (torch.arange(b, device=write.device) if slots is None else slots)[:, None]
        table, page = self.table, self.page
        w_at = table[rows, write // page] * page + write % page
        if span.dim() == 2:  # decode over (row, chunk) pairs: a decode step writes at its rows' positions
            return w_at, locate_pairs(table, page, span, write[:, -1])
        return w_at, table[rows, span[None, :] // page] * page + span[None, :] % page

    def attend_pairs(self, li: int, q: torch.Tensor, at, scale: float | None) -> torch.Tensor:
        return attend_pairs(q, self.k[li], self.v[li], at, scale)

    def reads(self, nb: int, needs: list[int], cuda_graphs: bool) -> torch.Tensor:
        """What a decode step of rows ``0..nb-1`` reads when they attend to ``needs`` positions: their chunks."""
        return chunk_pairs(needs, nb, self.n_slots, self.max_len, cuda_graphs, self.table.device)

    def warm_reads(self, nb: int, n: int) -> torch.Tensor:
        return pad_pairs(n, nb, self.table.device)

    def store(self, li: int, at: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        kc, vc = self.k[li], self.v[li]
        kc[at] = k.transpose(1, 2).to(kc.dtype)
        vc[at] = v.transpose(1, 2).to(vc.dtype)

    def load(self, li: int, at: torch.Tensor, b: int, kv_len) -> tuple[torch.Tensor, torch.Tensor]:
        # index_select over the flat addresses: on CPU about twice as fast as advanced indexing with [b, kv_len]
        flat = at.reshape(-1)
        return tuple(t[li].index_select(0, flat).view(*at.shape, *t[li].shape[1:]).transpose(1, 2)
                     for t in (self.k, self.v))

    # ---------------------------------------------------------------- host-side edits
    def copy_page(self, src: int, dst: int, n: int) -> None:
        """Copy the first ``n`` positions of page ``src`` into page ``dst``."""
        a, b = src * self.page, dst * self.page
        for t in self.k + self.v:
            t[b:b + n] = t[a:a + n]

    def set_rows(self, slots: list[int], pages: list[list[int]]) -> None:
        """Block tables of ``slots``: their pages in order, the trash page after them."""
        if not slots:
            return
        rows = torch.full((len(slots), self.table.shape[1]), self.trash_page, dtype=torch.long)
        for i, ps in enumerate(pages):
            rows[i, :len(ps)] = torch.tensor(ps, dtype=torch.long)
        self.table[torch.tensor(slots, dtype=torch.long, device=self.table.device)] = rows.to(self.table.device)

    def set_entries(self, entries: list[tuple[int, int, int]]) -> None:
        """Block-table entries (slot, logical page, physical page): the pages rows grow into, one small copy."""
        if entries:
            idx = torch.tensor(entries, dtype=torch.long).to(self.table.device)
            self.table[idx[:, 0], idx[:, 1]] = idx[:, 2]

    def move_row(self, src: int, dst: int) -> None:
        self.table[dst] = self.table[src]
        self.table[src] = self.trash_page


class PagedBatcher(ContinuousBatcher):
    """:class:`.batching.ContinuousBatcher` over a :class:`PagedKVCache`: admission by free pages, pages given
    before each interval, recompute preemption, prefix pages shared by reference (see the module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        c = self.cache
        c.table.fill_(c.trash_page)  # a previous call's tables
        self.free = list(range(c.n_pages - 1, -1, -1))  # a stack: low pages first
        self.refs = [0] * c.n_pages
        self.pages: list[list[int]] = [[] for _ in range(c.n_slots)]
        self.prefix: OrderedDict[tuple, list[int]] = OrderedDict()  # key -> its prefix's pages (a reference each)
        self.born = [0] * c.n_slots  # admission order: the youngest row is preempted first
        self.clock = 0
        self.resumed: set[int] = set()  # preempted requests waiting to be prefilled again
        self.preemptions = 0

    # ---------------------------------------------------------------- pages
    def _free_pages(self, n: int, keep: tuple | None = None) -> bool:
        """Evict cached prefixes (least recently used first, never ``keep``) until ``n`` pages are free."""
        while len(self.free) < n:
            key = next((k for k in self.prefix if k != keep), None)
            if key is None:
                return False
            self._drop(self.prefix.pop(key))
        return True

    def _take_pages(self, n: int) -> list[int]:
        out = [self.free.pop() for _ in range(n)]
        for p in out:
            self.refs[p] = 1
        return out

    def _drop(self, pages: list[int]) -> None:
        for p in pages:
            self.refs[p] -= 1
            if self.refs[p] == 0:
                self.free.append(p)

    def _share(self, pages: list[int]) -> None:
        for p in pages:
            self.refs[p] += 1

    # ---------------------------------------------------------------- admission
    def _seq(self, r: int) -> list[int]:
        return self.prompts[r] + self.tokens[r] if r in self.resumed else self.prompts[r]

    def _admit(self) -> None:
        free_slots = [s for s in range(self.cache.n_slots) if self.req[s] < 0]
        page = self.cache.page
        live = sum(q >= 0 for q in self.req)
        placed, prefill, copy_after = [], [], []
        pending: set[tuple] = set()  # keys whose pages are prefilled in this round
        while self.waiting and free_slots:
            r = self.waiting[0]
            seq = self._seq(r)
            n_pre = len(seq) - 1
            key = (int(self.adapters[r]), tuple(seq[:-1]))
            hit = self.prefix.get(key) if n_pre else None
            full = n_pre // page
            n_new = full + 1 - (full if hit is not None else 0)  # pages for positions 0..n_pre
            busy = live + len(placed)
            reserve = max(self.cache.n_pages // 100, busy) if busy else 0
            if not self._free_pages(n_new + reserve, keep=key):
                if not busy:
                    raise RuntimeError(f"the paged KV cache ({self.cache.n_pages} pages) cannot hold a prompt of "
                                       f"{len(seq)} tokens")  # the engine sizes the pool for one longest row
                break
            self.waiting.popleft()
            s = free_slots.pop(0)
            new = self._take_pages(n_new)
            if hit is not None:
                self.prefix.move_to_end(key)
                self._share(hit[:full])
                pages = hit[:full] + new
                if n_pre % page:  # the partial page: its prefix positions (once written, when prefilled now)
                    if key in pending:
                        copy_after.append((hit[full], new[0], n_pre % page))
                    else:
                        self.cache.copy_page(hit[full], new[0], n_pre % page)
            else:
                pages = new
                if n_pre:
                    prefill.append((s, r))
                    if r not in self.resumed:
                        held = pages[:-(-n_pre // page)]
                        self._share(held)
                        self.prefix[key] = held
                        pending.add(key)
            self.pages[s], self.key[s] = pages, key
            placed.append((s, r, seq))
        if not placed:
            return
        self.cache.set_rows([s for s, _, _ in placed], [self.pages[s] for s, _, _ in placed])
        self._prefill(prefill)
        for src, dst, n in copy_after:
            self.cache.copy_page(src, dst, n)
        self._place([(s, r, seq[-1], len(seq) - 1, len(self.tokens[r])) for s, r, seq in placed])
        for s, r, _ in placed:
            self.resumed.discard(r)
            self.born[s], self.clock = self.clock, self.clock + 1

    # ---------------------------------------------------------------- decode
    def _decode_interval(self) -> None:
        # Moving a row is a block-table row here, not a copy of its history: the live rows are packed into the
        # lowest slots before every interval (the static cache waits until they fill half the batch and nothing
        # waits), so a step decodes the smallest batch bucket that holds them.
        self._pack([s for s in range(self.cache.n_slots) if self.req[s] >= 0])
        super()._decode_interval()

    def _reserve(self, live: list[int], k: int) -> list[int]:
        page = self.cache.page
        order = sorted(live, key=lambda s: self.born[s])
        need = {}
        for s in order:
            r = self.req[s]
            k_s = min(k, self.row_max[r] - len(self.tokens[r]))
            need[s] = max(0, -(-(self.hpos[s] + k_s) // page) - len(self.pages[s]))
        total = sum(need.values())
        while not self._free_pages(total) and len(order) > 1:
            s = order.pop()
            total -= need[s]
            self._preempt(s)
        if not self._free_pages(total):
            raise RuntimeError("the paged KV cache cannot hold its oldest row")  # sized so that it always can
        grown = []
        for s in order:
            if need[s]:
                new = self._take_pages(need[s])
                grown += [(s, len(self.pages[s]) + j, p) for j, p in enumerate(new)]
                self.pages[s] += new
        self.cache.set_entries(grown)
        return sorted(order)

    def _preempt(self, s: int) -> None:
        """Free slot ``s``'s pages and queue its request first, to be prefilled again with the tokens it made."""
        r = self.req[s]
        self._release([s])
        self.pos[s], self.ids[s] = self.cache.trash, -1
        self.req[s], self.key[s] = -1, None
        self.waiting.appendleft(r)
        self.resumed.add(r)
        self.preemptions += 1
        self._ids_version += 1

    def _release(self, slots: list[int]) -> None:
        for s in slots:
            self._drop(self.pages[s])
            self.pages[s] = []
        self.cache.set_rows(slots, [[] for _ in slots])

    def _move_slot(self, src: int, dst: int) -> None:
        self.cache.move_row(src, dst)
        self.pages[dst], self.pages[src] = self.pages[src], []
        self.born[dst] = self.born[src]
        self._move_state(src, dst)


def kv_shape(kind: str, dims: tuple[int, int, int], dtype, tokens: int, cfg, prev: tuple | None, remake: bool,
             budget: int) -> tuple[int, int, int, str]:
    """The run's cache shape ``(n_slots, capacity, n_pages, kind)`` (``n_pages`` 0 for the static cache) for rows of
    up to ``tokens`` positions under ``budget`` bytes. ``prev``: the run's shape so far; ``remake``: the cache was
    released, so the same shape is made again if it still fits (one cache shape per run, see
    TorchEngine._kv_cache). ``kind`` auto keeps the run's kind once chosen (a new kind would compile new graphs).

    Static: ``engine.gen_batch_size`` slots of the capacity, or as many as the budget holds. Paged: that many slots
    and as many pages as the budget holds, no more than the slots' full length; the budget must hold one row of the
    capacity (else the error below, as for the static cache). Auto: static when it holds every slot, else paged."""
    n_layers, n_kv, head_dim = dims
    if kind == "auto":
        kind = prev[3] if prev is not None else "auto"
    if prev is not None and prev[3] == kind and prev[1] >= tokens and remake and \
            cache_bytes(kind, dims, dtype, prev) <= budget:
        return prev
    capacity = max(kv_capacity(tokens, cfg.max_model_len), prev[1] if prev is not None else 0)
    n_want = max(1, cfg.gen_batch_size)
    slot = StaticKVCache.slot_bytes(n_layers, n_kv, head_dim, capacity, dtype)
    if kind == "auto":
        kind = "static" if budget >= n_want * slot else "paged"
    if kind == "paged":
        per_page = PAGE * token_bytes(n_layers, n_kv, head_dim, dtype)
        n_pages = min(budget // per_page - 1, n_want * capacity // PAGE)  # the trash page counts
        row = (capacity // PAGE + 1) * per_page
        if n_pages >= capacity // PAGE:
            return n_want, capacity, n_pages, kind
    else:
        row = slot
        if budget >= row:
            return int(min(n_want, budget // row)), capacity, 0, kind
    raise RuntimeError(
        f"the KV cache budget ({budget / 2**30:.2f} GiB) cannot hold one row of {capacity} tokens "
        f"({row / 2**30:.2f} GiB): raise engine.kv_cache_gib / engine.kv_cache_memory_fraction or "
        "shorten engine.max_model_len / the prompts / max_new_tokens")


def cache_bytes(kind: str, dims: tuple[int, int, int], dtype, shape: tuple) -> int:
    n_slots, capacity, n_pages = shape[:3]
    if kind == "paged":
        return (n_pages + 1) * PAGE * token_bytes(*dims, dtype)
    return n_slots * StaticKVCache.slot_bytes(*dims, capacity, dtype)
