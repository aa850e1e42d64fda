"""Crossovers X1-X5, average, svd_merge and the replacement ``clone`` (docs/METHOD.md, Operators).

Same signature as the mutations: ``fn(parents, *, generator, scaling, fitness=None, log=None, **params)``.
``fitness`` is a sequence of floats aligned with ``parents`` (higher is better; PBT passes TrueSkill's expose).

Function in, function out: given parents that compute the same ``B A``, in any factorisation, every crossover
returns a child with that ``B A`` (DARE in expectation). The factor-space ones (``average``, X1, X4, X5) combine the
parents in one gauge for that (:func:`~lorapop.evolve.svd.common_gauge`: balanced SVD form, each parent turned
onto a reference parent); X2 copies whole modules, X3 and ``svd_merge`` act on ``B A`` itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from lorapop.evolve._common import (Adapter, copy_adapter, dtype_of, in_order, keep_mask, pmap, quantised_p,
                                    randint, shape_groups, uniform_scalar)
from lorapop.evolve.svd import common_gauge, modules_svd, null_mask, rebuild, trainable_scales


def _at_least_two(parents, name: str) -> None:
    if len(parents) < 2:
        raise ValueError(f"crossover '{name}' needs at least 2 parents, got {len(parents)}")


def _exactly_two(parents, name: str) -> None:
    if len(parents) != 2:
        raise ValueError(f"crossover '{name}' takes exactly 2 parents, got {len(parents)}")


def _fitness(fitness, parents, name: str, required: bool) -> list[float] | None:
    if fitness is None:
        if required:
            raise ValueError(f"crossover '{name}' needs fitness (one value per parent)")
        return None
    fitness = [float(f) for f in fitness]
    if len(fitness) != len(parents):
        raise ValueError(f"crossover '{name}': {len(fitness)} fitness values for {len(parents)} parents")
    return fitness


def _weighted_sum(tensors: Sequence[Tensor], coefs: Sequence[float], dtype: torch.dtype) -> Tensor:
    """``sum_i c_i T_i`` in float32 (two passes for two parents), cast to the storage dtype."""
    acc = tensors[0].float() * coefs[0]
    for t, c in zip(tensors[1:], coefs[1:]):
        acc.add_(t, alpha=c)
    return acc.to(dtype)


def _combine(parents: Sequence[Adapter], coefs: Sequence[float], ref: int = 0) -> Adapter:
    """``sum_i c_i p_i`` factor-wise, the parents first put in one gauge aligned on ``parents[ref]``
    (:func:`~lorapop.evolve.svd.common_gauge`); with ``sum_i c_i = 1``, parents of one ``B A`` give that ``B A``."""
    dtype = dtype_of(parents[0])
    aligned = common_gauge(parents, ref)
    return {n: (_weighted_sum([p[n][0] for p in aligned], coefs, dtype),
                _weighted_sum([p[n][1] for p in aligned], coefs, dtype)) for n in parents[0]}


def _pad_rank(A: Tensor, B: Tensor, r: int, dtype) -> tuple[Tensor, Tensor]:
    """Zero components up to rank r (only when a dimension is smaller than r), cast to the storage dtype."""
    if A.shape[0] < r:
        B = torch.nn.functional.pad(B, (0, r - B.shape[1]))
        A = torch.nn.functional.pad(A, (0, 0, 0, r - A.shape[0]))
    return A.to(dtype), B.to(dtype)


def average(parents, *, generator=None, scaling=None, fitness=None, log=None) -> Adapter:
    """average (acts on factors): the mean of the parents' A and of their B, in the common gauge aligned on
    ``parents[0]`` (:func:`~lorapop.evolve.svd.common_gauge`). Deterministic.

    Parents of one ``B A`` give that ``B A``. For different parents ``mean(B) mean(A) != mean(B A)``: the child
    carries cross terms ``B_i A_j``; for the mean of dW use ``svd_merge``.
    """
    _at_least_two(parents, "average")
    n = len(parents)
    return _combine(parents, [1.0 / n] * n)


def dare(parents, *, generator, scaling=None, fitness=None, log=None, p: float = 0.7) -> Adapter:
    """X1 (acts on factors): drop each factor element with probability p, rescale by 1/(1-p), average parents.

    The parents are first put in the common gauge aligned on ``parents[0]`` (:func:`~lorapop.evolve.svd.
    common_gauge`). Independent masks per parent, per factor, per element, so the child's ``B`` and ``A`` are
    independent with expectations ``mean_i B_i`` and ``mean_i A_i`` (aligned factors), and the child's ``B A`` is an
    unbiased estimate of ``mean(B) mean(A)``: of the parents' common ``B A`` when they compute the same function
    (one parent included), but not of ``mean_i B_i A_i`` for different parents (the cross terms of ``average``). p is
    quantised to 1/65536 (see ``keep_mask``); the value used is logged as ``p_used``.
    """
    _at_least_two(parents, "dare")
    if not 0 <= p < 1:
        raise ValueError(f"dare: p must be in [0, 1), got {p}")
    pq = min(quantised_p(p), 65535 / 65536)
    scale = 1.0 / (len(parents) * (1.0 - pq))
    dtype = dtype_of(parents[0])
    aligned = common_gauge(parents, 0)
    child: Adapter = {}
    for n in parents[0]:
        out = []
        for f in (0, 1):
            acc = None
            for par in aligned:
                F = par[n][f]
                kept = torch.where(keep_mask(F.shape, pq, generator, F.device), F, 0.0)
                acc = kept if acc is None else acc.add_(kept)
            out.append(acc.mul_(scale).to(dtype))
        child[n] = (out[0], out[1])
    if log is not None:
        log["p_used"] = pq
    return child


def layer_wise(parents, *, generator, scaling=None, fitness=None, log=None) -> Adapter:
    """X2 (acts on factors): each module's (A, B) copied whole from a parent drawn uniformly, per module."""
    _at_least_two(parents, "layer_wise")
    names = list(parents[0])
    choice = randint(len(parents), (len(names),), generator).tolist()
    child = {n: (parents[c][n][0].clone(), parents[c][n][1].clone()) for n, c in zip(names, choice)}
    if log is not None:
        log["modules_from_parent"] = [choice.count(i) for i in range(len(parents))]
    return child


def svd_subspace(parents, *, generator, scaling=None, fitness=None, log=None, k: int | None = None) -> Adapter:
    """X3 (acts on dW): singular triplets [0, k) of parent 1's dW and triplets [k, r) of parent 2's.

    Parent 1 is the fitter parent when fitness is given, else ``parents[0]``. Triplets are in descending order of
    singular value, so the child takes parent 1's strongest k directions and parent 2's weakest r - k, position by
    position: a parent crossed with itself (or with any factorisation of its own dW) is returned, as in the
    reference implementation. k is drawn uniformly from 1..r-1 (once per child, shared by all modules) unless given
    (0..r allowed: k = r is parent 1's dW, k = 0 parent 2's). The child dW is the sum of two rank-limited terms,
    represented exactly as a rank-r factorisation by concatenating the balanced factors (columns [0, k) from parent
    1, [k, r) from parent 2). Null components get the trainable (B = 0, A != 0) treatment of
    :func:`~lorapop.evolve.svd.trainable_scales`.
    """
    _exactly_two(parents, "svd_subspace")
    fit = _fitness(fitness, parents, "svd_subspace", required=False)
    if fit is not None and fit[1] > fit[0]:
        parents = [parents[1], parents[0]]
    first, second = parents
    r = next(iter(first.values()))[0].shape[0]
    if k is None:
        k = int(randint(r - 1, (), generator)) + 1 if r > 1 else int(randint(2, (), generator))
    k = int(k)
    if not 0 <= k <= r:
        raise ValueError(f"svd_subspace: k must be in [0, {r}], got {k}")
    dtype = dtype_of(first)
    child: Adapter = {}
    for names in shape_groups(first):
        n = len(names)
        # both parents' modules in one decomposition (their small SVDs batched together)
        d = modules_svd([first[nm][0] for nm in names] + [second[nm][0] for nm in names],
                        [first[nm][1] for nm in names] + [second[nm][1] for nm in names])
        s_b, s_a = trainable_scales(d.S, null_mask(d.S), d.a_rms)
        cb = d.U * s_b[:, None, :]
        ca = s_a[:, :, None] * d.Vh

        def one(i, d=d, cb=cb, ca=ca, n=n):
            j = i + n
            B = torch.cat([d.Qb[i] @ cb[i, :, :k], d.Qb[j] @ cb[j, :, k:]], dim=1)
            A = torch.cat([ca[i, :k] @ d.Qa[i].mT, ca[j, k:] @ d.Qa[j].mT], dim=0)
            return _pad_rank(A, B, r, dtype)

        for nm, f in zip(names, pmap(one, range(n))):
            child[nm] = f
    if log is not None:
        log["k"] = k
        log["parent_order_by_fitness"] = fit is not None
    return in_order(child, first)


def extrapolative(parents, *, generator, scaling=None, fitness=None, log=None, eta_min: float = 1.0,
                  eta_max: float = 1.5, eta: float | None = None) -> Adapter:
    """X4 (acts on factors): ``worse + eta (better - worse)`` on A and on B, eta ~ U(eta_min, eta_max).

    better/worse by fitness; without fitness ``parents[0]`` counts as the better one. The factors are those of the
    common gauge aligned on the better parent (:func:`~lorapop.evolve.svd.common_gauge`): eta = 1 gives the better
    parent's dW; eta > 1 steps past it, away from the worse; parents of one dW give that dW for every eta.
    """
    _exactly_two(parents, "extrapolative")
    fit = _fitness(fitness, parents, "extrapolative", required=False)
    better, worse = (parents[1], parents[0]) if fit is not None and fit[1] > fit[0] else (parents[0], parents[1])
    if eta is None:
        eta = uniform_scalar(eta_min, eta_max, generator)
    eta = float(eta)
    if log is not None:
        log["eta"] = eta
    return _combine([worse, better], [1.0 - eta, eta], ref=1)


# The reference implementation's z-score (population variance, this epsilon under the square root): equal fitness
# values give z = 0, so the child is the parents' mean rather than a division by zero.
ZSCORE_EPS = 1e-5


def xes(parents, *, generator=None, scaling=None, fitness=None, log=None, lr: float = 1.0) -> Adapter:
    """X5 (acts on factors): fitness-weighted recombination with equal numbers of good and bad parents.

    Rule (the reference implementation's, lucidrains/populora): n parents, n even (the better half are the "good",
    the worse half the "bad" parents). The fitness values are z-scored over the n parents,
    ``z_i = (f_i - mean f) / sqrt(var f + 1e-5)`` (population variance), the weights are ``w_i = z_i / n`` (sum 0,
    good positive, bad negative), and::

        child = mean(parents) + lr * sum_i w_i p_i = sum_i (1 + lr z_i) / n * p_i      (factor-wise)

    So the child moves from the parents' mean along good-minus-bad, each parent by how far its fitness stands from
    the others', and the coefficients sum to 1. The factors are those of the common gauge aligned on the fittest
    parent (:func:`~lorapop.evolve.svd.common_gauge`), so parents of one dW give that dW. ``lr`` is the reference's
    step ``eta`` (default 1). Two parents of different fitness have z = +-1, so with lr = 1 the child is the good
    parent's dW (coefficients 1 and 0), whatever the fitness gap; four give e.g. 0.46/0.45/0.24/-0.16. The
    coefficients are logged. Needs fitness.
    """
    _at_least_two(parents, "xes")
    n = len(parents)
    if n % 2:
        raise ValueError(f"crossover 'xes' needs an even number of parents (equal good and bad), got {n}")
    fit = _fitness(fitness, parents, "xes", required=True)
    mean = sum(fit) / n
    sd = math.sqrt(sum((f - mean) ** 2 for f in fit) / n + ZSCORE_EPS)
    coefs = [(1.0 + lr * (f - mean) / sd) / n for f in fit]
    if log is not None:
        log["coefficients"] = coefs
    return _combine(parents, coefs, ref=max(range(n), key=lambda i: fit[i]))


def svd_merge(parents, *, generator=None, scaling=None, fitness=None, log=None) -> Adapter:
    """svd_merge (acts on dW): the mean of the parents' dW truncated back to rank r (PEFT's ``svd`` combination).

    ``mean_i B_i A_i = [B_1 .. B_n] / n @ [A_1; ..; A_n]`` is a factored product of inner dimension n r; the
    QR-route SVD of that concatenation gives its top r triplets without a dense d_out x d_in matrix, rebuilt
    balanced. Deterministic. If the mean has rank below r (e.g. every parent fresh with B = 0), the missing
    components get B = 0 and A rows along the concatenation's row space (trainable, dW unchanged).
    """
    _at_least_two(parents, "svd_merge")
    n_par = len(parents)
    dtype = dtype_of(parents[0])
    r = next(iter(parents[0].values()))[0].shape[0]
    child: Adapter = {}
    for names in shape_groups(parents[0]):
        # sum_i B_i A_i = [B_1 .. B_n] @ [A_1; ..; A_n]; the 1/n goes on the singular values
        d = modules_svd(pmap(lambda nm: torch.cat([p[nm][0] for p in parents], dim=0), names),
                        pmap(lambda nm: torch.cat([p[nm][1] for p in parents], dim=1), names))
        S = d.S[:, :r] / n_par
        # null relative to the merged dW's largest singular value
        s_b, s_a = trainable_scales(S, null_mask(d.S)[:, :r], d.a_rms)
        for nm, (A, B) in zip(names, rebuild(d, s_b, s_a, r)):
            child[nm] = (A.to(dtype), B.to(dtype))
    return in_order(child, parents[0])


def clone(parents, *, generator=None, scaling=None, fitness=None, log=None) -> Adapter:
    """clone (replacement, acts on factors): an exact copy of the single parent (PBT's plain exploit)."""
    if len(parents) != 1:
        raise ValueError(f"'clone' takes exactly 1 parent, got {len(parents)}")
    return copy_adapter(parents[0])
