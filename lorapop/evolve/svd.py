"""QR-route SVD of a LoRA product ``B @ A`` without ever forming the d_out x d_in matrix (SPEC section 4).

With ``B = Qb Rb`` and ``A^T = Qa Ra`` (reduced QR), ``B A = Qb (Rb Ra^T) Qa^T``; the SVD of the small
``Rb Ra^T = U S Vh`` gives ``B A = (Qb U) S (Qa Vh^T)^T``. Everything here is batched over leading dimensions, so the
operators stack the modules that share a shape (a 7B adapter has only four distinct shapes) and run one batched QR
per group instead of one LAPACK call per module.

Always float32, whatever the storage dtype: the singular values of a low-rank product span several orders of
magnitude and a bf16 mantissa (8 bits) cannot resolve the small ones.

Note on ``scaling``: the engine's effective update is ``dW = scaling * B A``; every function here works on
``B A = dW / scaling``. Parents and child share one ``scaling`` (``alpha / r``, same alpha and r), so an operator that
edits ``B A`` and rebuilds factors from it gives a child whose effective ``dW`` is exactly the intended one; folding
the scaling into the factors would double-apply it once the engine multiplies again.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

# A singular value at most this fraction of the module's largest counts as zero (float32 QR/SVD leaves ~1e-7
# relative noise on exactly-null directions; 1e-6 keeps a margin without touching real components).
NULL_RTOL = 1e-6


class LoraSVD(NamedTuple):
    """``B A = Qb @ U @ diag(S) @ Vh @ Qa^T``, batched over leading dims; all float32.

    Qb: (..., d_out, kb), U: (..., kb, m), S: (..., m) descending, Vh: (..., m, ka), Qa: (..., d_in, ka), with
    kb = min(d_out, R), ka = min(d_in, R), m = min(kb, ka) for inner dimension R (the rank, or the total rank of
    concatenated factors).
    """

    Qb: Tensor
    U: Tensor
    S: Tensor
    Vh: Tensor
    Qa: Tensor

    @property
    def left(self) -> Tensor:
        """Left singular vectors of ``B A``: (..., d_out, m)."""
        return self.Qb @ self.U

    @property
    def right(self) -> Tensor:
        """Right singular vectors of ``B A``: (..., d_in, m)."""
        return self.Qa @ self.Vh.mT


def lora_svd(A: Tensor, B: Tensor) -> LoraSVD:
    """SVD of ``B @ A`` for A: (..., R, d_in), B: (..., d_out, R) through two thin QRs and an R x R SVD."""
    A = A.float()
    B = B.float()
    Qb, Rb = torch.linalg.qr(B)
    # A^T as a transposed view is already column-major for LAPACK, so no copy is made here.
    Qa, Ra = torch.linalg.qr(A.mT)
    U, S, Vh = torch.linalg.svd(Rb @ Ra.mT, full_matrices=False)
    return LoraSVD(Qb, U, S, Vh, Qa)


def rebuild(svd: LoraSVD, s_b: Tensor, s_a: Tensor, rank: int, U: Tensor | None = None,
            Vh: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Factors ``B' = Qb U diag(s_b)`` (d_out x rank) and ``A' = diag(s_a) Vh Qa^T`` (rank x d_in).

    ``B' A' = Qb U diag(s_b * s_a) Vh Qa^T``: pass ``s_b = s_a = sqrt(S')`` for the balanced rebuild of singular
    values ``S'``. The per-component scales multiply the small r x r matrices before the one big matmul per factor.
    ``U``/``Vh`` default to the decomposition's own (pass rotated ones for M1). Only the first ``rank`` components
    are used; when the product has fewer than ``rank`` (a dimension smaller than the rank) the factors are padded
    with zero components so the shapes are kept.
    """
    U = svd.U if U is None else U
    Vh = svd.Vh if Vh is None else Vh
    m = min(rank, U.shape[-1])
    B = svd.Qb @ (U[..., :m] * s_b[..., None, :m])
    A = (s_a[..., :m, None] * Vh[..., :m, :]) @ svd.Qa.mT
    if m < rank:
        B = torch.nn.functional.pad(B, (0, rank - m))
        A = torch.nn.functional.pad(A, (0, 0, 0, rank - m))
    return A, B


def null_mask(S: Tensor) -> Tensor:
    """True where a singular value is (numerically) zero; all True for a module whose ``B A`` is exactly 0."""
    smax = S.amax(dim=-1, keepdim=True)
    return S <= smax * NULL_RTOL


def row_scale(A: Tensor) -> Tensor:
    """RMS row norm of A per module (..., R, d_in) -> (...): the magnitude given to revived A rows (see below)."""
    a = A.float().square().sum(dim=(-2, -1)).div(A.shape[-2]).sqrt()
    return torch.where(a > 0, a, torch.ones_like(a))


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
