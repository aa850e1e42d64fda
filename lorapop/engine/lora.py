"""Stacked multi-LoRA linear layers: every adapter of the population lives in one tensor per target module.

Each wrapped ``nn.Linear`` keeps the frozen base layer and two parameters ``lora_A: [N, r, d_in]`` and
``lora_B: [N, d_out, r]``. A forward reads the per-row adapter ids from a shared :class:`LoRAContext` and adds
``scaling * (x @ A[id]^T) @ B[id]^T`` to the base output, so one forward serves a batch that mixes any adapters.
Four ways to compute it, chosen per call: one adapter for the whole batch (plain matmuls); decode with mixed rows
(rows gathered by adapter into ``[G, M, d]`` and two ``bmm``: each adapter's weights read once, a fixed number of
ops); training with equal-length runs of rows (the sorted rows viewed as ``[G, L * t, d]``, two ``bmm``); prefill
and other training batches with mixed rows (one matmul pair per contiguous run of rows, the engine sorts rows by
adapter; ``unbind`` views keep the backward to one stacked gradient per parameter). Rows with id ``-1`` get the
base output exactly: their delta is zero, and ``y + 0.0 == y`` bit for bit.

The factors are float32 master weights; the matmuls run in ``compute_dtype`` (the base's bf16 by default, see
``EngineConfig.lora_compute_dtype``) with float32 gradients.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _slot_index(slots: list[int], n_adapters: int, device) -> torch.Tensor | None:
    """``slots`` as an index into the stacked weights, or None when they are exactly 0..N-1 in order (then the
    stacked tensors serve as they are, with no ``index_select`` copy)."""
    return None if slots == list(range(n_adapters)) else torch.tensor(slots, dtype=torch.long, device=device)


class LoRAContext:
    """Per-forward state shared by every wrapped layer of one model (set by the engine before each forward)."""

    def __init__(self) -> None:
        self.adapter_ids: torch.Tensor | None = None  # [batch] long, -1 = base
        self.uniform: int | None = None  # set when every row uses the same adapter (>= 0): skip the gather
        self.has_base_rows = False
        self.runs: list[tuple[int, int, int]] = []  # (start, end, adapter) of contiguous equal-id rows
        self.equal_runs = False  # >= 2 runs, all of one length, no base rows: the [G, L * t, d] bmm path
        self._run_ids: tuple[torch.Tensor | None] | None = None  # cache of run_adapters()
        # Grouped layout for decode, built once per forward: rows gathered into [G groups, M rows] (padded with a
        # zero row) for the G adapters present, and where each row's result sits in the flattened [G * M] output.
        self.group_adapters: torch.Tensor | None = None  # None when the groups are exactly adapters 0..N-1
        self.gather: torch.Tensor | None = None
        self.scatter: torch.Tensor | None = None
        self.n_groups = self.group_rows = 0
        # Inference reads the layers' base-dtype copies of the factors (generation sets it, see refresh_low_precision).
        self.low_precision = False

    def set(self, adapter_ids: torch.Tensor | None) -> None:
        self.adapter_ids = adapter_ids
        self.uniform = None
        self.has_base_rows = False
        self.runs = []
        self.equal_runs = False
        self._run_ids = None
        self.gather = self.scatter = self.group_adapters = None
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
        self.equal_runs = (not self.has_base_rows and len(self.runs) > 1
                           and len({e - s for s, e, _ in self.runs}) == 1)

    def run_adapters(self, n_adapters: int) -> torch.Tensor | None:
        """Adapter id of each run as a tensor, or None when the runs are exactly adapters 0..N-1 in order."""
        if self._run_ids is None:
            ids = [i for _, _, i in self.runs]
            self._run_ids = (_slot_index(ids, n_adapters, self.adapter_ids.device),)
        return self._run_ids[0]

    def grouped(self, n_adapters: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int, int]:
        """``(gather, scatter, adapters, G, M)`` for the decode path (see ``MultiLoRALinear.forward``)."""
        if self.gather is None:
            ids = self.adapter_ids.tolist()
            b = len(ids)
            present = sorted({i for i in ids if i >= 0})
            rows = {a: [k for k, i in enumerate(ids) if i == a] for a in present}
            m = max((len(r) for r in rows.values()), default=1)
            gather, scatter = [], [len(present) * m] * b  # base rows read the zero row appended to the output
            for g, a in enumerate(present):
                for j, k in enumerate(rows[a]):
                    scatter[k] = g * m + j
                gather += rows[a] + [b] * (m - len(rows[a]))  # index b: the zero row appended to the input
            dev = self.adapter_ids.device
            self.gather = torch.tensor(gather, dtype=torch.long, device=dev)
            self.scatter = torch.tensor(scatter, dtype=torch.long, device=dev)
            self.group_adapters = _slot_index(present, n_adapters, dev)
            self.n_groups, self.group_rows = len(present), m
        return self.gather, self.scatter, self.group_adapters, self.n_groups, self.group_rows


class MultiLoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, n_adapters: int, rank: int, scaling: float, ctx: LoRAContext) -> None:
        super().__init__()
        self.base = base
        self.scaling = scaling
        self.ctx = ctx
        dev = base.weight.device
        # float32 whatever the base's lower precision: these are the trainable master weights (float64 on a float64
        # base, the numerical reference, which must not round through float32 anywhere).
        master = torch.float64 if base.weight.dtype == torch.float64 else torch.float32
        self.lora_A = nn.Parameter(torch.zeros(n_adapters, rank, base.in_features, device=dev, dtype=master))
        self.lora_B = nn.Parameter(torch.zeros(n_adapters, base.out_features, rank, device=dev, dtype=master))
        self.low_precision: tuple[torch.Tensor, torch.Tensor] | None = None  # see refresh_low_precision
        # dtype the LoRA matmuls run in when it differs from the master weights' (engine.lora_compute_dtype): the
        # factors are cast per forward (autograd casts their gradients back to float32), the input stays in the
        # base dtype, so backward keeps a bf16 activation per projection instead of a float32 copy.
        self.compute_dtype: torch.dtype | None = None

    @torch.no_grad()
    def refresh_low_precision(self) -> None:
        """Copies of A and B in the base dtype for inference (None when the base has the master weights' dtype),
        refilled in place."""
        dt = self.base.weight.dtype
        if dt == self.lora_A.dtype:
            self.low_precision = None
        elif self.low_precision is None:
            self.low_precision = (self.lora_A.detach().to(dt), self.lora_B.detach().to(dt))
        else:
            self.low_precision[0].copy_(self.lora_A)
            self.low_precision[1].copy_(self.lora_B)

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
        lA, lB = self.lora_A, self.lora_B
        if self.low_precision is not None and self.ctx.low_precision and not torch.is_grad_enabled():
            lA, lB = self.low_precision  # inference in the base dtype: no float32 GEMMs or casts around them
        elif self.compute_dtype is not None and self.compute_dtype != lA.dtype:
            lA, lB = lA.to(self.compute_dtype), lB.to(self.compute_dtype)
        shape = x.shape
        xf = x.reshape(shape[0], -1, shape[-1]).to(lA.dtype)  # [b, t, d_in]
        if self.ctx.uniform is not None:
            i = self.ctx.uniform
            delta = (xf @ lA[i].T) @ lB[i].T
        elif xf.shape[1] == 1 and not torch.is_grad_enabled() and self.ctx.runs:
            # Decode (one token per row): rows gathered by adapter into [G, M, d_in] and two bmm's, so each present
            # adapter's weights are read once and the op count does not grow with the number of adapters. A per-run
            # loop costs 2 matmuls per run per layer in dispatch; a per-row gather copies a weight slice per row;
            # multiplying by every adapter and masking costs N times the LoRA FLOPs.
            gather, scatter, adapters, g, m = self.ctx.grouped(lA.shape[0])
            b, d_in = xf.shape[0], xf.shape[-1]
            x2 = torch.cat([xf.reshape(b, d_in), xf.new_zeros(1, d_in)])
            a = lA if adapters is None else lA.index_select(0, adapters)
            bw = lB if adapters is None else lB.index_select(0, adapters)
            if g == 0:  # every row is a base row
                delta = xf.new_zeros(b, 1, lB.shape[1])
            else:
                h = torch.bmm(x2.index_select(0, gather).view(g, m, d_in), a.transpose(1, 2))
                o = torch.bmm(h, bw.transpose(1, 2)).reshape(g * m, -1)
                delta = torch.cat([o, o.new_zeros(1, o.shape[1])]).index_select(0, scatter).view(b, 1, -1)
        elif self.ctx.equal_runs and torch.is_grad_enabled():
            # Training, every run the same number of rows (the trainer's compute-matched micro-batches usually are):
            # the sorted rows are already an [G, L * t, d_in] view, so two bmm's serve every adapter at once,
            # forward and backward, with no copy of the activations. (Generation keeps the per-run matmuls below.)
            g = len(self.ctx.runs)
            xv = xf.reshape(g, -1, xf.shape[-1])
            run_ids = self.ctx.run_adapters(lA.shape[0])
            a = lA if run_ids is None else lA.index_select(0, run_ids)
            bw = lB if run_ids is None else lB.index_select(0, run_ids)
            delta = torch.bmm(torch.bmm(xv, a.transpose(1, 2)), bw.transpose(1, 2)).reshape(shape[0], xf.shape[1], -1)
        elif len(self.ctx.runs) * 2 <= shape[0]:
            # Rows grouped by adapter (the engine sorts them so): one matmul per run reads each adapter's weights
            # once, where a per-row gather copies them once per row; in decode, where every step is memory-bound,
            # that copy cost more than the LoRA math. unbind (views) keeps the backward to one stacked gradient per
            # parameter instead of a full-size gradient per run.
            a_all, b_all = lA.unbind(0), lB.unbind(0)
            # split (not xf[s:e] per run): its backward is one cat of the run gradients, where each slice's
            # backward would write a zero-filled full-size gradient for every run.
            parts = xf.split([e - s for s, e, _ in self.ctx.runs])
            pieces = []
            for (s, e, i), xr in zip(self.ctx.runs, parts):
                if i < 0:
                    pieces.append(xf.new_zeros(e - s, xf.shape[1], lB.shape[1]))
                else:
                    pieces.append((xr @ a_all[i].T) @ b_all[i].T)
            delta = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
        else:
            idx = ids.clamp(min=0)
            a = lA.index_select(0, idx)  # [b, r, d_in]
            b = lB.index_select(0, idx)  # [b, d_out, r]
            delta = torch.bmm(torch.bmm(xf, a.transpose(1, 2)), b.transpose(1, 2))
            if self.ctx.has_base_rows:
                delta = delta * (ids >= 0).to(delta.dtype)[:, None, None]
        return y + (self.scaling * delta).to(y.dtype).reshape(*shape[:-1], -1)


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
