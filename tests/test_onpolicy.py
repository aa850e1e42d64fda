"""On-policy updates and AZR's regularizers (docs/METHOD.md, "On-policy updates").

The sampler reports the log-probability of each token it drew under the distribution it drew it from
(Completion.logprobs); the update scores every trained token at its sample's temperature, so the two agree up to
float rounding, and train_step reports the mean |difference| (logprob_mismatch). The entropy bonus
(engine.entropy_coeff) pushes the gradient towards higher entropy."""

from __future__ import annotations

import math

import pytest
import torch

from floattol import sum_tol
from test_engine_helpers import (K_REAL, K_TINY, K_TINY_GRAD, REAL_LOGIT_SCALE, VOCAB, engine_logits, logprob_atol,
                                 tiny_engine)
from lorapop.engine import EngineConfig, SamplingParams, TorchEngine, TrainSample
from lorapop.engine.replicas import merge_stats, share_stats
from lorapop.records.members import Member
from lorapop.train import stages
from lorapop.train.metrics import train_means

T = 0.7


def mismatch_atol(k: int, logit_scale: float, temperature: float) -> float:
    """Sampler (KV-cached decode, one position at a time) and update (one forward over the whole row) compute the
    same log-probability at ``temperature``: a logit's rounding (reduction length ``k``, logits up to
    ``logit_scale``), magnified 1 / temperature by the division, plus the log-sum-exp's (tests/floattol.py)."""
    return logprob_atol(k, logit_scale / temperature)


def _prompts(eng):
    return [eng.chat_prompt("hello"), eng.chat_prompt("add two numbers in python please"), [1, 5, 9]]


def _reference_logprobs(eng, prompt, tokens, adapter, temperature):
    logits = engine_logits(eng, prompt + tokens, adapter)[len(prompt) - 1:-1] / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def _samples(comps, adapters, advantages):
    return [TrainSample(c.prompt_ids, c.token_ids, a, adv, c.temperature, c.logprobs)
            for c, a, adv in zip(comps, adapters, advantages)]


def _peaked_engine(**kw):
    """The tiny engine with its (tied) embeddings scaled 30x: the random tiny Llama's logits are under 1, so its
    next-token entropy sits within 1e-3 of log V with nothing to raise; scaled, it is ~5.5 nats."""
    eng = tiny_engine(**kw)
    with torch.no_grad():
        eng.model.get_output_embeddings().weight.mul_(30.0)
    return eng


def _logit_scale(eng, samples) -> float:
    return max(float(engine_logits(eng, s.prompt_ids + s.completion_ids, s.adapter_id).abs().max()) for s in samples)


def test_completion_logprobs_are_the_tempered_distribution_the_tokens_were_drawn_from():
    eng = tiny_engine()
    prompts = _prompts(eng)
    comps = eng.generate(prompts, [0, 1, -1], SamplingParams(max_new_tokens=10, temperature=T), seeds=[1, 2, 3])
    for p, c, a in zip(prompts, comps, [0, 1, -1]):
        assert c.temperature == T and len(c.logprobs) == len(c.token_ids) == 10
        ref = _reference_logprobs(eng, p, c.token_ids, a, T)
        torch.testing.assert_close(torch.tensor(c.logprobs), ref, rtol=0, atol=mismatch_atol(K_TINY, 1.0, T))
    # greedy: drawn from no distribution; the raw (temperature 1, whole vocabulary) log-prob, as vLLM reports it
    g = eng.generate(prompts[:1], [0], SamplingParams(max_new_tokens=6, greedy=True))[0]
    assert g.temperature == 0.0
    torch.testing.assert_close(torch.tensor(g.logprobs), _reference_logprobs(eng, prompts[0], g.token_ids, 0, 1.0),
                               rtol=0, atol=mismatch_atol(K_TINY, 1.0, 1.0))
    # a nucleus cut renormalises over the kept tokens: every log-prob rises above the whole vocabulary's
    cut = eng.generate(prompts[:1], [0], SamplingParams(max_new_tokens=6, temperature=T, top_p=0.5), seeds=[4])[0]
    rise = torch.tensor(cut.logprobs) - _reference_logprobs(eng, prompts[0], cut.token_ids, 0, T)
    atol = mismatch_atol(K_TINY, 1.0, T)
    assert (rise > atol).all() and (rise <= math.log(2) + atol).all()  # -log(kept mass), kept mass in [0.5, 1)


def test_the_update_scores_each_sample_at_its_sampling_temperature_through_the_production_path():
    """stages.update builds the TrainSamples (temperature and sampler log-probs from each Completion); the mismatch
    it reports, per adapter and pooled as train/logprob_mismatch, is rounding. Scored at temperature 1 (as the update
    once did), or sampled inside a nucleus, the same tokens are far off: the statistic sees an off-policy update."""
    eng = _peaked_engine(n_adapters=2)  # far from uniform, so the temperature changes every log-prob
    prompts = _prompts(eng)
    comps = eng.generate(prompts * 2, [0, 0, 0, 1, 1, 1], SamplingParams(max_new_tokens=8, temperature=T),
                         seeds=list(range(6)))
    atol = mismatch_atol(K_TINY, _logit_scale(eng, _samples(comps, [0, 0, 0, 1, 1, 1], [0.0] * 6)), T)
    members = [Member("t0", 0, "teacher"), Member("s0", 1, "student")]
    # rewards 0, 1, 3 in each TRR++ group: no advantage is 0, so every row is scored
    batch = [stages.Rollout(members[k // 3], members[k // 3].role, "code_o", c.prompt_ids, c,
                            reward=(0.0, 1.0, 3.0)[k % 3]) for k, c in enumerate(comps)]
    stats = stages.update(eng, batch)
    for a in (0, 1):
        n = sum(len(c.token_ids) for c in comps[3 * a:3 * a + 3])
        assert stats[a]["n_compared"] == stats[a]["n_scored"] == n
        assert stats[a]["logprob_mismatch"] <= atol
        # the importance ratio exp(update's - sampler's) is 1 up to that rounding: the cap truncates nothing
        assert stats[a]["is_capped_frac"] == 0.0 and abs(stats[a]["is_ratio_mean"] - 1.0) <= 2 * atol
    pooled = train_means(stats)
    assert pooled["train/logprob_mismatch"] <= atol and pooled["train/entropy"] > 0
    assert pooled["train/is_capped_frac"] == 0.0 and abs(pooled["train/is_ratio_mean"] - 1.0) <= 2 * atol

    eng = _peaked_engine(n_adapters=2)  # fresh weights: the update above moved them
    at_one = [TrainSample(c.prompt_ids, c.token_ids, 0, 1.0, 1.0, c.logprobs) for c in comps[:3]]
    assert eng.accumulate_gradients(at_one)[0]["logprob_mismatch"] > 100 * atol
    cut = eng.generate(prompts, [0] * 3, SamplingParams(max_new_tokens=8, temperature=T, top_p=0.5), seeds=[0, 1, 2])
    assert eng.accumulate_gradients(_samples(cut, [0] * 3, [1.0] * 3))[0]["logprob_mismatch"] > 100 * atol


@pytest.mark.slow
def test_real_model_update_logprobs_equal_the_samplers():
    """The issue's test on the embedded SmolLM2-135M (float32, CPU): tokens sampled at 0.7 through the engine, the
    update's log-probs of them against the sampler's, per token and as the step's logged mean."""
    from lorapop.model import load_base_model

    model, tok = load_base_model("embedded")
    eng = TorchEngine(model, tok, 2, EngineConfig(device="cpu", dtype="float32", lr=1e-3), seed=0)
    try:
        prompts = [eng.chat_prompt("Write a Python function that adds two numbers."),
                   eng.chat_prompt("What is 12 * 7?")]
        comps = eng.generate(prompts * 2, [0, 0, 1, 1], SamplingParams(max_new_tokens=24, temperature=T),
                             seeds=[5, 6, 7, 8])
        atol = mismatch_atol(K_REAL, REAL_LOGIT_SCALE, T)
        update = eng.token_logprobs([c.prompt_ids for c in comps], [c.token_ids for c in comps], [0, 0, 1, 1],
                                    [c.temperature for c in comps])
        for c, lp in zip(comps, update):
            torch.testing.assert_close(torch.tensor(lp), torch.tensor(c.logprobs), rtol=0, atol=atol)
        stats = eng.train_step(_samples(comps, [0, 0, 1, 1], [1.0, -1.0, 0.5, -0.5]))
        assert all(stats[a]["n_compared"] > 0 and stats[a]["logprob_mismatch"] <= atol for a in (0, 1))
        assert train_means(stats)["train/logprob_mismatch"] <= atol
    finally:
        eng.close()


def test_train_step_refuses_a_greedy_sample_and_misaligned_sampler_logprobs():
    eng = tiny_engine()
    with pytest.raises(ValueError, match="greedy sample.*temperature > 0"):
        eng.train_step([TrainSample([1, 2], [3, 4], 0, 1.0, temperature=0.0)])
    with pytest.raises(ValueError, match="1 sampler_logprobs for 2 completion ids"):
        eng.train_step([TrainSample([1, 2], [3, 4], 0, 1.0, sampler_logprobs=[-1.0])])


def test_replica_shares_merge_into_one_engines_statistics():
    """ReplicatedEngine: each replica's share normalised by the step's token totals, merged, equals one engine."""
    eng = tiny_engine(entropy_coeff=0.01)
    prompts = _prompts(eng)
    comps = eng.generate(prompts * 2, [0, 1, 2, 0, 1, 2], SamplingParams(max_new_tokens=6, temperature=T),
                         seeds=list(range(6)))
    samples = _samples(comps, [0, 1, 2, 0, 1, 2], [1.0, 0.0, -1.0, 0.5, 2.0, 0.0])
    samples[4].sampler_logprobs = None  # a sample without the sampler's log-probs is scored, not compared
    whole = eng.accumulate_gradients(samples)
    eng.optimizer.zero_grad()
    totals = {a: {"n_tokens": st["n_tokens"], "n_samples": st["n_samples"]} for a, st in whole.items()}
    parts = [share_stats(eng.accumulate_gradients(share, {a: t["n_tokens"] for a, t in totals.items()}), totals)
             for share in (samples[:2], samples[2:])]
    eng.optimizer.zero_grad()
    merged = merge_stats(parts)
    assert whole[1]["n_scored"] == len(comps[1].token_ids) + len(comps[4].token_ids)
    assert merged[1]["n_compared"] == whole[1]["n_compared"] == len(comps[1].token_ids)
    for a in range(3):
        for k in ("n_tokens", "n_samples", "n_scored", "n_compared"):
            assert merged[a][k] == whole[a][k]
        # the same terms from rows batched differently: each log-prob within logprob_atol, weights up to |adv| = 2
        for k in ("loss", "entropy", "logprob_mismatch", "is_ratio_mean"):
            assert merged[a][k] == pytest.approx(whole[a][k], rel=0, abs=2 * logprob_atol(K_TINY))
        assert merged[a]["is_capped_frac"] == whole[a]["is_capped_frac"] == 0.0  # on-policy: nothing capped


# ---- the entropy bonus ----------------------------------------------------------------------------------------------
def _flat_grads(eng):
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in eng._params])


def _entropy_gradient(eng, samples):
    """Gradient of each adapter's token-mean entropy at the samples' temperatures, straight from autograd."""
    eng.optimizer.zero_grad()
    n = {a: sum(len(s.completion_ids) for s in samples if s.adapter_id == a) for a in {s.adapter_id for s in samples}}
    with eng.checkpointing():
        (_, ent), row_t = eng.response_logprobs([s.prompt_ids for s in samples], [s.completion_ids for s in samples],
                                                 [s.adapter_id for s in samples], [s.temperature for s in samples],
                                                 entropy=True)
        inv = torch.tensor([1.0 / n[s.adapter_id] for s in samples])[row_t]
        (ent * inv).sum().backward()
    g = _flat_grads(eng)
    eng.optimizer.zero_grad()
    return g


def test_entropy_bonus_gradient_points_up_the_entropy_gradient():
    """With zero advantages the update's gradient is exactly -entropy_coeff times the entropy's gradient (the loss
    descends where entropy rises); without the bonus zero-advantage rows move nothing."""
    coeff = 0.05
    eng = _peaked_engine(entropy_coeff=coeff)
    comps = eng.generate(_prompts(eng)[:2], [0, 1], SamplingParams(max_new_tokens=8, temperature=T), seeds=[1, 2])
    samples = _samples(comps, [0, 1], [0.0, 0.0])
    g_h = _entropy_gradient(eng, samples)
    eng.optimizer.zero_grad()
    stats = eng.accumulate_gradients(samples)
    g = _flat_grads(eng)
    assert float(g @ g_h) < 0 and float(g_h.norm()) > 0
    scale = float(g.abs().max())
    assert float((g + coeff * g_h).abs().max()) <= sum_tol(torch.float32, K_TINY_GRAD) * scale
    n = stats[0]["n_scored"]  # the loss sums -coeff * H / n over n tokens, the entropy H over them, then / n
    assert stats[0]["loss"] == pytest.approx(-coeff * stats[0]["entropy"], rel=0,
                                             abs=sum_tol(torch.float32, n, coeff * stats[0]["entropy"]))

    eng.cfg.entropy_coeff = 0.0
    eng.optimizer.zero_grad()
    assert eng.accumulate_gradients(samples)[0]["n_scored"] == 0  # not even forwarded
    # nothing accumulated: gradients stay unset, or zero where the engine keeps them allocated for the run
    assert all(p.grad is None or not p.grad.any() for p in eng._params)


def test_entropy_is_measured_at_the_scoring_temperature():
    eng = _peaked_engine()
    comps = eng.generate(_prompts(eng)[:1], [0], SamplingParams(max_new_tokens=8, temperature=T), seeds=[1])
    samples = _samples(comps, [0], [1.0])
    stats = eng.accumulate_gradients(samples)
    eng.optimizer.zero_grad()
    s = samples[0]
    z = engine_logits(eng, s.prompt_ids + s.completion_ids, 0)[len(s.prompt_ids) - 1:-1] / T
    want = float(-(z.softmax(-1) * z.log_softmax(-1)).sum(-1).mean())
    scale = _logit_scale(eng, samples) / T
    assert stats[0]["entropy"] == pytest.approx(want, rel=0, abs=logprob_atol(K_TINY, scale) +
                                                sum_tol(torch.float32, VOCAB, scale))
    at_one = float(-(z * T).softmax(-1).mul((z * T).log_softmax(-1)).sum(-1).mean())
    assert abs(at_one - want) > 0.1  # the temperature matters: a test that ignored it would fail


def test_one_step_with_the_entropy_bonus_and_zero_advantage_raises_the_adapters_entropy():
    # AdamW's first step moves every weight by about lr whatever its gradient's size: 1e-4 keeps that step in the
    # first-order regime, where it raises the entropy (at 1e-3 it overshoots and lowers it for some prompts)
    eng = _peaked_engine(entropy_coeff=0.01, lr=1e-4)
    comps = eng.generate(_prompts(eng)[:2], [0, 1], SamplingParams(max_new_tokens=8, temperature=1.0), seeds=[1, 2])
    samples = _samples(comps, [0, 1], [0.0, 0.0])
    untouched = eng.get_adapter(2)
    before = eng.accumulate_gradients(samples)
    eng.optimizer.zero_grad()
    eng.train_step(samples)
    after = eng.accumulate_gradients(samples)
    eng.optimizer.zero_grad()
    scale = _logit_scale(eng, samples)
    tol = 2 * (logprob_atol(K_TINY, scale) + sum_tol(torch.float32, VOCAB, scale))  # two evaluations' rounding
    for a in (0, 1):
        assert after[a]["entropy"] - before[a]["entropy"] > tol, (a, before[a]["entropy"], after[a]["entropy"], tol)
    assert all(torch.equal(x, y) for n in untouched for x, y in zip(untouched[n], eng.get_adapter(2)[n]))


def test_weight_decay_and_entropy_coeff_reach_the_engine_and_bad_values_are_refused():
    eng = tiny_engine(weight_decay=0.01, entropy_coeff=0.001)
    assert eng.optimizer.weight_decay == 0.01 and eng.cfg.entropy_coeff == 0.001
    for name in ("weight_decay", "entropy_coeff"):
        with pytest.raises(ValueError, match=f"engine.{name}: must be >= 0"):
            EngineConfig(**{name: -0.1}).validate()
