"""Code benchmarks: program extraction, and the sandbox programs that judge a candidate.

Everything that touches benchmark values runs inside the executor sandbox:

* EvalPlus (MBPP+, HumanEval+): the canonical solution is run once per problem *in the sandbox* to produce the
  expected outputs (EvalPlus's own procedure; nothing shipped as an "expected output" is trusted). They come back
  pickled as a ``bytes`` literal that the host only reads with ``ast.literal_eval`` (never unpickles) and embeds
  in each candidate's judging program, where it is unpickled inside the sandbox. If they cannot be pickled, the
  judging program recomputes them from the canonical solution itself (slower, same result).
* Comparison mirrors EvalPlus (``evalplus/eval/__init__.py``): exact ``==``; when that fails and ``atol`` > 0, or
  the expected value ``is_floats`` (then atol = 1e-6), the types and lengths must match and an ``np.allclose``
  (rtol=1e-7) written in stdlib must hold. MBPP special oracles (are_equivalent, sum_div, set-equality tasks,
  output-not-None tasks) and HumanEval's ``find_zero`` are kept. Inputs are deep-copied per call.
* LiveCodeBench mirrors ``lcb_runner/evaluation/testing_util.py``: functional tests call ``Solution().<func_name>``
  (or a top-level function) with one JSON value per input line and compare with ``==`` (tuples as lists); stdin
  tests run the program as ``__main__`` with the input on stdin and compare stripped output lines, falling back to
  Decimal comparison per line. A fixed import preamble (typing, collections, math, ...) is prepended, as LCB does.

One sandbox run judges one candidate on all of its tests and stops at the first failure; the run's timeout covers
all tests (a timeout is a failure). Known limit: the candidate shares that process with the judging code, so a
program written to attack the harness (walking frames to overwrite ``_result``) could forge a pass; the candidate
runs in its own namespace, which stops accidental clobbering, not a deliberate attack.
"""

from __future__ import annotations

import ast
import json
import re

_BLOCK = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_OPEN = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n", re.IGNORECASE)


def extract_code(text: str) -> str:
    """The last ```python fenced block; else the last fenced block of any language; else the code after an
    unterminated final ```python fence (output cut by max_new_tokens); else the whole text."""
    blocks = _BLOCK.findall(text)
    py = [b for lang, b in blocks if lang]
    if py:
        return py[-1]
    opens = list(_OPEN.finditer(text))
    if opens and text.count("```", opens[-1].end()) == 0:
        return text[opens[-1].end():]
    if blocks:
        return blocks[-1][1]
    return text


# ---- EvalPlus ---------------------------------------------------------------------------------------------------

# Copied logic of evalplus/data/mbpp.py::mbpp_deserialize_inputs: JSON cannot hold tuples/sets/complex.
_MBPP_DESERIALIZE = r'''
def _deserialize(task_id, inputs):
    t = int(str(task_id).split("/")[-1])
    if t in (2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579, 596, 616, 630, 726, 740,
             744, 809):
        return [[tuple(lst) for lst in inp] for inp in inputs]
    if t in (63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780):
        return [[[tuple(lst) for lst in lst_lst] for lst_lst in inp] for inp in inputs]
    if t in (75, 413, 444, 753):
        return [[[tuple(lst) for lst in inp[0]]] + [inp[1]] for inp in inputs]
    if t in (106, 750):
        return [[inp[0]] + [tuple(inp[1])] for inp in inputs]
    if t == 115:
        return [[[set(item) if isinstance(item, list) and len(item) else {} for item in inp[0]]] for inp in inputs]
    if t == 124:
        return [(float(inp[0]), complex(inp[1])) for inp in inputs]
    if t in (250, 405, 446, 617, 720, 763, 808):
        return [[tuple(inp[0])] + [inp[1]] for inp in inputs]
    if t in (259, 401, 445):
        m = [[[tuple(lst) for lst in lst_lst] for lst_lst in inp] for inp in inputs]
        return [[tuple(lst) for lst in inp] for inp in m]
    if t == 278:
        m = [[[tuple(item) if isinstance(item, list) else item for item in inp[0]]] for inp in inputs]
        return [[tuple(lst) for lst in inp] for inp in m]
    if t == 307:
        return [[tuple(inp[0])] + [inp[1], inp[2]] for inp in inputs]
    if t == 722:
        return [[{k: tuple(v) for k, v in inp[0].items()}] + inp[1:] for inp in inputs]
    if t == 252:
        return [[complex(inp[0])] for inp in inputs]
    if t in (580, 615, 791):
        def tup(x):
            return tuple(tup(i) for i in x) if isinstance(x, list) else x
        return [tup(inp) for inp in inputs]
    return inputs
'''

_EVALPLUS_COMMON = r'''
import copy, io, json, math, pickle, sys
''' + _MBPP_DESERIALIZE + r'''
_SET_EQ = ("similar_elements", "find_char_long", "common_in_nested_lists", "extract_singly", "larg_nnum",
           "intersection_array", "find_dissimilar", "Diff")
_NOT_NONE = ("check_str", "text_match_three", "text_starta_endb")

def _load_inputs():
    base = json.loads(_BASE_JSON)
    plus = json.loads(_PLUS_JSON)
    if _DATASET == "mbpp":
        base, plus = _deserialize(_TASK_ID, base), _deserialize(_TASK_ID, plus)
    return base, plus

def _quiet_exec(src, name):
    ns = {"__name__": name}
    old = sys.stdout, sys.stdin
    sys.stdout, sys.stdin = io.StringIO(), io.StringIO("")
    try:
        exec(compile(src, "<" + name + ">", "exec"), ns)
    finally:
        sys.stdout, sys.stdin = old
    return ns

def _call(fn, inp):
    old = sys.stdout, sys.stdin
    sys.stdout, sys.stdin = io.StringIO(), io.StringIO("")
    try:
        return fn(*copy.deepcopy(inp))
    finally:
        sys.stdout, sys.stdin = old

def _expected_outputs(inputs):
    ns = _quiet_exec(_CANONICAL, "canonical")
    fn = ns[_ENTRY]
    outs = [_call(fn, inp) for inp in inputs]
    if _DATASET == "mbpp" and _ENTRY in _NOT_NONE:
        outs = [o is not None for o in outs]
    return outs
'''

_EXPECTED_MAIN = r'''
import time as _time
_t0 = _time.perf_counter()
_b, _p = _load_inputs()
_outs = _expected_outputs(_b + _p)
_result = (pickle.dumps(_outs, protocol=4), _time.perf_counter() - _t0)
'''

_JUDGE_MAIN = r'''
def _is_floats(x):
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)):
        return all(isinstance(i, float) for i in x)
    return False

def _num(x):
    return isinstance(x, (int, float, complex))

def _allclose(a, b, atol, rtol=1e-07):
    # np.allclose(a, b) for scalars and (nested, same-shape) sequences; non-numbers make numpy raise -> False.
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        if not (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple))) or len(a) != len(b):
            return False
        return all(_allclose(x, y, atol, rtol) for x, y in zip(a, b))
    if not (_num(a) and _num(b)):
        return False
    if a == b:
        return True
    if not (isinstance(a, complex) or isinstance(b, complex)) and (math.isinf(a) or math.isinf(b)):
        return False
    return abs(a - b) <= atol + rtol * abs(b)

def _poly(xs, x):
    return sum(c * math.pow(x, i) for i, c in enumerate(xs))

def _same(inp, out, exp, atol):
    exact = out == exp
    if _DATASET == "mbpp":
        if _ENTRY == "are_equivalent":
            exact = True
        elif _ENTRY == "sum_div":
            exact = exact or out == 0
        elif _ENTRY in _SET_EQ:
            try:
                exact = set(out) == set(exp)
            except TypeError:
                exact = False
        elif _ENTRY in _NOT_NONE:
            exact = (out == exp) if isinstance(out, bool) else (exp == (out is not None))
    if _DATASET == "humaneval" and _ENTRY == "find_zero":
        return abs(_poly(*inp, out)) <= atol
    if atol == 0 and _is_floats(exp):
        atol = 1e-6
    if not exact and atol != 0:
        if type(out) != type(exp):
            return False
        if isinstance(exp, (list, tuple)) and len(out) != len(exp):
            return False
        return _allclose(out, exp, atol)
    return bool(exact)

def _judge():
    base, plus = _load_inputs()
    inputs = base + plus
    expected = pickle.loads(_EXPECTED) if _EXPECTED is not None else _expected_outputs(inputs)
    res = {"base": False, "plus": False, "n_tests": len(inputs), "n_passed": 0, "error": None}
    try:
        fn = _quiet_exec(_CANDIDATE, "candidate")[_ENTRY]
    except BaseException as e:
        res["error"] = "load: " + type(e).__name__ + ": " + str(e)[:200]
        return res
    for i, (inp, exp) in enumerate(zip(inputs, expected)):
        try:
            ok = _same(inp, _call(fn, inp), exp, _ATOL)
        except BaseException as e:
            res["error"] = "test %d: %s: %s" % (i, type(e).__name__, str(e)[:200])
            ok = False
        if not ok:
            res["error"] = res["error"] or "test %d: wrong output" % i
            return res
        res["n_passed"] = i + 1
        if i + 1 == len(base):
            res["base"] = True
    res["base"] = True
    res["plus"] = True
    return res

_result = _judge()
'''


def _evalplus_header(gold: dict, dataset: str) -> str:
    return (f"_DATASET = {dataset!r}\n_TASK_ID = {gold['task_id']!r}\n_ENTRY = {gold['entry_point']!r}\n"
            f"_ATOL = {float(gold['atol'])!r}\n"
            f"_CANONICAL = {(gold['prompt'] + gold['canonical_solution'])!r}\n"
            f"_BASE_JSON = {json.dumps(gold['base_input'])!r}\n_PLUS_JSON = {json.dumps(gold['plus_input'])!r}\n")


def _dataset(benchmark: str) -> str:
    return "mbpp" if benchmark.startswith("mbpp") else "humaneval"


def evalplus_expected_program(gold: dict, benchmark: str) -> str:
    """Sandbox program whose ``_result`` is the pickled expected outputs (base inputs, then plus inputs)."""
    return _evalplus_header(gold, _dataset(benchmark)) + _EVALPLUS_COMMON + _EXPECTED_MAIN


def parse_expected(value: str | None) -> tuple[bytes, float] | None:
    """(pickled expected outputs, seconds the canonical solution took), read as a literal (never unpickled on the
    host); None when the value is not that shape."""
    if value is None:
        return None
    try:
        out = ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError):
        return None
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], bytes) and isinstance(out[1], float):
        return out
    return None


def _import_lines(prompt: str) -> str:
    """Top-level imports of a HumanEval prompt, so a candidate that restates only the function still runs."""
    return "".join(l + "\n" for l in prompt.splitlines() if re.match(r"(import |from \S+ import )", l))


def evalplus_judge_program(gold: dict, benchmark: str, candidate: str, expected: bytes | None) -> str:
    """Sandbox program whose ``_result`` is ``{"base", "plus", "n_tests", "n_passed", "error"}``."""
    if _dataset(benchmark) == "humaneval":
        candidate = _import_lines(gold["prompt"]) + candidate
    return (_evalplus_header(gold, _dataset(benchmark)) + f"_CANDIDATE = {candidate!r}\n_EXPECTED = {expected!r}\n"
            + _EVALPLUS_COMMON + _JUDGE_MAIN)


# ---- LiveCodeBench ----------------------------------------------------------------------------------------------

LCB_PREAMBLE = ("from typing import *\nfrom collections import *\nfrom functools import *\nfrom itertools import *\n"
                "from heapq import *\nfrom bisect import *\nimport math, heapq, bisect, itertools, functools, "
                "collections, re, string, sys, random, copy, operator\nsys.setrecursionlimit(50000)\n")

_LCB_MAIN = r'''
import decimal, io, json, sys

def _lines(s):
    return [l.strip() for l in s.strip().split("\n")]

def _decimals(line):
    try:
        return [decimal.Decimal(x) for x in line.split()]
    except Exception:
        return None

def _stdio_ok(pred, gt):
    p, g = _lines(pred), _lines(gt)
    if len(p) != len(g):
        return False
    for a, b in zip(p, g):
        if a == b:
            continue
        da, db = _decimals(a), _decimals(b)
        if da is None or db is None or da != db:
            return False
    return True

def _run_stdio(src, inp):
    sin = io.TextIOWrapper(io.BytesIO(inp.encode()), encoding="utf-8")
    sout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    old = sys.stdin, sys.stdout
    sys.stdin, sys.stdout = sin, sout
    try:
        exec(compile(src, "<candidate>", "exec"), {"__name__": "__main__"})
    except SystemExit:
        pass
    finally:
        sys.stdin, sys.stdout = old
    sout.flush()
    return sout.buffer.getvalue().decode("utf-8", "replace")

def _judge():
    tests = json.loads(_TESTS_JSON)
    src = _PREAMBLE + "\n" + _CANDIDATE
    res = {"pass": False, "n_tests": len(tests), "n_passed": 0, "error": None}
    method = None
    if _FN_NAME:
        try:
            ns = {"__name__": "candidate"}
            old = sys.stdout
            sys.stdout = io.StringIO()
            try:
                exec(compile(src, "<candidate>", "exec"), ns)
            finally:
                sys.stdout = old
            method = getattr(ns["Solution"](), _FN_NAME) if "Solution" in ns else ns[_FN_NAME]
        except BaseException as e:
            res["error"] = "load: %s: %s" % (type(e).__name__, str(e)[:200])
            return res
    for i, t in enumerate(tests):
        try:
            if method is not None:
                args = [json.loads(l) for l in t["input"].split("\n")]
                old = sys.stdout
                sys.stdout = io.StringIO()
                try:
                    pred = method(*args)
                finally:
                    sys.stdout = old
                if isinstance(pred, tuple):
                    pred = list(pred)
                ok = pred == json.loads(t["output"])
            else:
                ok = _stdio_ok(_run_stdio(src, t["input"]), t["output"])
        except BaseException as e:
            res["error"] = "test %d: %s: %s" % (i, type(e).__name__, str(e)[:200])
            ok = False
        if not ok:
            res["error"] = res["error"] or "test %d: wrong output" % i
            return res
        res["n_passed"] = i + 1
    res["pass"] = True
    return res

_result = _judge()
'''


def lcb_judge_program(gold: dict, candidate: str) -> str:
    """Sandbox program whose ``_result`` is ``{"pass", "n_tests", "n_passed", "error"}``."""
    return (f"_FN_NAME = {gold['fn_name']!r}\n_PREAMBLE = {LCB_PREAMBLE!r}\n_CANDIDATE = {candidate!r}\n"
            f"_TESTS_JSON = {json.dumps(gold['tests'])!r}\n" + _LCB_MAIN)


def parse_verdict(status: str, value: str | None, error: str | None) -> dict:
    """An ExecResult -> verdict dict; anything but a clean run is a failure with the reason kept."""
    if status == "ok" and value is not None:
        try:
            v = ast.literal_eval(value)
            if isinstance(v, dict):
                return v
        except (ValueError, SyntaxError):
            pass
        return {"pass": False, "base": False, "plus": False, "error": "unreadable verdict"}
    return {"pass": False, "base": False, "plus": False, "error": f"{status}: {error or ''}"[:300]}
