"""Code benchmarks: program extraction, and the sandbox programs that run candidates and canonical solutions.

**The candidate never sees what it is judged against.** A candidate runs in its own sandbox process with the test
*inputs* only; that process returns its outputs as data (a JSON tree of tagged plain values, built by ``_enc``), and
the comparison with the expected outputs happens in the host process (:mod:`lorapop.eval.outputs`), on values the
host rebuilt itself from that data (only plain builtin types, no unpickling, no code of the candidate's). So a
program that walks frames and rewrites the judge's comparison, or reads the expected outputs from the judge's
globals, finds neither: the worst it can do is lie about its own outputs, which is what it is tested on anyway.

* EvalPlus (MBPP+, HumanEval+): the canonical solution runs once per problem *in the sandbox* (EvalPlus's own
  procedure; nothing shipped as an "expected output" is trusted) and returns its outputs and the time it took on
  each input, encoded the same way. Inputs are deep-copied per call.
* HumanEval (the original, lorapop.eval.data._humaneval) ships asserts, not inputs: the canonical solution's
  sandbox run first runs the problem's ``check`` on it, seeded, and records the (JSON round-tripped) arguments of
  every call; those are the base inputs, returned with the outputs. ``check`` never enters a candidate's process.
* Time limits as EvalPlus computes them: input i may take ``max(min_time_limit, gt_time_limit_factor * t_i)`` where
  ``t_i`` is the canonical solution's time on it (``signal.setitimer`` in the candidate's process; the sandbox's
  wall clock over the whole run is ``min(60, sum of limits) + 3`` s). Base inputs and plus inputs run in separate
  sandbox runs (as EvalPlus runs them in separate processes), so a timeout on a plus input cannot cost the base
  verdict. Known limit: the per-input timing is measured inside the candidate's own process, so a program written
  to attack the harness could under-report it; it cannot exceed the sandbox's wall clock over the run.
* LiveCodeBench mirrors ``lcb_runner/evaluation/testing_util.py``: functional tests call ``Solution().<func_name>``
  (or a top-level function) with one JSON value per input line; stdin tests run the program as ``__main__`` with
  the input on stdin and return what it printed. A fixed import preamble (typing, collections, math, ...) is
  prepended, as LCB does. The comparison (``==`` with tuples as lists; stripped lines with a Decimal fallback) is
  in :mod:`lorapop.eval.outputs`.
* Outputs too large to send (a list or tuple of over 100,000 items, or over 1 MiB of JSON) travel as a SHA-256 of
  their encoding and are compared exactly by digest (Mbpp/255's canonical outputs would not fit in the sandbox's
  memory otherwise).
"""

from __future__ import annotations

import json
import re

from lorapop.eval.sanitize import sanitize

# The blank after the language only where there is a language: two blank runs side by side ("[ \t]*(py)?[ \t]*")
# can split a run of blanks in quadratically many ways before a missing newline fails the match.
_BLOCK = re.compile(r"```[ \t]*(?:(python3?|py)[ \t]*)?\n(.*?)```", re.DOTALL | re.IGNORECASE)
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


def extract_solution(text: str, entry_point: str | None) -> str:
    """The program to judge: :func:`extract_code`, then, when the benchmark names an entry point,
    :func:`~lorapop.eval.sanitize.sanitize` (imports and the definitions the entry point reaches)."""
    code = extract_code(text)
    return sanitize(code, entry_point) if entry_point else code


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

# Sandbox side: tagged plain data for any value (JSON natives for None/bool/int/float/str, tagged lists otherwise).
_ENCODER = r"""
import fractions as _fractions, decimal as _decimal
_MAX_INLINE_CHARS = 1 << 20
_MAX_INLINE_ITEMS = 100_000

_LEAF = frozenset((str, float, bool, type(None)))
_BIG = 1 << 8192  # about 2466 digits: json refuses ints over 4300 digits, hex has no such limit

def _items(xs, d):
    # leaves inline: a function call per element would double the cost on large outputs
    return [i if type(i) in _LEAF or (type(i) is int and -_BIG < i < _BIG) else _enc(i, d) for i in xs]

def _enc(x, depth=0):
    if depth > 500:
        raise RecursionError("output nested more than 500 deep")
    t = type(x)
    if t in _LEAF:
        return x
    if t is int:
        return x if -_BIG < x < _BIG else ["I", hex(x)]
    d = depth + 1
    if t is list:
        return ["L", _items(x, d)]
    if t is tuple:
        return ["T", _items(x, d)]
    if isinstance(x, bool):
        return bool(x)
    if isinstance(x, int):
        return _enc(int(x), depth)
    if isinstance(x, float):
        return float(x)
    if isinstance(x, str):
        return str(x)
    if isinstance(x, list):
        return ["L", _items(x, d)]
    if isinstance(x, tuple):
        return ["T", _items(x, d)]
    if isinstance(x, frozenset):
        return ["F", _items(x, d)]
    if isinstance(x, set):
        return ["S", _items(x, d)]
    if isinstance(x, dict):
        return ["D", [[_enc(k, d), _enc(v, d)] for k, v in x.items()]]
    if isinstance(x, complex):
        return ["C", float(x.real), float(x.imag)]
    if isinstance(x, (bytes, bytearray)):
        return ["B", bytes(x).decode("latin-1")]
    if isinstance(x, _fractions.Fraction):
        return ["Q", str(x)]
    if isinstance(x, _decimal.Decimal):
        return ["M", str(x)]
    try:
        r = repr(x)[:200]
    except BaseException:
        r = "?"
    return ["O", t.__module__ + "." + t.__qualname__, r]

import hashlib as _hashlib, json as _json

def _digest(text, kind):
    return _json.dumps(["H", kind + ":" + _hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(),
                        len(text)])

def _wire(x):
    # One output as JSON text. A huge one (Mbpp/255 makes 1.6 million tuples) travels as a SHA-256 instead, so it
    # is compared exactly, by digest, rather than exceed the sandbox's memory or result size: a list or tuple of
    # more than _MAX_INLINE_ITEMS items by the digest of its repr (encoding it would take gigabytes), anything
    # else whose JSON is over _MAX_INLINE_CHARS by the digest of that JSON.
    if (type(x) is list or type(x) is tuple) and len(x) > _MAX_INLINE_ITEMS:
        return _digest(type(x).__name__ + repr(x), "repr")
    s = _json.dumps(_enc(x))
    if len(s) > _MAX_INLINE_CHARS:
        return _digest(s, "json")
    return s
"""

_EVALPLUS_COMMON = r"""
import copy, io, json, math, sys, time
""" + _MBPP_DESERIALIZE + _ENCODER + r"""
_NOT_NONE = ("check_str", "text_match_three", "text_starta_endb")

def _load_inputs(which):
    inputs = json.loads(_BASE_JSON if which == "base" else _PLUS_JSON)
    return _deserialize(_TASK_ID, inputs) if _DATASET == "mbpp" else inputs

def _quiet_exec(src, name):
    ns = {"__name__": name}
    old = sys.stdout, sys.stdin
    sys.stdout, sys.stdin = io.StringIO(), io.StringIO("")
    try:
        exec(compile(src, "<" + name + ">", "exec"), ns)
    finally:
        sys.stdout, sys.stdin = old
    return ns

def _call(fn, args):
    old = sys.stdout, sys.stdin
    sys.stdout, sys.stdin = io.StringIO(), io.StringIO("")
    try:
        return fn(*args)
    finally:
        sys.stdout, sys.stdin = old
"""

# HumanEval: the inputs are the arguments check() passes to the canonical solution. Each goes through JSON before
# the call, so the asserts vouch for the inputs exactly as the candidate will receive them.
_RECORD = r"""
def _record_inputs():
    import random
    ns = _quiet_exec(_CANONICAL, "canonical")
    fn, calls = ns[_ENTRY], []

    def recorder(*args):
        calls.append(json.dumps(list(args)))
        return fn(*json.loads(calls[-1]))

    random.seed(0)  # HumanEval/53 draws its inputs from the global generator
    exec(compile(_TEST, "<test>", "exec"), ns)
    _call(ns["check"], (recorder,))
    if not calls:
        raise ValueError("check() never called the solution")
    return "[" + ",".join(calls) + "]"

if _TEST is not None:
    _BASE_JSON = _record_inputs()
"""

_EXPECTED_MAIN = r"""
def _expected():
    fn = _quiet_exec(_CANONICAL, "canonical")[_ENTRY]
    parts = []
    for which in ("base", "plus"):
        outs, times = [], []
        for inp in _load_inputs(which):
            args = copy.deepcopy(inp)
            t0 = time.perf_counter()
            out = _call(fn, args)
            times.append(time.perf_counter() - t0)
            if _DATASET == "mbpp" and _ENTRY in _NOT_NONE:
                out = out is not None
            outs.append(_wire(out))  # encoded at once: the raw outputs of all inputs together may not fit
            del out
        parts.append('"%s": {"outs": [%s], "times": %s}' % (which, ",".join(outs), json.dumps(times)))
    if _TEST is not None:
        parts.append('"inputs": ' + _BASE_JSON)
    return "{" + ", ".join(parts) + "}"

_result = _expected()
"""

# The candidate's process: outputs only, stopping at the first exception or timeout (EvalPlus's fast_check).
_CANDIDATE_MAIN = r"""
import signal as _signal

class _TimeLimit(BaseException):
    pass

def _on_alarm(signum, frame):
    raise _TimeLimit()

def _outputs():
    res = {"outs": [], "error": None}  # outs: JSON texts from _wire
    try:
        fn = _quiet_exec(_CANDIDATE, "candidate")[_ENTRY]
    except BaseException as e:
        res["error"] = "load: " + type(e).__name__ + ": " + str(e)[:200]
        return res
    _signal.signal(_signal.SIGALRM, _on_alarm)
    for i, inp in enumerate(_load_inputs(_WHICH)):
        args = copy.deepcopy(inp)
        t0 = time.perf_counter()
        try:
            _signal.setitimer(_signal.ITIMER_REAL, _LIMITS[i])
            try:
                out = _call(fn, args)
            finally:
                _signal.setitimer(_signal.ITIMER_REAL, 0)
            if time.perf_counter() - t0 > _LIMITS[i]:  # the program swallowed the alarm
                raise _TimeLimit()
            res["outs"].append(_wire(out))
        except _TimeLimit:
            res["error"] = "%s test %d: timeout (limit %.2fs)" % (_WHICH, i, _LIMITS[i])
            return res
        except BaseException as e:
            res["error"] = "%s test %d: %s: %s" % (_WHICH, i, type(e).__name__, str(e)[:200])
            return res
    return res

_res = _outputs()
_result = '{"outs": [%s], "error": %s}' % (",".join(_res["outs"]), json.dumps(_res["error"]))
"""


def _evalplus_header(gold: dict, dataset: str) -> str:
    return (f"_DATASET = {dataset!r}\n_TASK_ID = {gold['task_id']!r}\n_ENTRY = {gold['entry_point']!r}\n"
            f"_BASE_JSON = {json.dumps(gold['base_input'])!r}\n_PLUS_JSON = {json.dumps(gold['plus_input'])!r}\n")


def dataset_of(benchmark: str) -> str:
    """EvalPlus's dataset name: ``mbpp`` or ``humaneval`` (special oracles and input layouts differ)."""
    return "mbpp" if benchmark.startswith("mbpp") else "humaneval"


def evalplus_expected_program(gold: dict, benchmark: str) -> str:
    """Sandbox program whose ``_result`` is JSON ``{"base"|"plus": {"outs": [encoded], "times": [seconds]}}``, with
    ``"inputs"`` (the base inputs it recorded) for a problem that ships a ``test`` instead of inputs."""
    return (_evalplus_header(gold, dataset_of(benchmark))
            + f"_CANONICAL = {(gold['prompt'] + gold['canonical_solution'])!r}\n_TEST = {gold.get('test')!r}\n"
            + _EVALPLUS_COMMON + _RECORD + _EXPECTED_MAIN)


def _import_lines(prompt: str) -> str:
    """Top-level imports of a HumanEval prompt, so a candidate that restates only the function still runs."""
    return "".join(l + "\n" for l in prompt.splitlines() if re.match(r"(import |from \S+ import )", l))


def evalplus_candidate_program(gold: dict, benchmark: str, candidate: str, which: str,
                               limits: list[float]) -> str:
    """Sandbox program that runs ``candidate`` on the ``which`` ("base" or "plus") inputs, input i under
    ``limits[i]`` seconds; ``_result`` is JSON ``{"outs": [encoded], "error": str | None}``. It holds no expected
    output."""
    if dataset_of(benchmark) == "humaneval":
        candidate = _import_lines(gold["prompt"]) + candidate
    return (_evalplus_header(gold, dataset_of(benchmark)) + f"_CANDIDATE = {candidate!r}\n_WHICH = {which!r}\n"
            f"_LIMITS = {[float(x) for x in limits]!r}\n" + _EVALPLUS_COMMON + _CANDIDATE_MAIN)


def mbpp_deserializer():
    """The host's copy of ``_deserialize`` (inputs are benchmark data, so the host may rebuild them too)."""
    ns: dict = {}
    exec(compile(_MBPP_DESERIALIZE, "<mbpp_deserialize>", "exec"), ns)
    return ns["_deserialize"]


# ---- LiveCodeBench ----------------------------------------------------------------------------------------------

LCB_PREAMBLE = ("from typing import *\nfrom collections import *\nfrom functools import *\nfrom itertools import *\n"
                "from heapq import *\nfrom bisect import *\nimport math, heapq, bisect, itertools, functools, "
                "collections, re, string, sys, random, copy, operator\nsys.setrecursionlimit(50000)\n")

_LCB_MAIN = r"""
import io, json, sys
""" + _ENCODER + r"""
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

def _outputs():
    inputs = json.loads(_INPUTS_JSON)
    src = _PREAMBLE + "\n" + _CANDIDATE
    res = {"outs": [], "error": None}
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
    for i, inp in enumerate(inputs):
        try:
            if method is not None:
                args = [json.loads(l) for l in inp.split("\n")]
                old = sys.stdout
                sys.stdout = io.StringIO()
                try:
                    out = method(*args)
                finally:
                    sys.stdout = old
                res["outs"].append(_wire(out))
            else:
                res["outs"].append(_wire(_run_stdio(src, inp)))
        except BaseException as e:
            res["error"] = "test %d: %s: %s" % (i, type(e).__name__, str(e)[:200])
            return res
    return res

_res = _outputs()
_result = '{"outs": [%s], "error": %s}' % (",".join(_res["outs"]), json.dumps(_res["error"]))
"""


def lcb_candidate_program(gold: dict, candidate: str) -> str:
    """Sandbox program that runs ``candidate`` on every test input; ``_result`` is JSON ``{"outs", "error"}``."""
    inputs = [t["input"] for t in gold["tests"]]
    return (f"_FN_NAME = {gold['fn_name']!r}\n_PREAMBLE = {LCB_PREAMBLE!r}\n_CANDIDATE = {candidate!r}\n"
            f"_INPUTS_JSON = {json.dumps(inputs)!r}\n" + _LCB_MAIN)
