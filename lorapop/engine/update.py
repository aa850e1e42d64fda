"""The update: scoring response tokens under their adapters, the policy-gradient loss with its truncated importance
weights, backward in micro-batches, and the per-adapter statistics the trainer logs.

Pure functions of a model, its LoRA context and an :class:`~.base.EngineConfig`, so each piece can be exercised on a
tiny model without a whole engine; :class:`~.torch_engine.TorchEngine` holds the state and calls them.

Not implemented: a KL penalty against the base model (``kl_coef``). The loss is the token-mean of
``-advantage * w * logp - entropy_coeff * H`` per adapter, each token scored at its sample's temperature
(:mod:`.scoring`), as in docs/METHOD.md (Rewards), ``w`` the truncated importance weight against the sampler's
log-probs (there, "On-policy updates"); a KL term would need a second (base, id -1) forward per micro-batch.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial
from typing import Any, Callable

import torch
from torch.utils.checkpoint import checkpoint

from lorapop.progress import progress

from .base import TrainSample
from .scoring import chunk_scores, layout_rows, train_micro_batches

STAT_KEYS = ("loss", "grad_norm", "n_tokens", "n_samples", "entropy", "logprob_mismatch", "is_capped_frac",
             "is_ratio_mean", "n_scored", "n_compared")
COUNT_KEYS = ("n_tokens", "n_samples", "n_scored", "n_compared")


def response_logprobs(model: Any, ctx: Any, cfg: Any, pad_id: int, prompts, completions, adapter_ids,
                      temperatures=None, entropy: bool = False, entropy_grad: bool = True,
                      share_prompts: bool = False) -> tuple[Any, torch.Tensor]:
    """Log-probs of every completion token, flat ``[n_tokens]``, plus the batch row of each token; with
    ``entropy``, a tuple (log-probs, entropies) in place of the log-probs (the entropies outside autograd
    unless ``entropy_grad``). Row ``k`` is scored at ``temperatures[k]`` (default 1). Sets the LoRA context ``ctx``
    to the rows' adapters (the caller clears it).

    Right padding: a real token never attends to the pads after it, so its value does not depend on which other
    rows share the batch. ``share_prompts``: samples of one (adapter, prompt) may share a packed row that holds
    the prompt once (scoring.layout_rows; with sdpa or eager attention only, the two that take its mask). Only
    the hidden states of response positions reach the vocabulary projection, in chunks, and under autograd each
    chunk is checkpointed so its [chunk, vocab] logits are not kept for backward."""
    dev, b = next(model.parameters()).device, len(prompts)
    attn_impl = getattr(model.config, "_attn_implementation", None)
    lay = layout_rows(prompts, completions, adapter_ids, pad_id,
                      share_prompts=share_prompts and attn_impl in ("sdpa", "eager"))
    mask = lay.mask.to(dev)
    if lay.packed and attn_impl == "eager":  # eager attention adds its mask to the scores
        dt = getattr(torch, cfg.dtype)
        mask = torch.zeros(mask.shape, dtype=dt, device=dev).masked_fill(~mask, torch.finfo(dt).min)
    ctx.set(torch.tensor([adapter_ids[k] for k in lay.first], dtype=torch.long, device=dev))
    hidden = model.get_decoder()(
        input_ids=lay.input_ids.to(dev), attention_mask=mask, use_cache=False,
        position_ids=None if lay.position_ids is None else lay.position_ids.to(dev)).last_hidden_state
    row_t = torch.tensor(lay.sample, dtype=torch.long, device=dev)
    h = hidden[torch.tensor(lay.at_row, dtype=torch.long, device=dev),
               torch.tensor(lay.at_pos, dtype=torch.long, device=dev)]
    tgt_t = torch.tensor(lay.target, dtype=torch.long, device=dev)
    temps = torch.tensor([1.0] * b if temperatures is None else [float(t) for t in temperatures],
                         dtype=torch.float32, device=dev)[row_t]
    fn = partial(chunk_scores, model.get_output_embeddings(), entropy=entropy, entropy_grad=entropy_grad)
    n = max(1, cfg.logprob_chunk_size)
    parts = []
    for i in range(0, h.shape[0], n):
        args = (h[i:i + n], tgt_t[i:i + n], temps[i:i + n])
        if torch.is_grad_enabled() and args[0].requires_grad:
            parts.append(checkpoint(fn, *args, use_reentrant=False))
        else:
            parts.append(fn(*args))
    logp = torch.cat([p[0] for p in parts]) if parts else h.new_zeros(0, dtype=torch.float32)
    if not entropy:
        return logp, row_t
    return (logp, torch.cat([p[1] for p in parts]) if parts else logp), row_t


@contextmanager
def checkpointing(model: Any, cfg: Any, ctx: Any):
    """While training: activation checkpointing of each decoder layer when ``cfg.gradient_checkpointing`` (one
    layer in ``cfg.gradient_checkpointing_every``, the first included).

    Uses transformers' per-layer hook (``GradientCheckpointingLayer``), which checkpoints only a layer whose own
    ``training`` flag is set; only that flag is flipped (not ``model.train()``), so dropout and every other
    module stay in eval mode and the gradients equal the uncheckpointed ones. Always clears the LoRA context."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    on = bool(cfg.gradient_checkpointing)
    every = cfg.gradient_checkpointing_every
    if on and not layers:
        raise NotImplementedError(f"engine.gradient_checkpointing: {type(model).__name__} has no "
                                  "transformers GradientCheckpointingLayer to checkpoint")
    saved = [(m.gradient_checkpointing, m.training, getattr(m, "_gradient_checkpointing_func", None))
             for m in layers[::every]] if on else []
    try:
        if on:
            for m in layers[::every]:
                m.gradient_checkpointing, m.training = True, True
                m._gradient_checkpointing_func = partial(checkpoint, use_reentrant=False)
        yield
    finally:
        for m, (gc, tr, fn) in zip(layers[::every], saved):
            m.gradient_checkpointing, m.training = gc, tr
            if fn is None:
                del m._gradient_checkpointing_func
            else:
                m._gradient_checkpointing_func = fn
        ctx.set(None)


def sampler_logprobs(mb: list[TrainSample], logp: torch.Tensor) -> torch.Tensor:
    """The sampler's log-prob of each token of ``mb``, in the update's token order (0.0 for a sample without
    them: such rows are never compared, see is_weights and add_stats)."""
    return torch.tensor([v for s in mb for v in (s.sampler_logprobs or [0.0] * len(s.completion_ids))],
                        dtype=logp.dtype, device=logp.device)


def is_weights(mb: list[TrainSample], row_t: torch.Tensor, logp: torch.Tensor, sampler: torch.Tensor,
               cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token the raw importance ratio exp(update's - sampler's log-prob) and the policy-gradient weight
    min(ratio, cap) (verl's tis_imp_ratio_cap, TRL's vllm_importance_sampling_cap in token mode). Detached: the
    weight corrects for which distribution drew the token, it is not a quantity to optimise. 1 for a sample
    without the sampler's log-probs (nothing to correct against) and everywhere when ``cap`` <= 0 (off). A
    weight of exactly 1 leaves the product -adv * w * logp bit-identical to -adv * logp."""
    ratio = (logp - sampler).exp()
    if cap <= 0 or all(s.sampler_logprobs is None for s in mb):
        return ratio, torch.ones_like(logp)
    have = torch.tensor([s.sampler_logprobs is not None for s in mb], device=logp.device)[row_t]
    return ratio, torch.where(have, ratio.clamp(max=cap), torch.ones_like(logp))


def add_stats(stats, mb, row_t, per_tok, logp, ent, sampler, ratio, cap) -> None:
    """Sums into ``stats`` per adapter: loss, entropy, |scored - sampler| log-prob, the importance ratio, the
    tokens whose ratio the cap truncated, and their token counts."""
    n, dev, dt = len(mb), logp.device, logp.dtype

    def by_row(x):
        return torch.zeros(n, device=dev, dtype=dt).index_add_(0, row_t, x.to(dt)).tolist()

    capped = ratio > cap if cap > 0 else torch.zeros_like(ratio)
    have = [s.sampler_logprobs is not None for s in mb]
    for s, loss, e, gap, r, c, h in zip(mb, by_row(per_tok), by_row(ent), by_row((logp - sampler).abs()),
                                        by_row(ratio), by_row(capped), have):
        st = stats[int(s.adapter_id)]
        st["loss"] += loss
        st["entropy"] += e
        st["n_scored"] += len(s.completion_ids)
        if h:
            st["logprob_mismatch"] += gap
            st["is_ratio_mean"] += r
            st["is_capped_frac"] += c
            st["n_compared"] += len(s.completion_ids)


def empty_stats(samples: list[TrainSample]) -> dict[int, dict[str, float]]:
    """Per adapter of ``samples``: every statistic at zero but its token and sample counts."""
    stats: dict[int, dict[str, float]] = {}
    for s in samples:
        st = stats.setdefault(int(s.adapter_id), dict.fromkeys(STAT_KEYS, 0.0) | dict.fromkeys(COUNT_KEYS, 0))
        st["n_tokens"] += len(s.completion_ids)
        st["n_samples"] += 1
    return stats


def finish_stats(stats: dict[int, dict[str, float]]) -> None:
    """Sums into means: entropy over the scored tokens, the sampler comparisons over the compared ones (the ratio
    1.0 where none was compared)."""
    for st in stats.values():
        st["entropy"] /= max(st["n_scored"], 1)
        for k in ("logprob_mismatch", "is_capped_frac"):
            st[k] /= max(st["n_compared"], 1)
        st["is_ratio_mean"] = st["is_ratio_mean"] / st["n_compared"] if st["n_compared"] else 1.0


def accumulate(score: Callable[..., Any], cfg: Any, samples: list[TrainSample], token_counts: dict[int, int] | None,
               training: Callable[[], Any]) -> dict[int, dict[str, float]]:
    """Forward/backward ``samples`` in micro-batches, leaving the summed gradient wherever ``score`` (the
    :func:`response_logprobs` of a model) has it; ``training`` is the context it runs in (:func:`checkpointing`).
    The loss, its normalisation and the statistics are TorchEngine.accumulate_gradients'."""
    coeff = float(cfg.entropy_coeff)
    cap = float(cfg.importance_sampling_cap)
    stats = empty_stats(samples)
    denom = {a: st["n_tokens"] for a, st in stats.items()}
    if token_counts is not None:
        denom.update({int(a): int(n) for a, n in token_counts.items()})
    # Rows with no tokens, or zero advantage and no entropy bonus, add nothing to any gradient: no forward.
    work = [s for s in samples if s.completion_ids and (float(s.advantage) != 0.0 or coeff > 0)]
    share = bool(cfg.share_prompts)
    mbs = train_micro_batches(work, max(1, cfg.train_micro_batch_size), share_prompts=share)
    with progress("update", total=len(mbs), unit="micro-batches") as bar, training():
        for mb in mbs:
            (logp, ent), row_t = score(
                [s.prompt_ids for s in mb], [s.completion_ids for s in mb], [int(s.adapter_id) for s in mb],
                [s.temperature for s in mb], entropy=True, entropy_grad=coeff > 0, share_prompts=share)
            inv = torch.tensor([1.0 / denom[int(s.adapter_id)] for s in mb], device=logp.device,
                               dtype=logp.dtype)[row_t]
            adv = torch.tensor([float(s.advantage) for s in mb], device=logp.device, dtype=logp.dtype)[row_t]
            sampler = sampler_logprobs(mb, logp)
            ratio, w = is_weights(mb, row_t, logp.detach(), sampler, cap)
            pg = -adv * w * logp
            per_tok = (pg - coeff * ent if coeff > 0 else pg) * inv
            per_tok.sum().backward()
            add_stats(stats, mb, row_t, per_tok.detach(), logp.detach(), ent.detach(), sampler, ratio, cap)
            bar.advance(1)
    finish_stats(stats)
    return stats


def apply_step(optimizer: Any, stats: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    """One clipped AdamW step of ``optimizer`` for every adapter of ``stats`` with tokens, then clears the
    gradients; fills in ``grad_norm`` and makes the counts ints."""
    slots = [a for a, st in stats.items() if st["n_tokens"] > 0]
    norms = optimizer.step(slots)
    optimizer.zero_grad()
    for a, st in stats.items():
        st["grad_norm"] = norms.get(a, 0.0)
        for k in COUNT_KEYS:
            if k in st:
                st[k] = int(st[k])
    return stats
