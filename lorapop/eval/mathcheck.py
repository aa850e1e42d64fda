"""Math answers: extraction from model output and checking with ``math-verify``.

Extraction rule: the content of the last ``\\boxed{...}`` in the output; if there is none, the last number in the
output (``-1,234.5`` style, commas dropped; also ``3/4``). No answer -> wrong. Both gold and prediction are wrapped
in ``\\boxed{}`` before ``math_verify.parse`` so that its LaTeX extractor sees them the same way.

math-verify guards parse/verify with ``signal.alarm`` timeouts, which only work in the main thread; off the main
thread we pass ``None`` (no timeout) rather than let it raise. Note the alarm also cancels any other SIGALRM timer
(e.g. pytest-timeout's signal method) while a check runs.
"""

from __future__ import annotations

import re
import threading

from lorapop.eval.data import last_boxed

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")


def extract_answer(text: str) -> str | None:
    boxed = last_boxed(text)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    nums = _NUMBER.findall(text)
    if not nums:
        return None
    return nums[-1].replace(",", "").replace(" ", "")


def _clean_gold(g: str) -> str:
    g = g.strip()
    if len(g) >= 2 and g[0] == "$" and g[-1] == "$":
        g = g.strip("$").strip()
    return g


def _timeouts() -> int | None:
    return 5 if threading.current_thread() is threading.main_thread() else None


def check_answer(golds: list[str], answer: str | None) -> bool:
    """True when ``answer`` is equivalent (math-verify) to any gold answer."""
    if answer is None or not answer.strip():
        return False
    from math_verify import parse, verify

    t = _timeouts()
    try:
        pred = parse("\\boxed{" + answer + "}", parsing_timeout=t)
    except Exception:
        return False
    if not pred:
        return False
    for g in golds:
        try:
            gold = parse("\\boxed{" + _clean_gold(g) + "}", parsing_timeout=t)
            if gold and verify(gold, pred, timeout_seconds=t):
                return True
        except Exception:
            continue
        # A gold that math-verify cannot parse still counts when the strings agree exactly.
        if not gold and _clean_gold(g).replace(" ", "") == answer.replace(" ", ""):
            return True
    return False


def score_math(golds: list[str], output: str) -> dict:
    ans = extract_answer(output)
    return {"pass": check_answer(golds, ans), "answer": ans}
