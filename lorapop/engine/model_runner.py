"""Runs one step of a generate call over the paged KV cache (nano-vllm's ``ModelRunner``): a prefill of newly
admitted rows, or an interval of decode steps of the running ones; it holds the per-slot device state the decode
step reads (next input, position, adapter, seed, tokens made, sampling settings).

- Prefill: ``prompt[:-1]`` of each admitted row in waves of similar-length rows, each wave in chunks of positions,
  every forward holding at most ``prefill_chunk_tokens`` tokens (padding included).
- Decode: ``k`` steps of slots ``0..nb-1`` (a batch bucket: powers of two from 2, :mod:`.compiled`), each reading
  the (row, chunk) pairs its rows' lengths need (:mod:`.splitkv`), then one host sync for the interval's tokens.
- Sampling settings are per-slot tensors, so a compiled step never specialises on their values. Eager skips the
  noise / the vocabulary sort when no row needs them; compiled there is one graph for every temperature, and the
  nucleus (a [b, V] sort and scan per token) only in a graph of its own, declared with engine.compile_nucleus (else
  a call that cuts one decodes eagerly): training samples whole distributions (config load refuses top_p < 1), so
  its step never sorts the vocabulary. (Also, torch 2.11's inductor failed to generate the nucleus mask's triton
  kernel on an H200: docs/RESULTS.md, "GPU".)
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .decode import LlamaFamilyDecoder
from .paged import PagedKVCache
from .sequence import Request


class ModelRunner:
    """The step ``step`` (``dec.decode_step``, possibly compiled) over ``cache``; ``branches`` the call's sampling
    branches (some row samples, some row cuts a nucleus)."""

    def __init__(self, dec: LlamaFamilyDecoder, cache: PagedKVCache, ctx: Any, step: Callable, *, dense: bool,
                 compiled: bool, prefill_chunk_tokens: int, interval: int, branches: tuple[bool, bool],
                 vocab_key: torch.Tensor, eos_mask: torch.Tensor | None) -> None:
        self.dec, self.cache, self.ctx, self.step = dec, cache, ctx, step
        self.dense, self.compiled, self.branches = dense, compiled, branches
        self.chunk = max(1, prefill_chunk_tokens)
        self.vocab_key, self.eos_mask = vocab_key, eos_mask
        self.dev = dev = cache.k[0].device
        n, interval = cache.n_slots, max(1, interval)
        # Device state of each slot: next input token, its position (trash when free), adapter, seed, tokens made,
        # and its row's sampling settings.
        self.tok = torch.zeros(n, dtype=torch.long, device=dev)
        self.pos = torch.full((n,), cache.trash, dtype=torch.long, device=dev)
        self.ids = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.seeds = torch.zeros(n, dtype=torch.long, device=dev)
        self.steps = torch.zeros(n, dtype=torch.long, device=dev)
        self.min_new = torch.zeros(n, dtype=torch.long, device=dev)
        self.temp = torch.zeros(n, dtype=torch.float32, device=dev)
        self.top_p = torch.ones(n, dtype=torch.float32, device=dev)
        self.out = torch.zeros(n, interval, dtype=torch.long, device=dev)
        self.out_lp = torch.zeros(n, interval, dtype=torch.float32, device=dev)
        self._state = (self.tok, self.pos, self.ids, self.seeds, self.steps, self.min_new, self.temp, self.top_p)
        self.version = 0  # bumped whenever a slot's adapter changes (the LoRA context is set per version)
        self._ctx_for: tuple | None = None  # (nb, version) the LoRAContext was last set for
        self._view_cache: dict[int, tuple[torch.Tensor, ...]] = {}

    # ------------------------------------------------------------------ slots
    def place(self, rows: list[tuple[int, Request, int, int]]) -> None:
        """Device state of newly admitted rows: (slot, request, first input token, its position)."""
        slots = torch.tensor([s for s, *_ in rows], dtype=torch.long, device=self.dev)

        def col(vals, dtype=torch.long):
            return torch.tensor(vals, dtype=dtype, device=self.dev)

        reqs = [r for _, r, _, _ in rows]
        self.tok[slots] = col([t for _, _, t, _ in rows])
        self.pos[slots] = col([p for *_, p in rows])
        self.ids[slots] = col([r.adapter for r in reqs])
        self.seeds[slots] = col([r.seed % (1 << 63) for r in reqs])
        self.steps[slots] = col([len(r.tokens) for r in reqs])
        self.min_new[slots] = col([r.params.min_new_tokens for r in reqs])
        self.temp[slots] = col([0.0 if r.params.greedy else max(0.0, float(r.params.temperature)) for r in reqs],
                               torch.float32)
        self.top_p[slots] = col([float(r.params.top_p) for r in reqs], torch.float32)
        self.version += 1

    def move(self, src: int, dst: int) -> None:
        for t in self._state:
            t[dst] = t[src]
        self.release([src])

    def release(self, slots: list[int]) -> None:
        """Slots left free: they write the trash position under no adapter."""
        idx = torch.tensor(slots, dtype=torch.long, device=self.dev)
        self.pos[idx] = self.cache.trash
        self.ids[idx] = -1
        self.version += 1

    # ------------------------------------------------------------------ prefill
    @torch.no_grad()
    def prefill(self, rows: list[tuple[int, list[int], int]]) -> None:
        """Compute the K/V of each (slot, tokens, adapter) at positions ``0..len(tokens)-1``: waves of
        similar-length rows, each in chunks of positions, every forward holding at most ``chunk`` tokens."""
        todo = sorted(rows, key=lambda r: -len(r[1]))
        while todo:
            longest = len(todo[0][1])
            width = min(longest, self.chunk)
            wave, todo = todo[:max(1, self.chunk // width)], todo[max(1, self.chunk // width):]
            wave.sort(key=lambda r: r[2])  # contiguous adapter runs for the LoRA layers
            slots = torch.tensor([s for s, _, _ in wave], dtype=torch.long, device=self.dev)
            self.ctx.set(torch.tensor([a for _, _, a in wave], dtype=torch.long, device=self.dev))
            self._ctx_for = None
            for start in range(0, longest, width):
                w = min(width, longest - start)
                toks = torch.full((len(wave), w), 0, dtype=torch.long)
                valid = torch.zeros((len(wave), w), dtype=torch.bool)
                for k, (_, seq, _) in enumerate(wave):
                    piece = seq[start:start + w]
                    if piece:
                        toks[k, :len(piece)] = torch.tensor(piece)
                        valid[k, :len(piece)] = True
                pos = torch.arange(start, start + w).expand(len(wave), w)
                write = torch.where(valid, pos, torch.full_like(pos, self.cache.trash))
                self.dec.forward(self.cache, toks.to(self.dev), pos.to(self.dev), write.to(self.dev), start + w,
                                 slots, None)

    # ------------------------------------------------------------------ decode
    def _views(self, nb: int) -> tuple[torch.Tensor, ...]:
        """The per-slot state of slots ``0..nb-1`` as views, made once per bucket; on the compiled path their batch
        dimension is marked symbolic, so every bucket runs the one graph of its sampling branch."""
        views = self._view_cache.get(nb)
        if views is None:
            views = tuple(t[:nb] for t in self._state)
            if self.compiled and nb > 1:
                for v in views:
                    torch._dynamo.maybe_mark_dynamic(v, 0)
            self._view_cache[nb] = views
        return views

    def _step(self, nb: int, pairs: torch.Tensor, branches: tuple[bool, bool]) -> tuple[torch.Tensor, torch.Tensor]:
        tok, pos, ids, seeds, steps, min_new, temp, top_p = self._views(nb)
        return self.step(self.cache, tok, pos, ids, seeds, steps, pairs, self.vocab_key, self.eos_mask, min_new,
                         temp, top_p, self.dense, branches)

    @torch.no_grad()
    def decode(self, nb: int, pairs: torch.Tensor, k: int) -> tuple[list[list[int]], list[list[float]]]:
        """``k`` decode steps of slots ``0..nb-1`` reading ``pairs``; their tokens and log-probs, ``[nb][k]``."""
        if not self.dense and self._ctx_for != (nb, self.version):
            self.ctx.set(self.ids[:nb])
            self._ctx_for = (nb, self.version)
        tok, pos, _, _, steps = self._views(nb)[:5]
        out, out_lp, trash = self.out[:nb], self.out_lp[:nb], self.cache.trash
        for i in range(k):
            nxt, lp = self._step(nb, pairs, self.branches)
            out[:, i] = nxt  # a copy: a CUDA-graph output buffer is overwritten by the next replay
            out_lp[:, i] = lp
            tok.copy_(nxt)
            pos.add_(1).clamp_(max=trash)
            steps.add_(1)
        return self.out[:nb, :k].tolist(), self.out_lp[:nb, :k].tolist()  # the one host sync of the interval

    @torch.no_grad()
    def warm_up(self, shapes: list[tuple[bool, int, int]], calls: int) -> None:
        """Run the step ``calls`` times at each declared (nucleus, batch, pairs) before any row is admitted: every
        slot is free, so each step writes only the trash position and its tokens are dropped."""
        if (self.ids >= 0).any():
            raise RuntimeError("warm_up runs before any row is admitted")
        for nucleus, nb, n in shapes:
            pairs = self.cache.warm_reads(nb, n)
            for _ in range(calls):
                self._step(nb, pairs, (True, nucleus))
