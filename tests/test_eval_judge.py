"""Code judging against EvalPlus's behaviour: special oracles, per-input time limits, sanitize, and
forgeries that must not pass. Real MBPP+ data, the real sandbox; no model."""

from __future__ import annotations

import json

import pytest

from lorapop.eval import code as codeh
from lorapop.eval.data import load_benchmark
from lorapop.eval.sanitize import longest_valid_block, sanitize


@pytest.fixture(scope="module")
def mbpp(data_dir):
    probs, _ = load_benchmark("mbppplus", data_dir=data_dir)
    return {p.id: p for p in probs}


@pytest.fixture(scope="module")
def judge():
    from lorapop.eval.harness import CodeJudge, make_executor

    ex = make_executor(workers=2)
    yield CodeJudge(ex, workers=2)
    ex.close()


def _canonical(p) -> str:
    return p.gold["canonical_solution"]


def test_special_oracles_mbpp_581_and_558(mbpp, judge):
    # EvalPlus accepts both readings of these tasks (evalplus/eval/_special_oracle.py)
    surface = ("import math\ndef surface_Area(b, h):\n    s = math.sqrt((b / 2) ** 2 + h ** 2)\n"
               "    return round(b * b + 2 * b * s)\n")
    digits = ("def digit_distance_nums(a, b):\n    x, y = str(a), str(b)\n    n = max(len(x), len(y))\n"
              "    return sum(abs(int(c) - int(d)) for c, d in zip(x.zfill(n), y.zfill(n)))\n")
    p581, p558 = mbpp["Mbpp/581"], mbpp["Mbpp/558"]
    v = judge.judge([p581, p558, p581, p558], [surface, digits, _canonical(p581), _canonical(p558)])
    assert [x["pass"] for x in v] == [True, True, True, True], v
    # ... and still reject wrong answers
    v = judge.judge([p581, p558], ["def surface_Area(b, h):\n    return b * h\n",
                                   "def digit_distance_nums(a, b):\n    return abs(a - b)\n"])
    assert [x["pass"] for x in v] == [False, False]


def test_time_limits_follow_evalplus(judge):
    from lorapop.eval.harness import CodeJudge

    assert judge.time_limits([0.0001, 0.5, 2.0]) == [1.0, 2.0, 8.0]  # max(1 s, 4 x ground truth)
    azr = CodeJudge(None, min_time_limit=10.0, gt_time_limit_factor=8.0)  # AZR's evaluation settings
    assert azr.time_limits([0.0001, 2.0]) == [10.0, 16.0]


def _with_base_guard(p, body: str) -> str:
    """Mbpp/2's canonical solution, except that ``body`` runs first on inputs that are not base inputs."""
    base = [tuple(tuple(x) for x in inp) for inp in p.gold["base_input"]]
    return (f"import time\nBASE = {base!r}\ndef similar_elements(a, b):\n    if (tuple(a), tuple(b)) not in BASE:\n"
            f"        {body}\n    return tuple(set(a) & set(b))\n")


def test_a_timeout_on_a_plus_input_keeps_the_base_verdict(mbpp, judge):
    p = mbpp["Mbpp/2"]
    v = judge.judge([p], [_with_base_guard(p, "while True: pass")])[0]
    assert v["base"] is True and v["pass"] is False and "timeout" in v["error"], v


def test_one_slow_input_fails_like_evalplus(mbpp, judge):
    # 1.5 s on a single plus input: over that input's 1 s limit (the old whole-run budget of 10 s let it pass)
    p = mbpp["Mbpp/2"]
    first_plus = tuple(tuple(x) for x in p.gold["plus_input"][0])
    cand = (f"import time\ndef similar_elements(a, b):\n    if (tuple(a), tuple(b)) == {first_plus!r}:\n"
            "        time.sleep(1.5)\n    return tuple(set(a) & set(b))\n")
    v = judge.judge([p], [cand])[0]
    assert v["base"] is True and v["pass"] is False and "plus test 0: timeout" in v["error"], v


def test_a_correct_solution_slow_on_every_call_passes(mbpp, judge):
    # 90 ms per call x 128 inputs is over the old 10 s budget for the whole candidate, far under 1 s per input
    p = mbpp["Mbpp/56"]
    assert len(p.gold["base_input"]) + len(p.gold["plus_input"]) >= 125
    src = p.gold["canonical_solution"]
    cand = "import time as _t\n" + src + (f"\n_orig = {p.gold['entry_point']}\ndef {p.gold['entry_point']}(*a):\n"
                                         "    _t.sleep(0.09)\n    return _orig(*a)\n")
    v = judge.judge([p], [cand])[0]
    assert v["pass"] is True, v


# ---- sanitize -----------------------------------------------------------------------------------------------------

def test_sanitize_keeps_what_the_entry_point_needs():
    code = ("import math\nfrom itertools import (chain,\n    islice)\nMOD = 7\nUNUSED = input()\n"
            "def helper(x):\n    yield x % MOD\n"
            "@staticmethod\ndef unrelated():\n    pass\n"
            "def f(n):\n    return list(helper(n)) + [math.pi]\n"
            "print(f(3))\nn = int(input())\nassert f(1) == 2\nif __name__ == '__main__':\n    f(2)\n")
    out = sanitize(code, "f")
    assert out == ("import math\nfrom itertools import (chain,\n    islice)\nMOD = 7\ndef helper(x):\n"
                   "    yield x % MOD\ndef f(n):\n    return list(helper(n)) + [math.pi]\n")
    # a generator without return is kept (EvalPlus drops it), and so are decorators of a kept function
    assert "def helper" in out
    deco = "import functools\n@functools.lru_cache(None)\ndef g(n):\n    return n if n < 2 else g(n - 1) + g(n - 2)\n"
    assert sanitize(deco + "print(g(10))\n", "g") == deco
    # a truncated tail (max_new_tokens) is cut to the longest block that parses
    assert longest_valid_block("def f():\n    return 1\ndef g(:\n") == "def f():\n    return 1"
    # no entry point defined: every definition kept, so the harness reports the missing name
    assert sanitize("def a():\n    return 1\nprint(a())\n", "b") == "def a():\n    return 1\n"


def test_canonical_solutions_followed_by_junk_pass(mbpp, judge):
    # the experiment: each canonical solution followed by a crashing usage line; plus input() and a failing
    # example assert; Mbpp/630's generator-only helper must survive sanitize
    ids = ["Mbpp/2", "Mbpp/630", "Mbpp/56", "Mbpp/65", "Mbpp/581"]
    progs = []
    for i in ids:
        p = mbpp[i]
        junk = f"\nprint({p.gold['entry_point']}())\nx = input()\nassert {p.gold['entry_point']}(1, 2, 3) == 'no'\n"
        text = f"Here is my solution:\n```python\n{_canonical(p)}{junk}```\nIt works."
        progs.append(codeh.extract_solution(text, p.gold["entry_point"]))
    v = judge.judge([mbpp[i] for i in ids], progs)
    assert [x["pass"] for x in v] == [True] * len(ids), v
    # without sanitize the same programs fail (the crash line runs at load time)
    raw = [codeh.extract_code(f"```python\n{_canonical(mbpp[i])}\nprint({mbpp[i].gold['entry_point']}())\n```")
           for i in ids[:2]]
    assert not any(x["pass"] for x in judge.judge([mbpp[i] for i in ids[:2]], raw))


def test_response_prefix_prefill_is_extracted():
    # the evalplus template prefills "```python\n": the completion has no opening fence of its own
    prefix = "Below is a Python script ...:\n```python\n"
    completion = "def f(x):\n    return x + 1\n```\nThis adds one.\nprint(f(2))"
    assert codeh.extract_solution(prefix + completion, "f") == "def f(x):\n    return x + 1\n"


# ---- forgeries ----------------------------------------------------------------------------------------------------

# Rewrite the judge's comparison from the candidate's module code (it runs when the judge loads the candidate), the
# issue's first forgery; the function then answers nonsense.
FORGE_COMPARE = """import sys
sys._getframe(1).f_globals['_same'] = lambda *a, **k: True
def similar_elements(a, b):
    return 0
"""

FORGE_READ_EXPECTED = """import sys, pickle
def similar_elements(a, b):
    f = sys._getframe(1)
    while f is not None:  # find the expected output for this call in the judge's frames ...
        if 'expected' in f.f_locals and 'i' in f.f_locals:
            return f.f_locals['expected'][f.f_locals['i']]
        f = f.f_back
    g = sys._getframe(1).f_globals  # ... or the expected outputs in its globals
    for k in ('_EXPECTED', 'expected', '_expected'):
        if g.get(k) is not None:
            return pickle.loads(g[k]) if isinstance(g[k], bytes) else g[k]
    return None
"""


def test_a_candidate_cannot_forge_its_pass(mbpp, judge):
    p = mbpp["Mbpp/2"]
    v = judge.judge([p, p], [FORGE_COMPARE, FORGE_READ_EXPECTED])
    assert [x["pass"] for x in v] == [False, False] and [x["base"] for x in v] == [False, False], v
    # the program a candidate runs in holds the inputs and nothing it is compared against
    prog = codeh.evalplus_candidate_program(p.gold, "mbppplus", "pass\n", "base", [1.0] * 3)
    assert "_same" not in prog and "_EXPECTED" not in prog and "canonical" not in prog


def test_unencodable_and_lying_outputs_fail(mbpp, judge):
    p = mbpp["Mbpp/2"]
    eq_always = ("class Eq(tuple):\n    def __eq__(self, o):\n        return True\n    __hash__ = tuple.__hash__\n"
                 "class Any:\n    def __eq__(self, o):\n        return True\n"
                 "def similar_elements(a, b):\n    return Any()\n")
    lie = ("import json\ndef similar_elements(a, b):\n    return ()\n"
           "_result = json.dumps({'outs': 'not a list', 'error': None})\n")
    v = judge.judge([p, p], [eq_always, lie])
    assert [x["pass"] for x in v] == [False, False], v


def test_huge_outputs_travel_as_digests():
    # Mbpp/255's canonical makes 1.6 million tuples: too big to send, so both sides send a digest of it
    from lorapop.eval import outputs as cmp

    ns: dict = {}
    exec(codeh._ENCODER, ns)
    wire = ns["_wire"]
    big = [(i, "x") for i in range(100_001)]
    a, b = cmp.decode(json.loads(wire(big))), cmp.decode(json.loads(wire(list(big))))
    c = cmp.decode(json.loads(wire(big[:-1] + [(0, "x")])))
    assert isinstance(a, cmp.Digest) and a == b and a != c and a != big
    long_text = "y" * (1 << 21)  # over 1 MiB of JSON
    assert isinstance(cmp.decode(json.loads(wire(long_text))), cmp.Digest)
    small = {"k": [(1, 2.5, None, True, frozenset({3})), {7}, b"\x00", 3 + 4j, 10 ** 3000]}
    assert cmp.decode(json.loads(wire(small))) == small


# Candidates that try to spoil the judging of others: fill and lock the working area, leave thousands of files, lower
# the worker's priority and CPU set, forge a result on every descriptor. Each fails its own problem; the canonical
# solution judged right after each, on the same two workers, still passes.
SPOILERS = {
    "fill_and_lock": ("import os\ndef similar_elements(a, b):\n    for i in range(3000):\n"
                      "        os.close(os.open('f%d' % i, os.O_CREAT | os.O_WRONLY))\n    os.chmod('.', 0)\n"
                      "    return 0\n"),
    "degrade_worker": ("import os\ndef similar_elements(a, b):\n    for call in (lambda: os.setpriority(os.PRIO_PROCESS, 1, 19),"
                       " lambda: os.sched_setaffinity(1, {0}), lambda: os.setpriority(os.PRIO_USER, 0, 19)):\n"
                       "        try:\n            call()\n        except OSError:\n            pass\n    return 0\n"),
    "forge_pass": ("import os, json\ndef similar_elements(a, b):\n    v = repr(json.dumps({'outs': [], 'error': None}))\n"
                   "    body = ('ok' + chr(0) + '1' + v + chr(0) + '0').encode()\n    for fd in range(3, 64):\n"
                   "        try:\n            os.write(fd, len(body).to_bytes(4, 'big') + body)\n"
                   "        except OSError:\n            pass\n    os._exit(0)\n"),
}


def test_a_candidate_cannot_spoil_the_judging_of_others(mbpp, judge):
    p = mbpp["Mbpp/2"]
    cands = []
    for spoiler in SPOILERS.values():
        cands += [spoiler, _canonical(p)]
    v = judge.judge([p] * len(cands), cands)
    assert [x["pass"] for x in v] == [False, True] * len(SPOILERS), v
