"""TorchEngine: a population of LoRA adapters on one frozen HF causal LM, in plain PyTorch.

Generation (KV cache, left padding, per-row seeds, finished rows dropped from the batch), token log-probs
(chunked over the vocabulary projection) and a multi-adapter policy-gradient train step all run one forward over a
batch that mixes adapters; see :mod:`lorapop.engine.lora` for the stacked layers and :mod:`lorapop.engine.optim`
for the per-slot AdamW.

Not implemented: a KL penalty against the base model (``kl_coef``). The loss is the token-mean of
``-advantage * w * logp - entropy_coeff * H`` per adapter, each token scored at its sample's temperature
(:mod:`.scoring`), as in docs/METHOD.md (Rewards), ``w`` the truncated importance weight against the sampler's
log-probs (there, "On-policy updates"); a KL term would need a second (base, id -1) forward per micro-batch.
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from lorapop.hostmem import drop_pages
from lorapop.progress import progress

from .base import (Completion, EngineConfig, SamplingParams, TrainSample, chat_prompt_ids, check_generate_args,
                   check_rows, check_samples, check_slot, end_of_turn_ids)
from .batching import ContinuousBatcher, cuts_nucleus, stop_checker
from .compiled import CompiledDecode, DecodeShapes
from .cudamem import allocatable_bytes
from .decode import LlamaFamilyDecoder, StaticKVCache, _mix32
from .dtype import resolve_dtype, resolve_lora_compute_dtype
from .lora import inject_lora, kaiming_uniform_A, remove_lora
from .optim import StackedAdamW
from .kvsize import KVCachePlan, kv_budget, kv_cache_plan
from .paged import PagedBatcher, PagedKVCache
from .peft_io import AdapterFormatError, load_peft_adapter, save_peft_adapter
from .scoring import chunk_scores, layout_rows, train_micro_batches


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _chunks(seq: list, n: int):
    for i in range(0, len(seq), n):
        yield seq[i:i + n]


def _rms_norm_float64(self, hidden_states: torch.Tensor) -> torch.Tensor:
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _norms_in_float64(model: Any) -> None:
    """Hugging Face's RMSNorms compute in float32 (an upcast for bf16 models); on a float64 model that is a downcast
    that would put float32 rounding back into the numerical reference, so each instance computes in its input's
    dtype."""
    for m in model.modules():
        if type(m).__name__.endswith("RMSNorm") and hasattr(m, "variance_epsilon") and hasattr(m, "weight"):
            m.forward = types.MethodType(_rms_norm_float64, m)


class TorchEngine:
    """Owns ``model``: its target linear layers are replaced in place (``close()`` puts them back)."""

    def __init__(self, model: Any, tokenizer: Any, n_adapters: int, cfg: EngineConfig | None = None,
                 seed: int = 0) -> None:
        self.cfg = cfg = cfg if cfg is not None else EngineConfig()
        self.device = resolve_device(cfg.device)
        cfg.dtype = resolve_dtype(cfg.dtype, self.device)  # 'auto' -> the name in use, so callers can record it
        dtype = getattr(torch, cfg.dtype)
        model.to(device=self.device, dtype=dtype)
        if dtype == torch.float64:
            _norms_in_float64(model)
        model.requires_grad_(False)
        self.model, self.tokenizer = model, tokenizer
        self.n_adapters = n_adapters
        self.scaling = cfg.lora_alpha / cfg.rank
        self.base_model_name = str(getattr(model, "name_or_path", "") or "") or None
        self._ctx, self.layers = inject_lora(model, n_adapters, cfg.rank, cfg.lora_alpha, list(cfg.target_modules))
        cfg.lora_compute_dtype = resolve_lora_compute_dtype(cfg.lora_compute_dtype, cfg.dtype)
        for layer in self.layers.values():
            layer.compute_dtype = getattr(torch, cfg.lora_compute_dtype)
        if self.device.type == "cuda":
            torch.set_float32_matmul_precision("high" if cfg.tf32 else "highest")
        model.eval()  # after injection: the new LoRA modules too (a fresh nn.Module starts in training mode)
        self.module_names = list(self.layers)
        self._params = [p for layer in self.layers.values() for p in (layer.lora_A, layer.lora_B)]
        self.optimizer = StackedAdamW(self._params, n_adapters, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                                      weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm)
        self.eos_ids = self._eos_ids()
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad if pad is not None else 0)
        self._dec: LlamaFamilyDecoder | None = None  # built on the first generate
        self._cache: StaticKVCache | None = None
        self._kv_shape: tuple[int, int, int, str] | None = None  # (slots, capacity, pages, kind) of the run's cache
        self.kv_plan: KVCachePlan | None = None  # the run's cache as kvsize.kv_cache_plan decided it
        self.kv_cache_allocations = 0  # caches allocated so far (bench/gpu.py reports it; one per run is the aim)
        # generate's per-row bookkeeping (seconds), the row-steps it covered and the decode steps (bench/gpu.py)
        self.host_s, self.row_tokens, self.decode_steps = 0.0, 0, 0
        self.kv_preemptions = 0  # rows the paged cache preempted (and recomputed) so far
        self.decode_compile: CompiledDecode | None = None  # engine.compile's step, warm-up and figures
        self._vocab_key: torch.Tensor | None = None
        for i in range(n_adapters):
            self.reset_adapter(i, seed=seed * 1_000_003 + i)

    @classmethod
    def from_config(cls, model_name: str = "embedded", n_adapters: int = 1, cfg: EngineConfig | None = None,
                    seed: int = 0) -> "TorchEngine":
        from lorapop.model import load_base_model

        cfg = cfg if cfg is not None else EngineConfig()
        cfg.dtype = resolve_dtype(cfg.dtype, resolve_device(cfg.device))
        model, tok = load_base_model(model_name, dtype=cfg.dtype, device=str(resolve_device(cfg.device)))
        return cls(model, tok, n_adapters, cfg, seed)

    def pop_metrics(self) -> dict[str, float]:
        """engine.compile's cumulative figures: seconds torch spent compiling and recording the decode step
        (``perf/compile_s``), the graphs it compiled (``perf/graphs``), the CUDA graphs it recorded
        (``perf/cuda_graphs``) and the warm-ups it ran (``perf/warmups``: 1 in a run, whose cache is made once); all
        0 with compile off. (No weight sync to time: generation and the update share the weights.)"""
        c = self.decode_compile
        return {"perf/compile_s": round(c.compile_s, 3) if c else 0.0, "perf/graphs": c.graphs if c else 0,
                "perf/cuda_graphs": c.cuda_graphs if c else 0, "perf/warmups": c.warm_ups if c else 0}

    def close(self) -> None:
        """Remove the LoRA layers from the model (it becomes the plain base again)."""
        remove_lora(self.model)

    # ------------------------------------------------------------------ helpers
    def _eos_ids(self) -> list[int]:
        """Stop ids: the tokenizer's and the generation config's EOS, and the chat template's end-of-turn token."""
        ids: set[int] = set(end_of_turn_ids(self.tokenizer))
        for v in (self.tokenizer.eos_token_id, getattr(getattr(self.model, "generation_config", None),
                                                        "eos_token_id", None)):
            if isinstance(v, int):
                ids.add(v)
            elif isinstance(v, (list, tuple)):
                ids.update(int(x) for x in v)
        return sorted(ids)

    def _check_slot(self, i: int, *, allow_base: bool = False) -> None:
        check_slot(i, self.n_adapters, allow_base=allow_base)

    def _check_rows(self, prompts: list[list[int]], adapter_ids: list[int], *, allow_base: bool = True) -> None:
        check_rows(prompts, adapter_ids, self.n_adapters, allow_base=allow_base)

    def chat_prompt(self, user_message: str, system: str | None = None) -> list[int]:
        return chat_prompt_ids(self.tokenizer, user_message, system)

    def base_bytes(self) -> int:
        lora = {id(p) for p in self._params}
        return sum(p.numel() * p.element_size() for p in self.model.parameters() if id(p) not in lora)

    def adapter_bytes(self) -> int:
        """Bytes of one adapter's weights (all slots are the same size)."""
        return sum(p[0].numel() * p.element_size() for p in self._params)

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], adapter_ids: list[int], params: SamplingParams | None = None,
                 seeds: list[int] | None = None, *, max_new_tokens: list[int] | None = None) -> list[Completion]:
        """Sample a completion per prompt under its adapter (-1 = base). Row ``k``'s tokens depend only on its
        prompt, adapter and ``seeds[k]`` (default ``k``), not on the other rows (see :mod:`.decode`).
        ``max_new_tokens`` optionally caps each row below ``params.max_new_tokens`` (bench/gpu.py uses it for
        rows of known, unequal lengths)."""
        params = params if params is not None else SamplingParams()
        seeds = check_generate_args(prompts, adapter_ids, self.n_adapters, params, seeds, max_new_tokens)
        prompts = [[int(t) for t in p] for p in prompts]
        self._check_model_len(prompts, params.max_new_tokens, max_new_tokens)
        dec = self._decoder()
        cache = self._kv_cache(max(len(p) for p in prompts) + params.max_new_tokens)
        # A nucleus cut outside the declared set (engine.compile_nucleus off) decodes eagerly: the same tokens, and
        # nothing compiles after the warm-up.
        cuts = cuts_nucleus(bool(params.greedy), float(params.temperature), float(params.top_p))
        dense = bool(self.cfg.compile) and (bool(self.cfg.compile_nucleus) or not cuts)
        if dense:
            dec.refresh_dense()
        for layer in self.layers.values():
            layer.refresh_low_precision()
        sampling = (int(params.min_new_tokens), bool(params.greedy), float(params.temperature), float(params.top_p))
        with progress("generate", total=len(prompts), unit="rows") as bar:
            batcher = (PagedBatcher if isinstance(cache, PagedKVCache) else ContinuousBatcher)(
                dec, cache, self._ctx, self._decode_step() if dense else dec.decode_step, dense=dense, compiled=dense,
                prefill_chunk_tokens=self.cfg.prefill_chunk_tokens, check_interval=self.cfg.stop_check_interval,
                max_new_tokens=params.max_new_tokens, sampling=sampling, eos_ids=self.eos_ids,
                vocab_key=self._vocab_key, eos_mask=self._eos_mask(), on_finished=lambda r: bar.advance(1),
                stop_fn=stop_checker(self.tokenizer, params.stop), min_new_tokens=int(params.min_new_tokens))
            self._ctx.low_precision = True
            try:
                caps = None if max_new_tokens is None else [int(m) for m in max_new_tokens]
                with self.decode_compile.call(batcher, cache, self.kv_cache_allocations) if dense else nullcontext():
                    toks, reasons, lps = batcher.run(prompts, [int(a) for a in adapter_ids], [int(s) for s in seeds],
                                                     caps)
            finally:
                self._ctx.low_precision = False
                self._ctx.set(None)
                if self._cache_per_call():
                    self._drop_kv_pages()
        self.host_s += batcher.host_s
        self.row_tokens += batcher.row_tokens
        self.decode_steps += batcher.decode_steps
        self.kv_preemptions += getattr(batcher, "preemptions", 0)
        temp = 0.0 if params.greedy else max(0.0, float(params.temperature))
        return [Completion(list(p), t, self.tokenizer.decode(t, skip_special_tokens=True), r, lp, temp)
                for p, t, r, lp in zip(prompts, toks, reasons, lps)]

    def _decoder(self) -> LlamaFamilyDecoder:
        if self._dec is None:
            self._dec = LlamaFamilyDecoder(self.model, self.n_adapters, self.cfg.rank, self.scaling)
            vocab = self.model.get_output_embeddings().weight.shape[0]
            self._vocab_key = _mix32(torch.arange(vocab, dtype=torch.long, device=self.device) + 0x9E3779B9)
            if self.device.type == "cuda":  # read in place by the CUDA graphs, not copied into them every step
                torch._dynamo.mark_static_address(self._vocab_key)
        return self._dec

    def _eos_mask(self) -> torch.Tensor | None:
        """``[V]`` bool, True at the EOS ids (built per call: ``eos_ids`` may change); None without any, except on
        the compiled path, where an all-False mask keeps the declared set's one graph per sampling branch."""
        vocab = self._vocab_key.shape[0]
        ok = [i for i in self.eos_ids if 0 <= i < vocab]
        if not ok and not self.cfg.compile:
            return None
        mask = torch.zeros(vocab, dtype=torch.bool, device=self.device)
        mask[ok] = True
        return mask

    def _decode_step(self):
        """The decode step, compiled once per engine when ``cfg.compile`` (see EngineConfig.compile)."""
        if not self.cfg.compile:
            return self._dec.decode_step
        if self.decode_compile is None:
            self.decode_compile = CompiledDecode(self._dec.decode_step, self.device, bool(self.cfg.compile_nucleus))
        return self.decode_compile.step

    def decode_shapes(self) -> DecodeShapes | None:
        """The declared set of the compiled decode step over the run's cache (None before the first generate)."""
        if self._kv_shape is None:
            return None
        return DecodeShapes(*self._kv_shape[:2], self.device.type == "cuda", bool(self.cfg.compile_nucleus),
                            self._kv_shape[3] == "paged")

    def kv_budget_bytes(self) -> int:
        """Bytes the KV cache (static or paged) may take now: on CUDA a fraction of what a new allocation can use (the
        allocator's unused blocks outside CUDA-graph pools and the current cache count as free, see
        :mod:`.cudamem`), elsewhere ``kv_cache_gib``."""
        if self.device.type == "cuda":
            free = allocatable_bytes(self.device)
            if self._cache is not None:
                free += sum(t.numel() * t.element_size() for t in self._cache.k + self._cache.v)
            return kv_budget(self.cfg, "cuda", free)
        return kv_budget(self.cfg, self.device.type, 0)

    def _kv_cache(self, max_len: int) -> StaticKVCache | PagedKVCache:
        """The run's cache (``engine.kv_cache``). Sized once, on the first call: ``gen_batch_size`` rows (static: as
        many slots as the budget holds, if fewer; paged: as many pages as it holds), whatever this call's row count,
        since continuous batching streams any number of rows through them; rows of up to ``engine.max_model_len``
        (or this call's longest row, rounded up to 256). Every later call reuses it, so the compiled step sees one
        cache shape (and, on CUDA, one address) per run. With ``engine.max_model_len`` set no row is longer
        (generate refuses one); without it a row longer than the capacity makes a new, longer cache (one allocated
        again after ``release_kv_cache`` keeps the run's shape): see paged.kv_shape."""
        dec, cur = self._dec, self._cache
        if cur is not None and cur.max_len >= max_len:
            return cur
        dtype = next(iter(self.layers.values())).base.weight.dtype
        self.kv_plan = self.plan_kv_cache(max_len)
        self._cache = None  # free the old cache before allocating the new one
        shape = self.kv_plan.shape
        n_slots, capacity, n_pages, kind = shape
        if kind == "paged":
            self._cache = PagedKVCache(dec.n_layers, n_slots, dec.n_kv, dec.head_dim, capacity, n_pages, dtype,
                                       self.device)
        else:
            self._cache = StaticKVCache(dec.n_layers, n_slots, dec.n_kv, dec.head_dim, capacity, dtype, self.device)
        self._kv_shape = shape
        self.kv_cache_allocations += 1
        return self._cache

    def plan_kv_cache(self, max_len: int) -> KVCachePlan:
        """The cache :meth:`_kv_cache` would allocate now for rows of up to ``max_len`` positions: the function
        `lorapop plan` sizes it with (lorapop/engine/kvsize.py), over this engine's budget."""
        dec = self._decoder()
        dtype = next(iter(self.layers.values())).base.weight.dtype
        return kv_cache_plan(self.cfg, (dec.n_layers, dec.n_kv, dec.head_dim), dtype, max_len, self.kv_budget_bytes(),
                             self._kv_shape, self._cache is None)

    def _check_model_len(self, prompts: list[list[int]], max_new: int, caps: list[int] | None) -> None:
        """With ``engine.max_model_len`` set the run's cache is sized for rows of that many positions and never
        grows: a new cache would sit at a new address, which the compiled step's CUDA graphs would record again in a
        warm-up of their own. A longer row (prompt + its max_new_tokens) is refused here, as vLLM refuses a request
        over its max_model_len; the trainer keeps its prompts inside the budget (lorapop/train/stages.py)."""
        limit = int(self.cfg.max_model_len)
        if limit <= 0:
            return
        for k, p in enumerate(prompts):
            n = len(p) + (max_new if caps is None else min(max_new, int(caps[k])))
            if n > limit:
                raise ValueError(f"row {k}: a prompt of {len(p)} tokens + {n - len(p)} new tokens is over "
                                 f"engine.max_model_len={limit} (the KV cache is sized once for the run): shorten the "
                                 "prompt or max_new_tokens, or raise engine.max_model_len")

    def _cache_per_call(self) -> bool:
        """Eager on CPU the KV cache holds memory for one generate call only: its pages are resident only where that
        call's rows wrote them (decode.cache_zeros) and go back to the OS when it returns (:meth:`_drop_kv_pages`),
        so neither the update nor the next call holds them. The compiled step keeps its cache's pages (one cache for
        the run, and on CUDA one address, for its graphs)."""
        return self.device.type == "cpu" and not self.cfg.compile

    def _drop_kv_pages(self) -> None:
        """The cache's pages back to the OS, the cache kept (all zeros again, at the same addresses); where the OS
        cannot do that, the cache itself is dropped (the next call allocates it again)."""
        if self._cache is not None and not all(drop_pages(t) for t in self._cache.k + self._cache.v):
            self.release_kv_cache()

    def release_kv_cache(self) -> None:
        """Drop the KV cache (the next ``generate`` allocates it again, of the run's shape): for benches and tests
        that size another cache. A run never calls it: a new cache is a new address, whose CUDA graphs the compiled
        step records again."""
        self._cache = None

    # ------------------------------------------------------------------ log-probs
    def _response_logprobs(self, prompts, completions, adapter_ids, temperatures=None, entropy: bool = False,
                           entropy_grad: bool = True, share_prompts: bool = False) -> tuple[Any, torch.Tensor]:
        """Log-probs of every completion token, flat ``[n_tokens]``, plus the batch row of each token; with
        ``entropy``, a tuple (log-probs, entropies) in place of the log-probs (the entropies outside autograd
        unless ``entropy_grad``). Row ``k`` is scored at ``temperatures[k]`` (default 1).

        Right padding: a real token never attends to the pads after it, so its value does not depend on which other
        rows share the batch. ``share_prompts``: samples of one (adapter, prompt) may share a packed row that holds
        the prompt once (scoring.layout_rows; with sdpa or eager attention only, the two that take its mask). Only
        the hidden states of response positions reach the vocabulary projection, in chunks, and under autograd each
        chunk is checkpointed so its [chunk, vocab] logits are not kept for backward."""
        dev, b = self.device, len(prompts)
        attn_impl = getattr(self.model.config, "_attn_implementation", None)
        lay = layout_rows(prompts, completions, adapter_ids, self.pad_id,
                          share_prompts=share_prompts and attn_impl in ("sdpa", "eager"))
        mask = lay.mask.to(dev)
        if lay.packed and attn_impl == "eager":  # eager attention adds its mask to the scores
            dt = getattr(torch, self.cfg.dtype)
            mask = torch.zeros(mask.shape, dtype=dt, device=dev).masked_fill(~mask, torch.finfo(dt).min)
        self._ctx.set(torch.tensor([adapter_ids[k] for k in lay.first], dtype=torch.long, device=dev))
        hidden = self.model.get_decoder()(
            input_ids=lay.input_ids.to(dev), attention_mask=mask, use_cache=False,
            position_ids=None if lay.position_ids is None else lay.position_ids.to(dev)).last_hidden_state
        rows, tgt = lay.sample, lay.target
        row_t = torch.tensor(rows, dtype=torch.long, device=dev)
        h = hidden[torch.tensor(lay.at_row, dtype=torch.long, device=dev),
                   torch.tensor(lay.at_pos, dtype=torch.long, device=dev)]
        tgt_t = torch.tensor(tgt, dtype=torch.long, device=dev)
        temps = torch.tensor([1.0] * b if temperatures is None else [float(t) for t in temperatures],
                             dtype=torch.float32, device=dev)[row_t]
        fn = partial(chunk_scores, self.model.get_output_embeddings(), entropy=entropy, entropy_grad=entropy_grad)
        n = max(1, self.cfg.logprob_chunk_size)
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

    @torch.no_grad()
    def token_logprobs(self, prompts: list[list[int]], completions: list[list[int]], adapter_ids: list[int],
                       temperatures: list[float] | None = None) -> list[list[float]]:
        """Per-token log p(completion token | prefix) under each row's adapter (-1 = base), at each row's
        temperature (default 1), as train_step scores them."""
        self._check_rows(prompts, adapter_ids)
        if len(completions) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        temps = [1.0] * len(prompts) if temperatures is None else [float(t) for t in temperatures]
        out: list[list[float]] = [[] for _ in prompts]
        order = sorted(range(len(prompts)), key=lambda k: len(prompts[k]) + len(completions[k]))
        try:
            for rows in _chunks(order, max(1, self.cfg.train_micro_batch_size)):
                rows = sorted((k for k in rows if completions[k]), key=lambda k: adapter_ids[k])
                if not rows:
                    continue
                logp, row_t = self._response_logprobs([prompts[k] for k in rows], [completions[k] for k in rows],
                                                      [adapter_ids[k] for k in rows], [temps[k] for k in rows])
                for r, v in zip(row_t.tolist(), logp.tolist()):
                    out[rows[r]].append(v)
        finally:
            self._ctx.set(None)
        return out

    # ------------------------------------------------------------------ training
    def _check_samples(self, samples: list[TrainSample]) -> None:
        check_samples(samples, self.n_adapters)

    def accumulate_gradients(self, samples: list[TrainSample],
                             token_counts: dict[int, int] | None = None) -> dict[int, dict[str, float]]:
        """Forward/backward ``samples`` in micro-batches, leaving the summed gradient in the LoRA parameters.

        The per-adapter loss is normalised by that adapter's response-token count over *all* samples, so splitting
        into micro-batches (or mixing adapters in one) does not change any adapter's gradient. ``token_counts``
        (adapter -> tokens) overrides those counts: a data-parallel replica given a share of the step's samples
        normalises by the whole step's counts, so the replicas' summed gradients equal one engine's.

        A token whose sample carries ``sampler_logprobs`` has its policy-gradient term weighted by the truncated
        importance ratio ``min(exp(logp - sampler), engine.importance_sampling_cap)``, detached (:meth:`_is_weights`);
        the entropy term and the normalisation are not weighted.

        Beside the loss, per adapter over the tokens the update scored (``n_scored``): the mean ``entropy`` (at the
        scoring temperature) and, over those whose sample carries ``sampler_logprobs`` (``n_compared``), the mean
        ``logprob_mismatch`` |scored - sampler| log-prob, the share ``is_capped_frac`` of raw ratios above the cap
        (0.0 with the correction off) and the mean raw ratio ``is_ratio_mean``; with no such token the means are 0.0
        and the ratio 1.0."""
        self._check_samples(samples)
        coeff = float(self.cfg.entropy_coeff)
        cap = float(self.cfg.importance_sampling_cap)
        stats: dict[int, dict[str, float]] = {}
        for s in samples:
            st = stats.setdefault(int(s.adapter_id), {"loss": 0.0, "grad_norm": 0.0, "n_tokens": 0, "n_samples": 0,
                                                      "entropy": 0.0, "logprob_mismatch": 0.0, "is_capped_frac": 0.0,
                                                      "is_ratio_mean": 0.0, "n_scored": 0, "n_compared": 0})
            st["n_tokens"] += len(s.completion_ids)
            st["n_samples"] += 1
        denom = {a: st["n_tokens"] for a, st in stats.items()}
        if token_counts is not None:
            denom.update({int(a): int(n) for a, n in token_counts.items()})
        # Rows with no tokens, or zero advantage and no entropy bonus, add nothing to any gradient: no forward.
        work = [s for s in samples if s.completion_ids and (float(s.advantage) != 0.0 or coeff > 0)]
        share = bool(self.cfg.share_prompts)
        mbs = train_micro_batches(work, max(1, self.cfg.train_micro_batch_size), share_prompts=share)
        with progress("update", total=len(mbs), unit="micro-batches") as bar, self._checkpointing():
            for mb in mbs:
                (logp, ent), row_t = self._response_logprobs(
                    [s.prompt_ids for s in mb], [s.completion_ids for s in mb], [int(s.adapter_id) for s in mb],
                    [s.temperature for s in mb], entropy=True, entropy_grad=coeff > 0, share_prompts=share)
                inv = torch.tensor([1.0 / denom[int(s.adapter_id)] for s in mb], device=logp.device,
                                   dtype=logp.dtype)[row_t]
                adv = torch.tensor([float(s.advantage) for s in mb], device=logp.device, dtype=logp.dtype)[row_t]
                sampler = self._sampler_logprobs(mb, logp)
                ratio, w = self._is_weights(mb, row_t, logp.detach(), sampler, cap)
                pg = -adv * w * logp
                per_tok = (pg - coeff * ent if coeff > 0 else pg) * inv
                per_tok.sum().backward()
                self._add_stats(stats, mb, row_t, per_tok.detach(), logp.detach(), ent.detach(), sampler, ratio, cap)
                bar.advance(1)
        for st in stats.values():
            st["entropy"] /= max(st["n_scored"], 1)
            for k in ("logprob_mismatch", "is_capped_frac"):
                st[k] /= max(st["n_compared"], 1)
            st["is_ratio_mean"] = st["is_ratio_mean"] / st["n_compared"] if st["n_compared"] else 1.0
        return stats

    @staticmethod
    def _sampler_logprobs(mb, logp):
        """The sampler's log-prob of each token of ``mb``, in the update's token order (0.0 for a sample without
        them: such rows are never compared, see _is_weights and _add_stats)."""
        return torch.tensor([v for s in mb for v in (s.sampler_logprobs or [0.0] * len(s.completion_ids))],
                            dtype=logp.dtype, device=logp.device)

    @staticmethod
    def _is_weights(mb, row_t, logp, sampler, cap):
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

    @staticmethod
    def _add_stats(stats, mb, row_t, per_tok, logp, ent, sampler, ratio, cap) -> None:
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

    @contextmanager
    def _checkpointing(self):
        """While training: activation checkpointing of each decoder layer when ``cfg.gradient_checkpointing`` (one
        layer in ``cfg.gradient_checkpointing_every``, the first included).

        Uses transformers' per-layer hook (``GradientCheckpointingLayer``), which checkpoints only a layer whose own
        ``training`` flag is set; only that flag is flipped (not ``model.train()``), so dropout and every other
        module stay in eval mode and the gradients equal the uncheckpointed ones. Always clears the LoRA context."""
        from transformers.modeling_layers import GradientCheckpointingLayer

        layers = [m for m in self.model.modules() if isinstance(m, GradientCheckpointingLayer)]
        on = bool(self.cfg.gradient_checkpointing)
        every = self.cfg.gradient_checkpointing_every
        if on and not layers:
            raise NotImplementedError(f"engine.gradient_checkpointing: {type(self.model).__name__} has no "
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
            self._ctx.set(None)

    def train_step(self, samples: list[TrainSample]) -> dict[int, dict[str, float]]:
        """One AdamW step for every adapter in ``samples``; loss per adapter = token-mean of -advantage * w * logp -
        entropy_coeff * entropy over its response tokens, each scored at its sample's temperature, w the truncated
        importance weight against the sampler's log-probs (1 without them). Returns per adapter {"loss",
        "grad_norm" (before clipping), "n_tokens", "n_samples", "entropy", "logprob_mismatch", "is_capped_frac",
        "is_ratio_mean", "n_scored", "n_compared"} (see accumulate_gradients)."""
        # The KV cache stays: the run's one cache, at one address, which the compiled step's CUDA graphs read in
        # place; the memory plan (lorapop/engine/kvsize.py) sized it to leave the update's peak beside it.
        self.optimizer.zero_grad()
        return self.apply_step(self.accumulate_gradients(samples))

    def apply_step(self, stats: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
        """The optimizer half of ``train_step``: one clipped AdamW step from the gradients in the LoRA parameters
        for every adapter of ``stats`` with tokens, then clears them; fills in ``grad_norm``. A data-parallel
        replica calls it after summing gradients across replicas (lorapop/engine/replicas.py)."""
        slots = [a for a, st in stats.items() if st["n_tokens"] > 0]
        norms = self.optimizer.step(slots)
        self.optimizer.zero_grad()
        for a, st in stats.items():
            st["grad_norm"] = norms.get(a, 0.0)
            for k in ("n_tokens", "n_samples", "n_scored", "n_compared"):
                if k in st:
                    st[k] = int(st[k])
        return stats

    # ------------------------------------------------------------------ adapters by index
    def get_adapter(self, i: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        self._check_slot(i)
        return {n: (l.lora_A[i].detach().clone(), l.lora_B[i].detach().clone()) for n, l in self.layers.items()}

    @torch.no_grad()
    def set_adapter(self, i: int, weights: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Overwrite slot ``i`` (weights only; the slot's optimizer state is kept: see reset_optimizer)."""
        self._check_slot(i)
        missing = [n for n in self.module_names if n not in weights]
        unknown = [n for n in weights if n not in self.layers]
        if unknown:
            raise KeyError(f"adapter has modules the engine does not adapt: {unknown[:3]}"
                           f"{' ...' if len(unknown) > 3 else ''} (engine targets {list(self.cfg.target_modules)})")
        if missing:
            raise KeyError(f"adapter lacks {len(missing)} of the engine's modules, e.g. {missing[:3]}")
        for n, (a, b) in weights.items():
            layer = self.layers[n]
            want_a, want_b = tuple(layer.lora_A.shape[1:]), tuple(layer.lora_B.shape[1:])
            if a.dim() == 2 and b.dim() == 2 and (a.shape[0] != self.cfg.rank or b.shape[1] != self.cfg.rank):
                raise ValueError(f"rank mismatch for {n}: adapter has rank {a.shape[0]}, engine uses "
                                 f"rank {self.cfg.rank}")
            if tuple(a.shape) != want_a or tuple(b.shape) != want_b:
                raise ValueError(f"shape mismatch for {n}: got A {tuple(a.shape)}, B {tuple(b.shape)}; "
                                 f"expected A {want_a}, B {want_b}")
        for n, (a, b) in weights.items():
            self.layers[n].lora_A[i].copy_(a.to(self.device))  # copy_ casts to the master weights' dtype
            self.layers[n].lora_B[i].copy_(b.to(self.device))

    @torch.no_grad()
    def reset_adapter(self, i: int, seed: int) -> None:
        """PEFT's init: A ~ kaiming_uniform(a=sqrt(5)), B = 0, so the fresh adapter is exactly the base model.
        Weights only; call reset_optimizer too for a fresh member."""
        self._check_slot(i)
        g = torch.Generator().manual_seed(int(seed))
        for layer in self.layers.values():
            layer.lora_A[i].copy_(kaiming_uniform_A(self.cfg.rank, layer.in_features, g).to(self.device))
            layer.lora_B[i].zero_()

    def reset_optimizer(self, i: int) -> None:
        self._check_slot(i)
        self.optimizer.reset_slot(i)

    def save_adapter(self, i: int, path: str | os.PathLike) -> Path:
        return save_peft_adapter(self.get_adapter(i), path, rank=self.cfg.rank, lora_alpha=self.cfg.lora_alpha,
                                 target_modules=list(self.cfg.target_modules),
                                 base_model_name_or_path=self.base_model_name)

    def load_adapter(self, i: int, path: str | os.PathLike) -> None:
        """Load a PEFT LoRA directory into slot ``i``. Its rank must equal the engine's. A different alpha (or
        rslora) is absorbed by rescaling B so the weight delta is unchanged; engine modules the file lacks get a
        zero delta (fresh A, B = 0)."""
        self._check_slot(i)
        weights, pcfg = load_peft_adapter(path)
        self.load_adapter_weights(i, weights, pcfg, source=str(path))

    def load_adapter_weights(self, i: int, weights: dict[str, tuple[torch.Tensor, torch.Tensor]], pcfg: dict,
                             source: str = "the adapter") -> None:
        """``load_adapter`` once the PEFT files are read (``load_peft_adapter``'s two results): a replicated engine
        reads the files where the run directory is and sends these to every replica."""
        self._check_slot(i)
        path = source
        if int(pcfg["r"]) != self.cfg.rank:
            raise AdapterFormatError(f"rank mismatch: adapter at {path} has r={pcfg['r']}, "
                                     f"the engine uses rank={self.cfg.rank}")
        unknown = [n for n in weights if n not in self.layers]
        if unknown:
            raise AdapterFormatError(f"adapter at {path} adapts modules the engine does not: {unknown[:3]} "
                                     f"(engine target_modules={list(self.cfg.target_modules)})")
        ratio = pcfg["scaling"] / self.scaling
        g = torch.Generator().manual_seed(i)
        full = {}
        for n, layer in self.layers.items():
            if n in weights:
                a, b = weights[n]
                full[n] = (a, b * ratio if ratio != 1.0 else b)
            else:
                full[n] = (kaiming_uniform_A(self.cfg.rank, layer.in_features, g),
                           torch.zeros(layer.out_features, self.cfg.rank))
        self.set_adapter(i, full)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "format": 1,
            "n_adapters": self.n_adapters,
            "config": asdict(self.cfg),
            "modules": list(self.module_names),
            "lora_A": [l.lora_A.detach().cpu().clone() for l in self.layers.values()],
            "lora_B": [l.lora_B.detach().cpu().clone() for l in self.layers.values()],
            "optimizer": self.optimizer.state_dict(),
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("n_adapters") != self.n_adapters:
            raise ValueError(f"checkpoint holds {state.get('n_adapters')} adapters, engine has {self.n_adapters}")
        if list(state.get("modules", [])) != self.module_names:
            raise ValueError("checkpoint adapts different modules than this engine (target_modules differ)")
        if state["config"]["rank"] != self.cfg.rank:
            raise ValueError(f"rank mismatch: checkpoint rank {state['config']['rank']}, engine rank {self.cfg.rank}")
        for layer, a, b in zip(self.layers.values(), state["lora_A"], state["lora_B"]):
            layer.lora_A.copy_(a)
            layer.lora_B.copy_(b)
        self.optimizer.load_state_dict(state["optimizer"])
