"""Continuous batching over the static KV cache, with prompt-prefix sharing.

The cache has ``n_slots`` rows. Requests (prompt, adapter, seed) wait in a queue; whenever slots are free the next
requests take them: their prompt but its last token is prefilled into the slot (in chunks of at most
``prefill_chunk_tokens`` tokens per forward), and the last prompt token becomes the slot's first decode input. One
decode step then advances every slot by one token; every ``stop_check_interval`` steps the host reads the sampled
tokens, finishes rows at EOS, a stop string or ``max_new_tokens`` and hands their slots to waiting requests, so the
batch stays full however unequal the rows' lengths.

Prefix sharing: a slot remembers the key ``(adapter, prompt[:-1])`` of the prefix it holds; the prefix of a live or
finished (not yet reused) slot is never overwritten, since generated tokens go after it. A request whose key some
slot holds copies those cache rows instead of recomputing them, so the n_solve answers to one task (same prompt,
same adapter) prefill once. Requests are queued longest prompt first with equal keys adjacent.

When no request is waiting and at most half the decoded slots are live, the live slots are moved to the front of
the cache (compaction), so the tail of a generation decodes a smaller batch. Decoded batches are rounded up to powers
of two from 2 (the batch buckets) and attention lengths to multiples of 64 (to powers of two under CUDA graphs,
which record one graph per shape); the compiled step treats both as symbolic (:mod:`.compiled`).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable

import torch

from .compiled import batch_bucket
from .decode import LlamaFamilyDecoder, StaticKVCache


class StopChecker:
    """Stop strings under vLLM's rule (``check_stop_strings``): a stop string counts only where it ends inside the
    newest token's characters, so one completed while ``min_new_tokens`` held stops back is never found later (the
    batcher looks only past ``min_new_tokens``), and both backends end the same rows at the same token.
    :meth:`hit` is that rule for the row's last token: it decodes a short tail (a token is at least one character,
    plus slack for ids that decode to partial UTF-8), with and without its last id. :meth:`first_hit` applies it to
    every token of an interval at the cost of one decode when no stop string is in the new text (the common case)."""

    def __init__(self, tokenizer: Any, stop: tuple[str, ...]) -> None:
        self.tokenizer, self.stop = tokenizer, stop
        self.n_tail = max(len(s) for s in stop) + 8

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def hit(self, row: list[int]) -> bool:
        tail = row[-self.n_tail:]
        text = self._text(tail)
        before = len(self._text(tail[:-1])) if len(tail) > 1 else 0
        return any(text.find(s, max(0, before - len(s) + 1)) != -1 for s in self.stop)

    def first_hit(self, row: list[int], start: int) -> int | None:
        """The shortest length ``j > start`` at which ``hit(row[:j])``, or None. First one decode of the window
        from ``n_tail`` ids before ``start``: a stop string ending in the new tokens' text lies in it, past the old
        text (less a stop string's length and the slack), so when none is there no token is checked one by one."""
        if len(row) <= start:
            return None
        lo = max(0, start - self.n_tail)
        text = self._text(row[lo:])
        old = len(self._text(row[lo:start])) if start > lo else 0
        if all(text.find(s, max(0, old - len(s) + 1 - 8)) == -1 for s in self.stop):
            return None
        return next((j for j in range(start + 1, len(row) + 1) if self.hit(row[:j])), None)


def cuts_nucleus(greedy: bool, temperature: float, top_p: float) -> bool:
    """Whether a call with these settings samples from a nucleus (``top_p < 1``): the sampling branch that has a
    compiled graph of its own (engine.compile_nucleus)."""
    return not greedy and temperature > 0 and top_p < 1.0


def stop_checker(tokenizer: Any, stop: tuple[str, ...] | list[str]) -> StopChecker | None:
    """The :class:`StopChecker` of ``stop`` (empty strings dropped); None without any."""
    stop = tuple(s for s in stop if s)
    return StopChecker(tokenizer, stop) if stop else None


class ContinuousBatcher:
    """One ``generate`` call's rows over ``cache``; ``step`` is the (possibly compiled) ``decode_step``."""

    def __init__(self, dec: LlamaFamilyDecoder, cache: StaticKVCache, ctx: Any, step: Callable, *, dense: bool,
                 compiled: bool, prefill_chunk_tokens: int, check_interval: int, max_new_tokens: int,
                 sampling: tuple, eos_ids: list[int], vocab_key: torch.Tensor, eos_mask: torch.Tensor | None,
                 on_finished: Callable[[int], None] | None = None,
                 stop_fn: StopChecker | None = None, min_new_tokens: int = 0) -> None:
        self.dec, self.cache, self.ctx, self.step = dec, cache, ctx, step
        self.dense, self.compiled = dense, compiled
        self.chunk = max(1, prefill_chunk_tokens)
        self.interval = max(1, check_interval)
        self.max_new, self.sampling = max_new_tokens, sampling
        self.eos = set(eos_ids)
        self.vocab_key, self.eos_mask = vocab_key, eos_mask
        self.on_finished = on_finished
        self.stop_fn, self.min_new = stop_fn, min_new_tokens
        dev = cache.k[0].device
        n = cache.n_slots
        self.dev = dev
        # Device state of each slot: next input token, its position (trash when free), adapter, seed, tokens made.
        self.tok = torch.zeros(n, dtype=torch.long, device=dev)
        self.pos = torch.full((n,), cache.trash, dtype=torch.long, device=dev)
        self.ids = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.seeds = torch.zeros(n, dtype=torch.long, device=dev)
        self.steps = torch.zeros(n, dtype=torch.long, device=dev)
        self.out = torch.zeros(n, self.interval, dtype=torch.long, device=dev)
        self.out_lp = torch.zeros(n, self.interval, dtype=torch.float32, device=dev)
        # Sampling settings as per-slot tensors, so a compiled step never specialises on their values.
        min_new, greedy, temperature, top_p = sampling
        temperature = 0.0 if greedy else max(0.0, float(temperature))
        self.min_new_t = torch.full((n,), int(min_new), dtype=torch.long, device=dev)
        self.temp = torch.full((n,), temperature, dtype=torch.float32, device=dev)
        self.top_p = torch.full((n,), float(top_p), dtype=torch.float32, device=dev)
        # Eager: skip the noise / the vocabulary sort when no row needs them. Compiled: one graph for every
        # temperature, and the nucleus (a [b, V] sort and scan per token) only in a graph of its own, declared with
        # engine.compile_nucleus (else a call that cuts one decodes eagerly): training samples whole distributions
        # (config load refuses top_p < 1), so its step never sorts the vocabulary. (Also, torch 2.11's inductor
        # failed to generate the nucleus mask's triton kernel on an H200: docs/RESULTS.md, "GPU".)
        nucleus = cuts_nucleus(greedy, temperature, top_p)
        self.branches = (True, nucleus) if compiled else (temperature > 0, nucleus)
        # Host state: request in the slot (-1 free), prefix key it holds, position of its next input.
        self.req = [-1] * n
        self.key: list[tuple | None] = [None] * n
        self.hpos = [0] * n
        self._ctx_for: tuple | None = None  # (nb, ids version) the LoRAContext was last set for
        self._view_cache: dict[int, tuple[torch.Tensor, ...]] = {}
        # Host time of the per-row bookkeeping after each interval's sync, the row-steps it covered and the decode
        # steps (bench/gpu.py: host_us_per_row_token, rows decoded per step).
        self.host_s, self.row_tokens, self.decode_steps = 0.0, 0, 0

    # ------------------------------------------------------------------ public
    def run(self, prompts: list[list[int]], adapter_ids: list[int], seeds: list[int],
            max_new: list[int] | None = None) -> tuple[list[list[int]], list[str], list[list[float]]]:
        """Tokens, finish reasons and the sampler's log-probability of each token (see sample_tokens) per row;
        ``max_new`` optionally caps each row (default ``max_new_tokens``)."""
        self.prompts, self.adapters, self.row_seeds = prompts, adapter_ids, seeds
        self.row_max = max_new if max_new is not None else [self.max_new] * len(prompts)
        self.tokens: list[list[int]] = [[] for _ in prompts]
        self.logprobs: list[list[float]] = [[] for _ in prompts]
        self.reasons = ["length"] * len(prompts)
        order = sorted(range(len(prompts)), key=lambda k: (-len(prompts[k]), adapter_ids[k], prompts[k]))
        self.waiting = deque(order)
        self._ids_version = 0
        while self.waiting or any(r >= 0 for r in self.req):
            self._admit()
            self._decode_interval()
            if not self.waiting:
                self._compact()
        return self.tokens, self.reasons, self.logprobs

    # ------------------------------------------------------------------ admission and prefill
    def _seq(self, r: int) -> list[int]:
        """The tokens request ``r`` enters its slot with (a paged batcher resumes a preempted row with its own)."""
        return self.prompts[r]

    def _prefix_key(self, r: int) -> tuple:
        return (int(self.adapters[r]), tuple(self.prompts[r][:-1]))

    def _admit(self) -> None:
        free = [s for s in range(self.cache.n_slots) if self.req[s] < 0]
        if not free or not self.waiting:
            return
        take = [self.waiting.popleft() for _ in range(min(len(free), len(self.waiting)))]
        wanted = {self._prefix_key(r) for r in take}
        sources: set[int] = set()
        pending: dict[tuple, int] = {}  # key -> slot prefilled in this round
        late: set[int] = set()  # slots whose prefix is written only after the prefill: no copy source before it
        copy_now, copy_after, prefill, placed, unplaced = [], [], [], [], []
        for r in take:
            key = self._prefix_key(r)
            holder = next((h for h in range(self.cache.n_slots) if self.key[h] == key and h not in late), None)
            if holder is not None and holder in free:  # a finished slot still holds this very prefix: reuse it
                s = holder
            else:
                # A free slot whose stale prefix nobody in this round wants (and that is not a copy source).
                cand = [f for f in free if f not in sources]
                if not cand:
                    unplaced.append(r)
                    continue
                s = next((f for f in cand if self.key[f] not in wanted), cand[0])
                if holder is not None:
                    copy_now.append((holder, s))
                    sources.add(holder)
                elif key in pending:
                    copy_after.append((pending[key], s))
                    late.add(s)
                elif len(key[1]):
                    pending[key] = s
                    prefill.append((s, r))
                    late.add(s)
            free.remove(s)
            self.key[s] = key
            placed.append((s, r))
        self.waiting.extendleft(reversed(unplaced))
        n_pre = {s: len(self.prompts[r]) - 1 for s, r in placed}
        for src, dst in copy_now:
            self.cache.copy_slot(src, dst, n_pre[dst])
        self._prefill(prefill)
        for src, dst in copy_after:
            self.cache.copy_slot(src, dst, n_pre[dst])
        self._place([(s, r, self.prompts[r][-1], n_pre[s], 0) for s, r in placed])

    def _place(self, rows: list[tuple[int, int, int, int, int]]) -> None:
        """Device and host state of newly admitted rows: (slot, request, first input token, its position, tokens the
        request has made)."""
        slots = torch.tensor([s for s, *_ in rows], dtype=torch.long, device=self.dev)

        def col(vals):
            return torch.tensor(vals, dtype=torch.long, device=self.dev)

        self.tok[slots] = col([t for _, _, t, _, _ in rows])
        self.pos[slots] = col([p for _, _, _, p, _ in rows])
        self.ids[slots] = col([int(self.adapters[r]) for _, r, *_ in rows])
        self.seeds[slots] = col([int(self.row_seeds[r]) % (1 << 63) for _, r, *_ in rows])
        self.steps[slots] = col([n for *_, n in rows])
        for s, r, _, p, _ in rows:
            self.req[s], self.hpos[s] = r, p
        self._ids_version += 1

    @torch.no_grad()
    def _prefill(self, rows: list[tuple[int, int]]) -> None:
        """Prefill ``prompt[:-1]`` of each (slot, request): waves of similar-length rows, each wave in chunks of
        positions, every forward holding at most ``chunk`` tokens (padding included)."""
        todo = sorted(rows, key=lambda sr: -len(self._seq(sr[1])))
        while todo:
            longest = len(self._seq(todo[0][1])) - 1
            width = min(longest, self.chunk)
            wave, todo = todo[:max(1, self.chunk // width)], todo[max(1, self.chunk // width):]
            wave.sort(key=lambda sr: int(self.adapters[sr[1]]))  # contiguous adapter runs for the LoRA layers
            seqs = [self._seq(r)[:-1] for _, r in wave]
            slots = torch.tensor([s for s, _ in wave], dtype=torch.long, device=self.dev)
            self.ctx.set(torch.tensor([int(self.adapters[r]) for _, r in wave], dtype=torch.long, device=self.dev))
            self._ctx_for = None
            for start in range(0, longest, width):
                w = min(width, longest - start)
                toks = torch.full((len(wave), w), 0, dtype=torch.long)
                valid = torch.zeros((len(wave), w), dtype=torch.bool)
                for k, seq in enumerate(seqs):
                    piece = seq[start:start + w]
                    if piece:
                        toks[k, :len(piece)] = torch.tensor(piece)
                        valid[k, :len(piece)] = True
                pos = torch.arange(start, start + w).expand(len(wave), w)
                write = torch.where(valid, pos, torch.full_like(pos, self.cache.trash))
                self.dec.forward(self.cache, toks.to(self.dev), pos.to(self.dev), write.to(self.dev), start + w,
                                 slots, None)

    # ------------------------------------------------------------------ decode
    def _reads(self, k: int) -> tuple[int, torch.Tensor]:
        """The batch bucket of the next ``k`` steps and what they read (``cache.reads``: the longest row's span
        for every row in a static cache, each row's own chunks in a paged one)."""
        live = [s for s in range(self.cache.n_slots) if self.req[s] >= 0]
        nb = batch_bucket(max(live) + 1, self.cache.n_slots, self.compiled)
        needs = [self.hpos[s] + k if self.req[s] >= 0 else 0 for s in range(nb)]
        return nb, self.cache.reads(nb, needs, self.compiled and self.dev.type == "cuda")

    def _views(self, nb: int) -> tuple[torch.Tensor, ...]:
        """The per-slot state of slots ``0..nb-1`` as views, made once per bucket; on the compiled path their batch
        dimension is marked symbolic, so every bucket runs the one graph of its sampling branch."""
        views = self._view_cache.get(nb)
        if views is None:
            views = tuple(t[:nb] for t in (self.tok, self.pos, self.ids, self.seeds, self.steps, self.min_new_t,
                                           self.temp, self.top_p))
            if self.compiled and nb > 1:
                for v in views:
                    torch._dynamo.maybe_mark_dynamic(v, 0)
            self._view_cache[nb] = views
        return views

    def _step(self, nb: int, span: torch.Tensor, branches: tuple[bool, bool]) -> tuple[torch.Tensor, torch.Tensor]:
        tok, pos, ids, seeds, steps, min_new, temp, top_p = self._views(nb)
        return self.step(self.cache, tok, pos, ids, seeds, steps, span, self.vocab_key, self.eos_mask, min_new, temp,
                         top_p, self.dense, branches)

    @torch.no_grad()
    def warm_up(self, shapes: list[tuple[bool, int, int]], calls: int) -> None:
        """Run the step ``calls`` times at each declared (nucleus, batch, attention length) before any row is
        admitted: every slot is free, so each step writes only the trash column and its tokens are dropped."""
        if any(r >= 0 for r in self.req):
            raise RuntimeError("warm_up runs before any row is admitted")
        for nucleus, nb, kv in shapes:
            span = self.cache.warm_reads(nb, kv)
            for _ in range(calls):
                self._step(nb, span, (True, nucleus))

    @torch.no_grad()
    def _decode_interval(self) -> None:
        live = [s for s in range(self.cache.n_slots) if self.req[s] >= 0]
        if not live:
            return
        k = min(self.interval, max(self.row_max[self.req[s]] - len(self.tokens[self.req[s]]) for s in live))
        live = self._reserve(live, k)
        nb, span = self._reads(k)
        if not self.dense and self._ctx_for != (nb, self._ids_version):
            self.ctx.set(self.ids[:nb])
            self._ctx_for = (nb, self._ids_version)
        tok, pos, _, _, steps = self._views(nb)[:5]
        out, out_lp, trash = self.out[:nb], self.out_lp[:nb], self.cache.trash
        for i in range(k):
            nxt, lp = self._step(nb, span, self.branches)
            out[:, i] = nxt  # a copy: a CUDA-graph output buffer is overwritten by the next replay
            out_lp[:, i] = lp
            tok.copy_(nxt)
            pos.add_(1).clamp_(max=trash)
            steps.add_(1)
        got = self.out[:nb, :k].tolist()  # the one host sync of the interval
        got_lp = self.out_lp[:nb, :k].tolist()  # already computed: no wait
        t0 = time.perf_counter()
        freed = []
        for s in live:
            r = self.req[s]
            if self._take(r, got[s][:self.row_max[r] - len(self.tokens[r])], got_lp[s]):
                freed.append(s)
            self.hpos[s] += k
            self.row_tokens += k
        self.decode_steps += k
        self.host_s += time.perf_counter() - t0
        if freed:
            self._release(freed)
            idx = torch.tensor(freed, dtype=torch.long, device=self.dev)
            self.pos[idx] = self.cache.trash
            self.ids[idx] = -1
            for s in freed:
                if self.on_finished is not None:
                    self.on_finished(self.req[s])
                self.req[s] = -1
            self._ids_version += 1

    def _reserve(self, live: list[int], k: int) -> list[int]:
        """The live slots that decode the next ``k`` steps: all of them here (every slot holds a whole row); a paged
        cache first finds the pages they write, preempting rows when there are too few."""
        return live

    def _release(self, slots: list[int]) -> None:
        """Slots whose rows just finished (a paged cache frees their pages)."""

    def _take(self, r: int, seg: list[int], seg_lp: list[float]) -> bool:
        """Append an interval's tokens (already capped at the row's budget) to request ``r``, cut at its first EOS
        or stop string; True when the row is done. Per row, not per token: a C-level membership test finds an EOS,
        and the stop strings are looked for in one decode of the new text (see StopChecker)."""
        row, row_lp = self.tokens[r], self.logprobs[r]
        n, start = len(seg), len(row)
        if not self.eos.isdisjoint(seg):
            n = next(i for i, t in enumerate(seg) if t in self.eos) + 1
            self.reasons[r] = "eos"
        row.extend(seg[:n])
        row_lp.extend(seg_lp[:n])
        if self.stop_fn is not None and len(row) > self.min_new:
            j = self.stop_fn.first_hit(row, max(start, self.min_new))
            if j is not None and (j < len(row) or self.reasons[r] != "eos"):  # EOS first at the same token
                del row[j:], row_lp[j:]  # tokens sampled after it in this interval are dropped
                self.reasons[r] = "stop"
        return self.reasons[r] != "length" or len(row) >= self.row_max[r]

    def _compact(self) -> None:
        """Move live slots to the front once they fill at most half of the decoded batch."""
        live = [s for s in range(self.cache.n_slots) if self.req[s] >= 0]
        if not live:
            return
        nb = batch_bucket(max(live) + 1, self.cache.n_slots, self.compiled)
        if len(live) > nb // 2:
            return
        self._pack(live)

    def _pack(self, live: list[int]) -> None:
        """Move the live slots ``live`` into slots ``0..len(live)-1``."""
        holes = [s for s in range(len(live)) if self.req[s] < 0]
        movers = [s for s in live if s >= len(live)]
        for src, dst in zip(movers, holes):
            self._move_slot(src, dst)
        if movers:
            self._ids_version += 1

    def _move_slot(self, src: int, dst: int) -> None:
        self.cache.copy_slot(src, dst, self.hpos[src] + 1)
        self._move_state(src, dst)

    def _move_state(self, src: int, dst: int) -> None:
        for t in (self.tok, self.pos, self.ids, self.seeds, self.steps):
            t[dst] = t[src]
        self.pos[src], self.ids[src] = self.cache.trash, -1
        self.req[dst], self.req[src] = self.req[src], -1
        self.key[dst], self.key[src] = self.key[src], None
        self.hpos[dst] = self.hpos[src]
