"""Attention the fused CUDA kernels accept: each query group folded into the query length, so K/V
keep their KV heads, no ``enable_gqa``, and a mask the memory-efficient kernel takes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from test_engine_helpers import tiny_engine
from lorapop.engine import SamplingParams
from lorapop.engine.decode import attend

# Qwen2.5-Coder-7B's attention: 28 query heads, 4 KV heads, head_dim 128.
H, N_KV, D = 28, 4, 128


def _inputs(t: int, length: int, dtype, device="cpu"):
    g = torch.Generator().manual_seed(t * 1000 + length)
    q = torch.randn(2, H, t, D, generator=g).to(device, dtype)
    k = torch.randn(2, N_KV, length, D, generator=g).to(device, dtype)
    v = torch.randn(2, N_KV, length, D, generator=g).to(device, dtype)
    # Rows at different positions (continuous batching): row 0's queries end at length - 1, row 1's earlier.
    pos = torch.stack([torch.arange(length - t, length), torch.arange(length // 2 - t, length // 2)])
    allowed = torch.arange(length)[None, None, None, :] <= pos[:, None, :, None]
    return q, k, v, allowed.to(device)


@pytest.mark.parametrize("t", [1, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_folded_attention_equals_the_gqa_call_it_replaces(t, dtype):
    length = 40
    q, k, v, allowed = _inputs(t, length, dtype)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=D ** -0.5, enable_gqa=True)
    got = attend(q, k, v, allowed, D ** -0.5)
    # Both are softmax-weighted sums of at most `length` values of |v| <= ~4 (seeded randn): a different
    # reduction order moves each by at most ~length * eps(dtype) * max|v|; the output's own rounding is eps / 2.
    eps = torch.finfo(dtype).eps
    tol = length * eps * float(v.abs().max())
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=eps)


def test_the_engine_calls_attention_in_the_form_the_efficient_kernel_accepts(monkeypatch):
    """A CPU check of the CUDA property: every SDPA call of a prefill has as many query heads as KV heads (no enable_gqa, which the memory-efficient kernel rejects), 4-D inputs with a unit last
    stride, and a bool mask [b or 1, 1, q_len, kv_len] (the efficient kernel broadcasts it over heads)."""
    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        calls.append((q, k, v, attn_mask, kw))
        return sdpa(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    eng = tiny_engine()  # 4 query heads over 2 KV heads
    assert eng.decoder().n_heads != eng._dec.n_kv
    eng.generate([[1, 5, 9, 13, 17], [1, 7]], [0, -1], SamplingParams(max_new_tokens=3, greedy=True))
    # the prefill's calls carry a mask; the eager CPU decode step's (one a row, all of its positions) carry none
    prefill = [c for c in calls if c[3] is not None]
    assert prefill and all(q.shape[2] > 2 for q, *_ in prefill)
    assert all(q.shape[2] == eng.decoder().n_heads // eng._dec.n_kv for q, _, _, m, _ in calls if m is None)
    for q, k, v, mask, kw in calls:
        assert not kw.get("enable_gqa", False)
        assert q.dim() == k.dim() == v.dim() == 4 and q.shape[1] == k.shape[1] == v.shape[1] == eng._dec.n_kv
        assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
        if mask is None:
            continue
        assert mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1] == 1
        assert mask.shape[0] in (1, q.shape[0]) and mask.shape[2:] == (q.shape[2], k.shape[2])
        assert mask.stride(-1) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 64])
def test_fused_kernels_run_the_7b_attention_on_cuda(t):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v, allowed = _inputs(t, 384, torch.bfloat16, "cuda")
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=allowed, scale=D ** -0.5,
                                          enable_gqa=True)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):  # raises if neither accepts
        got = attend(q, k, v, allowed, D ** -0.5)
    # bf16 inputs against a float32 reference: rounding of q, k, v (eps / 2 each) dominates, times ~4 * max|v|.
    eps = torch.finfo(torch.bfloat16).eps
    torch.testing.assert_close(got.float(), want, atol=4 * eps * float(v.abs().max()), rtol=eps)
