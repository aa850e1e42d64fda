"""LoRA compute dtype: bf16 matmuls over float32 master weights, float32 gradients."""

from __future__ import annotations

import copy

import pytest
import torch

from test_engine_helpers import tiny_engine
from lorapop.engine import EngineConfig, TorchEngine, TrainSample
from lorapop.engine.dtype import resolve_lora_compute_dtype


def test_auto_follows_the_base_dtype():
    assert resolve_lora_compute_dtype("auto", "bfloat16") == "bfloat16"
    assert resolve_lora_compute_dtype("auto", "float32") == "float32"  # e.g. CPU runs where engine.dtype picks fp32
    assert resolve_lora_compute_dtype("float32", "bfloat16") == "float32"
    with pytest.raises(ValueError, match="lora_compute_dtype"):
        resolve_lora_compute_dtype("fp8", "bfloat16")
    eng = tiny_engine(dtype="bfloat16")
    assert eng.cfg.lora_compute_dtype == "bfloat16"
    layer = next(iter(eng.layers.values()))
    assert layer.compute_dtype == torch.bfloat16 and layer.lora_A.dtype == torch.float32
    eng.optimizer.zero_grad()
    eng.accumulate_gradients([TrainSample([1, 5, 9], [4, 7, 8], 0, 1.0)])
    assert layer.lora_A.grad.dtype == torch.float32 and layer.lora_B.grad.abs().sum() > 0


@pytest.mark.slow
def test_bf16_lora_gradients_agree_with_float32(embedded_model):
    """One update's gradients on the embedded model, LoRA matmuls in bf16 vs float32 (a float32 base, so only the
    LoRA compute differs). Tolerance: bf16 keeps 8 significand bits (unit roundoff u = 2^-9). Each adapted
    projection rounds about seven values to bf16 on a gradient's path (the input, A, B, x A^T and the delta
    forward; the incoming gradient and the product backward), each a relative error <= u, and accumulation is in
    float32 (its error ~ n * 2^-24 over n <= 100 tokens is negligible), so the norm-wise relative error of a
    gradient stays below ~7u whatever the reduction length; 8u = 0.0156 allows that. Measured: ~1.7u overall,
    ~2.8u for the worst tensor."""
    model, tok = embedded_model
    eng = TorchEngine(copy.deepcopy(model), tok, 2, EngineConfig(dtype="float32", device="cpu",
                                                                 lora_compute_dtype="bfloat16",
                                                                 train_micro_batch_size=2), seed=0)
    g = torch.Generator().manual_seed(0)
    for i in range(2):  # non-zero B: A's gradient is non-zero too
        eng.set_adapter(i, {k: (a, torch.randn(b.shape, generator=g) * 0.01) for k, (a, b) in
                            eng.get_adapter(i).items()})
    gen = torch.Generator().manual_seed(1)
    samples = [TrainSample(eng.chat_prompt(f"Write a function number {k}."),
                           torch.randint(100, 40000, (16,), generator=gen).tolist(), k, 1.0 - 1.5 * k)
               for k in range(2)]
    grads = {}
    for dt in (torch.bfloat16, torch.float32):
        for layer in eng.layers.values():
            layer.compute_dtype = dt
        eng.optimizer.zero_grad()
        eng.accumulate_gradients(samples)
        grads[dt] = [p.grad.double().clone() for p in eng._params]
    assert all(g.dtype == torch.float32 for g in (p.grad for p in eng._params))
    u = 2.0 ** -9
    ref, low = (torch.cat([x.flatten() for x in grads[d]]) for d in (torch.float32, torch.bfloat16))
    assert ((low - ref).norm() / ref.norm()).item() < 8 * u
    for r, b in zip(grads[torch.float32], grads[torch.bfloat16]):
        assert ((b - r).norm() / r.norm()).item() < 8 * u
    assert ((low - ref).norm() / ref.norm()).item() > 0  # the bf16 path really ran
