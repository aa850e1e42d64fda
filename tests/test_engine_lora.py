"""Unit tests of the stacked multi-LoRA layer and the per-slot AdamW, on tiny nn.Linear bases (fast)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from floattol import assert_close_sums
from lorapop.engine.lora import LoRAContext, MultiLoRALinear, inject_lora, kaiming_uniform_A, remove_lora
from lorapop.engine.optim import StackedAdamW


class TinyMLP(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.up_proj = nn.Linear(d, 10, bias=True)
        self.down_proj = nn.Linear(10, d, bias=False)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return self.down_proj(torch.tanh(self.up_proj(self.norm(x))))


# Reduction lengths for assert_close_sums (tests/floattol.py). Per TinyMLP(d=6, hidden 10, rank 2) the longest path
# sums LayerNorm's 6, up_proj's 6 + LoRA 6 + 2, down_proj's 10 + LoRA 10 + 2 terms; the model stacks two.
K_UP = 6 + 6 + 2
K_FWD = 2 * (6 + K_UP + 10 + 10 + 2)
# A LoRA gradient runs the forward path, the backward path back through it, and sums over the batch's rows.
K_GRAD = 2 * K_FWD + 6 * 3


def _tiny(n_adapters=3, rank=2, seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(TinyMLP(), TinyMLP())
    ref = [torch.clone(p) for p in model.parameters()]
    ctx, layers = inject_lora(model, n_adapters, rank, 4.0, ["up_proj", "down_proj"])
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in layers.values():
            layer.lora_A.copy_(torch.randn(layer.lora_A.shape, generator=g))
            layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=g))
    return model, ctx, layers, ref


def test_base_rows_get_exactly_the_base_output_in_a_mixed_batch():
    model, ctx, layers, _ = _tiny()
    x = torch.randn(4, 5, 6)
    ctx.set(None)
    base = model(x)
    ctx.set(torch.tensor([-1, 0, 2, -1]))
    mixed = model(x)
    assert torch.equal(mixed[0], base[0]) and torch.equal(mixed[3], base[3])
    assert not torch.allclose(mixed[1], base[1])


def test_lora_delta_matches_the_formula_per_row():
    model, ctx, layers, _ = _tiny()
    layer = layers["0.up_proj"]
    x = torch.randn(3, 4, 6)
    ctx.set(torch.tensor([2, 0, 1]))
    y = layer(x)
    for row, a in enumerate([2, 0, 1]):
        want = layer.base(x[row]) + layer.scaling * x[row] @ layer.lora_A[a].T @ layer.lora_B[a].T
        assert_close_sums(y[row], want, K_UP)
    ctx.set(torch.tensor([1, 1, 1]))  # the single-adapter fast path computes the same thing
    assert_close_sums(layer(x)[2], layer.base(x[2]) + layer.scaling * x[2] @ layer.lora_A[1].T @ layer.lora_B[1].T,
                      K_UP)


def test_mixed_batch_gradient_equals_each_adapter_alone():
    model, ctx, layers, _ = _tiny()
    x = torch.randn(6, 3, 6)
    ids = [0, 2, 0, 1, 2, 2]
    target = torch.randn(6, 3, 6)

    def grads(rows, grouped=False):
        for layer in layers.values():
            layer.lora_A.grad = layer.lora_B.grad = None
        if grouped:  # rows sorted by adapter take the per-run matmul path
            rows = sorted(rows, key=lambda r: ids[r])
        ctx.set(torch.tensor([ids[r] for r in rows]))
        ((model(x[rows]) - target[rows]) ** 2).sum().backward()
        return {n: (l.lora_A.grad.clone(), l.lora_B.grad.clone()) for n, l in layers.items()}

    mixed = grads(list(range(6)))
    grouped = grads(list(range(6)), grouped=True)
    for n in layers:
        assert_close_sums(grouped[n][0], mixed[n][0], K_GRAD)
        assert_close_sums(grouped[n][1], mixed[n][1], K_GRAD)
    for a in range(3):
        alone = grads([r for r in range(6) if ids[r] == a])
        for n in layers:
            assert_close_sums(mixed[n][0][a], alone[n][0][a], K_GRAD)
            assert_close_sums(mixed[n][1][a], alone[n][1][a], K_GRAD)
            # and an adapter's rows never push gradient into another slot
            others = [b for b in range(3) if b != a]
            assert torch.count_nonzero(alone[n][0][others]) == 0


def test_bf16_base_keeps_fp32_lora_params_and_grads():
    torch.manual_seed(0)
    model = TinyMLP().to(torch.bfloat16)
    ctx, layers = inject_lora(model, 2, 2, 4.0, ["up_proj"])
    layer = layers["up_proj"]
    assert layer.lora_A.dtype == torch.float32 and layer.base.weight.dtype == torch.bfloat16
    with torch.no_grad():
        layer.lora_A.normal_()
        layer.lora_B.normal_()
    ctx.set(torch.tensor([1, 0]))
    out = model(torch.randn(2, 3, 6, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert layer.lora_B.grad.dtype == torch.float32 and layer.lora_B.grad[1].abs().sum() > 0


def test_unknown_target_module_is_named_in_the_error():
    with pytest.raises(ValueError, match=r"unknown LoRA target module 'q_prj'.*down_proj"):
        inject_lora(TinyMLP(), 2, 2, 4.0, ["up_proj", "q_prj"])
    with pytest.raises(ValueError, match="target_modules is empty"):
        inject_lora(TinyMLP(), 2, 2, 4.0, [])


def test_remove_lora_restores_the_original_linears():
    model, ctx, layers, ref = _tiny()
    remove_lora(model)
    assert not any(isinstance(m, MultiLoRALinear) for m in model.modules())
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref))
    inject_lora(model, 1, 2, 4.0, ["up_proj"])  # and it can be wrapped again


def test_kaiming_init_is_peft_like_and_seeded():
    a = kaiming_uniform_A(16, 576, torch.Generator().manual_seed(3))
    b = kaiming_uniform_A(16, 576, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    bound = 1 / math.sqrt(576)  # kaiming_uniform(a=sqrt(5)) on fan_in 576
    assert a.abs().max() <= bound and a.abs().max() > 0.95 * bound


# ---------------------------------------------------------------- StackedAdamW


def _params(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(n, 4, 5, generator=g)), nn.Parameter(torch.randn(n, 2, 4, generator=g))]


def _set_grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


@pytest.mark.parametrize("max_norm", [0.0, 0.5])
def test_stacked_adamw_matches_torch_adamw_per_slot(max_norm):
    params = _params()
    opt = StackedAdamW(params, 3, lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1, max_grad_norm=max_norm)
    ref = [nn.Parameter(p[1].detach().clone()) for p in params]
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    before0 = [p[0].detach().clone() for p in params]
    for it in range(3):
        _set_grads(params, it)
        for r, p in zip(ref, params):
            r.grad = p.grad[1].clone()
        if max_norm > 0:
            torch.nn.utils.clip_grad_norm_(ref, max_norm)
        norms = opt.step([1, 2] if it != 1 else [1])
        ref_opt.step()
        assert set(norms) == ({1, 2} if it != 1 else {1})
    for r, p in zip(ref, params):
        # elementwise updates, except the clipping norm: a sum over the slot's 4*5 + 2*4 gradient entries
        assert_close_sums(p[1], r, 4 * 5 + 2 * 4)
    assert all(torch.equal(p[0], b) for p, b in zip(params, before0))  # never named: untouched
    assert opt.step_count.tolist() == [0, 3, 2]


def test_adamw_reset_slot_and_per_slot_lr():
    params = _params()
    opt = StackedAdamW(params, 3, lr=1e-2, max_grad_norm=0)
    _set_grads(params, 0)
    opt.step([0, 1, 2])
    opt.reset_slot(1)
    assert opt.step_count.tolist() == [1, 0, 1]
    assert all(torch.count_nonzero(m[1]) == 0 for m in opt.exp_avg + opt.exp_avg_sq)
    assert all(torch.count_nonzero(m[0]) > 0 for m in opt.exp_avg)
    # first Adam step moves every weight by ~lr: lr 0 on slot 2 freezes it
    opt.lr[2] = 0.0
    before = [p.detach().clone() for p in params]
    _set_grads(params, 1)
    opt.step([1, 2])
    assert all(torch.equal(p[2], b[2]) for p, b in zip(params, before))
    moved = (params[0][1] - before[0][1]).abs()
    # not a rounding comparison: a first step moves by lr * |g| / (|g| + eps) (+ decay), ~lr to 1e-3 for these grads
    torch.testing.assert_close(moved, torch.full_like(moved, 1e-2), rtol=1e-3, atol=1e-6)


def test_adamw_state_dict_roundtrip():
    params = _params()
    opt = StackedAdamW(params, 3, lr=1e-3)
    _set_grads(params, 0)
    opt.step([0, 2])
    state = opt.state_dict()
    opt2 = StackedAdamW(_params(seed=1), 3, lr=5.0)
    opt2.load_state_dict(state)
    assert opt2.step_count.tolist() == [1, 0, 1] and float(opt2.lr[0]) == 1e-3
    assert all(torch.equal(a, b) for a, b in zip(opt2.exp_avg_sq, opt.exp_avg_sq))


def test_lora_context_detects_uniform_batches():
    ctx = LoRAContext()
    ctx.set(torch.tensor([2, 2]))
    assert ctx.uniform == 2 and not ctx.has_base_rows
    ctx.set(torch.tensor([-1, -1]))
    assert ctx.uniform is None and ctx.has_base_rows


def test_grouped_runs_path_equals_gather_path_and_keeps_base_rows_exact():
    model, ctx, layers, _ = _tiny()
    x = torch.randn(6, 3, 6)
    ids = torch.tensor([-1, 0, 0, 2, 2, 2])
    ctx.set(ids)
    assert ctx.runs == [(0, 1, -1), (1, 3, 0), (3, 6, 2)]
    grouped = model(x)  # one matmul per run of equal ids
    ctx.runs = ctx.runs * 2  # too many runs to be worth it: falls back to index_select + bmm
    with torch.no_grad():
        gathered = model(x)
        ctx.set(None)
        base = model(x)
    # the two paths sum the LoRA products in different orders (MKL picks bmm and mm kernels per processor)
    assert_close_sums(grouped.detach(), gathered, K_FWD)
    assert torch.equal(grouped[0].detach(), base[0])  # a base row never enters a LoRA sum: exact


@pytest.mark.parametrize("ids", [[0, 0, 1, 1, 2, 2], [2, 2, 0, 0], [1, 0, 2]])
def test_equal_runs_bmm_path_gradient_equals_each_adapter_alone(ids):
    # Equal-length runs of sorted rows (all adapters, a subset in any order, one row each) take the [G, L*t, d]
    # bmm path under autograd; each adapter's gradient must still be exactly what its rows give alone.
    model, ctx, layers, _ = _tiny()
    model.double()  # float64, so the comparison below is about the path and not float32 summation order
    x = torch.randn(len(ids), 3, 6, dtype=torch.float64)
    target = torch.randn(len(ids), 3, 6, dtype=torch.float64)

    def grads(rows):
        for layer in layers.values():
            layer.lora_A.grad = layer.lora_B.grad = None
        ctx.set(torch.tensor([ids[r] for r in rows]))
        out = model(x[rows])
        ((out - target[rows]) ** 2).sum().backward()
        return out.detach(), {n: (l.lora_A.grad.clone(), l.lora_B.grad.clone()) for n, l in layers.items()}

    out, mixed = grads(list(range(len(ids))))
    assert ctx.equal_runs
    for a in set(ids):
        rows = [r for r in range(len(ids)) if ids[r] == a]
        out_a, alone = grads(rows)
        assert_close_sums(out[rows], out_a, K_FWD)
        for n in layers:
            assert_close_sums(mixed[n][0][a], alone[n][0][a], K_GRAD)
            assert_close_sums(mixed[n][1][a], alone[n][1][a], K_GRAD)
    for n in layers:  # a slot with no rows gets no gradient
        for a in set(range(3)) - set(ids):
            assert torch.count_nonzero(mixed[n][0][a]) == 0 and torch.count_nonzero(mixed[n][1][a]) == 0


def test_equal_runs_flag_needs_equal_lengths_and_no_base_rows():
    ctx = LoRAContext()
    ctx.set(torch.tensor([0, 0, 1, 1]))
    assert ctx.equal_runs and ctx.run_adapters(2) is None  # exactly slots 0..N-1: the stacked weights as they are
    ctx.set(torch.tensor([0, 0, 1, 1]))
    assert ctx.run_adapters(3).tolist() == [0, 1]
    ctx.set(torch.tensor([0, 0, 1]))
    assert not ctx.equal_runs
    ctx.set(torch.tensor([-1, -1, 1, 1]))
    assert not ctx.equal_runs
    ctx.set(torch.tensor([1, 1]))
    assert not ctx.equal_runs and ctx.uniform == 1
