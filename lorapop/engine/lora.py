"""Stacked multi-LoRA linear layers: every adapter of the population lives in one tensor per target module.

Each wrapped ``nn.Linear`` keeps the frozen base layer and two parameters ``lora_A: [N, r, d_in]`` and
``lora_B: [N, d_out, r]``. A forward reads the per-row adapter ids from a shared :class:`LoRAContext` and computes
``base(x) + scaling * (x @ A[id]^T) @ B[id]^T`` with ``index_select`` + ``bmm``, so one forward serves a batch that
mixes any adapters (measured at ~1.07x of a single-adapter batch, against 1.62x for peft's mixed batch). Rows with
id ``-1`` get the base output exactly: their delta is multiplied by zero, and ``y + 0.0 == y`` bit for bit.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class LoRAContext:
    """Per-forward state shared by every wrapped layer of one model (set by the engine before each forward)."""

    def __init__(self) -> None:
        self.adapter_ids: torch.Tensor | None = None  # [batch] long, -1 = base
        self.uniform: int | None = None  # set when every row uses the same adapter (>= 0): skip the gather
        self.has_base_rows = False
        self.runs: list[tuple[int, int, int]] = []  # (start, end, adapter) of contiguous equal-id rows
        self._masks: dict[tuple[int, int, torch.dtype], torch.Tensor] = {}

    def set(self, adapter_ids: torch.Tensor | None) -> None:
        self.adapter_ids = adapter_ids
        self.uniform = None
        self.has_base_rows = False
        self.runs = []
        self._masks = {}
        if adapter_ids is None or adapter_ids.numel() == 0:
            return
        ids = adapter_ids.tolist()
        self.has_base_rows = min(ids) < 0
        if min(ids) == max(ids) and ids[0] >= 0:
            self.uniform = ids[0]
        start = 0
        for k in range(1, len(ids) + 1):
            if k == len(ids) or ids[k] != ids[start]:
                self.runs.append((start, k, ids[start]))
                start = k


    def block_mask(self, n_adapters: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
        """``[batch, 1, n_adapters * rank]``: ones on each row's own adapter block, zeros elsewhere (and everywhere for
        base rows). Built once per forward and shared by every layer of that shape."""
        key = (n_adapters, rank, dtype)
        m = self._masks.get(key)
        if m is None:
            ids = self.adapter_ids
            onehot = (ids[:, None] == torch.arange(n_adapters, device=ids.device)[None, :]).to(dtype)
            m = onehot.repeat_interleave(rank, dim=1)[:, None, :]
            self._masks[key] = m
        return m


class MultiLoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, n_adapters: int, rank: int, scaling: float, ctx: LoRAContext) -> None:
        super().__init__()
        self.base = base
        self.scaling = scaling
        self.ctx = ctx
        dev = base.weight.device
        # float32 regardless of the base dtype: these are the trainable master weights.
        self.lora_A = nn.Parameter(torch.zeros(n_adapters, rank, base.in_features, device=dev))
        self.lora_B = nn.Parameter(torch.zeros(n_adapters, base.out_features, rank, device=dev))
        self._b_cat: tuple[int, torch.Tensor] | None = None  # (lora_B version, [N * r, d_out] copy) for decode

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    @property
    def weight(self) -> torch.Tensor:  # some HF code peeks at .weight (dtype/device checks)
        return self.base.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        ids = self.ctx.adapter_ids
        if ids is None:
            return y
        shape = x.shape
        xf = x.reshape(shape[0], -1, shape[-1]).to(self.lora_A.dtype)  # [b, t, d_in]
        if self.ctx.uniform is not None:
            i = self.ctx.uniform
            delta = (xf @ self.lora_A[i].T) @ self.lora_B[i].T
        elif xf.shape[1] == 1 and not torch.is_grad_enabled():
            # Decode (one token per row, memory bound): three ops whatever the mix. x goes through every adapter's A
            # at once ([b, N*r], tiny), a mask keeps each row's own r-block, and one matmul with all B's stacked
            # [N*r, d_out] finishes. A per-run loop costs 2 matmuls per run per layer in dispatch, and a per-row
            # gather copies a weight slice per row; at 8 adapters both cost more than the LoRA math itself.
            n, r = self.lora_A.shape[0], self.lora_A.shape[1]
            h = xf @ self.lora_A.reshape(n * r, -1).T
            delta = (h * self.ctx.block_mask(n, r, h.dtype)) @ self._stacked_b()
        elif len(self.ctx.runs) * 2 <= shape[0]:
            # Rows grouped by adapter (the engine sorts them so): one matmul per run reads each adapter's weights
            # once, where a per-row gather copies them once per row; in decode, where every step is memory-bound,
            # that copy cost more than the LoRA math. unbind (views) keeps the backward to one stacked gradient per
            # parameter instead of a full-size gradient per run.
            a_all, b_all = self.lora_A.unbind(0), self.lora_B.unbind(0)
            pieces = []
            for s, e, i in self.ctx.runs:
                if i < 0:
                    pieces.append(xf.new_zeros(e - s, xf.shape[1], self.lora_B.shape[1]))
                else:
                    pieces.append((xf[s:e] @ a_all[i].T) @ b_all[i].T)
            delta = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
        else:
            idx = ids.clamp(min=0)
            a = self.lora_A.index_select(0, idx)  # [b, r, d_in]
            b = self.lora_B.index_select(0, idx)  # [b, d_out, r]
            delta = torch.bmm(torch.bmm(xf, a.transpose(1, 2)), b.transpose(1, 2))
            if self.ctx.has_base_rows:
                delta = delta * (ids >= 0).to(delta.dtype)[:, None, None]
        return y + (self.scaling * delta).to(y.dtype).reshape(*shape[:-1], -1)


    def _stacked_b(self) -> torch.Tensor:
        """``lora_B`` as ``[N * r, d_out]`` (adapter-major, matching ``lora_A.reshape(N * r, d_in)``), rebuilt only
        when the weights change (optimizer step, set/copy/load), which the parameter's version counter tracks."""
        version = self.lora_B._version
        if self._b_cat is None or self._b_cat[0] != version:
            n, d_out, r = self.lora_B.shape
            self._b_cat = (version, self.lora_B.detach().permute(0, 2, 1).reshape(n * r, d_out).contiguous())
        return self._b_cat[1]


def linear_module_names(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]


def find_targets(model: nn.Module, target_modules: list[str]) -> list[str]:
    """Full module paths of the nn.Linear layers whose last name component is in ``target_modules``."""
    if not target_modules:
        raise ValueError("target_modules is empty: name at least one linear layer, e.g. ['q_proj', 'v_proj']")
    linears = linear_module_names(model)
    leaf_names = sorted({n.rsplit(".", 1)[-1] for n in linears})
    for t in target_modules:
        if t not in leaf_names:
            raise ValueError(
                f"unknown LoRA target module {t!r}: the base model has no nn.Linear named so "
                f"(its linear layers are named {leaf_names})"
            )
    wanted = set(target_modules)
    # The output head is tied to the embeddings in small models; adapting it would silently adapt the input too.
    return [n for n in linears if n.rsplit(".", 1)[-1] in wanted and n.rsplit(".", 1)[-1] != "lm_head"]


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def inject_lora(model: nn.Module, n_adapters: int, rank: int, lora_alpha: float,
                target_modules: list[str]) -> tuple[LoRAContext, dict[str, MultiLoRALinear]]:
    """Replace every target nn.Linear of ``model`` (in place) by a :class:`MultiLoRALinear` with zeroed adapters."""
    if n_adapters < 1:
        raise ValueError(f"n_adapters must be >= 1, got {n_adapters}")
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    if any(isinstance(m, MultiLoRALinear) for m in model.modules()):
        raise ValueError("model already carries multi-LoRA layers (call remove_lora first)")
    names = find_targets(model, target_modules)
    ctx = LoRAContext()
    layers: dict[str, MultiLoRALinear] = {}
    for name in names:
        base = model.get_submodule(name)
        base.requires_grad_(False)
        layer = MultiLoRALinear(base, n_adapters, rank, lora_alpha / rank, ctx)
        _set_submodule(model, name, layer)
        layers[name] = layer
    return ctx, layers


def remove_lora(model: nn.Module) -> None:
    """Undo :func:`inject_lora`: put the original nn.Linear layers back."""
    names = [n for n, m in model.named_modules() if isinstance(m, MultiLoRALinear)]
    for name in names:
        _set_submodule(model, name, model.get_submodule(name).base)


def kaiming_uniform_A(rank: int, d_in: int, generator: torch.Generator) -> torch.Tensor:
    """PEFT's A init: kaiming_uniform_(a=sqrt(5)) on a [r, d_in] weight, i.e. U(-1/sqrt(d_in), 1/sqrt(d_in))."""
    return nn.init.kaiming_uniform_(torch.empty(rank, d_in), a=math.sqrt(5), generator=generator)
