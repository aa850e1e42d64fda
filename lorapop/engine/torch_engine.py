"""TorchEngine: a population of LoRA adapters on one frozen HF causal LM, in plain PyTorch.

Generation (KV cache, left padding, per-row seeds, finished rows dropped from the batch), token log-probs
(chunked over the vocabulary projection) and a multi-adapter policy-gradient train step all run one forward over a
batch that mixes adapters; see :mod:`lorapop.engine.lora` for the stacked layers and :mod:`lorapop.engine.optim`
for the per-slot AdamW. The engine owns the model and runs generation as nano-vllm's LLMEngine does: per-row requests
(:mod:`.sequence`), a scheduler (:mod:`.scheduler`) over a block manager's pages (:mod:`.block_manager`) and a model
runner (:mod:`.model_runner`), compiled by :mod:`.compiled`. Its parts are used directly by benches and tests: the
run's KV cache (:attr:`kv`, :mod:`.kvcache`, sized by :mod:`.kvsize`), the update's loss and statistics
(:mod:`.update`, which also says what the loss leaves out), and the adapter slots with their files and checkpoint
(:attr:`slots`, :mod:`.slots`).
"""

from __future__ import annotations

import dataclasses
import os
import time
import types
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

from lorapop.progress import progress

from . import update
from .base import (Completion, EngineConfig, SamplingParams, TrainSample, chat_prompt_ids, check_generate_args,
                   check_rows, check_samples, end_of_turn_ids)
from .block_manager import BlockManager
from .compiled import CompiledDecode, DecodeShapes, batch_bucket
from .decode import LlamaFamilyDecoder, _mix32
from .dtype import resolve_dtype, resolve_lora_compute_dtype
from .kvcache import KVCacheKeeper
from .kvsize import model_len
from .lora import inject_lora, remove_lora
from .model_runner import ModelRunner
from .optim import StackedAdamW
from .paged import PagedKVCache
from .scheduler import Scheduler
from .sequence import Request, cuts_nucleus, stop_checker
from .slots import AdapterSlots


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
        # The gradients are allocated here and zeroed in place (StackedAdamW.zero_grad), not made by each backward:
        # they are resident, as the memory plan counts them, when the KV cache is sized from what is left.
        for p in self._params:
            p.grad = torch.zeros_like(p)
        # vLLM's rule: unset, the run's rows may reach the model's max_position_embeddings. Resolved here, so the
        # cache is sized from it once and the trainer's prompt budget reads it (lorapop/train/stages.py).
        cfg.max_model_len = model_len(cfg.max_model_len, getattr(model.config, "max_position_embeddings", None))
        self.eos_ids = self._eos_ids()
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad if pad is not None else 0)
        self._dec: LlamaFamilyDecoder | None = None  # built on the first generate
        self.kv = KVCacheKeeper(cfg, self.device)
        self.slots = AdapterSlots(self.layers, n_adapters, cfg, self.device, self.optimizer, self.base_model_name)
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
        rows of known, unequal lengths).

        As nano-vllm's LLMEngine: each row a :class:`.sequence.Request` carrying its sampling parameters; the
        :class:`.scheduler.Scheduler` decides who runs each step over the pages the :class:`.block_manager.
        BlockManager` holds; the :class:`.model_runner.ModelRunner` runs it."""
        params = params if params is not None else SamplingParams()
        seeds = check_generate_args(prompts, adapter_ids, self.n_adapters, params, seeds, max_new_tokens)
        prompts = [[int(t) for t in p] for p in prompts]
        self.kv.check_model_len(prompts, params.max_new_tokens, max_new_tokens)
        # A nucleus cut outside the declared set (engine.compile_nucleus off) decodes eagerly: the same tokens, and
        # nothing compiles after the warm-up.
        cuts = cuts_nucleus(bool(params.greedy), float(params.temperature), float(params.top_p))
        dense = bool(self.cfg.compile) and (bool(self.cfg.compile_nucleus) or not cuts)
        dec, cache = self.decoder(), self.kv_cache()
        hot = not params.greedy and float(params.temperature) > 0
        runner = ModelRunner(dec, cache, self._ctx, self._decode_step() if dense else dec.decode_step, dense=dense,
                             compiled=dense, prefill_chunk_tokens=self.cfg.prefill_chunk_tokens,
                             interval=self.cfg.stop_check_interval, branches=(True, cuts) if dense else (hot, cuts),
                             vocab_key=self._vocab_key, eos_mask=self._eos_mask())
        caps = [params.max_new_tokens] * len(prompts) if max_new_tokens is None else \
            [min(int(m), params.max_new_tokens) for m in max_new_tokens]
        requests = [Request(k, p, int(a), int(s), dataclasses.replace(params, max_new_tokens=c))
                    for k, (p, a, s, c) in enumerate(zip(prompts, adapter_ids, seeds, caps))]
        sched = Scheduler(requests, BlockManager(cache), cache.n_slots, self.cfg.stop_check_interval)
        try:
            compiled = self.decode_compile.call(runner, cache, self.kv.allocations) if dense else None
            with progress("generate", total=len(prompts), unit="rows") as bar, \
                    self.lora_rows(None, low_precision=True), compiled or nullcontext():
                self._run(sched, runner, stop_checker(self.tokenizer, params.stop), bar)
        finally:
            if self.kv.per_call():
                self.kv.drop_pages()
        self.kv_preemptions += sched.preemptions
        temp = 0.0 if params.greedy else max(0.0, float(params.temperature))
        return [Completion(list(r.prompt), r.tokens, self.tokenizer.decode(r.tokens, skip_special_tokens=True),
                           r.finish_reason, r.logprobs, temp) for r in requests]

    def _run(self, sched: Scheduler, runner: ModelRunner, stop_fn, bar) -> None:
        """Steps until every request is done: admit and prefill, pack, reserve pages (preempting), decode an
        interval, take its tokens in, free the finished rows' slots."""
        eos, cuda_graphs = set(self.eos_ids), runner.compiled and self.device.type == "cuda"
        n_slots = runner.cache.n_slots
        while not sched.done():
            adm = sched.admit()
            if adm.placed:
                runner.prefill(adm.prefill)
                for src, dst, n in adm.copy_after:
                    sched.blocks.copy_page(src, dst, n)
                runner.place(adm.placed)
            for src, dst in sched.pack():
                runner.move(src, dst)
            if not sched.running():
                continue
            k = sched.interval_steps()
            live, preempted = sched.reserve(k)
            if preempted:
                runner.release(preempted)
            nb = batch_bucket(max(live) + 1, n_slots, runner.compiled)
            got, got_lp = runner.decode(nb, runner.cache.reads(nb, sched.needs(nb, k), cuda_graphs), k)
            t0 = time.perf_counter()
            done = sched.postprocess(live, got, got_lp, k, eos, stop_fn)
            self.row_tokens += k * len(live)
            self.decode_steps += k
            self.host_s += time.perf_counter() - t0
            if done:
                sched.finish(done)
                runner.release(done)
                bar.advance(len(done))

    def kv_cache(self) -> PagedKVCache:
        """The run's KV cache (:attr:`kv`), the inference copies refreshed first: on its first call it is sized from
        the memory left beside the resident state the plan counts (base, adapters with their moments and
        gradients, the copies), as `lorapop plan` sizes it."""
        self.refresh_inference_copies()
        return self.kv.get(*self.cache_dims())

    def refresh_inference_copies(self) -> LlamaFamilyDecoder:
        """Refill what generation reads besides the float32 adapters: their base-dtype copies and, with
        engine.compile, the decoder's dense stacks. Made before the KV cache is sized, so its budget is taken
        from the memory left beside them, as the plan counts it (lorapop/plan/gpu.py)."""
        dec = self.decoder()
        if self.cfg.compile:
            dec.refresh_dense()
        for layer in self.layers.values():
            layer.refresh_low_precision()
        return dec

    def decoder(self) -> LlamaFamilyDecoder:
        """The model's decode forward over a KV cache (built once, on first use)."""
        if self._dec is None:
            self._dec = LlamaFamilyDecoder(self.model, self.n_adapters, self.cfg.rank, self.scaling)
            vocab = self.model.get_output_embeddings().weight.shape[0]
            self._vocab_key = _mix32(torch.arange(vocab, dtype=torch.long, device=self.device) + 0x9E3779B9)
            if self.device.type == "cuda":  # read in place by the CUDA graphs, not copied into them every step
                torch._dynamo.mark_static_address(self._vocab_key)
        return self._dec

    def cache_dims(self) -> tuple[tuple[int, int, int], torch.dtype]:
        """((layers, KV heads, head dim), dtype) of the model's KV cache: what :attr:`kv` sizes it with."""
        dec = self.decoder()
        return (dec.n_layers, dec.n_kv, dec.head_dim), next(iter(self.layers.values())).base.weight.dtype

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
        c = self.kv.cache
        if c is None:
            return None
        return DecodeShapes(c.n_slots, c.max_len, self.device.type == "cuda", bool(self.cfg.compile_nucleus))

    # ------------------------------------------------------------------ log-probs and the update (update.py)
    def lora_params(self) -> list[torch.Tensor]:
        """Every stacked LoRA weight (A and B of each adapted module; dim 0 is the slot)."""
        return list(self._params)

    @contextmanager
    def lora_rows(self, adapter_ids: torch.Tensor | None, *, low_precision: bool = False):
        """Forwards inside run row ``k`` under adapter ``adapter_ids[k]`` (-1 = base; None: the base for all),
        with ``low_precision`` on the adapters' base-dtype copies as generate runs them; cleared on exit."""
        self._ctx.set(adapter_ids)
        self._ctx.low_precision = low_precision
        try:
            yield
        finally:
            self._ctx.low_precision = False
            self._ctx.set(None)

    def response_logprobs(self, prompts, completions, adapter_ids, temperatures=None, entropy: bool = False,
                          entropy_grad: bool = True, share_prompts: bool = False) -> tuple[Any, torch.Tensor]:
        """Log-probs (and with ``entropy`` entropies) of every completion token, flat, with each token's row:
        :func:`.update.response_logprobs` on this engine's model. Leaves the LoRA context set (see lora_rows)."""
        return update.response_logprobs(self.model, self._ctx, self.cfg, self.pad_id, prompts, completions,
                                        adapter_ids, temperatures, entropy, entropy_grad, share_prompts)

    def checkpointing(self):
        """While training: activation checkpointing when ``cfg.gradient_checkpointing``
        (:func:`.update.checkpointing`); clears the LoRA context on exit."""
        return update.checkpointing(self.model, self.cfg, self._ctx)

    @torch.no_grad()
    def token_logprobs(self, prompts: list[list[int]], completions: list[list[int]], adapter_ids: list[int],
                       temperatures: list[float] | None = None) -> list[list[float]]:
        """Per-token log p(completion token | prefix) under each row's adapter (-1 = base), at each row's
        temperature (default 1), as train_step scores them."""
        check_rows(prompts, adapter_ids, self.n_adapters)
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
                logp, row_t = self.response_logprobs([prompts[k] for k in rows], [completions[k] for k in rows],
                                                     [adapter_ids[k] for k in rows], [temps[k] for k in rows])
                for r, v in zip(row_t.tolist(), logp.tolist()):
                    out[rows[r]].append(v)
        finally:
            self._ctx.set(None)
        return out

    def accumulate_gradients(self, samples: list[TrainSample],
                             token_counts: dict[int, int] | None = None) -> dict[int, dict[str, float]]:
        """Forward/backward ``samples`` in micro-batches, leaving the summed gradient in the LoRA parameters.

        The per-adapter loss is normalised by that adapter's response-token count over *all* samples, so splitting
        into micro-batches (or mixing adapters in one) does not change any adapter's gradient. ``token_counts``
        (adapter -> tokens) overrides those counts: a data-parallel replica given a share of the step's samples
        normalises by the whole step's counts, so the replicas' summed gradients equal one engine's.

        A token whose sample carries ``sampler_logprobs`` has its policy-gradient term weighted by the truncated
        importance ratio ``min(exp(logp - sampler), engine.importance_sampling_cap)``, detached
        (:func:`.update.is_weights`); the entropy term and the normalisation are not weighted.

        Beside the loss, per adapter over the tokens the update scored (``n_scored``): the mean ``entropy`` (at the
        scoring temperature) and, over those whose sample carries ``sampler_logprobs`` (``n_compared``), the mean
        ``logprob_mismatch`` |scored - sampler| log-prob, the share ``is_capped_frac`` of raw ratios above the cap
        (0.0 with the correction off) and the mean raw ratio ``is_ratio_mean``; with no such token the means are 0.0
        and the ratio 1.0."""
        check_samples(samples, self.n_adapters)
        return update.accumulate(self.response_logprobs, self.cfg, samples, token_counts, self.checkpointing)

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
        return update.apply_step(self.optimizer, stats)

    # ------------------------------------------------------------------ adapters and checkpoints (slots.AdapterSlots)
    def get_adapter(self, i: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return self.slots.get(i)

    def set_adapter(self, i: int, weights: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Overwrite slot ``i`` (weights only; the slot's optimizer state is kept: see reset_optimizer)."""
        self.slots.set(i, weights)

    def reset_adapter(self, i: int, seed: int) -> None:
        """PEFT's init (A kaiming-uniform, B = 0: exactly the base model). Weights only; call reset_optimizer too
        for a fresh member."""
        self.slots.reset(i, seed)

    def reset_optimizer(self, i: int) -> None:
        self.slots.reset_optimizer(i)

    def save_adapter(self, i: int, path: str | os.PathLike) -> Path:
        return self.slots.save(i, path)

    def load_adapter(self, i: int, path: str | os.PathLike) -> None:
        """Load a PEFT LoRA directory into slot ``i`` (:meth:`.slots.AdapterSlots.load`: same rank, alpha absorbed,
        missing modules a zero delta)."""
        self.slots.load(i, path)

    def load_adapter_weights(self, i: int, weights: dict[str, tuple[torch.Tensor, torch.Tensor]], pcfg: dict,
                             source: str = "the adapter") -> None:
        """``load_adapter`` once the PEFT files are read (``load_peft_adapter``'s two results): a replicated engine
        reads the files where the run directory is and sends these to every replica."""
        self.slots.load_weights(i, weights, pcfg, source)

    def state_dict(self) -> dict[str, Any]:
        return self.slots.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.slots.load_state_dict(state)
