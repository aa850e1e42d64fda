"""The update's shared prompts (engine.share_prompts, scoring.layout_rows): the samples of one (adapter, prompt) in
one packed row give the gradients, losses and statistics of one row per sample, and packing is taken only where it
computes fewer positions."""

from __future__ import annotations

import pytest
import torch

from floattol import sum_tol
from test_engine_helpers import K_TINY_GRAD, tiny_engine
from lorapop.engine import TrainSample
from lorapop.engine.scoring import layout_rows, train_micro_batches

# float64, the engine's numerical reference: packing is algebra (the same terms, summed in another order), so any
# difference above rounding over a gradient's reduction length is a real one.
REL64 = sum_tol(torch.float64, K_TINY_GRAD)


def _groups():
    """Three prompts answered 4, 3 and 1 times by adapters 0 and 1, completions of different lengths (one empty,
    which the update skips), advantages of both signs."""
    p1, p2, p3 = [1, 5, 9, 4, 7], [1, 2, 3], [6, 6, 8, 1, 2, 3, 4]
    return [
        TrainSample(p1, [7, 8, 9], 0, 1.0), TrainSample(p1, [11, 12], 0, -0.5), TrainSample(p1, [13], 0, 0.25),
        TrainSample(p1, [14, 15, 16, 17], 0, -1.5),
        TrainSample(p2, [20, 21], 1, 0.7), TrainSample(p2, [], 1, 1.0), TrainSample(p2, [22, 23, 24], 1, -0.7),
        TrainSample(p1, [30, 31], 1, 2.0),  # p1 under another adapter: a group of its own
        TrainSample(p3, [40], 0, -1.0),
    ]


def _grads(eng, samples):
    eng.optimizer.zero_grad()
    stats = eng.accumulate_gradients(samples)
    return stats, [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in eng._params]


@pytest.mark.parametrize("attn,coeff,ckpt", [("sdpa", 0.0, False), ("sdpa", 0.01, False), ("sdpa", 0.0, True),
                                             ("eager", 0.0, False), ("eager", 0.01, True)])
def test_packed_rows_give_the_gradients_of_one_row_per_sample(attn, coeff, ckpt):
    eng = tiny_engine(train_micro_batch_size=8, dtype="float64", entropy_coeff=coeff, gradient_checkpointing=ckpt)
    eng.model.config._attn_implementation = attn
    samples = _groups()
    eng.cfg.share_prompts = False
    plain_stats, plain = _grads(eng, samples)
    eng.cfg.share_prompts = True
    shared_stats, shared = _grads(eng, samples)
    # transformers' eager attention takes its softmax in float32 whatever the model's dtype: float32's tolerance
    rel = REL64 if attn == "sdpa" else sum_tol(torch.float32, K_TINY_GRAD)
    scale = max(float(g.abs().max()) for g in plain)
    assert scale > 0
    for a, b in zip(plain, shared):
        assert float((a - b).abs().max()) <= rel * scale
    assert shared_stats.keys() == plain_stats.keys() == {0, 1}
    for a in plain_stats:
        for k, v in plain_stats[a].items():
            assert shared_stats[a][k] == pytest.approx(v, rel=rel, abs=rel), (a, k)


def test_packed_rows_were_taken_and_hold_each_prompt_once():
    s = _groups()
    work = [x for x in s if x.completion_ids]
    mbs = train_micro_batches(work, 8, share_prompts=True)
    assert sorted(id(x) for mb in mbs for x in mb) == sorted(id(x) for x in work)
    # ordered by prompt within an adapter, a micro-batch of 4 takes adapter 0's four answers to p1 together
    p1 = work[0].prompt_ids
    assert any(sum(x.adapter_id == 0 and x.prompt_ids == p1 for x in mb) == 4
               for mb in train_micro_batches(work, 4, share_prompts=True))
    lay = layout_rows([x.prompt_ids for x in work], [x.completion_ids for x in work], [x.adapter_id for x in work],
                      pad_id=0, share_prompts=True)
    assert lay.packed and lay.input_ids.shape[0] == 4  # (0, p1), (1, p2), (1, p1), (0, p3)
    plain = layout_rows([x.prompt_ids for x in work], [x.completion_ids for x in work],
                        [x.adapter_id for x in work], pad_id=0)
    assert not plain.packed and plain.input_ids.shape[0] == len(work)
    assert lay.input_ids.numel() < plain.input_ids.numel()
    # every token is predicted from the hidden state of the token before it, at the position it has alone
    for k, r, at, t in zip(lay.sample, lay.at_row, lay.at_pos, lay.target):
        seq, pos = list(work[k].prompt_ids) + list(work[k].completion_ids), int(lay.position_ids[r, at])
        assert int(lay.input_ids[r, at]) == seq[pos] and seq[pos + 1] == t
    # row 0 is (adapter 0, p1): prompt at 0..4, then [7, 8, 9] at 5..7, [11, 12] at 8..9, [13] at 10, [14..17]
    # at 11..14; a completion token sees the prompt and its own earlier tokens, never another completion
    m = lay.mask[0, 0]
    assert lay.position_ids[0, :15].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 5, 6, 5, 5, 6, 7, 8]
    assert m[9, :5].all() and not m[9, 5:8].any() and m[9, 8:10].all() and not m[9, 10:].any()
    assert m[10, :5].all() and not m[10, 5:10].any() and m[10, 10] and not m[10, 11:].any()
    assert m[4, :5].all() and not m[4, 5:].any()  # the prompt sees only itself, causally
    assert not m[:15, 15:].any() and m[15:, 15:].equal(torch.eye(m.shape[0] - 15, dtype=torch.bool))  # padding


def test_packing_is_left_out_where_it_computes_no_fewer_positions():
    # all prompts distinct: nothing to share
    lay = layout_rows([[1, 2], [3, 4, 5]], [[6], [7, 8]], [0, 0], pad_id=0, share_prompts=True)
    assert not lay.packed
    # one prompt, but its long completions would make one row wider than MAX_PACKED_WIDTH rows
    long = [list(range(10, 60))] * 6
    lay = layout_rows([[1]] * 6, long, [0] * 6, pad_id=0, share_prompts=True)
    assert not lay.packed
    # one prompt under two adapters: a row per adapter, nothing to pack
    lay = layout_rows([[1, 2, 3]] * 2, [[4], [5]], [0, 1], pad_id=0, share_prompts=True)
    assert not lay.packed
