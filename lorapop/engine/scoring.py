"""What train_step computes from a batch of samples, apart from the model: micro-batches that mix adapters, and
per response token the log-probability and entropy at the sample's own temperature.

On-policy scoring (docs/METHOD.md, "On-policy updates"): a token sampled at temperature ``T`` came from
``softmax(logits / T)``, so the update scores ``log_softmax(logits / T)`` at it, as verl does; scored at
temperature 1 instead, the REINFORCE update is not the gradient of the policy that sampled. The sampler reports its
own log-probability of each token (Completion.logprobs), and the mean |difference| per adapter is the
``logprob_mismatch`` statistic: float rounding only, when both run the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def row_len(s) -> int:
    return len(s.prompt_ids) + len(s.completion_ids)


# A micro-batch may pad at most this fraction of extra tokens to take rows from more adapters at once.
MAX_PAD_FRACTION = 0.15


def train_micro_batches(work: list, size: int, share_prompts: bool = False) -> list[list]:
    """Split training rows into micro-batches of at most ``size`` rows, each holding the same number of rows from
    every adapter in it, rows sorted by adapter.

    Equal runs let the LoRA layers serve a micro-batch with one bmm pair (see lora.py) instead of a matmul pair per
    adapter, but rows of very different lengths in one micro-batch waste compute on padding (a teacher's proposal
    prompt is far longer than a student's). So adapters are taken in order of their mean row length, rows within
    an adapter shortest first, and each micro-batch takes ``q`` rows from each of the next ``k`` adapters: the
    largest ``k`` (most rows) whose padding stays within ``MAX_PAD_FRACTION`` of the real tokens, else one adapter.
    Gradients are summed over micro-batches, so the split never changes an update (beyond float summation order).
    ``share_prompts``: an adapter's rows are ordered by (prompt length, prompt, completion length) instead, so the
    samples of one prompt sit together and a micro-batch can score their prompt once (:func:`layout_rows`).
    """
    by: dict[int, list] = {}
    for s in work:
        by.setdefault(int(s.adapter_id), []).append(s)
    key = (lambda s: (len(s.prompt_ids), list(s.prompt_ids), len(s.completion_ids))) if share_prompts else row_len
    groups = sorted((sorted(v, key=key) for v in by.values()),
                    key=lambda g: (sum(map(row_len, g)) / len(g), int(g[0].adapter_id)))
    out, pos = [], [0] * len(groups)
    while True:
        active = [k for k, g in enumerate(groups) if pos[k] < len(g)]
        if not active:
            return out
        best = None
        for k in range(1, min(len(active), size) + 1):
            chosen = active[:k]
            q = max(1, min(size // k, min(len(groups[j]) - pos[j] for j in chosen)))
            rows = [s for j in chosen for s in groups[j][pos[j]:pos[j] + q]]
            lens = [row_len(s) for s in rows]
            if k == 1 or max(lens) * len(lens) <= (1 + MAX_PAD_FRACTION) * sum(lens):
                if best is None or len(rows) >= len(best[2]):
                    best = (chosen, q, rows)
        chosen, q, rows = best
        out.append(sorted(rows, key=lambda s: int(s.adapter_id)))  # contiguous runs in slot order
        for j in chosen:
            pos[j] += q


# A packed row may be at most this many times the micro-batch's longest unpacked row: its [width, width] mask and
# attention grow with the square of its width, where everything else in the forward grows with its positions.
MAX_PACKED_WIDTH = 4


@dataclass
class RowLayout:
    """How a micro-batch of (prompt, completion) samples enters the model's forward.

    Unpacked: one right-padded row per sample, a [rows, width] padding mask, positions 0.. (the model's default).
    Packed: the samples of one (adapter, prompt) share a row, the prompt once and then each completion, every
    completion at the positions it would have alone and attending to the prompt and to itself only (a [rows, 1,
    width, width] boolean mask, True = attend): each completion token's hidden state is the one its own row would
    give, up to float summation order. ``first[r]`` is a sample of row ``r`` (its adapter is the row's);
    ``sample, at_row, at_pos, target`` list every completion token in sample order: the sample, the row and
    position of the hidden state that predicts it, and the token."""
    input_ids: torch.Tensor
    mask: torch.Tensor
    position_ids: torch.Tensor | None
    first: list[int]
    sample: list[int]
    at_row: list[int]
    at_pos: list[int]
    target: list[int]

    @property
    def packed(self) -> bool:
        return self.position_ids is not None


def layout_rows(prompts: list, completions: list, adapter_ids: list[int], pad_id: int,
                share_prompts: bool = False) -> RowLayout:
    """The forward's rows for these samples: packed (see RowLayout) when ``share_prompts`` and packing computes
    fewer positions (rows x width) than one row per sample, with no packed row wider than ``MAX_PACKED_WIDTH``
    times the widest sample; else one row per sample, exactly as before packing existed."""
    n = len(prompts)

    def row_width(g: list[int]) -> int:
        return len(prompts[g[0]]) + sum(len(completions[k]) for k in g)

    rows: list[list[int]] = [[k] for k in range(n)]
    width = max(map(row_width, rows))
    packed_layout = False
    if share_prompts and n > 1:
        by: dict[tuple, list[int]] = {}
        for k in range(n):
            by.setdefault((int(adapter_ids[k]), tuple(prompts[k])), []).append(k)
        packed = list(by.values())
        packed_width = max(map(row_width, packed))
        if len(packed) < n and len(packed) * packed_width < n * width and packed_width <= MAX_PACKED_WIDTH * width:
            rows, width, packed_layout = packed, packed_width, True
    b = len(rows)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    seg = torch.full((b, width), -1, dtype=torch.long)  # 0 prompt, i + 1 the row's i-th completion, -1 padding
    pos = torch.zeros((b, width), dtype=torch.long)
    where: dict[int, tuple[int, int]] = {}  # sample -> (row, offset of its completion)
    for r, g in enumerate(rows):
        p = list(prompts[g[0]])
        input_ids[r, :len(p)] = torch.tensor(p, dtype=torch.long)
        seg[r, :len(p)] = 0
        pos[r, :len(p)] = torch.arange(len(p))
        off = len(p)
        for i, k in enumerate(g):
            c = list(completions[k])
            if c:
                input_ids[r, off:off + len(c)] = torch.tensor(c, dtype=torch.long)
                seg[r, off:off + len(c)] = i + 1
                pos[r, off:off + len(c)] = torch.arange(len(p), len(p) + len(c))
            where[k] = (r, off)
            off += len(c)
    sample, at_row, at_pos, target = [], [], [], []
    for k in range(n):
        r, off = where[k]
        c = list(completions[k])
        sample += [k] * len(c)
        at_row += [r] * len(c)
        at_pos += [len(prompts[k]) - 1] + list(range(off, off + len(c) - 1)) if c else []
        target += c
    if not packed_layout:
        return RowLayout(input_ids, (seg >= 0).long(), None, [g[0] for g in rows], sample, at_row, at_pos, target)
    q, kv = seg[:, :, None], seg[:, None, :]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    mask = causal & (q >= 0) & (kv >= 0) & ((kv == 0) | (kv == q))
    mask |= torch.eye(width, dtype=torch.bool)  # a padding query attends to itself: no all-masked row (NaN)
    return RowLayout(input_ids, mask[:, None], pos, [g[0] for g in rows], sample, at_row, at_pos, target)


def chunk_scores(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temp: torch.Tensor,
                 entropy: bool = False, entropy_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: ``log_softmax(head(hidden) / T)`` at ``targets`` and, when ``entropy``, the entropy of that
    distribution (else zeros), both ``[n]`` in float32 (float64 on a float64 reference engine); ``temp [n]`` is T
    per token. Divided, not multiplied by 1 / T,
    as the sampler does (decode.sample_tokens), so both round alike. ``entropy_grad`` False computes the entropy as
    a statistic only, outside autograd. One [n, vocab] logits tensor: callers chunk ``hidden`` to bound it."""
    z = head(hidden)
    z = z.to(torch.promote_types(z.dtype, torch.float32)) / temp[:, None]  # bf16 up to float32; float64 kept
    lse = z.logsumexp(-1)
    logp = z.gather(-1, targets[:, None]).squeeze(-1) - lse
    if not entropy:
        return logp, torch.zeros_like(logp)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        return logp, lse - (torch.softmax(z, -1) * z).sum(-1)  # H = log Z - E_p[z]
