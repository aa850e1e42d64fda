"""LoRA weight-space operators (docs/METHOD.md, Operators) on small random adapters (dense dW only inside the tests)."""

from __future__ import annotations

import pytest
import torch

from floattol import assert_close_sums, sum_tol
from lorapop.evolve.operators import OPERATORS, get_operator, make_child
from lorapop.evolve.svd import common_gauge, modules_svd

R = 6
# (d_in, d_out); two modules share a shape so the batched (grouped) path runs with n > 1
SHAPES = {"m.q": (16, 24), "m.k": (24, 12), "m.o": (16, 24), "m.down": (20, 20), "m.up": (12, 32)}
SCALING = 2.0
ALL = list(OPERATORS)
RANDOM_OPS = [n for n in ALL if n not in ("average", "svd_merge", "clone", "xes")]


def adapter(seed: int, dtype=torch.float32, fresh: bool = False, rank: int = R):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (d_in, d_out) in SHAPES.items():
        A = torch.randn(rank, d_in, generator=g) / d_in**0.5
        B = torch.zeros(d_out, rank) if fresh else torch.randn(d_out, rank, generator=g)
        out[name] = (A.to(dtype), B.to(dtype))
    return out


def dW(ad, name):
    A, B = ad[name]
    return SCALING * B.double() @ A.double()


def parents_for(op, seed=1, dtype=torch.float32, fresh=False):
    n = 1 if get_operator(op).n_parents == 1 else 2
    return [adapter(seed + i, dtype, fresh) for i in range(n)]


def child(op, parents, seed=0, **params):
    fitness = [1.0, 0.0][: len(parents)] if len(parents) == 2 else None
    return make_child(op, parents, generator=torch.Generator().manual_seed(seed), scaling=SCALING,
                      fitness=fitness, params=params or None)


def same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n][0], b[n][0]) and torch.equal(a[n][1], b[n][1]) for n in a)


def dw_atol(name: str, ref: torch.Tensor) -> float:
    """The operators work in float32 (QR, an R x R SVD, rank-R products). Householder QR and the SVD are backward
    stable with an error of about (rows + cols)·u·||dW||_2 (Higham, ch. 19), and each product adds R terms, so the
    reduction length of tests/floattol.py is d_in + d_out + R and the scale the largest singular value."""
    d_in, d_out = SHAPES.get(name, ref.shape[::-1])
    return sum_tol(torch.float32, d_in + d_out + R, float(torch.linalg.matrix_norm(ref.double(), ord=2)))


def assert_dW_close(a, b):
    for n in a:
        ref = dW(b, n)
        torch.testing.assert_close(dW(a, n), ref, atol=dw_atol(n, ref), rtol=0)


# ---- the QR route ----------------------------------------------------------------------------------------------


def test_qr_route_matches_dense_svd():
    ad = adapter(3)
    for name in SHAPES:
        A, B = ad[name]
        d = modules_svd([A], [B])
        left, right, S = d.Qb[0] @ d.U[0], d.Qa[0] @ d.Vh[0].mT, d.S[0]
        dense = B.double() @ A.double()
        ref = torch.linalg.svdvals(dense)[:R]
        torch.testing.assert_close(S.double(), ref, atol=dw_atol(name, dense), rtol=0)
        recon = (left * S) @ right.mT
        torch.testing.assert_close(recon.double(), dense, atol=dw_atol(name, dense), rtol=0)
        assert left.shape == (B.shape[0], R) and right.shape == (A.shape[1], R)


def test_qr_route_batched_equals_per_module():
    ad = adapter(4)
    d = modules_svd([ad["m.q"][0], ad["m.o"][0]], [ad["m.q"][1], ad["m.o"][1]])
    for i, name in enumerate(["m.q", "m.o"]):
        alone = modules_svd([ad[name][0]], [ad[name][1]]).S[0]
        torch.testing.assert_close(d.S[i], alone, atol=dw_atol(name, dW(ad, name) / SCALING), rtol=0)


def test_qr_route_in_float32_for_bf16_input():
    A, B = adapter(5, torch.bfloat16)["m.q"]
    d = modules_svd([A], [B])
    assert d.S.dtype == torch.float32 and d.Qb[0].dtype == torch.float32


# ---- contract: every operator ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", ALL)
def test_keeps_keys_rank_shapes_dtype(op, dtype):
    ps = parents_for(op, dtype=dtype)
    c, rec = child(op, ps)
    assert list(c) == list(ps[0])
    for n, (A, B) in c.items():
        assert A.shape == ps[0][n][0].shape and B.shape == ps[0][n][1].shape
        assert A.dtype == dtype and B.dtype == dtype
        assert torch.isfinite(A.float()).all() and torch.isfinite(B.float()).all()
    assert rec["operator"] == op and rec["id"] == get_operator(op).id
    assert rec["acts_on"] in ("factors", "dW")


@pytest.mark.parametrize("op", ALL)
def test_parents_unchanged(op):
    ps = parents_for(op)
    before = [{n: (A.clone(), B.clone()) for n, (A, B) in p.items()} for p in ps]
    c, _ = child(op, ps)
    for p, b in zip(ps, before):
        assert same(p, b)
    # and the child does not alias a parent's storage (writing to it must not reach a parent)
    for n, (A, B) in c.items():
        A.add_(1.0)
        B.add_(1.0)
    for p, b in zip(ps, before):
        assert same(p, b)


@pytest.mark.parametrize("op", RANDOM_OPS)
def test_seeded(op):
    ps = parents_for(op)
    a, ra = child(op, ps, seed=7)
    b, rb = child(op, ps, seed=7)
    assert same(a, b) and ra == rb
    others = [child(op, ps, seed=s)[0] for s in (8, 9, 10)]
    assert any(not same(a, o) for o in others)


@pytest.mark.parametrize("op", ["average", "svd_merge", "clone", "xes"])
def test_deterministic_ops_ignore_seed(op):
    ps = parents_for(op)
    assert same(child(op, ps, seed=1)[0], child(op, ps, seed=2)[0])


def test_ids_and_registry():
    ids = {op.id: name for name, op in OPERATORS.items() if op.id}
    assert ids == {"M1": "svd_structured", "M2": "layer_selective_gaussian", "M3": "component_masking",
                   "M4": "full_gaussian", "M5": "neftune_style", "X1": "dare", "X2": "layer_wise",
                   "X3": "svd_subspace", "X4": "extrapolative", "X5": "xes"}
    assert {"average", "svd_merge", "clone"} <= set(OPERATORS)
    for name in ("svd_structured", "component_masking", "svd_subspace", "svd_merge"):
        assert OPERATORS[name].acts_on == "dW"


# ---- exactness -------------------------------------------------------------------------------------------------


def test_clone_is_exact():
    p = adapter(1)
    c, _ = child("clone", [p])
    assert same(c, p)


@pytest.mark.parametrize("op", ["average", "svd_merge"])
def test_merge_of_identical_parents_is_the_parent(op):
    p = adapter(1)
    q = {n: (A.clone(), B.clone()) for n, (A, B) in p.items()}
    c, _ = child(op, [p, q])
    assert_dW_close(c, p)


def test_svd_merge_is_best_rank_r_of_mean():
    p, q = adapter(1), adapter(2)
    c, _ = child("svd_merge", [p, q])
    for n in SHAPES:
        mean = (dW(p, n) + dW(q, n)) / 2
        U, S, Vh = torch.linalg.svd(mean)
        best = (U[:, :R] * S[:R]) @ Vh[:R]
        torch.testing.assert_close(dW(c, n), best, atol=dw_atol(n, best), rtol=0)


def test_m1_eps0_and_m3_fraction0_preserve_dW():
    p = adapter(1)
    assert_dW_close(child("svd_structured", [p], eps=0.0)[0], p)
    assert_dW_close(child("component_masking", [p], fraction=0.0)[0], p)


def test_m1_changes_spectrum_and_keeps_rank():
    p = adapter(1)
    c, _ = child("svd_structured", [p])
    for n in SHAPES:
        s_old = torch.linalg.svdvals(dW(p, n))[:R]
        s_new = torch.linalg.svdvals(dW(c, n))
        assert not torch.allclose(s_old, s_new[:R], rtol=1e-3)
        assert (s_new[:R] > 1e-6 * s_new[0]).all() and (s_new[R:] < 1e-6 * s_new[0]).all()


@pytest.mark.parametrize("rank, fraction, masked", [(8, 0.3, 3), (12, 0.3, 4), (10, 0.3, 3), (6, 0.5, 3), (4, 0.0, 0),
                                                    (4, 1.0, 4)])
def test_m3_masks_ceil_of_the_share(rank, fraction, masked):
    """ceil(fraction r) as in the reference (r = 8 at 0.3: 3), of the exact product (0.3 x 10 = 3)."""
    rec = child("component_masking", [adapter(1, rank=rank)], fraction=fraction)[1]
    assert rec["params"]["n_masked_per_module"] == masked


def test_m3_masks_components_but_keeps_them_trainable():
    p = adapter(1)
    c, rec = child("component_masking", [p], fraction=0.5)
    k = rec["params"]["n_masked_per_module"]
    assert k == 3
    for n in SHAPES:
        s = torch.linalg.svdvals(dW(c, n))
        kept = s > 1e-6 * s[0]
        assert int(kept.sum()) == R - k
        # surviving components are the parent's own singular values
        s_par = torch.linalg.svdvals(dW(p, n))[:R]
        assert all(torch.isclose(s_par, v, rtol=0, atol=dw_atol(n, dW(p, n))).any() for v in s[kept])
        A, B = c[n]
        assert torch.linalg.matrix_rank(A.double()) == R  # masked components: B column 0, A row kept
        assert int((B.abs().sum(0) == 0).sum()) == k


@pytest.mark.parametrize("k", [0, 3, R])
def test_x3_split(k):
    """Components [0, k) of the first parent's dW and [k, R) of the second's, position by position."""
    p1, p2 = adapter(1), adapter(2)
    c, rec = child("svd_subspace", [p1, p2], k=k)
    assert rec["params"]["k"] == k
    for n in SHAPES:
        def comps(ad, lo, hi):
            U, S, Vh = torch.linalg.svd(dW(ad, n))
            return (U[:, lo:hi] * S[lo:hi]) @ Vh[lo:hi]
        want = comps(p1, 0, k) + comps(p2, k, R)
        torch.testing.assert_close(dW(c, n), want, atol=dw_atol(n, want), rtol=0)


def test_x3_fitter_parent_first_and_k_drawn_inside():
    p1, p2 = adapter(1), adapter(2)
    a, rec = make_child("svd_subspace", [p1, p2], generator=torch.Generator().manual_seed(0), scaling=SCALING,
                        fitness=[0.0, 1.0], params={"k": R})
    assert_dW_close(a, p2)  # p2 is fitter
    for s in range(10):
        k = child("svd_subspace", [p1, p2], seed=s)[1]["params"]["k"]
        assert 1 <= k <= R - 1


def test_x2_modules_whole_from_one_parent():
    p1, p2 = adapter(1), adapter(2)
    seen = set()
    for s in range(4):
        c, rec = child("layer_wise", [p1, p2], seed=s)
        for n, (A, B) in c.items():
            src = [i for i, p in enumerate((p1, p2)) if torch.equal(A, p[n][0]) and torch.equal(B, p[n][1])]
            assert len(src) == 1
            seen.add(src[0])
        assert sum(rec["params"]["modules_from_parent"]) == len(SHAPES)
    assert seen == {0, 1}


def test_x4_extrapolates_from_worse_to_better():
    p1, p2 = adapter(1), adapter(2)
    c, _ = make_child("extrapolative", [p1, p2], generator=torch.Generator().manual_seed(0), scaling=SCALING,
                      fitness=[0.0, 5.0], params={"eta": 1.0})
    assert_dW_close(c, p2)
    c, rec = make_child("extrapolative", [p1, p2], generator=torch.Generator().manual_seed(0), scaling=SCALING,
                        fitness=[0.0, 5.0])
    eta = rec["params"]["eta"]
    assert 1.0 <= eta <= 1.5
    worse, better = common_gauge([p1, p2], ref=1)  # the gauge aligned on the better parent
    for n in SHAPES:
        for f in (0, 1):
            assert_close_sums(c[n][f], worse[n][f] + eta * (better[n][f] - worse[n][f]), 2)


def test_x5_xes_rule():
    """The reference's rule: z-scored fitness (population variance + 1e-5), weights z / n, step lr = 1."""
    good, bad = adapter(1), adapter(2)
    c, rec = make_child("xes", [bad, good], generator=torch.Generator().manual_seed(0), scaling=SCALING,
                        fitness=[-1.0, 2.0])
    co = rec["params"]["coefficients"]
    z = 1.5 / (1.5**2 + 1e-5) ** 0.5
    assert co == pytest.approx([(1 - z) / 2, (1 + z) / 2], abs=1e-12)
    assert_dW_close(c, good)  # two parents at lr 1: the good one's function (coefficient 1 - 1e-6)
    b, g = common_gauge([bad, good], ref=1)
    for n in SHAPES:
        assert_close_sums(c[n][1], co[1] * g[n][1] + co[0] * b[n][1], 2)
    four = [adapter(i) for i in range(4)]
    fit = [3.0, 0.0, 2.0, 1.0]
    c, rec = make_child("xes", four, generator=torch.Generator().manual_seed(0), scaling=SCALING, fitness=fit)
    sd = (sum((f - 1.5) ** 2 for f in fit) / 4 + 1e-5) ** 0.5
    assert rec["params"]["coefficients"] == pytest.approx([(1 + (f - 1.5) / sd) / 4 for f in fit], abs=1e-12)
    same_fit = make_child("xes", four, generator=torch.Generator(), scaling=SCALING, fitness=[1.0] * 4)[1]
    assert same_fit["params"]["coefficients"] == [0.25] * 4  # no spread in fitness: the mean
    half = make_child("xes", [bad, good], generator=torch.Generator(), scaling=SCALING, fitness=[-1.0, 2.0],
                      params={"lr": 0.5})[1]
    assert half["params"]["coefficients"] == pytest.approx([(1 - z / 2) / 2, (1 + z / 2) / 2], abs=1e-12)


def test_dare_p0_is_average_and_drop_rate():
    p1, p2 = adapter(1), adapter(2)
    assert_dW_close(child("dare", [p1, p2], p=0.0)[0], child("average", [p1, p2])[0])
    big = {"w": (torch.randn(64, 256), torch.randn(256, 64))}
    big2 = {"w": (torch.randn(64, 256), torch.randn(256, 64))}
    c, rec = child("dare", [big, big2], p=0.7)
    zeros = float((c["w"][0] == 0).float().mean())
    assert abs(zeros - 0.49) < 0.02  # dropped in both parents
    assert abs(rec["params"]["p_used"] - 0.7) < 1e-4


# ---- function in, function out: every registered crossover -------------------------------------------------------

CROSSOVERS = [n for n, op in OPERATORS.items() if op.kind == "crossover"]
DARE_DRAWS = 150


def refactored(ad, seed: int, how: str):
    """``ad``'s function in another factorisation, float32: ``same`` (a copy), ``invertible`` (``B G, G^-1 A`` with G
    a random orthogonal x diag(log-uniform 0.5..2) x orthogonal, condition number <= 4, signs included) or ``svd``
    (the balanced SVD form of the dense dW, a random sign per component)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, (A, B) in ad.items():
        A64, B64 = A.double(), B.double()
        r = A.shape[0]
        if how == "same":
            out[n] = (A.clone(), B.clone())
            continue
        if how == "invertible":
            q1 = torch.linalg.qr(torch.randn(r, r, generator=g, dtype=torch.float64))[0]
            q2 = torch.linalg.qr(torch.randn(r, r, generator=g, dtype=torch.float64))[0]
            s = 2.0 ** (2 * torch.rand(r, generator=g, dtype=torch.float64) - 1)
            G, Ginv = q1 @ torch.diag(s) @ q2, q2.mT @ torch.diag(1 / s) @ q1.mT
            out[n] = ((Ginv @ A64).float(), (B64 @ G).float())
        else:
            U, S, Vh = torch.linalg.svd(B64 @ A64, full_matrices=False)
            sign = torch.where(torch.rand(r, generator=g) < 0.5, -1.0, 1.0).double()
            root = S[:r].sqrt() * sign  # the sign on both factors: B A unchanged
            out[n] = ((root[:, None] * Vh[:r]).float(), (U[:, :r] * root).float())
    return out


def factor_scale(parents, name: str) -> float:
    """SCALING * max over parents of ||B||_2 ||A||_2: the size the QR route's rounding is relative to (a re-factored
    parent's factors can be larger than its dW)."""
    return SCALING * max(float(torch.linalg.matrix_norm(p[name][1].double(), ord=2)
                               * torch.linalg.matrix_norm(p[name][0].double(), ord=2)) for p in parents)


def function_tol(parents, name: str) -> float:
    """:func:`dw_atol`'s derivation with the factors' scale: float32, reduction length d_in + d_out + R; the
    re-factoring itself rounds each parent's factors to float32 once more, within the same bound."""
    d_in, d_out = SHAPES[name]
    return sum_tol(torch.float32, d_in + d_out + R, factor_scale(parents, name))


@pytest.mark.parametrize("how", ["same", "invertible", "svd"])
@pytest.mark.parametrize("n_par", [2, 4])
@pytest.mark.parametrize("op", CROSSOVERS)
def test_crossover_of_one_function_is_that_function(op, n_par, how):
    """Parents that compute the same dW, each in its own factorisation, give a child with that dW: exactly (float
    rounding) or, for an operator registered ``keeps_function="expectation"``, on average over draws. Iterates the
    registry: a newly registered crossover is held to this by registering it."""
    spec = get_operator(op)
    if spec.n_parents == 2 and n_par != 2:
        pytest.skip(f"{op} takes exactly 2 parents")
    base = adapter(11)
    parents = [base] + [refactored(base, 100 + i, how) for i in range(n_par - 1)]
    fitness = torch.randn(n_par, generator=torch.Generator().manual_seed(n_par)).tolist()
    # the reference parent (fitter, or first) in either factorisation; the sampled check once (it is the slow one)
    for order in (parents, parents[::-1]) if spec.keeps_function == "exact" else (parents[::-1],):
        if spec.keeps_function == "exact":
            c, _ = make_child(op, order, generator=torch.Generator().manual_seed(3), scaling=SCALING, fitness=fitness)
            for n in SHAPES:
                torch.testing.assert_close(dW(c, n), dW(base, n), atol=function_tol(order, n), rtol=0,
                                           msg=lambda m, n=n: f"{op} ({how}, {n_par} parents), module {n}: {m}")
            continue
        assert spec.keeps_function == "expectation", spec.keeps_function
        gen = torch.Generator().manual_seed(3)
        draws = {n: [] for n in SHAPES}
        for _ in range(DARE_DRAWS):
            c, _ = make_child(op, order, generator=gen, scaling=SCALING, fitness=fitness)
            for n in SHAPES:
                draws[n].append(dW(c, n))
        for n in SHAPES:
            x = torch.stack(draws[n])
            err = float(torch.linalg.norm(x.mean(0) - dW(base, n)))
            # E||mean - dW||^2 = sum of per-element variances / draws; 4 standard errors of the norm's scale, plus
            # float rounding, leaves a systematic bias of the same size nowhere to hide
            se = float(x.var(0).sum() / DARE_DRAWS) ** 0.5
            assert err <= 4 * se + function_tol(order, n) * x.shape[-1], (op, how, n, err, se)


def test_property_test_catches_a_factor_mean_without_a_gauge():
    """The property above can fail: the plain factor mean of P and P re-factored is far from P."""
    base = adapter(11)
    other = refactored(base, 100, "invertible")
    for n in SHAPES:
        plain = SCALING * ((base[n][1] + other[n][1]).double() / 2) @ ((base[n][0] + other[n][0]).double() / 2)
        assert float(torch.linalg.norm(plain - dW(base, n))) > 100 * function_tol([base, other], n)


def test_common_gauge_keeps_each_parent_and_aligns_the_same_function():
    p, q = adapter(1), adapter(2)
    q_as_p = refactored(p, 5, "invertible")
    aligned = common_gauge([p, q, q_as_p], ref=0)
    for src, al in zip([p, q, q_as_p], aligned):
        for n in SHAPES:
            torch.testing.assert_close(SCALING * al[n][1].double() @ al[n][0].double(), dW(src, n),
                                       atol=function_tol([src], n), rtol=0)
    for n in SHAPES:  # the same function, re-factored, lands on the reference's own factors
        for f in (0, 1):
            scale = float(aligned[0][n][f].abs().max())
            assert_close_sums(aligned[2][n][f], aligned[0][n][f], sum(SHAPES[n]) + R, scale, torch.float32)


# ---- fresh adapters (B = 0) ------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["layer_selective_gaussian", "full_gaussian"])
def test_gaussian_fallback_moves_dW_of_fresh_adapter(op):
    p = adapter(1, fresh=True)
    c, rec = child(op, [p])
    changed = [n for n in SHAPES if dW(c, n).abs().max() > 0]
    expected = len(SHAPES) if op == "full_gaussian" else rec["params"]["n_mutated"]
    assert len(changed) == expected >= 1
    for n in changed:
        B = c[n][1]
        # fallback scale eps / sqrt(last dim of B = r)
        eps = rec["params"]["eps"]
        assert 0.5 * eps / R**0.5 < float(B.std()) < 2 * eps / R**0.5


def test_neftune_moves_A_only():
    p = adapter(1, fresh=True)
    c, _ = child("neftune_style", [p])
    for n, (A, B) in c.items():
        assert not torch.equal(A, p[n][0]) and torch.equal(B, p[n][1])
        r, d_in = A.shape
        assert float((A - p[n][0]).abs().max()) <= 10.0 / (d_in * r) ** 0.5


@pytest.mark.parametrize("op", ["svd_structured", "component_masking"])
def test_svd_mutations_on_zero_dW_copy_the_factors(op):
    """dW = 0 has no spectrum to scale, rotate or mask: the child is the parent (still trainable: A != 0)."""
    p = adapter(1, fresh=True)
    c, rec = child(op, [p])
    assert same(c, p)
    assert rec["params"]["zero_dW_modules"] == len(SHAPES)


def test_svd_merge_of_fresh_adapters_stays_trainable():
    c, _ = child("svd_merge", [adapter(1, fresh=True), adapter(2, fresh=True)])
    for A, B in c.values():
        assert float(B.abs().max()) == 0.0
        assert torch.linalg.matrix_rank(A.double()) == R


# ---- errors ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", [n for n in ALL if get_operator(n).kind == "crossover"])
def test_crossover_with_one_parent_is_an_error(op):
    with pytest.raises(ValueError, match="parents"):
        make_child(op, [adapter(1)], generator=torch.Generator(), scaling=SCALING, fitness=[1.0])


def test_other_errors():
    g = torch.Generator()
    p, q = adapter(1), adapter(2)
    with pytest.raises(ValueError, match="unknown operator"):
        make_child("nope", [p], generator=g, scaling=SCALING)
    with pytest.raises(ValueError, match="fitness"):
        make_child("xes", [p, q], generator=g, scaling=SCALING)
    with pytest.raises(ValueError, match="even"):
        make_child("xes", [p, q, p], generator=g, scaling=SCALING, fitness=[1, 2, 3])
    with pytest.raises(ValueError, match="no parameter 'epsilon'"):
        make_child("full_gaussian", [p], generator=g, scaling=SCALING, params={"epsilon": 0.1})
    with pytest.raises(ValueError, match="exactly 1"):
        make_child("full_gaussian", [p, q], generator=g, scaling=SCALING)
    with pytest.raises(ValueError, match="different modules"):
        make_child("average", [p, {"x": p["m.q"]}], generator=g, scaling=SCALING)
    with pytest.raises(TypeError, match="Generator"):
        make_child("clone", [p], generator=0, scaling=SCALING)


_PMAP_THREADS_SCRIPT = """
import json, threading, torch
from lorapop.evolve import _common

steps = []
for caller in (2, 3, 2):  # 3: a new pool of a new size; 2 again: a pool made before a count change
    torch.set_num_threads(caller)
    step = {"caller": caller, "set": torch.get_num_threads()}
    out = _common.pmap(lambda i: (i, torch.get_num_threads()), list(range(6)))
    step["order"] = [i for i, _ in out]
    step["workers"] = sorted({n for _, n in out})
    step["after"] = torch.get_num_threads()
    later = []
    t = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
    t.start()
    t.join()
    step["later"] = later[0]
    steps.append(step)
print(json.dumps(steps))
"""


def test_pmap_workers_run_single_threaded_and_keep_order():
    # Oversubscription guard: pmap's workers must not each start a full OpenMP team (on 2 cores that made M1 at
    # rank 64 eight times slower); the caller's own thread count must stay as it was, and so must the process-wide
    # count a thread started later adopts (torch.set_num_threads in a worker also sets that one). Run in a fresh
    # interpreter: thread counts are process state, and an earlier test in the same xdist worker decided what this
    # one saw (on CI, after test_vllm_engine's in-process engine had made torch.set_num_threads a no-op, fixed in
    # vllm_engine.py and tested there); OMP_NUM_THREADS=1 as the suite's workers have it.
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", _PMAP_THREADS_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = json.loads(proc.stdout.strip().splitlines()[-1])
    why = json.dumps(steps)  # every step in the message, so a failure on another machine says where it went wrong
    for step in steps:
        c = step["caller"]
        assert step["set"] == c, f"torch did not keep set_num_threads({c}) even before pmap ran: {why}"
        assert step["order"] == list(range(6)), why
        assert step["workers"] == [1], why
        assert step["after"] == c, why
        assert step["later"] == c, why
