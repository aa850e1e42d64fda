"""Mutations M1-M5 (docs/METHOD.md, Operators): one parent in, one child out, same rank/shapes/dtype.

Every function has the operator signature ``fn(parents, *, generator, scaling, fitness=None, log=None, **params)``;
``log`` (a dict, optional) receives the values drawn or derived during the call, for lineage records. ``scaling`` is
accepted for the common contract and unused: the dW-space operators edit ``B A = dW / scaling`` and the child keeps
the parent's scaling (see :mod:`lorapop.evolve.svd`).
"""

from __future__ import annotations

import math

import torch

from lorapop.evolve._common import Adapter, dtype_of, gaussian_perturb, in_order, rand, randn, shape_groups
from lorapop.evolve.svd import modules_svd, null_mask, rebuild, trainable_scales


def _single(parents, name: str) -> Adapter:
    if len(parents) != 1:
        raise ValueError(f"mutation '{name}' takes exactly 1 parent, got {len(parents)}")
    return parents[0]


def _skew(M: torch.Tensor) -> torch.Tensor:
    return (M - M.mT) / 2


def svd_structured(parents, *, generator, scaling=None, fitness=None, log=None, eps: float = 0.1) -> Adapter:
    """M1 (acts on dW): ``S' = S exp(eps z)``, ``U' = U (I + eps skew(M_U))``, ``V' = V (I + eps skew(M_V))``.

    z, M_U, M_V standard normal, drawn per module. The rotation is the spec's first-order one (not exactly
    orthogonal; it also nudges the scale a little, O(eps^2)); it is applied to the r x r SVD factors before the
    single big matmul per factor. Components with zero singular value (a rank-deficient dW) keep a zero B column and
    a non-zero A row (see :func:`~lorapop.evolve.svd.trainable_scales`). A module whose dW is exactly zero (PEFT
    init: B = 0) has nothing to scale or rotate: its factors are copied unchanged (log: ``zero_dW_modules``), so a
    fresh adapter's M1 child equals the parent; use M2/M4 to move such an adapter.
    """
    p = _single(parents, "svd_structured")
    dtype = dtype_of(p)
    child: Adapter = {}
    zero_modules = 0
    for names in shape_groups(p):
        As, Bs = [p[n][0] for n in names], [p[n][1] for n in names]
        d = modules_svd(As, Bs)
        n, m = d.S.shape
        dev = d.S.device
        z = randn((n, m), generator, dev)
        eye = torch.eye(m, device=dev)
        U = d.U @ (eye + eps * _skew(randn((n, m, m), generator, dev)))
        # V' = V R_V  <=>  Vh' = R_V^T Vh
        Vh = (eye + eps * _skew(randn((n, m, m), generator, dev))).mT @ d.Vh
        dead = null_mask(d.S)
        s_b, s_a = trainable_scales(d.S * torch.exp(eps * z), dead, d.a_rms)
        zero = dead.all(dim=-1).tolist()
        zero_modules += sum(zero)
        _emit(child, names, rebuild(d, s_b, s_a, As[0].shape[0], U=U, Vh=Vh), zero, p, dtype)
    if log is not None:
        log["zero_dW_modules"] = zero_modules
    return in_order(child, p)


def _emit(child: Adapter, names, factors, zero, parent: Adapter, dtype) -> None:
    """Store rebuilt factors; modules whose dW is exactly 0 get the parent's factors copied instead."""
    for name, (A, B), z in zip(names, factors, zero):
        child[name] = (parent[name][0].clone(), parent[name][1].clone()) if z else (A.to(dtype), B.to(dtype))


def layer_selective_gaussian(parents, *, generator, scaling=None, fitness=None, log=None, eps: float = 0.1,
                             fraction: float = 1 / 3) -> Adapter:
    """M2 (acts on factors): ``F + eps * std(F) * N(0, 1)`` on both factors of a random ``fraction`` of modules.

    ``max(1, round(fraction * n_modules))`` modules are chosen uniformly without replacement; the others are copied.
    std is each factor's own std over all its elements; when it is 0 (B of a fresh adapter) the noise scale falls
    back to ``1/sqrt(last dim)`` so B, and therefore dW, really change.
    """
    p = _single(parents, "layer_selective_gaussian")
    if not 0 <= fraction <= 1:
        raise ValueError(f"layer_selective_gaussian: fraction must be in [0, 1], got {fraction}")
    names = list(p)
    k = max(1, round(fraction * len(names)))
    chosen = set(torch.randperm(len(names), generator=generator, device=generator.device)[:k].tolist())
    child: Adapter = {}
    for i, n in enumerate(names):
        A, B = p[n]
        if i in chosen:
            child[n] = (gaussian_perturb(A, eps, generator), gaussian_perturb(B, eps, generator))
        else:
            child[n] = (A.clone(), B.clone())
    if log is not None:
        log["n_mutated"] = k
        log["mutated"] = sorted(chosen)
    return child


def full_gaussian(parents, *, generator, scaling=None, fitness=None, log=None, eps: float = 0.15) -> Adapter:
    """M4 (acts on factors): M2's Gaussian noise on every module (same std and B = 0 fallback)."""
    p = _single(parents, "full_gaussian")
    return {n: (gaussian_perturb(A, eps, generator), gaussian_perturb(B, eps, generator)) for n, (A, B) in p.items()}


def neftune_style(parents, *, generator, scaling=None, fitness=None, log=None, alpha_n: float = 10.0) -> Adapter:
    """M5 (acts on factors): ``A + U(-b, b)`` with ``b = alpha_n / sqrt(d_in r)``; B is copied.

    Noise on the input-side factor only. With B = 0 (fresh adapter) A changes but dW stays 0, by construction.
    """
    p = _single(parents, "neftune_style")
    child: Adapter = {}
    for n, (A, B) in p.items():
        r, d_in = A.shape
        bound = alpha_n / math.sqrt(d_in * r)
        noise = torch.empty(A.shape, dtype=torch.float32, device=generator.device).uniform_(-bound, bound,
                                                                                             generator=generator)
        noise = noise.to(A.device).add_(A)
        child[n] = (noise.to(A.dtype), B.clone())
    return child


def component_masking(parents, *, generator, scaling=None, fitness=None, log=None, fraction: float = 0.3
                      ) -> Adapter:
    """M3 (acts on dW): zero ``ceil(fraction * r)`` random singular components of each module's dW.

    ``ceil`` as in the reference implementation (lucidrains/populora): at the default 0.3, r = 8 masks 3 and r = 16
    masks 5. The product is rounded to 1e-9 first, so 0.3 x 10 masks 3, not the 4 that float arithmetic's
    3.0000000000000004 would give.

    Components are drawn per module, uniformly among the r. A masked component keeps its A row (``sqrt(S) v^T``)
    and gets a zero B column: its contribution to dW is exactly 0 as the spec asks, but it stays trainable (zeroing
    both would freeze it for good, see :func:`~lorapop.evolve.svd.trainable_scales`). Kept components are rebuilt
    balanced, so with ``fraction = 0`` dW is preserved (factors re-balanced). A module with dW exactly 0 is copied
    unchanged (there is nothing to mask; log: ``zero_dW_modules``).
    """
    p = _single(parents, "component_masking")
    if not 0 <= fraction <= 1:
        raise ValueError(f"component_masking: fraction must be in [0, 1], got {fraction}")
    dtype = dtype_of(p)
    child: Adapter = {}
    zero_modules = 0
    n_drop = 0
    for names in shape_groups(p):
        As, Bs = [p[n][0] for n in names], [p[n][1] for n in names]
        d = modules_svd(As, Bs)
        n, m = d.S.shape
        n_drop = min(m, math.ceil(fraction * m - 1e-9))
        # Random subset per module: rank of uniform keys < n_drop  <=>  among the n_drop smallest keys.
        keys = rand((n, m), generator, d.S.device)
        masked = keys.argsort(dim=-1).argsort(dim=-1) < n_drop
        null = null_mask(d.S)
        sqrt_s = torch.where(null, torch.zeros_like(d.S), d.S.sqrt())
        s_b, s_a = trainable_scales(torch.where(masked, torch.zeros_like(d.S), d.S), masked | null, d.a_rms,
                                    s_a_dead=sqrt_s)
        zero = null.all(dim=-1).tolist()
        zero_modules += sum(zero)
        _emit(child, names, rebuild(d, s_b, s_a, As[0].shape[0]), zero, p, dtype)
    if log is not None:
        log["n_masked_per_module"] = n_drop
        log["zero_dW_modules"] = zero_modules
    return in_order(child, p)
