"""Who runs the next step (nano-vllm's ``Scheduler``, vLLM's v1 scheduler reduced to what a generate call needs):
the waiting requests, the slots of the running ones, admission by free pages, the pages each running row writes in
the next decode interval, recompute preemption when they run short, and the rows' tokens taken in after it.

- Requests wait longest prompt first with equal prefixes adjacent. A waiting request takes a free slot when the
  pool has pages for its prompt plus a reserve (one page per running row, so they can grow through the next
  interval, and at least 1% of the pool, vLLM's watermark). Its prompt but the last token is prefilled (the model
  runner's job); the last token is its first decode input.
- Before each decode interval the running rows are packed into the lowest slots (moving a row moves its block-table
  row, not its history), so a step decodes the smallest batch bucket that holds them, and each is given the pages
  it writes in the interval. When the pool runs short the youngest row is *preempted*: its pages are freed and it
  goes back to the front of the queue with the tokens it made, to be prefilled again (vLLM's recompute preemption)
  and continue at the same step count. A row is never dropped: the oldest row always fits, since the cache is sized
  to hold one row of its capacity (:mod:`.kvsize`).
- Every ``stop_check_interval`` steps the host reads the sampled tokens, finishes rows at EOS, a stop string or
  their ``max_new_tokens``, and hands their slots to waiting requests, so the batch stays full however unequal the
  rows' lengths.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .sequence import Request, StopChecker


@dataclass
class Admission:
    """Requests given slots in one round: ``placed`` (slot, request, first decode input, its position);
    ``prefill`` (slot, tokens to compute, adapter) for prefixes not already in the cache; ``copy_after`` (source
    page, page, positions) partial pages copied once the prefill has written their source."""
    placed: list[tuple[int, Request, int, int]] = field(default_factory=list)
    prefill: list[tuple[int, list[int], int]] = field(default_factory=list)
    copy_after: list[tuple[int, int, int]] = field(default_factory=list)


class Scheduler:
    """One generate call's ``requests`` over ``blocks`` (the run's cache's pages) and its ``n_slots`` rows."""

    def __init__(self, requests: list[Request], blocks: BlockManager, n_slots: int, interval: int) -> None:
        self.waiting = deque(sorted(requests, key=lambda r: (-len(r.prompt), r.adapter, r.prompt)))
        self.blocks, self.interval = blocks, max(1, interval)
        self.slots: list[Request | None] = [None] * n_slots
        self.clock = 0
        self.preemptions = 0

    def running(self) -> list[int]:
        return [s for s, r in enumerate(self.slots) if r is not None]

    def done(self) -> bool:
        return not self.waiting and all(r is None for r in self.slots)

    # ---------------------------------------------------------------- admission
    def admit(self) -> Admission:
        blocks, page = self.blocks, self.blocks.page
        free_slots = [s for s, r in enumerate(self.slots) if r is None]
        live = len(self.slots) - len(free_slots)
        out = Admission()
        pending: set[tuple] = set()  # keys whose pages are prefilled in this round
        while self.waiting and free_slots:
            r = self.waiting[0]
            seq = r.seq()
            n_pre = len(seq) - 1
            key = r.prefix_key()
            hit = blocks.prefix.get(key) if n_pre else None
            full = n_pre // page
            n_new = full + 1 - (full if hit is not None else 0)  # pages for positions 0..n_pre
            busy = live + len(out.placed)
            reserve = max(blocks.n_pages // 100, busy) if busy else 0
            if not blocks.make_free(n_new + reserve, keep=key):
                if not busy:
                    raise RuntimeError(f"the paged KV cache ({blocks.n_pages} pages) cannot hold a prompt of "
                                       f"{len(seq)} tokens")  # the engine sizes the pool for one longest row
                break
            self.waiting.popleft()
            s = free_slots.pop(0)
            new = blocks.take(n_new)
            if hit is not None:
                blocks.cached(key)
                blocks.share(hit[:full])
                pages = hit[:full] + new
                if n_pre % page:  # the partial page: its prefix positions (once written, when prefilled now)
                    if key in pending:
                        out.copy_after.append((hit[full], new[0], n_pre % page))
                    else:
                        blocks.copy_page(hit[full], new[0], n_pre % page)
            else:
                pages = new
                if n_pre:
                    out.prefill.append((s, seq[:-1], r.adapter))
                    if not r.resumed:
                        blocks.keep_prefix(key, pages[:blocks.pages_for(n_pre)])
                        pending.add(key)
            r.slot, r.pages, r.key, r.pos = s, pages, key, n_pre
            self.slots[s] = r
            out.placed.append((s, r, seq[-1], n_pre))
        if out.placed:
            blocks.set_rows([s for s, *_ in out.placed], [r.pages for _, r, *_ in out.placed])
        for _, r, *_ in out.placed:
            r.resumed = False
            r.born, self.clock = self.clock, self.clock + 1
        return out

    # ---------------------------------------------------------------- a decode interval
    def pack(self) -> list[tuple[int, int]]:
        """Move the running rows into the lowest slots; the (source, destination) moves made."""
        live = self.running()
        holes = [s for s in range(len(live)) if self.slots[s] is None]
        movers = [s for s in live if s >= len(live)]
        for src, dst in zip(movers, holes):
            self.blocks.move_row(src, dst)
            r = self.slots[dst] = self.slots[src]
            self.slots[src] = None
            r.slot = dst
        return list(zip(movers, holes))

    def interval_steps(self) -> int:
        """Decode steps before the next host read: ``stop_check_interval``, fewer when every row ends sooner."""
        return min(self.interval, max(self.slots[s].left for s in self.running()))

    def reserve(self, k: int) -> tuple[list[int], list[int]]:
        """The slots that decode the next ``k`` steps, each given the pages it writes in them, and the slots whose
        rows were preempted (youngest first) to find those pages."""
        blocks = self.blocks
        order = sorted(self.running(), key=lambda s: self.slots[s].born)
        need = {}
        for s in order:
            r = self.slots[s]
            need[s] = max(0, blocks.pages_for(r.pos + min(k, r.left)) - len(r.pages))
        total = sum(need.values())
        preempted = []
        while not blocks.make_free(total) and len(order) > 1:
            s = order.pop()
            total -= need[s]
            self._preempt(s)
            preempted.append(s)
        if not blocks.make_free(total):
            raise RuntimeError("the paged KV cache cannot hold its oldest row")  # sized so that it always can
        grown = []
        for s in order:
            if need[s]:
                r = self.slots[s]
                new = blocks.take(need[s])
                grown += [(s, len(r.pages) + j, p) for j, p in enumerate(new)]
                r.pages += new
        blocks.grow(grown)
        return sorted(order), preempted

    def needs(self, nb: int, k: int) -> list[int]:
        """Positions each of slots ``0..nb-1`` attends to by the end of the next ``k`` steps (0 when free)."""
        return [self.slots[s].pos + k if self.slots[s] is not None else 0 for s in range(nb)]

    def postprocess(self, live: list[int], got: list[list[int]], got_lp: list[list[float]], k: int,
                    eos: set[int], stop_fn: StopChecker | None) -> list[int]:
        """Take in the interval's tokens of the ``live`` slots; the slots whose rows are done."""
        done = []
        for s in live:
            r = self.slots[s]
            if r.append(got[s][:r.left], got_lp[s], eos, stop_fn):
                done.append(s)
            r.pos += k
        return done

    def finish(self, slots: list[int]) -> list[Request]:
        """Free the slots of finished rows and their pages; the rows."""
        out = [self.slots[s] for s in slots]
        self._release(slots)
        return out

    def _release(self, slots: list[int]) -> None:
        for s in slots:
            r = self.slots[s]
            self.blocks.drop(r.pages)
            r.pages, r.slot = [], -1
            self.slots[s] = None
        self.blocks.set_rows(slots, [[] for _ in slots])

    def _preempt(self, s: int) -> None:
        """Free slot ``s``'s pages and queue its request first, to be prefilled again with the tokens it made."""
        r = self.slots[s]
        self._release([s])
        r.key = None
        r.resumed = True
        self.waiting.appendleft(r)
        self.preemptions += 1
