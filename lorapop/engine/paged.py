"""The KV cache: a pool of pages that rows take as they grow, as in vLLM (PagedAttention) and nano-vllm.

A cache that gives every row room for the longest row the run allows (14336 positions a row at the 7B configs'
6144-token prompts and 8096-token replies) holds budget / 14336 rows whatever their real lengths, while AZR's
replies are mostly far shorter. Here the cache is a pool of pages of :data:`.kvsize.PAGE` positions and each row
holds a *block table* of the pages it has written, so a budget holds as many rows as their real lengths allow, up to
``engine.gen_batch_size``. Its size is decided once for the run (:mod:`.kvsize`); who holds which page is the block
manager's (:mod:`.block_manager`); who runs each step is the scheduler's (:mod:`.scheduler`).

- Layout: per layer ``k, v: [(n_pages + 1) * PAGE, n_kv, head_dim]`` (vLLM's NHD: one token's heads contiguous);
  the last page is the *trash* page. ``table [n_slots, max_len / PAGE + 1]`` maps a row's logical page to a
  physical one; unallocated entries and the last column (position ``max_len``, the trash position) point at the
  trash page, so padding, free slots and the steps a row takes past its end write there, and nothing reads them.
- The forward computes each row's physical addresses once per call (``locate``): K/V writes are one ``index_put_``
  on the whole pool (no functionalised copy of a slice). A decode step reads each row's own length: it is given the
  (row, chunk) pairs its rows' lengths need and attends chunk by chunk, merging the partial softmaxes (split-KV,
  :mod:`.splitkv`), so one long row does not make every row read its span; eagerly on CPU it reads row by row,
  each row's own positions (``attend_rows``). A prefill chunk reads the positions
  ``0..kv_len-1`` of its rows, gathered into ``[b, n_kv, kv_len, head_dim]`` for SDPA.

Same tokens: sampling is counter-based on (seed, tokens made), so a row's tokens depend only on its prompt, adapter
and seed, whichever slot and pages hold it; a preempted row's history, recomputed by a prefill, matches the
decode-made K/V within float rounding (chunked vs one-token matmuls), so its tokens are equal unless two logits tie
within that rounding (tests/test_engine_paged.py).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from .decode import cache_zeros
from .kvsize import PAGE
from .splitkv import attend_pairs, attend_rows, chunk_pairs, locate_pairs, locate_rows, pad_pairs


class PagedKVCache:
    """``k[l], v[l]: [(n_pages + 1) * page, n_kv, head_dim]`` and ``table [n_slots, max_len / page + 1]`` (see the
    module docstring); ``n_slots`` rows of at most ``max_len`` positions each, ``n_pages`` pages between them."""

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
        # Pool, rows and capacity symbolic for a compiled step (one graph for any budget).
        for t in self.k + self.v:
            torch._dynamo.maybe_mark_dynamic(t, 0)
        torch._dynamo.maybe_mark_dynamic(self.table, 0)
        torch._dynamo.maybe_mark_dynamic(self.table, 1)
        torch._dynamo.maybe_mark_dynamic(self.index, 0)
        if torch.device(device).type == "cuda":  # read and written in place by the CUDA graphs
            for t in self.k + self.v + [self.table]:
                torch._dynamo.mark_static_address(t)

    def span(self, kv_len: int) -> torch.Tensor:
        """Cache positions ``0..kv_len-1`` as a tensor whose length a compiled step treats as symbolic (a prefill
        chunk reads them)."""
        out = self.index[:kv_len]
        torch._dynamo.maybe_mark_dynamic(out, 0)
        return out

    # ---------------------------------------------------------------- the forward's cache operations
    def locate(self, slots: torch.Tensor | None, b: int, write: torch.Tensor, span: torch.Tensor):
        """Physical addresses ``[b, T]`` of the positions the rows write and ``[b, kv_len]`` of those they read."""
        rows = (torch.arange(b, device=write.device) if slots is None else slots)[:, None]
        table, page = self.table, self.page
        w_at = table[rows, write // page] * page + write % page
        if span.dim() == 2:  # decode: a decode step writes at its rows' positions and reads each row's own length
            if self.row_by_row():
                return w_at, locate_rows(table, page, write[:, -1], self.max_len)
            return w_at, locate_pairs(table, page, span, write[:, -1])
        return w_at, table[rows, span[None, :] // page] * page + span[None, :] % page

    def row_by_row(self) -> bool:
        """Whether a decode step reads row by row (:func:`.splitkv.attend_rows`): eagerly on CPU, where a Python
        loop over the rows costs little beside their reads and each row's gather stays in cache. Compiled, on CUDA
        and under the plan's fake tensors it reads (row, chunk) pairs in one batch (:func:`.splitkv.attend_pairs`)."""
        return self.table.device.type == "cpu" and not torch.compiler.is_compiling() \
            and not is_in_torch_dispatch_mode()

    def attend_pairs(self, li: int, q: torch.Tensor, at, scale: float | None) -> torch.Tensor:
        if isinstance(at, list):
            return attend_rows(q, self.k[li], self.v[li], at, scale)
        return attend_pairs(q, self.k[li], self.v[li], at, scale, self.max_len)

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
