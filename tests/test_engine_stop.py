"""Stop strings checked once per interval: StopChecker.first_hit finds the token the per-token rule
(vLLM's check_stop_strings, StopChecker.hit after every token) finds, at one decode per row and interval when no stop
string is in the new text."""

from __future__ import annotations

import random

from test_engine_helpers import tokenizer
from lorapop.engine.sequence import stop_checker


def _per_token(checker, row, start):
    return next((j for j in range(start + 1, len(row) + 1) if checker.hit(row[:j])), None)


def test_first_hit_equals_the_per_token_rule():
    """Rows made of text with stop strings at random places (so some end mid-token and some span tokens), cut into
    intervals of 1 to 9 tokens, from random starts (min_new_tokens): the same token every time."""
    tok = tokenizer()
    rng = random.Random(0)
    words = ["def", " f", "(x", "):", "\n", "    return", " x", " +", " 1", "```", "``", "`", " assert", "éà", "中文",
             "</answer>", "</ans", "wer>", " ", "\n\n"]
    checkers = [stop_checker(tok, s) for s in (["```"], ["</answer>", "\n\n"], ["x +"], ["中"])]
    hits = 0
    for _ in range(40):
        text = "".join(rng.choice(words) for _ in range(rng.randint(1, 20)))
        row = tok(text, add_special_tokens=False)["input_ids"]
        for checker in checkers:
            start = rng.randint(0, len(row))
            want = _per_token(checker, row, start)
            pos, got = start, None
            while pos < len(row) and got is None:  # intervals, as the batcher takes them
                end = min(len(row), pos + rng.randint(1, 9))
                got = checker.first_hit(row[:end], pos)
                pos = end
            assert got == want, (text, start, checker.stop)
            hits += want is not None
    assert hits > 12  # the rows really stop, at many places


def test_no_stop_strings_no_checker():
    assert stop_checker(tokenizer(), ["", ""]) is None
