"""Tolerances for comparing two float computations of the same value that may add their terms in a different order.

Two code paths that compute the same sum (a grouped matmul vs index_select + bmm, a chunked vs a whole prefill,
the engine vs Hugging Face) round differently wherever the order of additions differs: GEMM libraries pick their
blocking, FMA use and kernel by processor (MKL's SGEMM on AVX2 vs AVX-512, oneDNN's bf16 matmul on AVX-512 vs AMX).
A fixed ``atol=1e-5`` passes on the processor it was tuned on and fails on the next one, so the tolerance is derived
instead from the dtype and the number of terms summed.

Derivation (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed.: §3.1 for the bound, §2.8 for the
statistical rule): a sum of ``k`` terms, in any order, is within about ``k·u·S`` of the exact sum in the worst case and
``sqrt(k)·u·S`` typically, where ``u = eps/2`` is the unit roundoff and ``S`` bounds the magnitude of the terms. Two
orders differ by at most the sum of their errors, ``≈ sqrt(k)·eps·S`` typically. For a stack of layers, ``k`` is the
total reduction length along the path (the first-order errors of successive reductions add) and ``S`` the magnitude
of the compared values. ``SAFETY`` covers the tail of that rule and the amplification by the nonlinear layers
between reductions (a LayerNorm divides by its input's std); it was set from a measurement, not guessed: the largest
ratio |difference| / (eps·sqrt(k)·S) seen for the tiny two-MLP model of test_engine_lora over 300 seeds, under MKL's
AVX2 and AVX-512 SGEMM kernels (k = 84), is 9.2, and SAFETY = 16 is above it. For ``k < SAFETY**2 = 256`` the
tolerance is above the proven worst-case bound ``k·eps·S``; for longer reductions it stays SAFETY times the typical
error.

Identities through the real model run in float64. Through 30 layers, float32's rounding is amplified by
the nonlinear layers past what SAFETY was measured on: the mixed-batch-vs-alone gradient difference on the embedded
model reached 1.08x its float32 tolerance on an AVX2-only EPYC (2.89e-5 against 2.68e-5) while passing on AVX-512
and AMX Xeons, a tolerance fitted to the processor it was written on. So where the claim is algebra (a row's
gradient does not depend on its batch partners, micro-batching, replicas vs one engine) the engine runs with
``engine.dtype: float64`` (LoRA master weights, log-probs, optimizer and RMSNorm in float64 too) and the tolerance
is ``sum_tol(torch.float64, k)``: about 1e-12 of the scale for the real model's k, where a bug is O(1). float32
tolerances remain where float32 itself is the claim (the engine against Hugging Face or PEFT, bf16 against float32,
the operators, which compute in float32 by design).
"""

from __future__ import annotations

import math

import torch

SAFETY = 16.0


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def sum_tol(dtype: torch.dtype, k: int, scale: float = 1.0) -> float:
    """Absolute tolerance between two orders of summing ``k`` terms of magnitude ``scale`` in ``dtype``."""
    return SAFETY * eps(dtype) * math.sqrt(k) * scale


def assert_close_sums(actual: torch.Tensor, expected: torch.Tensor, k: int, scale: float | None = None,
                      dtype: torch.dtype | None = None) -> None:
    """``torch.testing.assert_close`` with the tolerance of :func:`sum_tol` (absolute only: a summation error scales
    with the terms, not with the result, so small results get no tighter bound). ``scale`` defaults to the largest
    magnitude of ``expected`` (at least 1); ``dtype`` to the dtype the values were computed in."""
    if scale is None:
        scale = max(1.0, float(expected.detach().abs().max()))
    atol = sum_tol(dtype or expected.dtype, k, scale)
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=atol)
