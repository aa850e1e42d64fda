"""QR-route SVD of a LoRA product ``B @ A`` without ever forming the d_out x d_in matrix (docs/METHOD.md, Operators).

With ``B = Qb Rb`` and ``A^T = Qa Ra`` (reduced QR), ``B A = Qb (Rb Ra^T) Qa^T``; the SVD of the small
``Rb Ra^T = U S Vh`` gives ``B A = (Qb U) S (Qa Vh^T)^T``. The operators group the modules that share a shape (a 7B
adapter has four distinct shapes): thin QRs per module, the small r x r products and SVDs batched per group.

Always float32, whatever the storage dtype: the singular values of a low-rank product span several orders of
magnitude and a bf16 mantissa (8 bits) cannot resolve the small ones.

Note on ``scaling``: the engine's effective update is ``dW = scaling * B A``; every function here works on
``B A = dW / scaling``. Parents and child share one ``scaling`` (``alpha / r``, same alpha and r), so an operator that
edits ``B A`` and rebuilds factors from it gives a child whose effective ``dW`` is exactly the intended one; folding
the scaling into the factors would double-apply it once the engine multiplies again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from lorapop.evolve._common import Adapter, pmap, shape_groups

# A singular value at most this fraction of the module's largest counts as zero (float32 QR/SVD leaves ~1e-7
# relative noise on exactly-null directions; 1e-6 keeps a margin without touching real components).
NULL_RTOL = 1e-6


class ModulesSVD(NamedTuple):
    """QR-route SVDs of n modules of one shape: ``B_i A_i = Qb[i] @ U[i] @ diag(S[i]) @ Vh[i] @ Qa[i]^T``.

    The tall orthonormal factors stay per module (lists of (d_out, kb) and (d_in, ka) float32 tensors); the small
    ones are batched: U (n, kb, m), S (n, m) descending, Vh (n, m, ka), with kb = min(d_out, R), ka = min(d_in, R),
    m = min(kb, ka) for inner dimension R (the rank, or the total rank of concatenated factors). ``a_rms`` (n,) is
    the RMS row norm of each A (``||A||_F / sqrt(R)``, read off ``Ra`` for free; 1 where A is 0).
    """

    Qb: list[Tensor]
    U: Tensor
    S: Tensor
    Vh: Tensor
    Qa: list[Tensor]
    a_rms: Tensor


def modules_svd(As: Sequence[Tensor], Bs: Sequence[Tensor]) -> ModulesSVD:
    """QR-route SVD of ``B_i @ A_i`` for same-shape modules A_i: (R, d_in), B_i: (d_out, R).

    The thin QRs run per module: on CPU a batched ``torch.linalg.qr`` loops over the batch anyway and needs the
    factors stacked first (one more copy of the whole adapter), which measured 2x slower than per-module calls. The
    R x R products and SVDs, where batching does pay, are batched.
    """
    def one(ab):
        A, B = ab
        qb, rb = torch.linalg.qr(B.float())
        # A^T as a transposed view is already column-major for LAPACK
        qa, ra = torch.linalg.qr(A.float().mT)
        return qb, qa, rb @ ra.mT, torch.linalg.matrix_norm(ra)

    Qb, Qa, M, a_rms = (list(t) for t in zip(*pmap(one, list(zip(As, Bs)))))
    U, S, Vh = torch.linalg.svd(torch.stack(M), full_matrices=False)
    a = torch.stack(a_rms) / math.sqrt(As[0].shape[-2])
    return ModulesSVD(Qb, U, S, Vh, Qa, torch.where(a > 0, a, torch.ones_like(a)))


def rebuild(svd: ModulesSVD, s_b: Tensor, s_a: Tensor, rank: int, U: Tensor | None = None,
            Vh: Tensor | None = None, first: int | None = None) -> list[tuple[Tensor, Tensor]]:
    """Per-module factors ``B' = Qb U diag(s_b)`` (d_out x k) and ``A' = diag(s_a) Vh Qa^T`` (k x d_in), float32.

    ``B' A' = Qb U diag(s_b * s_a) Vh Qa^T``: pass ``s_b = s_a = sqrt(S')`` for the balanced rebuild of singular
    values ``S'``. The per-component scales multiply the small matrices before the one big matmul per factor.
    ``U``/``Vh`` default to the decomposition's own (pass rotated ones for M1). The top ``first`` components are
    used (default ``rank``); when the product has fewer (a dimension smaller than the rank) the factors are padded
    with zero components up to ``first`` so the shapes are kept.
    """
    U = svd.U if U is None else U
    Vh = svd.Vh if Vh is None else Vh
    k = rank if first is None else first
    m = min(k, U.shape[-1])
    cb = U[..., :m] * s_b[..., None, :m]
    ca = s_a[..., :m, None] * Vh[..., :m, :]

    def one(i):
        B = svd.Qb[i] @ cb[i]
        A = ca[i] @ svd.Qa[i].mT
        if m < k:
            B = torch.nn.functional.pad(B, (0, k - m))
            A = torch.nn.functional.pad(A, (0, 0, 0, k - m))
        return A, B

    return pmap(one, range(len(svd.Qb)))


def null_mask(S: Tensor) -> Tensor:
    """True where a singular value is (numerically) zero; all True for a module whose ``B A`` is exactly 0."""
    smax = S.amax(dim=-1, keepdim=True)
    return S <= smax * NULL_RTOL


def trainable_scales(S_new: Tensor, dead: Tensor, a_ref: Tensor, s_a_dead: Tensor | None = None
                     ) -> tuple[Tensor, Tensor]:
    """Per-component (s_b, s_a) for :func:`rebuild` that keep zeroed components trainable.

    A balanced rebuild of a zero singular value gives a zero column in B *and* a zero row in A; such a component has
    zero gradient in both factors forever (each factor's gradient is proportional to the other). So a component that
    must contribute nothing (``dead``: masked by M3, or numerically null) gets ``s_b = 0`` and a non-zero A row
    instead, which is exactly PEFT's fresh-adapter state (A random, B = 0) for that component: ``dW`` is identical,
    and training can grow it again. Its A row is ``s_a_dead`` (e.g. the component's pre-mask ``sqrt(S)``) where that
    is positive, else ``a_ref`` (the parent's RMS A-row norm).
    """
    s = S_new.clamp_min(0).sqrt()
    fill = a_ref[..., None].expand_as(s)
    if s_a_dead is not None:
        fill = torch.where(s_a_dead > 0, s_a_dead, fill)
    s_b = torch.where(dead, torch.zeros_like(s), s)
    s_a = torch.where(dead, fill, s)
    return s_b, s_a


def common_gauge(parents: Sequence[Adapter], ref: int = 0) -> list[Adapter]:
    """Every parent's factors in one gauge, float32: what the factor-space crossovers combine.

    A LoRA module's function is ``B A``; any invertible r x r ``G`` gives another factorisation ``(B G, G^-1 A)`` of
    the same function, and members of one population hold theirs in different ones (PEFT's own per seed, or the
    balanced SVD form the dW-space operators write). Combining factors across gauges mixes unrelated coordinates:
    the factor mean of P and P re-factored is not P. So each parent is first put in balanced SVD form
    (``B = Qb U sqrt(S)``, ``A = sqrt(S) Vh Qa^T``: the one form up to an orthogonal r x r, numerically null
    components as in :func:`trainable_scales`), then turned by the orthogonal ``R_j`` that best maps it onto
    ``parents[ref]``'s: ``argmax_R tr(R^T (B_j^T B_ref + A_j A_ref^T))``, the orthogonal Procrustes solution
    ``R = W Z^T`` of the r x r SVD ``W S Z^T``. ``(B_j R, R^T A_j)`` has parent j's ``B A`` exactly (R is
    orthogonal). Two parents with the same ``B A`` come out with the same factors (a sign, a permutation or a
    rotation within equal singular values is an orthogonal map Procrustes recovers), so any weighted sum of the
    aligned factors with weights summing to 1 has that ``B A`` too. Different parents are matched component by
    component, the alignment that leaves the least between their factors.
    """
    n_par = len(parents)
    rank = next(iter(parents[0].values()))[0].shape[0]
    out: list[Adapter] = [{} for _ in range(n_par)]
    for names in shape_groups(parents[0]):
        n = len(names)
        d = modules_svd([p[nm][0] for p in parents for nm in names], [p[nm][1] for p in parents for nm in names])
        s_b, s_a = trainable_scales(d.S, null_mask(d.S), d.a_rms)
        facs = rebuild(d, s_b, s_a, rank)  # parent-major: facs[j * n + i] is parent j's module names[i]
        others = [(j, i) for j in range(n_par) if j != ref for i in range(n)]
        if others:
            def cross(ji):
                (A, B), (Ar, Br) = facs[ji[0] * n + ji[1]], facs[ref * n + ji[1]]
                return B.mT @ Br + A @ Ar.mT

            W, _, Zh = torch.linalg.svd(torch.stack(pmap(cross, others)))
            rot = W @ Zh

            def turn(t):
                A, B = facs[others[t][0] * n + others[t][1]]
                return rot[t].mT @ A, B @ rot[t]

            for (j, i), f in zip(others, pmap(turn, range(len(others)))):
                out[j][names[i]] = f
        for i, nm in enumerate(names):
            out[ref][nm] = facs[ref * n + i]
    return [{nm: o[nm] for nm in parents[0]} for o in out]
