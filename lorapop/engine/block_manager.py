"""Who holds which page of the paged KV cache (nano-vllm's ``BlockManager``): the free pages, each page's reference
count, the prefixes kept for reuse, and the rows of the block table the forward reads.

- A row takes pages as it grows; a page is free again when its last holder lets it go.
- Prefix sharing: the pages wholly inside a prompt's prefix are shared by reference between the rows with that
  prefix and adapter (the n_solve answers to a task); the partial last page is copied. A finished row's prefix stays
  cached until the pool needs its pages (least recently used first, before any row is preempted).
- One block manager per generate call, over the run's one cache: its tables are reset when it is made.
"""

from __future__ import annotations

from collections import OrderedDict

from .paged import PagedKVCache


class BlockManager:
    """The pages of ``cache`` and their holders."""

    def __init__(self, cache: PagedKVCache) -> None:
        self.cache, self.page = cache, cache.page
        cache.table.fill_(cache.trash_page)  # a previous call's tables
        self.free = list(range(cache.n_pages - 1, -1, -1))  # a stack: low pages first
        self.refs = [0] * cache.n_pages
        self.prefix: OrderedDict[tuple, list[int]] = OrderedDict()  # key -> its prefix's pages (a reference each)

    @property
    def n_pages(self) -> int:
        return self.cache.n_pages

    def pages_for(self, positions: int) -> int:
        """Pages that hold ``positions`` positions."""
        return -(-positions // self.page)

    def make_free(self, n: int, keep: tuple | None = None) -> bool:
        """Evict cached prefixes (least recently used first, never ``keep``) until ``n`` pages are free."""
        while len(self.free) < n:
            key = next((k for k in self.prefix if k != keep), None)
            if key is None:
                return False
            self.drop(self.prefix.pop(key))
        return True

    def take(self, n: int) -> list[int]:
        out = [self.free.pop() for _ in range(n)]
        for p in out:
            self.refs[p] = 1
        return out

    def drop(self, pages: list[int]) -> None:
        for p in pages:
            self.refs[p] -= 1
            if self.refs[p] == 0:
                self.free.append(p)

    def share(self, pages: list[int]) -> None:
        for p in pages:
            self.refs[p] += 1

    def cached(self, key: tuple) -> list[int] | None:
        """The pages of a cached prefix (marked used now), or None."""
        hit = self.prefix.get(key)
        if hit is not None:
            self.prefix.move_to_end(key)
        return hit

    def keep_prefix(self, key: tuple, pages: list[int]) -> None:
        """Cache ``pages`` as the prefix ``key`` (a reference of their own)."""
        self.share(pages)
        self.prefix[key] = pages

    # ---------------------------------------------------------------- the block table (the cache's, on its device)
    def set_rows(self, slots: list[int], pages: list[list[int]]) -> None:
        self.cache.set_rows(slots, pages)

    def grow(self, entries: list[tuple[int, int, int]]) -> None:
        """(slot, logical page, physical page) entries of the pages rows grow into."""
        self.cache.set_entries(entries)

    def move_row(self, src: int, dst: int) -> None:
        self.cache.move_row(src, dst)

    def copy_page(self, src: int, dst: int, n: int) -> None:
        self.cache.copy_page(src, dst, n)
