"""Every eval judge is bounded and isolated per candidate: hostile results and texts (tests/eval_probe.py) fail
their own candidate only, every honest candidate judged among them keeps its score, and the host's time and memory
stay within bounds derived from the limits the judges set (lorapop/eval/harness.py, outputs.py, sanitize.py,
mathcheck.py; docs/METHOD.md, "Which layer bounds what"). The code judges run as root in this process and as uid
65534 (tests/unprivileged.py); the math checker, which runs no candidate code, in this process.
"""

from __future__ import annotations

import ast
import json
import os
import random
import sys
import warnings
from pathlib import Path

import pytest

import unprivileged  # tests/unprivileged.py: a script as uid 65534

sys.path.insert(0, str(Path(__file__).parent))
import eval_probe  # noqa: E402

MIB = 1 << 20
# Host memory a rebuilt result may take per character of its text: the worst pattern measured (a list of empty
# sets) takes about 35 bytes; CPython's object sizes, the same on every 64-bit build.
BYTES_PER_CHAR = 64
# Slowest host parsing assumed, characters per second (ast and json run at several MB/s on this machine): a bound
# for any CI machine, far below the seconds to minutes the unbounded judges took.
CHARS_PER_S = 250_000
JUDGE_WORKERS = 2


def check_code(out: dict) -> None:
    limits = out["limits"]
    for label in ("mbpp", "humaneval", "lcb_functional", "lcb_stdio"):
        r = out[label]
        for name, v in r["verdicts"].items():
            # every hostile candidate fails; every honest one judged beside them passes, every wrong one fails
            assert v["pass"] == name.startswith("honest_after_"), (label, name, v)
            assert v["host_s"] <= 2 + r["cap_chars"] / CHARS_PER_S, (label, name, v)
        # per worker, the executor reads a candidate's result only up to the candidate's own cap (harness.result_cap,
        # passed to the executor: a forged result at the executor's 16 MiB cap grew the host by 220-270 MB when it
        # was read whole) in characters of up to 4 bytes, held three times (the bytes read, their join, the text);
        # then the judge rebuilds at most one result within that cap
        bound = JUDGE_WORKERS * (12 + BYTES_PER_CHAR) * r["cap_chars"] + 64 * MIB
        assert r["growth_kb"] * 1024 <= bound, (label, r["growth_kb"] // 1024, bound // MIB)
    for name, t in out["texts"].items():
        assert t["error"] is None, (name, t)
        budget = limits["parse_budget_factor"] * t["chars"] + limits["parse_floor_chars"]
        assert t["s"] <= 2 + budget / CHARS_PER_S, (name, t)


@pytest.mark.skipif(os.geteuid() != 0, reason="the root path needs root (the unprivileged path runs anyway)")
def test_code_judges_as_root():
    check_code(eval_probe.code_probe())


def test_code_judges_as_an_unprivileged_user():
    proc = unprivileged.run("tests/eval_probe.py", [], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["euid"] != 0
    check_code(out["code"])


def test_math_checker_on_hostile_answers():
    res = eval_probe.math_probe(timeout_s=10.0)
    for name, a in res["answers"].items():
        assert not a["pass"] and a["honest_after"] and not a["wrong_after"], (name, a)
        assert a["s"] <= res["timeout_s"] + 2, (name, a)  # the caller's bound, whatever sympy does
        assert a["helper_hwm_kb"] is None or a["helper_hwm_kb"] <= res["memory_mb"] * 1024, (name, a)
    assert res["growth_kb"] < 64 * 1024, res["growth_kb"]  # nothing of an answer is parsed in the caller


def test_only_one_string_literal_passes_the_one_pass_check():
    # generated: the reprs of random strings all pass and read back; random texts over quotes, backslashes, line
    # ends and letters pass only when they parse to one string constant
    from lorapop.eval.outputs import is_one_string_literal

    rng = random.Random(0)
    alphabet = ["'", '"', "\\", "\n", "\r", "a", " ", "\x00", "\u20ac", "\U0001f600", "[", "1", ","]
    for _ in range(3000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        assert is_one_string_literal(repr(s)) and ast.literal_eval(repr(s)) == s, s
        t = rng.choice(["'", '"', ""]) + s + rng.choice(["'", '"', ""])
        if is_one_string_literal(t):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "invalid escape sequence": repr never writes one, a forger may
                node = ast.parse(t, mode="eval").body
            assert isinstance(node, ast.Constant) and isinstance(node.value, str), t


def test_a_text_that_breaks_extraction_is_its_own_failure(monkeypatch):
    from lorapop.eval import code as codeh
    from lorapop.eval.harness import candidate_program

    def boom(text, entry_point):
        raise RecursionError("deep")

    monkeypatch.setattr(codeh, "extract_solution", boom)
    prog = candidate_program("def f(): pass", "f")
    compile(prog, "<p>", "exec")
    assert "answer could not be extracted: RecursionError" in prog


CODE_PIECES = ["def f(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total",
               "import math\n\ndef g(n):\n    return math.isqrt(n) ** 2 == n",
               "class A:\n    def h(self, s):\n        return s[::-1]", "x = [1, 2,\n     3]", "print(f([1, 2]))"]
PROSE = ["Here is the solution:", "This works because every element is visited once.", "Example: f([1, 2]) == 3",
         "Complexity: O(n).", "1. First, read the input", "Note that (a) and (b) hold.", "",
         "Let's think step by step.", "    indented explanation", "x is the input (a list"]
CUT = ["    return x +", "def broken(:", "    if x ==", "'''unterminated", "(a, b"]


def _plain_search(code: str) -> str:
    """The longest block that parses, by trying every block longest first (EvalPlus's search), with no budget."""
    if ast_parses(code):
        return code
    lines = code.splitlines()
    n = len(lines)
    w = [0]
    for line in lines:
        w.append(w[-1] + bool(line.strip()))
    for i, j in sorted(((i, j) for i in range(n) for j in range(i + 1, n + 1)), key=lambda s: -(w[s[1]] - w[s[0]])):
        if w[j] - w[i] == 0:
            break
        if ast_parses("\n".join(lines[i:j])):
            return "\n".join(lines[i:j])
    return ""


def ast_parses(src: str) -> bool:
    try:
        ast.parse(src)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def test_the_parse_budget_leaves_ordinary_answers_alone():
    # generated: answers made of prose, code and prose, some cut off at the end; the bounded search (its budget and
    # its skipping of blocks that must fail) finds the block the plain search finds
    from lorapop.eval.sanitize import longest_valid_block

    rng = random.Random(1)
    for _ in range(120):
        parts = [rng.choice(PROSE) for _ in range(rng.randint(0, 20))]
        parts += [rng.choice(CODE_PIECES) for _ in range(rng.randint(1, 4))]
        parts += [rng.choice(PROSE) for _ in range(rng.randint(0, 20))]
        if rng.random() < 0.5:
            parts.append(rng.choice(CUT))
        text = "\n".join(parts)
        assert longest_valid_block(text) == _plain_search(text), text


def _random_tree(rng: random.Random, depth: int = 0):
    leaves = [0, -1, 2 ** 61 - 1, 10 ** 30, 1.5, -0.0, 1e308, "x", "", "1e10000000", "sNaN", "NaN", "Infinity",
              "-3/4", "1/0", "ff" * 50, None, True]
    if depth > 3 or rng.random() < 0.3:
        return rng.choice(leaves)
    tag = rng.choice("LTSFDICBQMOHXZ")
    kids = [_random_tree(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if tag == "D":
        return [tag, [[_random_tree(rng, depth + 1), _random_tree(rng, depth + 1)] for _ in range(rng.randint(0, 3))]]
    if tag in "LTSF":
        return [tag, kids] if rng.random() < 0.9 else [tag] + kids
    return [tag] + kids


def test_generated_results_fail_only_their_candidate():
    # generated: result texts built from every tag with odd payloads, some mangled; reading and comparing them raises
    # nothing but WireError, and the comparisons answer (True or False) for every one of them
    from lorapop.eval import outputs as cmp
    from lorapop.eval.harness import candidate_outputs

    rng = random.Random(2)
    expected = [[(1, 2)], [3], [0.5], ["a"], [{1: 2}]]
    tests = [{"input": "1", "output": "[1, 2]"}, {"input": "2", "output": "3\n"}]
    for _ in range(3000):
        res = {"outs": [_random_tree(rng) for _ in range(rng.randint(0, 3))], "error": _random_tree(rng)}
        text = repr(json.dumps(res)) if rng.random() < 0.8 else rng.choice(
            [json.dumps(res), repr(json.dumps(res))[:-1], "{[1]: 2}", repr(res), "'" + json.dumps(res) + "' 'x'"])
        try:
            _, outs = candidate_outputs(text, 1 << 20)
        except cmp.WireError:
            continue
        for exp in expected:
            for entry in ("similar_elements", "sum_div", "surface_Area", "check_str", "f"):
                ok, _ = cmp.evalplus_check("mbpp", entry, [[1, 2]] * len(exp), outs, exp, rng.choice([0, 1e-6]))
                assert isinstance(ok, bool)
        ok, _ = cmp.evalplus_check("humaneval", "find_zero", [[[1, 2]]], outs, [0.5], 1e-6)
        for functional in (True, False):
            assert isinstance(cmp.lcb_check(tests, outs, functional)[0], bool)
