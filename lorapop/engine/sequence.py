"""One row of a generate call as the engine schedules it (nano-vllm's ``Sequence``, vLLM's ``Request``): its prompt,
adapter, seed and own :class:`.base.SamplingParams` (vLLM's, with the row's ``max_new_tokens`` cap), the tokens it
has made and why it stopped; and the stop rules a row is cut by (EOS, stop strings under vLLM's rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .base import SamplingParams


@dataclass(eq=False)
class Request:
    """Row ``index`` of a call. ``params.max_new_tokens`` is this row's own cap. While it holds a slot: ``slot``,
    its ``pages`` (block manager), ``pos`` (the position of its next input), ``key`` (the prefix it holds) and
    ``born`` (admission order: the youngest row is preempted first). ``resumed``: preempted and waiting to be
    prefilled again with the tokens it made."""
    index: int
    prompt: list[int]
    adapter: int
    seed: int
    params: SamplingParams
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"
    resumed: bool = False
    slot: int = -1
    pages: list[int] = field(default_factory=list)
    pos: int = 0
    key: tuple | None = None
    born: int = 0

    @property
    def max_tokens(self) -> int:
        return self.params.max_new_tokens

    @property
    def left(self) -> int:
        """Tokens it may still make."""
        return self.max_tokens - len(self.tokens)

    def seq(self) -> list[int]:
        """The tokens it enters a slot with: its prompt, and a resumed row the tokens it made."""
        return self.prompt + self.tokens if self.resumed else self.prompt

    def prefix_key(self) -> tuple:
        """(adapter, the tokens before its first decode input): rows with one key share their prefix's pages."""
        return self.adapter, tuple(self.seq()[:-1])

    def append(self, seg: list[int], seg_lp: list[float], eos: set[int], stop_fn: "StopChecker | None") -> bool:
        """Append an interval's tokens (already capped at the row's budget), cut at its first EOS or stop string;
        True when the row is done. Per row, not per token: a C-level membership test finds an EOS, and the stop
        strings are looked for in one decode of the new text (see StopChecker)."""
        row, row_lp, min_new = self.tokens, self.logprobs, self.params.min_new_tokens
        n, start = len(seg), len(row)
        if not eos.isdisjoint(seg):
            n = next(i for i, t in enumerate(seg) if t in eos) + 1
            self.finish_reason = "eos"
        row.extend(seg[:n])
        row_lp.extend(seg_lp[:n])
        if stop_fn is not None and len(row) > min_new:
            j = stop_fn.first_hit(row, max(start, min_new))
            if j is not None and (j < len(row) or self.finish_reason != "eos"):  # EOS first at the same token
                del row[j:], row_lp[j:]  # tokens sampled after it in this interval are dropped
                self.finish_reason = "stop"
        return self.finish_reason != "length" or len(row) >= self.max_tokens


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
