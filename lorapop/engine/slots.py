"""Adapter slots: the population's LoRA weights by index, their optimizer state, PEFT files in and out, and the
engine checkpoint (every slot's weights and AdamW moments).

:class:`AdapterSlots` works on the stacked layers :func:`.lora.inject_lora` put into a model and the
:class:`~.optim.StackedAdamW` over them; it needs neither a decoder nor a cache, so it can be exercised on any model
with LoRA layers.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from .base import check_slot
from .lora import kaiming_uniform_A
from .optim import StackedAdamW
from .peft_io import AdapterFormatError, load_peft_adapter, save_peft_adapter


class AdapterSlots:
    """``n_adapters`` slots over ``layers`` (module name -> stacked LoRA layer) of an engine of config ``cfg``."""

    def __init__(self, layers: dict[str, Any], n_adapters: int, cfg: Any, device: torch.device,
                 optimizer: StackedAdamW, base_model_name: str | None = None) -> None:
        self.layers, self.n_adapters, self.cfg, self.device = layers, n_adapters, cfg, device
        self.optimizer, self.base_model_name = optimizer, base_model_name
        self.module_names = list(layers)
        self.scaling = cfg.lora_alpha / cfg.rank

    def get(self, i: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        check_slot(i, self.n_adapters)
        return {n: (l.lora_A[i].detach().clone(), l.lora_B[i].detach().clone()) for n, l in self.layers.items()}

    @torch.no_grad()
    def set(self, i: int, weights: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Overwrite slot ``i`` (weights only; the slot's optimizer state is kept: see reset_optimizer)."""
        check_slot(i, self.n_adapters)
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
    def reset(self, i: int, seed: int) -> None:
        """PEFT's init: A ~ kaiming_uniform(a=sqrt(5)), B = 0, so the fresh adapter is exactly the base model.
        Weights only; call reset_optimizer too for a fresh member."""
        check_slot(i, self.n_adapters)
        g = torch.Generator().manual_seed(int(seed))
        for layer in self.layers.values():
            layer.lora_A[i].copy_(kaiming_uniform_A(self.cfg.rank, layer.in_features, g).to(self.device))
            layer.lora_B[i].zero_()

    def reset_optimizer(self, i: int) -> None:
        check_slot(i, self.n_adapters)
        self.optimizer.reset_slot(i)

    def save(self, i: int, path: str | os.PathLike) -> Path:
        return save_peft_adapter(self.get(i), path, rank=self.cfg.rank, lora_alpha=self.cfg.lora_alpha,
                                 target_modules=list(self.cfg.target_modules),
                                 base_model_name_or_path=self.base_model_name)

    def load(self, i: int, path: str | os.PathLike) -> None:
        """Load a PEFT LoRA directory into slot ``i``. Its rank must equal the engine's. A different alpha (or
        rslora) is absorbed by rescaling B so the weight delta is unchanged; engine modules the file lacks get a
        zero delta (fresh A, B = 0)."""
        check_slot(i, self.n_adapters)
        weights, pcfg = load_peft_adapter(path)
        self.load_weights(i, weights, pcfg, source=str(path))

    def load_weights(self, i: int, weights: dict[str, tuple[torch.Tensor, torch.Tensor]], pcfg: dict,
                     source: str = "the adapter") -> None:
        """:meth:`load` once the PEFT files are read (``load_peft_adapter``'s two results): a replicated engine
        reads the files where the run directory is and sends these to every replica."""
        check_slot(i, self.n_adapters)
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
        self.set(i, full)

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
