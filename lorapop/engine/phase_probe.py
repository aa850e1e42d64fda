"""The engine's phases one at a time on a model of fake tensors, for a memory plan to measure.

:class:`PhaseProbe` builds a :class:`~lorapop.engine.torch_engine.TorchEngine` on a fake-tensor base model (no
weights read, nothing computed) and runs each phase of a run through the engine's own code: the inference copies of
the adapters, one prefill chunk, one decode step, one train micro-batch, one scoring batch. The planner
(:mod:`lorapop.plan.measure`) counts the bytes each call allocates; this is all it needs of the engine, so the engine's
internals can change without the plan silently measuring something else.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from .base import EngineConfig
from .kvsize import PAGE
from .paged import PagedKVCache


def _adapter_rows(rows: int, n_adapters: int) -> list[int]:
    """Adapter ids of ``rows`` rows in equal runs per adapter, as scoring.train_micro_batches orders them."""
    return sorted(k % n_adapters for k in range(rows))


class PhaseProbe:
    """A TorchEngine on a fake-tensor base of transformers config ``mcfg``; each method runs one phase."""

    def __init__(self, mcfg: Any, n_adapters: int, ecfg: EngineConfig, fake_mode: Any) -> None:
        from lorapop.model import import_transformers

        from .torch_engine import TorchEngine

        with torch.device("meta"):
            model = import_transformers().AutoModelForCausalLM.from_config(mcfg, dtype=getattr(torch, ecfg.dtype))
        with fake_mode:
            model = model.to_empty(device="cpu")
        # Already on the plan's device and dtype; the engine's model.to() would try to swap the fake parameters,
        # which the fake-tensor mode forbids (it holds weak references to them).
        model.to = lambda *a, **k: model
        # The engine needs only the stop and pad ids from a tokenizer; memory does not depend on them.
        tok = SimpleNamespace(eos_token_id=0, pad_token_id=0, chat_template=None)
        self.engine = eng = TorchEngine(model, tok, n_adapters, ecfg, seed=0)
        self.cfg, self.n_adapters = eng.cfg, eng.n_adapters
        self.dtype = getattr(torch, ecfg.dtype)

    # ------------------------------------------------------------------ resident state
    def base_bytes(self) -> int:
        return self.engine.base_bytes()

    def lora_elements(self) -> int:
        """Elements of every adapter slot's LoRA weights together."""
        return sum(t.numel() for t in self.engine.lora_params())

    def adapter_state_bytes(self) -> int:
        """The adapters' training state: master weights, their float32 gradients (the same size) and AdamW's
        moments."""
        lora = sum(t.numel() * t.element_size() for t in self.engine.lora_params())
        opt = self.engine.optimizer
        return 2 * lora + sum(t.numel() * t.element_size() for t in opt.exp_avg + opt.exp_avg_sq)

    def inference_copies(self) -> None:
        """Make what generate refreshes before it sizes the KV cache (TorchEngine.refresh_inference_copies): the
        adapters' base-dtype copies, and with engine.compile the decoder's dense stacks."""
        self.engine.refresh_inference_copies()

    def cache_dims(self) -> tuple[int, int, int]:
        """(layers, KV heads, head dim) of the model's KV cache."""
        dec = self.engine.decoder()
        return dec.n_layers, dec.n_kv, dec.head_dim

    # ------------------------------------------------------------------ generation
    def paged_cache(self, rows: int, capacity: int) -> PagedKVCache:
        """A page pool holding ``rows`` rows of ``capacity`` positions. Its block table is made fake afterwards
        (:meth:`fake_table`), so the gather a decode step makes is counted without being computed."""
        n_layers, n_kv, head_dim = self.cache_dims()
        return PagedKVCache(n_layers, rows, n_kv, head_dim, capacity, rows * capacity // PAGE, self.dtype,
                            torch.device("cpu"))

    def fake_table(self, cache: PagedKVCache) -> None:
        cache.table = next(self.engine.model.parameters()).fake_mode.from_tensor(cache.table)

    def prefill(self, cache: PagedKVCache, rows: int, width: int) -> None:
        """One prefill chunk as the continuous batcher runs it: rows into their slots, positions 0..width-1."""
        pos = torch.arange(width)[None].expand(rows, width)
        with self.engine.lora_rows(torch.tensor(_adapter_rows(rows, self.n_adapters)), low_precision=True):
            with torch.no_grad():
                self.engine.decoder().forward(cache, torch.ones(rows, width, dtype=torch.long), pos, pos, width,
                                              torch.arange(rows), None)

    def decode(self, cache: PagedKVCache, rows: int, kv: int) -> None:
        """One decode step's forward with every row attending ``kv`` positions, each reading its own chunks
        (split-KV), as the engine's decode step does."""
        pos = torch.full((rows, 1), kv - 1)
        kv = cache.reads(rows, [kv] * rows, False)
        with self.engine.lora_rows(torch.tensor(_adapter_rows(rows, self.n_adapters)), low_precision=True):
            with torch.no_grad():
                self.engine.decoder().forward(cache, torch.ones(rows, 1, dtype=torch.long), pos, pos, kv, None, None)

    # ------------------------------------------------------------------ training
    def zero_grad(self) -> None:
        self.engine.optimizer.zero_grad()

    def train_micro_batch(self, rows: int, prompt: int, completion: int, checkpointing: bool) -> None:
        """Forward and backward of one train micro-batch into the LoRA gradients, as accumulate_gradients runs it
        (``checkpointing`` sets engine.gradient_checkpointing); the entropy term's [chunk, vocab] softmax is
        backpropagated too when entropy_coeff > 0."""
        self.cfg.gradient_checkpointing = checkpointing
        bonus = self.cfg.entropy_coeff > 0
        with torch.enable_grad(), self.engine.checkpointing():
            (logp, ent), _ = self.engine.response_logprobs(
                [[1] * prompt] * rows, [[2] * completion] * rows, _adapter_rows(rows, self.n_adapters),
                entropy=True, entropy_grad=bonus)
            (logp.sum() + ent.sum() if bonus else logp.sum()).backward()

    def logprobs(self, rows: int, prompt: int, completion: int) -> None:
        """One scoring batch without gradients (token_logprobs' forward)."""
        with torch.no_grad(), self.engine.lora_rows(None):
            self.engine.response_logprobs([[1] * prompt] * rows, [[2] * completion] * rows,
                                          _adapter_rows(rows, self.n_adapters))
