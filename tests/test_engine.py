"""TorchEngine on a tiny random Llama with the real tokenizer: generation, log-probs, training, adapter ops,
errors (fast). The real embedded model is covered in test_engine_integration.py."""

from __future__ import annotations

import pytest
import torch

from floattol import sum_tol
from test_engine_helpers import K_TINY_GRAD, assert_greedy_agrees, logprob_atol, randomize_adapters, tiny_engine
from lorapop.engine import Engine, EngineConfig, SamplingParams, TorchEngine, TrainSample
from lorapop.engine.torch_engine import resolve_device


@pytest.fixture
def eng():
    return tiny_engine()


def _prompts(eng):
    return [eng.chat_prompt("hello"), eng.chat_prompt("add two numbers in python please"), [1, 5, 9]]


def _full_logprobs(eng, prompt, completion, adapter):
    """Reference: log_softmax of the model's own full logits under the engine's LoRA context."""
    eng._ctx.set(torch.tensor([adapter]))
    try:
        with torch.no_grad():
            logits = eng.model(input_ids=torch.tensor([prompt + completion])).logits[0].float()
    finally:
        eng._ctx.set(None)
    lp = logits.log_softmax(-1)
    return [float(lp[len(prompt) - 1 + t, tok]) for t, tok in enumerate(completion)]


def test_engine_satisfies_protocol_and_resolves_device(eng):
    assert isinstance(eng, Engine)
    assert eng.cfg.device == "cpu" and eng.device == torch.device("cpu")  # tiny_engine asks for the CPU
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert EngineConfig().device == "auto"
    assert all("help" in f.metadata for f in EngineConfig.__dataclass_fields__.values())
    assert eng.module_names[0] == "model.layers.0.self_attn.q_proj" and len(eng.module_names) == 2 * 7
    assert all(p.dtype == torch.float32 for p in eng._params)


def test_chat_prompt_uses_the_template_with_generation_prompt(eng):
    ids = eng.chat_prompt("hi", system="be brief")
    text = eng.tokenizer.decode(ids)
    assert "be brief" in text and "hi" in text and text.rstrip().endswith("<|im_start|>assistant")


def test_greedy_batch_with_left_padding_equals_each_row_alone(eng):
    prompts = _prompts(eng)
    ids = [0, 2, -1]
    p = SamplingParams(max_new_tokens=6, greedy=True)
    batch = eng.generate(prompts, ids, p)
    for k in range(3):
        alone = eng.generate([prompts[k]], [ids[k]], p)[0]
        assert_greedy_agrees(batch[k].token_ids, alone.token_ids, eng, prompts[k], ids[k])
        assert batch[k].prompt_ids == prompts[k]
    # adapters really change the output (same prompt, different slots)
    outs = eng.generate([prompts[1]] * 3, [0, 1, -1], SamplingParams(max_new_tokens=6, greedy=True))
    assert len({tuple(o.token_ids) for o in outs}) > 1


def test_base_rows_match_hf_generate_on_the_plain_model(eng):
    prompt = _prompts(eng)[1]
    got = eng.generate([prompt, prompt], [1, -1], SamplingParams(max_new_tokens=6, greedy=True))[1]
    eng._ctx.set(None)
    ref = eng.model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=6, do_sample=False, min_new_tokens=6)
    assert_greedy_agrees(got.token_ids, ref[0, len(prompt):].tolist(), eng, prompt, -1)


def test_greedy_matches_argmax_of_token_logprobs(eng):
    prompt = _prompts(eng)[0]
    c = eng.generate([prompt], [2], SamplingParams(max_new_tokens=5, greedy=True))[0]
    ref = _full_logprobs(eng, prompt, c.token_ids, 2)
    got = eng.token_logprobs([prompt], [c.token_ids], [2])[0]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=0, atol=logprob_atol())


def test_per_row_seeds_reproduce_regardless_of_batch_partners(eng):
    prompts = _prompts(eng)
    p = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.95)
    a = eng.generate(prompts, [0, 1, 2], p, seeds=[11, 12, 13])
    b = eng.generate([prompts[1]], [1], p, seeds=[12])[0]
    assert a[1].token_ids == b.token_ids
    c = eng.generate(prompts, [0, 1, 2], p, seeds=[11, 99, 13])
    assert c[0].token_ids == a[0].token_ids and c[1].token_ids != a[1].token_ids


def test_tiny_top_p_is_greedy_and_zero_temperature_is_greedy(eng):
    prompt = _prompts(eng)[2]
    greedy = eng.generate([prompt], [0], SamplingParams(max_new_tokens=5, greedy=True))[0].token_ids
    assert eng.generate([prompt], [0], SamplingParams(max_new_tokens=5, top_p=1e-6), seeds=[3])[0].token_ids == greedy
    assert eng.generate([prompt], [0], SamplingParams(max_new_tokens=5, temperature=0.0))[0].token_ids == greedy


def test_eos_stops_a_row_and_the_others_continue_unchanged(eng):
    prompts = _prompts(eng)
    p = SamplingParams(max_new_tokens=7, greedy=True)
    free = eng.generate(prompts, [0, 1, 2], p)
    stop_tok = free[0].token_ids[2]
    eng.eos_ids = sorted(set(eng.eos_ids) | {stop_tok})  # make that token an end-of-turn token
    out = eng.generate(prompts, [0, 1, 2], p)
    assert out[0].finish_reason == "eos" and out[0].token_ids[-1] == stop_tok
    assert out[0].token_ids == free[0].token_ids[: free[0].token_ids.index(stop_tok) + 1]
    for k in (1, 2):  # rows dropped from the batch (and KV cache) do not disturb the rest
        if stop_tok not in free[k].token_ids:
            assert out[k].token_ids == free[k].token_ids and out[k].finish_reason == "length"
    forced = eng.generate(prompts[:1], [0], SamplingParams(max_new_tokens=7, greedy=True, min_new_tokens=7))[0]
    assert len(forced.token_ids) == 7 and forced.finish_reason == "length"


def test_stop_string_ends_a_row_after_it_and_the_others_continue_unchanged(eng):
    prompts = _prompts(eng)
    p = SamplingParams(max_new_tokens=8, greedy=True)
    free = eng.generate(prompts, [0, 1, 2], p)
    # A stop string ending in token j's text that the text before it does not hold: row 0 must end on token j
    # (the string may span a token boundary), text and ids kept.
    def text(n):
        return eng.tokenizer.decode(free[0].token_ids[:n], skip_special_tokens=True)
    j = next(j for j in range(2, 7) if len(text(j + 1)) >= 3 and text(j + 1)[-3:] not in text(j))
    stop = text(j + 1)[-3:]
    out = eng.generate(prompts, [0, 1, 2], SamplingParams(max_new_tokens=8, greedy=True, stop=(stop,)))
    assert out[0].finish_reason == "stop" and out[0].token_ids == free[0].token_ids[:j + 1]
    assert out[0].text.endswith(stop)
    for k in (1, 2):
        if stop not in free[k].text:
            assert out[k].token_ids == free[k].token_ids and out[k].finish_reason == free[k].finish_reason
        else:
            assert out[k].finish_reason == "stop" and stop in out[k].text
    # min_new_tokens holds the stop back as it holds EOS back
    late = eng.generate(prompts[:1], [0], SamplingParams(max_new_tokens=8, greedy=True, stop=(stop,),
                                                         min_new_tokens=6))[0]
    assert len(late.token_ids) >= 6 and late.token_ids[:6] == free[0].token_ids[:6]
    # vLLM's rule: a stop string completed while min_new_tokens held stops back is not found later either; the row
    # runs on past token j + 1 (it used to end there, one token after min_new_tokens let stops count)
    held = eng.generate(prompts[:1], [0], SamplingParams(max_new_tokens=8, greedy=True, stop=(stop,),
                                                         min_new_tokens=j + 1))[0]
    assert len(held.token_ids) > j + 1 and held.token_ids[:j + 1] == free[0].token_ids[:j + 1]


def test_gen_batch_size_splits_without_changing_results():
    eng = tiny_engine(gen_batch_size=2)
    prompts = _prompts(eng)
    p = SamplingParams(max_new_tokens=5)
    small = eng.generate(prompts, [0, 1, -1], p, seeds=[1, 2, 3])
    eng.cfg.gen_batch_size = 8
    big = eng.generate(prompts, [0, 1, -1], p, seeds=[1, 2, 3])
    assert [c.token_ids for c in small] == [c.token_ids for c in big]
    assert all(c.text == eng.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in big)


def test_token_logprobs_chunked_equals_full_logits():
    eng = tiny_engine(logprob_chunk_size=3, train_micro_batch_size=2)
    prompts = _prompts(eng)
    comps = [[5, 6, 7, 8], [9], [10, 11, 12, 13, 14, 15, 16]]
    ids = [2, -1, 0]
    got = eng.token_logprobs(prompts, comps, ids)
    for k in range(3):
        ref = _full_logprobs(eng, prompts[k], comps[k], ids[k])
        torch.testing.assert_close(torch.tensor(got[k]), torch.tensor(ref), rtol=0, atol=logprob_atol())
    assert eng.token_logprobs([[1, 2]], [[]], [0]) == [[]]


def _samples():
    return [
        TrainSample([1, 5, 9, 4], [7, 8, 9], 0, 1.0),
        TrainSample([1, 2], [3, 4, 5, 6, 7, 8], 1, -0.5),
        TrainSample([1, 5, 9, 4, 4, 4, 4], [11, 12], 0, -2.0),
        TrainSample([3], [20, 21, 22, 23], 2, 0.7),
        TrainSample([1, 3, 3], [30], 1, 1.5),
        TrainSample([2, 2, 2, 2, 2], [40, 41], 2, 0.0),
    ]


def _assert_grad_close(a, b, rel=sum_tol(torch.float32, K_TINY_GRAD), scale=None):
    """Equal up to float summation order (tests/floattol.py, over a gradient's reduction length), judged against
    ``scale`` (default: the gradient's own largest entry).

    Pass the adapter's largest gradient entry over all its parameters when one parameter's gradient is tiny next
    to the others: float32 rounding follows the activations' scale, not that parameter's."""
    if scale is None:
        scale = max(float(a.abs().max()), float(b.abs().max()), 1e-12)
    assert float((a - b).abs().max()) <= rel * scale, float((a - b).abs().max()) / scale


def _grads(eng, samples):
    eng.optimizer.zero_grad()
    stats = eng.accumulate_gradients(samples)
    return stats, [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in eng._params]


# The two identities below are algebra (a row's gradient does not depend on its batch partners or on micro-batching):
# checked in float64, the engine's numerical reference, where rounding cannot hide a real difference.
REL64 = sum_tol(torch.float64, K_TINY_GRAD)


def test_mixed_batch_gradient_equals_each_adapter_alone():
    eng = tiny_engine(train_micro_batch_size=8, dtype="float64")
    samples = _samples()
    _, mixed = _grads(eng, samples)
    for a in range(3):
        stats, alone = _grads(eng, [s for s in samples if s.adapter_id == a])
        scale = max(float(ga[a].abs().max()) for ga in alone)
        for gm, ga in zip(mixed, alone):
            assert gm.dtype == torch.float64
            _assert_grad_close(gm[a], ga[a], rel=REL64, scale=scale)
            assert torch.count_nonzero(ga[[b for b in range(3) if b != a]]) == 0
        assert any(torch.count_nonzero(g[a]) > 0 for g in mixed)


def test_micro_batching_does_not_change_gradients():
    eng = tiny_engine(train_micro_batch_size=6, dtype="float64")
    _, big = _grads(eng, _samples())
    eng.cfg.train_micro_batch_size = 1
    eng.cfg.logprob_chunk_size = 2
    _, small = _grads(eng, _samples())
    for a, b in zip(big, small):
        _assert_grad_close(a, b, rel=REL64)


def test_loss_is_token_mean_of_minus_advantage_logp_per_adapter():
    eng = tiny_engine()
    samples = _samples()
    lps = eng.token_logprobs([s.prompt_ids for s in samples], [s.completion_ids for s in samples],
                             [s.adapter_id for s in samples])
    stats = eng.train_step(samples)
    for a in range(3):
        mine = [(s, lp) for s, lp in zip(samples, lps) if s.adapter_id == a]
        n_tok = sum(len(s.completion_ids) for s, _ in mine)
        want = sum(-s.advantage * sum(lp) for s, lp in mine) / n_tok
        assert stats[a]["n_tokens"] == n_tok and stats[a]["n_samples"] == len(mine)
        # a weighted mean of log-probabilities: each within logprob_atol, weights up to |advantage|
        tol = logprob_atol() * max(abs(s.advantage) for s, _ in mine)
        assert stats[a]["loss"] == pytest.approx(want, rel=0, abs=tol)
        assert stats[a]["grad_norm"] > 0
    assert set(stats[0]) == {"loss", "grad_norm", "n_tokens", "n_samples", "entropy", "logprob_mismatch",
                             "is_capped_frac", "is_ratio_mean", "n_scored", "n_compared"}
    # no sampler log-probs on these samples: scored (non-zero advantage rows), compared with nothing
    assert stats[2]["n_scored"] == 4 and stats[2]["n_compared"] == 0 and stats[2]["logprob_mismatch"] == 0.0
    assert stats[2]["is_capped_frac"] == 0.0 and stats[2]["is_ratio_mean"] == 1.0


def test_train_step_updates_only_the_adapters_present_and_improves_them():
    eng = tiny_engine(n_adapters=4, lr=1e-2)
    before = {i: eng.get_adapter(i) for i in range(4)}
    s = [TrainSample([1, 5, 9], [7, 8, 9], 1, 1.0), TrainSample([1, 5, 9], [7, 8, 9], 3, -1.0)]
    lp0 = eng.token_logprobs([[1, 5, 9]] * 2, [[7, 8, 9]] * 2, [1, 3])
    for _ in range(3):
        eng.train_step(s)
    lp1 = eng.token_logprobs([[1, 5, 9]] * 2, [[7, 8, 9]] * 2, [1, 3])
    assert sum(lp1[0]) > sum(lp0[0]) and sum(lp1[1]) < sum(lp0[1])  # +advantage up, -advantage down
    for i in (0, 2):
        assert all(torch.equal(before[i][n][0], a) and torch.equal(before[i][n][1], b)
                   for n, (a, b) in eng.get_adapter(i).items())
    assert eng.optimizer.step_count.tolist() == [0, 3, 0, 3]
    assert all(not p.grad.any() for p in eng._params)  # zeroed in place: resident for the run, as planned


def test_grad_clip_is_per_adapter():
    eng = tiny_engine(max_grad_norm=1e-3, lr=1e-3)
    eng.optimizer.zero_grad()
    eng.accumulate_gradients([TrainSample([1, 2], [3, 4], 0, 100.0), TrainSample([1, 2], [3, 4], 1, 1e-6)])
    norms = eng.optimizer.grad_norms()
    assert norms[0] > 1e-3 > norms[1] > 0
    stats = eng.train_step([TrainSample([1, 2], [3, 4], 0, 100.0), TrainSample([1, 2], [3, 4], 1, 1e-6)])
    assert stats[0]["grad_norm"] == pytest.approx(float(norms[0]), rel=1e-4)


def test_adapter_ops_get_set_reset(eng):
    prompt = _prompts(eng)[1]
    comp = [5, 6, 7]
    w = eng.get_adapter(0)
    w[next(iter(w))][0].add_(1.0)  # a copy: editing it leaves the engine alone
    assert not torch.equal(w[next(iter(w))][0], eng.get_adapter(0)[next(iter(w))][0])
    eng.set_adapter(1, eng.get_adapter(0))
    assert eng.token_logprobs([prompt], [comp], [1]) == eng.token_logprobs([prompt], [comp], [0])
    eng.set_adapter(2, eng.get_adapter(0))
    assert eng.token_logprobs([prompt], [comp], [2]) == eng.token_logprobs([prompt], [comp], [0])
    eng.reset_adapter(2, seed=5)
    assert all(torch.count_nonzero(b) == 0 for _, b in eng.get_adapter(2).values())
    base = eng.token_logprobs([prompt], [comp], [-1])
    assert eng.token_logprobs([prompt], [comp], [2]) == base  # B = 0: exactly the base model
    a5 = eng.get_adapter(2)
    eng.reset_adapter(2, seed=5)
    assert all(torch.equal(a5[n][0], a) for n, (a, _) in eng.get_adapter(2).items())


def test_reset_optimizer(eng):
    eng.train_step([TrainSample([1, 2], [3, 4], 0, 1.0), TrainSample([1, 2], [3, 4], 1, 1.0)])
    eng.reset_optimizer(0)
    assert eng.optimizer.step_count.tolist() == [0, 1, 0]
    assert all(torch.count_nonzero(m[0]) == 0 for m in eng.optimizer.exp_avg)
    assert eng.optimizer.step_count[1] == 1


def test_state_dict_roundtrip_restores_adapters_and_optimizer(eng):
    eng.train_step([TrainSample([1, 2], [3, 4], 0, 1.0)])
    state = eng.state_dict()
    other = tiny_engine(seed=0, randomize=False)
    randomize_adapters(other, seed=9)
    other.load_state_dict(state)
    prompt = _prompts(eng)[0]
    assert other.token_logprobs([prompt] * 3, [[5, 6]] * 3, [0, 1, 2]) == eng.token_logprobs(
        [prompt] * 3, [[5, 6]] * 3, [0, 1, 2])
    # the optimizer continues identically
    s = [TrainSample([1, 2], [3, 4], 0, 1.0)]
    eng.train_step(s)
    other.train_step(s)
    assert all(torch.equal(a, b) for a, b in zip(eng._params, other._params))
    with pytest.raises(ValueError, match="adapters"):
        tiny_engine(n_adapters=2).load_state_dict(state)


def test_bad_inputs_raise_clear_errors(eng):
    p = SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError, match="empty prompt list"):
        eng.generate([], [], p)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        eng.generate([[1], []], [0, 0], p)
    with pytest.raises(IndexError, match="adapter index 3 out of range"):
        eng.generate([[1]], [3], p)
    with pytest.raises(IndexError, match="out of range"):
        eng.generate([[1]], [-2], p)
    with pytest.raises(ValueError, match="2 prompts but 1 adapter_ids"):
        eng.generate([[1], [2]], [0], p)
    with pytest.raises(IndexError, match="out of range"):
        eng.get_adapter(7)
    with pytest.raises(IndexError, match="out of range"):
        eng.train_step([TrainSample([1], [2], -1, 1.0)])
    with pytest.raises(ValueError, match="no samples"):
        eng.train_step([])
    with pytest.raises(ValueError, match="empty prompt list"):
        eng.token_logprobs([], [], [])
    w = eng.get_adapter(0)
    bad = {n: (torch.zeros(2, a.shape[1]), torch.zeros(b.shape[0], 2)) for n, (a, b) in w.items()}
    with pytest.raises(ValueError, match="rank mismatch"):
        eng.set_adapter(0, bad)
    w.pop(next(iter(w)))
    with pytest.raises(KeyError, match="lacks 1"):
        eng.set_adapter(0, w)


def test_wrong_target_module_in_config_is_named():
    from test_engine_helpers import tiny_llama

    model, tok = tiny_llama()
    with pytest.raises(ValueError, match="unknown LoRA target module 'qkv_proj'"):
        TorchEngine(model, tok, 2, EngineConfig(target_modules=["q_proj", "qkv_proj"], device="cpu"))


def test_close_restores_the_plain_model():
    eng = tiny_engine()
    prompt = _prompts(eng)[0]
    base = eng.token_logprobs([prompt], [[5, 6]], [-1])[0]
    eng.close()
    with torch.no_grad():
        lp = eng.model(input_ids=torch.tensor([prompt + [5, 6]])).logits[0].log_softmax(-1)
    ref = [float(lp[len(prompt) - 1, 5]), float(lp[len(prompt), 6])]
    torch.testing.assert_close(torch.tensor(base), torch.tensor(ref), rtol=0, atol=logprob_atol())
    assert not any(type(m).__name__ == "MultiLoRALinear" for m in eng.model.modules())


def test_mixed_decode_equals_each_adapter_alone_and_follows_weight_changes(eng):
    prompts = [eng.chat_prompt("hello there"), eng.chat_prompt("a b c")] * 3
    ids = [0, 1, 2, -1, 1, 0]  # mixed adapters and a base row: decode takes the masked all-adapter path
    params = SamplingParams(max_new_tokens=8, greedy=True)

    def check():
        mixed = eng.generate(prompts, ids, params)
        for k, (p, a) in enumerate(zip(prompts, ids)):
            assert mixed[k].token_ids == eng.generate([p], [a], params)[0].token_ids  # alone: the uniform path

    check()
    randomize_adapters(eng, seed=7, slots=[1])  # the stacked-B cache must notice the new weights
    check()
    eng.train_step([TrainSample(prompts[0], [5, 6, 7], 2, 1.0)])  # and an optimizer step
    check()


@pytest.mark.parametrize("counts,size", [([4, 4, 4, 4], 8), ([8, 7], 8), ([3, 1, 5], 4), ([2, 2, 2], 2),
                                         ([5], 3), ([1, 1, 1, 1, 1], 3)])
def test_train_micro_batches_are_bounded_complete_and_balanced(counts, size):
    from types import SimpleNamespace

    from lorapop.engine.scoring import train_micro_batches

    g = torch.Generator().manual_seed(sum(counts) + size)
    work = [SimpleNamespace(adapter_id=a, prompt_ids=[0] * int(torch.randint(1, 9, (), generator=g)),
                            completion_ids=[1] * int(torch.randint(1, 9, (), generator=g)))
            for a, c in enumerate(counts) for _ in range(c)]
    mbs = train_micro_batches(list(reversed(work)), size)
    assert sorted(id(s) for mb in mbs for s in mb) == sorted(id(s) for s in work)  # every row exactly once
    for mb in mbs:
        assert 1 <= len(mb) <= size
        ids = [s.adapter_id for s in mb]
        assert ids == sorted(ids)  # contiguous runs
        per = [ids.count(a) for a in set(ids)]
        assert len(set(per)) == 1  # the same number of rows from every adapter present


def test_train_micro_batches_fill_up_with_equal_lengths_and_keep_long_and_short_rows_apart():
    from types import SimpleNamespace

    from lorapop.engine.scoring import train_micro_batches

    def row(a, n):
        return SimpleNamespace(adapter_id=a, prompt_ids=[0] * n, completion_ids=[1])

    same = [row(a, 50) for a in range(8) for _ in range(2)]
    mbs = train_micro_batches(same, 16)
    assert len(mbs) == 1 and [s.adapter_id for s in mbs[0]] == sorted(a for a in range(8) for _ in range(2))
    # teachers (slots 0-3) with ~400-token rows, students (4-7) with ~100: mixing them would pad students 4x
    mixed = [row(a, (400 if a < 4 else 100) + i) for a in range(8) for i in range(6)]
    mbs = train_micro_batches(mixed, 8)
    for mb in mbs:
        assert len({s.adapter_id < 4 for s in mb}) == 1
    assert sum(len(mb) for mb in mbs) == 48 and max(len(mb) for mb in mbs) == 8
