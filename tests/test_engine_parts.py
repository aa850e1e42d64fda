"""The engine's parts without the engine: the run's KV cache (kvcache.KVCacheKeeper), the update's loss and
statistics (update.py) and the adapter slots (slots.AdapterSlots), each on the smallest base it needs."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from torch import nn

from floattol import assert_close_sums
from lorapop.engine.base import EngineConfig, TrainSample
from lorapop.engine.kvcache import KVCacheKeeper
from lorapop.engine.lora import inject_lora
from lorapop.engine.optim import StackedAdamW
from lorapop.engine.slots import AdapterSlots
from lorapop.engine import update
from test_engine_helpers import K_TINY_GRAD, tiny_llama


# ------------------------------------------------------------------ the KV cache alone
def test_the_keeper_sizes_one_cache_for_the_run_and_refuses_longer_rows():
    cfg = EngineConfig(device="cpu", gen_batch_size=2, max_model_len=40)
    keeper = KVCacheKeeper(cfg, torch.device("cpu"))
    dims = (2, 1, 4)  # layers, KV heads, head dim
    first = keeper.get(dims, torch.float32)
    assert keeper.allocations == 1 and first.n_slots == 2 and first.max_len == 256  # 40 rounded up
    assert keeper.get(dims, torch.float32) is first and keeper.allocations == 1  # every call: the same cache
    assert keeper.plan.kind == "paged" and keeper.plan.n_pages == 2 * 256 // 16
    keeper.release()
    assert keeper.cache is None
    again = keeper.get(dims, torch.float32)  # allocated again (a bench's release), at the run's shape
    assert (again.n_slots, again.max_len, again.n_pages) == (first.n_slots, first.max_len, first.n_pages)
    assert keeper.per_call()  # eager on CPU: the pages go back to the OS after each call
    keeper.drop_pages()  # the pages back to the OS (all zeros again), or where it cannot, the cache released
    assert keeper.cache is None or all(int(t.abs().sum()) == 0 for t in keeper.cache.k + keeper.cache.v)

    capped = KVCacheKeeper(EngineConfig(device="cpu", max_model_len=50), torch.device("cpu"))
    capped.check_model_len([[1] * 30], 20, None)
    with pytest.raises(ValueError, match="max_model_len=50"):
        capped.check_model_len([[1] * 30], 21, None)
    capped.check_model_len([[1] * 30], 21, [20])  # a row's own cap keeps it inside


# ------------------------------------------------------------------ the update alone
def test_importance_weights_cap_and_skip_rows_without_sampler_logprobs():
    mb = [TrainSample([1], [2, 3], 0, 1.0, sampler_logprobs=[-1.0, -1.0]), TrainSample([1], [4], 0, 1.0)]
    row_t = torch.tensor([0, 0, 1])
    logp = torch.tensor([-0.5, -3.0, -2.0], dtype=torch.float64)
    sampler = update.sampler_logprobs(mb, logp)
    assert sampler.tolist() == [-1.0, -1.0, 0.0]
    ratio, w = update.is_weights(mb, row_t, logp, sampler, cap=1.5)
    assert ratio[:2].tolist() == pytest.approx([math.exp(0.5), math.exp(-2.0)])
    assert w.tolist() == pytest.approx([1.5, math.exp(-2.0), 1.0])  # capped, kept, no sampler: 1
    assert update.is_weights(mb, row_t, logp, sampler, cap=0.0)[1].tolist() == [1.0, 1.0, 1.0]  # off


def _lora_llama(n_adapters: int):
    model, tok = tiny_llama(0)
    model.requires_grad_(False)
    ctx, layers = inject_lora(model, n_adapters, 4, 8, ["q_proj", "v_proj"])
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in layers.values():  # injected as zeros: random A and B, so both get a gradient
            layer.lora_A.copy_(torch.randn(layer.lora_A.shape, generator=g) * 0.5)
            layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=g) * 0.5)
    return model, tok, ctx, layers


def test_the_loss_is_micro_batch_invariant_and_touches_only_the_adapters_it_trains():
    model, tok, ctx, layers = _lora_llama(3)
    params = [p for layer in layers.values() for p in (layer.lora_A, layer.lora_B)]
    g = torch.Generator().manual_seed(1)
    samples = [TrainSample(torch.randint(3, 200, (5 + k,), generator=g).tolist(),
                           torch.randint(3, 200, (3 + k % 4,), generator=g).tolist(), k % 2, (-1.0) ** k * (k + 1))
               for k in range(6)]  # adapters 0 and 1 only

    def grads(micro_batch: int):
        cfg = EngineConfig(device="cpu", train_micro_batch_size=micro_batch)
        for p in params:
            p.grad = None
        score = partial(update.response_logprobs, model, ctx, cfg, tok.pad_token_id)
        stats = update.accumulate(score, cfg, samples, None, partial(update.checkpointing, model, cfg, ctx))
        return stats, [p.grad.clone() for p in params]

    stats, whole = grads(8)
    assert sorted(stats) == [0, 1]
    assert [stats[a]["n_samples"] for a in (0, 1)] == [3, 3]
    assert stats[0]["n_tokens"] == sum(len(s.completion_ids) for s in samples if s.adapter_id == 0)
    assert all(math.isfinite(stats[a]["loss"]) and stats[a]["is_ratio_mean"] == 1.0 for a in (0, 1))
    for grad in whole:
        assert grad[2].abs().sum() == 0  # adapter 2 trained on nothing: no gradient reaches its slot
        assert grad[0].abs().sum() > 0 and grad[1].abs().sum() > 0
    _, split = grads(1)
    for a, b in zip(split, whole):
        assert_close_sums(a, b, K_TINY_GRAD)


# ------------------------------------------------------------------ the adapter slots alone
class _TwoLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.v_proj = nn.Linear(8, 6), nn.Linear(6, 4)

    def forward(self, x):
        return self.v_proj(self.q_proj(x))


def _slots(n: int = 2) -> tuple[AdapterSlots, nn.Module, object]:
    torch.manual_seed(0)
    model = _TwoLinear().requires_grad_(False)
    cfg = EngineConfig(device="cpu", rank=4, lora_alpha=8, target_modules=("q_proj", "v_proj"))
    ctx, layers = inject_lora(model, n, cfg.rank, cfg.lora_alpha, list(cfg.target_modules))
    opt = StackedAdamW([p for l in layers.values() for p in (l.lora_A, l.lora_B)], n, lr=1e-2)
    return AdapterSlots(layers, n, cfg, torch.device("cpu"), opt), model, ctx


def test_a_reset_slot_is_the_base_and_weights_survive_peft_files_and_the_checkpoint(tmp_path):
    slots, model, ctx = _slots()
    x = torch.randn(3, 8)
    base = model(x)
    slots.reset(0, seed=7)
    g = torch.Generator().manual_seed(3)
    slots.set(1, {n: (torch.randn(a.shape, generator=g), torch.randn(b.shape, generator=g))
                  for n, (a, b) in slots.get(1).items()})
    ctx.set(torch.tensor([0, 0, 0]))
    assert torch.equal(model(x), base)  # B = 0: exactly the base
    ctx.set(torch.tensor([1, 1, 1]))
    assert not torch.allclose(model(x), base)
    ctx.set(None)

    slots.save(1, tmp_path / "one")
    slots.load(0, tmp_path / "one")
    assert all(torch.equal(a0, a1) and torch.equal(b0, b1)
               for (a0, b0), (a1, b1) in zip(slots.get(0).values(), slots.get(1).values()))

    state = slots.state_dict()
    slots.reset(0, seed=1)
    slots.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(slots.get(0)["q_proj"], slots.get(1)["q_proj"]))
    with pytest.raises(KeyError, match="lacks 1"):
        slots.set(0, {"q_proj": slots.get(0)["q_proj"]})
    with pytest.raises(ValueError, match="holds 2 adapters"):
        _slots(3)[0].load_state_dict(state)
