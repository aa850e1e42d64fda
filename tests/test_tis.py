"""Truncated importance sampling between the sampler and the update (engine.importance_sampling_cap; docs/METHOD.md,
"On-policy updates").

Each scored token whose sample carries the sampler's log-prob has its policy-gradient term weighted by
min(exp(logp - sampler), cap), detached; the entropy term and the per-adapter normalisation are not. The gradients
are checked in float64 (the engine's numerical reference) against autograd on a loss written here from the model's
plain full-sequence forward, so neither the engine's scoring path nor its weighting is reused."""

from __future__ import annotations

import math

import pytest
import torch

from floattol import sum_tol
from test_engine_helpers import K_TINY, K_TINY_GRAD, VOCAB, tiny_engine
from lorapop.engine import Completion, TrainSample
from lorapop.engine.replicas import merge_stats, share_stats
from lorapop.records.members import Member
from lorapop.train import stages
from lorapop.train.metrics import step_metrics, train_means

T = 0.7
CAP = 2.0
# Raw ratios exp(logp - sampler) the shifted sampler log-probs give, cycled over the compared tokens: two above the
# cap, one at 1, two below it; none near the cap, so float rounding cannot move a token across it.
RATIOS = (3.0, 0.5, 1.0, 1.5, 2.5)
REL64 = sum_tol(torch.float64, K_TINY_GRAD)  # a gradient, two summation orders, float64
LP64 = sum_tol(torch.float64, K_TINY) + sum_tol(torch.float64, VOCAB)  # a log-prob, two paths, float64


def _samples():
    rows = [([1, 5, 9, 4], [7, 8, 9], 0, 1.0), ([1, 2], [3, 4, 5, 6, 7, 8], 1, -0.5),
            ([1, 5, 9, 4, 4, 4, 4], [11, 12], 0, -2.0), ([3], [20, 21, 22, 23], 2, 0.7),
            ([1, 3, 3], [30, 31, 32, 33, 34], 1, 1.5), ([2, 2, 2, 2, 2], [40, 41], 2, 0.0)]
    return [TrainSample(p, c, a, adv, T) for p, c, a, adv in rows]


def _own_logprobs(eng, samples):
    return eng.token_logprobs([s.prompt_ids for s in samples], [s.completion_ids for s in samples],
                              [s.adapter_id for s in samples], [s.temperature for s in samples])


def _with_ratios(eng, samples, skip=(3,)):
    """``samples`` carrying sampler log-probs shifted off the engine's own so each token's raw ratio is the next of
    RATIOS; the rows in ``skip`` carry none (weight 1, not compared). Returns the samples and the ratio per token
    (None for an uncompared row)."""
    own = _own_logprobs(eng, samples)
    out, ratios, k = [], [], 0
    for i, (s, lp) in enumerate(zip(samples, own)):
        if i in skip:
            out.append(s)
            ratios.append(None)
            continue
        r = [RATIOS[(k + t) % len(RATIOS)] for t in range(len(lp))]
        k += len(lp)
        out.append(TrainSample(s.prompt_ids, s.completion_ids, s.adapter_id, s.advantage, s.temperature,
                               [v - math.log(x) for v, x in zip(lp, r)]))
        ratios.append(r)
    return out, ratios


def _grads(eng):
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in eng._params])


def _engine_gradient(eng, samples):
    eng.optimizer.zero_grad()
    stats = eng.accumulate_gradients(samples)
    g = _grads(eng)
    eng.optimizer.zero_grad()
    return stats, g


def _reference_gradient(eng, samples, weights, coeff: float = 0.0):
    """The update's gradient by another route: each row alone through the model's full forward (every position's
    logits), log_softmax(logits / T) at the tokens, loss sum of (-adv * w * logp - coeff * H) / adapter tokens with
    the weights ``weights`` given per token (None: 1). Returns the gradient and each adapter's loss."""
    eng.optimizer.zero_grad()
    n = {}
    for s in samples:
        n[s.adapter_id] = n.get(s.adapter_id, 0) + len(s.completion_ids)
    losses = {a: 0.0 for a in n}
    try:
        for s, w in zip(samples, weights):
            eng._ctx.set(torch.tensor([s.adapter_id]))
            logits = eng.model(input_ids=torch.tensor([s.prompt_ids + s.completion_ids])).logits[0]
            # the engine (sampler and update alike) holds temperatures as float32: 0.7 is 1.7e-8 off in float64
            z = logits[len(s.prompt_ids) - 1:-1] / float(torch.tensor(s.temperature, dtype=torch.float32))
            assert z.dtype == torch.float64
            logp = z.log_softmax(-1).gather(-1, torch.tensor(s.completion_ids)[:, None]).squeeze(-1)
            ent = -(z.softmax(-1) * z.log_softmax(-1)).sum(-1)
            wt = torch.tensor([1.0] * len(logp) if w is None else w, dtype=logp.dtype)
            loss = ((-s.advantage * wt * logp - coeff * ent) / n[s.adapter_id]).sum()
            loss.backward()
            losses[s.adapter_id] += float(loss.detach())
    finally:
        eng._ctx.set(None)
    g = _grads(eng)
    eng.optimizer.zero_grad()
    return g, losses


def _assert_grad_close(got, want):
    scale = max(float(want.abs().max()), 1e-12)
    assert float((got - want).abs().max()) <= REL64 * scale, float((got - want).abs().max()) / scale


def test_the_samplers_own_logprobs_leave_the_gradient_unchanged():
    """On-policy (the sampler's log-probs are the update's at the same temperature) every ratio is 1 up to rounding:
    the gradient is the one without sampler log-probs, nothing is capped."""
    eng = tiny_engine(dtype="float64")
    plain = _samples()
    own = _own_logprobs(eng, plain)
    carried = [TrainSample(s.prompt_ids, s.completion_ids, s.adapter_id, s.advantage, s.temperature, lp)
               for s, lp in zip(plain, own)]
    s0, g0 = _engine_gradient(eng, plain)
    s1, g1 = _engine_gradient(eng, carried)
    assert float(g0.abs().max()) > 0
    _assert_grad_close(g1, g0)
    for a in range(3):
        assert s0[a]["n_compared"] == 0 and s0[a]["is_ratio_mean"] == 1.0 and s0[a]["is_capped_frac"] == 0.0
        # the zero-advantage row of adapter 2 is not forwarded, so it is neither scored nor compared
        assert s1[a]["n_compared"] == s1[a]["n_scored"] > 0
        assert s1[a]["is_capped_frac"] == 0.0
        assert s1[a]["is_ratio_mean"] == pytest.approx(1.0, rel=0, abs=2 * LP64)
        # each term -adv * w * logp / n moves by |adv| |logp| |w - 1| / n: |advantage| <= 2, |logp| < 20 (log V / T
        # is 15.4 for the near-uniform tiny model)
        assert s1[a]["loss"] == pytest.approx(s0[a]["loss"], rel=0, abs=2 * LP64 * 2.0 * 20.0)
    pooled = train_means(s1)
    assert pooled["train/is_capped_frac"] == 0.0
    assert pooled["train/is_ratio_mean"] == pytest.approx(1.0, rel=0, abs=2 * LP64)


@pytest.mark.parametrize("coeff", [0.0, 0.05])
def test_ratios_above_the_cap_are_truncated_and_the_entropy_term_is_not_weighted(coeff):
    eng = tiny_engine(dtype="float64", entropy_coeff=coeff, importance_sampling_cap=CAP)
    samples, ratios = _with_ratios(eng, _samples())
    stats, g = _engine_gradient(eng, samples)
    want, losses = _reference_gradient(eng, samples, [None if r is None else [min(x, CAP) for x in r]
                                                      for r in ratios], coeff)
    _assert_grad_close(g, want)
    # the weights matter: the unweighted gradient is far off
    plain, _ = _reference_gradient(eng, samples, [None] * len(samples), coeff)
    assert float((plain - want).abs().max()) > 1e-3 * float(want.abs().max())
    for a in range(3):
        # forwarded rows: every row with the entropy bonus, else the non-zero advantage ones
        mine = [(s, r) for s, r in zip(samples, ratios) if s.adapter_id == a and (coeff > 0 or s.advantage != 0)]
        compared = [x for _, r in mine if r is not None for x in r]
        assert stats[a]["n_scored"] == sum(len(s.completion_ids) for s, _ in mine)
        assert stats[a]["n_compared"] == len(compared)
        if compared:  # a ratio of 3 is off by 3 x its log's rounding, two log-probs' worth
            assert stats[a]["is_capped_frac"] == sum(x > CAP for x in compared) / len(compared)
            assert stats[a]["is_ratio_mean"] == pytest.approx(sum(compared) / len(compared), rel=0, abs=6 * LP64)
        else:  # adapter 2 without the bonus: its compared row has advantage 0 and is not forwarded
            assert (stats[a]["is_capped_frac"], stats[a]["is_ratio_mean"]) == (0.0, 1.0)
        assert stats[a]["loss"] == pytest.approx(losses[a], rel=0, abs=sum_tol(torch.float64, K_TINY_GRAD, 10.0))
    assert 0 < stats[0]["is_capped_frac"] < 1

    # cap <= 0: no correction (the plain gradient), the ratios still measured, nothing counted as capped
    eng.cfg.importance_sampling_cap = 0.0
    off, g_off = _engine_gradient(eng, samples)
    _assert_grad_close(g_off, plain)
    for a in range(3):
        assert off[a]["is_capped_frac"] == 0.0
        assert off[a]["is_ratio_mean"] == pytest.approx(stats[a]["is_ratio_mean"], rel=0, abs=6 * LP64)


def test_replica_shares_merge_the_importance_statistics_weighted_by_compared_tokens():
    """ReplicatedEngine's merge: a share with no compared token of an adapter (or none of its samples) weighs
    nothing, and a mean over no token stays the engine's (ratio 1.0), not 0."""
    eng = tiny_engine(dtype="float64")
    samples, _ = _with_ratios(eng, _samples(), skip=(3, 4))
    whole, g_whole = _engine_gradient(eng, samples)
    totals = {a: {"n_tokens": st["n_tokens"], "n_samples": st["n_samples"]} for a, st in whole.items()}
    counts = {a: t["n_tokens"] for a, t in totals.items()}
    eng.optimizer.zero_grad()
    # share 1: adapter 0's first row, adapter 2's uncompared row, adapter 1's uncompared row; share 2: the rest
    parts = [share_stats(eng.accumulate_gradients([samples[k] for k in share], counts), totals)
             for share in ((0, 3, 4), (1, 2, 5))]
    g_parts = _grads(eng)
    eng.optimizer.zero_grad()
    _assert_grad_close(g_parts, g_whole)
    assert parts[0][2]["n_compared"] == 0 and parts[0][2]["is_ratio_mean"] == 1.0
    merged = merge_stats(parts)
    for a in range(3):
        for k in ("n_tokens", "n_samples", "n_scored", "n_compared"):
            assert merged[a][k] == whole[a][k], (a, k)
        assert merged[a]["is_capped_frac"] == pytest.approx(whole[a]["is_capped_frac"], rel=0, abs=1e-15)
        for k in ("is_ratio_mean", "logprob_mismatch", "loss"):
            assert merged[a][k] == pytest.approx(whole[a][k], rel=0, abs=sum_tol(torch.float64, K_TINY_GRAD, 10.0))
    assert merged[2]["n_compared"] == 0 and merged[2]["is_ratio_mean"] == 1.0  # adapter 2: its only row skipped
    assert whole[2]["is_ratio_mean"] == 1.0


def test_merge_stats_sums_each_count_once():
    """n_compared weighs three means; it must still be summed once over the replicas."""
    def part(n_compared, capped, ratio):
        return {0: {"loss": 0.0, "grad_norm": 0.0, "n_tokens": 10, "n_samples": 2, "entropy": 1.0,
                    "logprob_mismatch": 0.1, "is_capped_frac": capped, "is_ratio_mean": ratio, "n_scored": 5,
                    "n_compared": n_compared}}
    merged = merge_stats([part(4, 0.5, 1.5), part(0, 0.0, 1.0), part(2, 1.0, 3.0)])[0]
    assert merged["n_compared"] == 6 and merged["n_scored"] == 15
    assert merged["is_capped_frac"] == pytest.approx((0.5 * 4 + 1.0 * 2) / 6)
    assert merged["is_ratio_mean"] == pytest.approx((1.5 * 4 + 3.0 * 2) / 6)
    assert merge_stats([part(0, 0.0, 1.0), part(0, 0.0, 1.0)])[0]["is_ratio_mean"] == 1.0


def test_step_metrics_log_the_capped_share_pooled_and_per_member(tmp_path):
    """Through stages.update (TrainSamples from Completions) to metrics.jsonl's names: train/is_capped_frac,
    train/is_ratio_mean and member/<id>/is_capped_frac; a member whose samples carry no sampler log-probs has none."""
    from lorapop.diagnostics.coverage import CoverageConfig, CoverageTracker
    from lorapop.train.rating import Ratings

    eng = tiny_engine(n_adapters=2)
    t0, s0 = Member("t0", 0, "teacher"), Member("s0", 1, "student")
    plain = _samples()[:3]
    shifted, ratios = _with_ratios(eng, [TrainSample(s.prompt_ids, s.completion_ids, 0, 1.0, T) for s in plain],
                                   skip=())
    batch = []
    for k, s in enumerate(shifted):  # rewards 0, 1, 3 in each TRR++ group: every advantage non-zero
        batch.append(stages.Rollout(t0, "teacher", "code_o", s.prompt_ids, Completion(
            s.prompt_ids, s.completion_ids, "", "eos", s.sampler_logprobs, T), reward=(0.0, 1.0, 3.0)[k]))
        batch.append(stages.Rollout(s0, "student", "code_o", s.prompt_ids, Completion(
            s.prompt_ids, s.completion_ids, "", "eos", None, T), reward=(0.0, 1.0, 3.0)[k]))
    stats = stages.update(eng, batch)
    compared = [x for r in ratios for x in r]
    want = sum(x > CAP for x in compared) / len(compared)
    assert stats[0]["is_capped_frac"] == want and stats[1]["n_compared"] == 0
    ratings = Ratings()
    for m in (t0, s0):
        ratings.add(m.id)
    result = stages.StepResult(1, (t0, s0), (), (), tuple(batch), stats, (), {})
    m = step_metrics(result, [], ratings, CoverageTracker(CoverageConfig(), run_dir=tmp_path), ["code_o"])
    assert m["member/t0/is_capped_frac"] == want
    assert m["train/is_capped_frac"] == pytest.approx(want, rel=1e-15)  # pooled: x n_compared / n_compared
    assert m["train/is_ratio_mean"] == pytest.approx(sum(compared) / len(compared), rel=0, abs=1e-4)
    assert "member/s0/is_capped_frac" not in m and "member/s0/logprob_mismatch" not in m
    assert "member/s0/entropy" in m
