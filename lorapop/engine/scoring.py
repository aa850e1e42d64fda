"""What train_step computes from a batch of samples, apart from the model: micro-batches that mix adapters, and
per response token the log-probability and entropy at the sample's own temperature.

On-policy scoring (docs/METHOD.md, "On-policy updates"): a token sampled at temperature ``T`` came from
``softmax(logits / T)``, so the update scores ``log_softmax(logits / T)`` at it, as verl does; scored at
temperature 1 instead, the REINFORCE update is not the gradient of the policy that sampled. The sampler reports its
own log-probability of each token (Completion.logprobs), and the mean |difference| per adapter is the
``logprob_mismatch`` statistic: float rounding only, when both run the same weights.
"""

from __future__ import annotations

import torch


def row_len(s) -> int:
    return len(s.prompt_ids) + len(s.completion_ids)


# A micro-batch may pad at most this fraction of extra tokens to take rows from more adapters at once.
MAX_PAD_FRACTION = 0.15


def train_micro_batches(work: list, size: int) -> list[list]:
    """Split training rows into micro-batches of at most ``size`` rows, each holding the same number of rows from
    every adapter in it, rows sorted by adapter.

    Equal runs let the LoRA layers serve a micro-batch with one bmm pair (see lora.py) instead of a matmul pair per
    adapter, but rows of very different lengths in one micro-batch waste compute on padding (a teacher's proposal
    prompt is far longer than a student's). So adapters are taken in order of their mean row length, rows within
    an adapter shortest first, and each micro-batch takes ``q`` rows from each of the next ``k`` adapters: the
    largest ``k`` (most rows) whose padding stays within ``MAX_PAD_FRACTION`` of the real tokens, else one adapter.
    Gradients are summed over micro-batches, so the split never changes an update (beyond float summation order).
    """
    by: dict[int, list] = {}
    for s in work:
        by.setdefault(int(s.adapter_id), []).append(s)
    groups = sorted((sorted(v, key=row_len) for v in by.values()),
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
