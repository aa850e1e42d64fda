"""AdamW over stacked adapter tensors, one independent optimizer per slot (dim 0 of every parameter).

Why not torch.optim.AdamW: its step counter and moments are per tensor, so slots would share bias correction and
resetting one member (PBT replacement) would mean surgery on its state. Here the step counter, the learning rate and
the gradient clip are per slot, a step touches only the slots named, and resetting a slot is zeroing a row."""

from __future__ import annotations

import torch


class StackedAdamW:
    def __init__(self, params: list[torch.nn.Parameter], n_slots: int, *, lr: float, betas=(0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, max_grad_norm: float = 1.0) -> None:
        self.params = list(params)
        for p in self.params:
            if p.shape[0] != n_slots:
                raise ValueError(f"parameter of shape {tuple(p.shape)} is not stacked over {n_slots} slots")
        self.n_slots = n_slots
        dev = self.params[0].device
        self.lr = torch.full((n_slots,), float(lr), dtype=torch.float64)
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = float(eps)
        self.weight_decay = float(weight_decay)
        self.max_grad_norm = float(max_grad_norm)
        self.step_count = torch.zeros(n_slots, dtype=torch.long)
        self.exp_avg = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self._device = dev

    def zero_grad(self) -> None:
        """Zero the gradients in place where they are allocated (the engine keeps them for the run: resident, as
        its memory plan counts them), else leave them unset."""
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def grad_norms(self) -> torch.Tensor:
        """Per-slot L2 norm of the gradient over all parameters, shape [n_slots] (in the parameters' dtype, float32
        or a float64 reference's, on the params' device)."""
        sq = torch.zeros(self.n_slots, device=self._device, dtype=self.params[0].dtype)
        for p in self.params:
            if p.grad is not None:
                sq += p.grad.to(sq.dtype).pow(2).flatten(1).sum(1)
        return sq.sqrt()

    @torch.no_grad()
    def step(self, slots: list[int]) -> dict[int, float]:
        """Clip each slot's gradient to max_grad_norm, then take one AdamW step on those slots only.
        Returns the pre-clip gradient norm per slot."""
        if not slots:
            return {}
        norms = self.grad_norms()
        idx = torch.tensor(sorted(set(slots)), dtype=torch.long, device=self._device)
        idx_cpu = idx.cpu()
        self.step_count[idx_cpu] += 1
        b1, b2 = self.betas
        steps = self.step_count[idx_cpu].double()
        lr = self.lr[idx_cpu]
        bc1 = 1 - b1 ** steps
        bc2 = 1 - b2 ** steps
        step_size = (lr / bc1).float().to(self._device)[:, None, None]
        bc2_sqrt = bc2.sqrt().float().to(self._device)[:, None, None]
        decay = (1 - lr * self.weight_decay).float().to(self._device)[:, None, None]
        sel_norms = norms.index_select(0, idx)
        if self.max_grad_norm > 0:
            clip = (self.max_grad_norm / (sel_norms + 1e-6)).clamp(max=1.0)[:, None, None]
        else:
            clip = torch.ones_like(sel_norms)[:, None, None]
        for p, m_all, v_all in zip(self.params, self.exp_avg, self.exp_avg_sq):
            if p.grad is None:
                continue
            g = p.grad.index_select(0, idx).to(p.dtype) * clip  # the float32 scalars above promote to p's dtype
            m = m_all.index_select(0, idx).mul_(b1).add_(g, alpha=1 - b1)
            v = v_all.index_select(0, idx).mul_(b2).addcmul_(g, g, value=1 - b2)
            w = p.index_select(0, idx).mul_(decay)
            w.addcdiv_(m * step_size, v.sqrt().div_(bc2_sqrt).add_(self.eps), value=-1.0)
            p.index_copy_(0, idx, w)
            m_all.index_copy_(0, idx, m)
            v_all.index_copy_(0, idx, v)
        return {int(i): float(n) for i, n in zip(idx_cpu.tolist(), sel_norms.tolist())}

    @torch.no_grad()
    def reset_slot(self, i: int) -> None:
        for m, v in zip(self.exp_avg, self.exp_avg_sq):
            m[i].zero_()
            v[i].zero_()
        self.step_count[i] = 0

    @torch.no_grad()
    def copy_slot(self, src: int, dst: int) -> None:
        for m, v in zip(self.exp_avg, self.exp_avg_sq):
            m[dst].copy_(m[src])
            v[dst].copy_(v[src])
        self.step_count[dst] = self.step_count[src]
        self.lr[dst] = self.lr[src]

    def state_dict(self) -> dict:
        return {
            "exp_avg": [m.detach().cpu().clone() for m in self.exp_avg],
            "exp_avg_sq": [v.detach().cpu().clone() for v in self.exp_avg_sq],
            "step": self.step_count.clone(),
            "lr": self.lr.clone(),
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        if len(state["exp_avg"]) != len(self.params):
            raise ValueError(f"optimizer state has {len(state['exp_avg'])} tensors, engine has {len(self.params)}")
        for dst, src in zip(self.exp_avg + self.exp_avg_sq, list(state["exp_avg"]) + list(state["exp_avg_sq"])):
            if dst.shape != src.shape:
                raise ValueError(f"optimizer state shape {tuple(src.shape)} does not match {tuple(dst.shape)}")
            dst.copy_(src)
        self.step_count.copy_(state["step"])
        self.lr.copy_(state["lr"])
