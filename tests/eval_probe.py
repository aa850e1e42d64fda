"""Hostile candidates for every eval judge (MBPP+, HumanEval+, LiveCodeBench, the math checker), each judged among
honest ones through the harness's own path (CodeJudge.judge, MathChecker.score), with the host's time and memory
measured. Run by tests/test_eval_hostile.py in the test process (root) and, as a script, by an unprivileged user.

    python -S tests/eval_probe.py [--math]      (prints one JSON object)

A hostile candidate forges its result (written to every descriptor before the real one, then an exit), or returns
values built to be costly on the host (a Fraction whose text is '1e10000000', thousands of distinct ints of one
hash, a 3-million-bit int, a signaling NaN), or is a text built to be costly to extract or sanitize.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "fixtures"

# The run writes ``value`` as its result to every descriptor it has, then leaves before the real one is written.
_FORGE = ("    import os\n    value = {value}\n    body = ('ok' + chr(0) + '1' + value + chr(0) + '0').encode()\n"
          "    for fd in range(3, 64):\n        try:\n            os.write(fd, len(body).to_bytes(4, 'big') + body)\n"
          "        except OSError:\n            pass\n    os._exit(0)\n")


def forge(entry: str, value_expr: str) -> str:
    """A candidate defining ``entry`` that forges a result whose text is ``value_expr`` (evaluated in the run)."""
    return f"def {entry}(*args):\n" + _FORGE.format(value=value_expr)


def forge_prepared(entry: str, value_expr: str) -> str:
    """:func:`forge` with the text built when the program loads (a large one would overrun the per-input limit)."""
    return f"_V = {value_expr}\n" + forge(entry, "_V")


def returning(entry: str, expr: str, prelude: str = "") -> str:
    return prelude + f"def {entry}(*args):\n    return {expr}\n"


FRACTION_SUBCLASS = ("import fractions\nclass Big(fractions.Fraction):\n    def __str__(self):\n"
                     "        return '1e10000000'\n")


def hostile_returns(entry: str) -> dict[str, str]:
    """Candidates for a function benchmark (an EvalPlus entry point or an LCB functional one)."""
    return {
        "forge_unhashable_literal": forge(entry, "'{[1]: 2}'"),
        "forge_list_literal_3mib": forge(entry, "'[' + '0,' * (3 << 19) + ']'"),
        "forge_string_24mib": forge(entry, "repr('x' * (24 << 20))"),
        # as many 4-byte characters as the executor takes: the most it reads of a result
        "forge_wide_string_at_cap": forge_prepared(entry, "repr(chr(0x1F600) * ((16 << 20) - 2))"),
        "forge_deep_json": forge(entry, "repr('{\"outs\": ' + '[' * 100000 + ']' * 100000 + '}')"),
        "forge_fraction_exponent": forge(entry, "repr('{\"outs\": [[\"Q\", \"1e10000000\"]], \"error\": null}')"),
        "forge_colliding_set": forge(entry, "repr('{\"outs\": [[\"S\", [' + ','.join(str(k * (2**61 - 1)) "
                                            "for k in range(40000)) + ']]], \"error\": null}')"),
        "forge_error_flood": forge(entry, "repr('{\"outs\": [], \"error\": \"' + 'e' * (1 << 19) + '\"}')"),
        "fraction_subclass": returning(entry, "Big(1)", FRACTION_SUBCLASS),
        "colliding_ints": returning(entry, "[k * (2**61 - 1) for k in range(30000)]"),
        "huge_int": returning(entry, "1 << 500_000"),
        "signaling_nan": returning(entry, "decimal.Decimal('sNaN')", "import decimal\n"),
    }


# Texts a model could write, built to be costly to extract or sanitize on the host
HOSTILE_TEXTS = {
    "spans_fail_at_their_end": "```python\n" + "\n".join(["(a" + " +a" * 30] * 200) + "\n```",
    "unary_nesting": "```python\n" + "-" * 100_000 + "1\n```",
    "attribute_chain": "```python\n" + "a" + ".b" * 200_000 + "\n```",
    "open_fences": "```python\n" * 5_000,
    "fence_blanks": "```" + " " * 20_000 + "x\n",
}

# Math answers built to be costly for sympy (huge powers, deep nesting, long sums)
HOSTILE_MATH = {
    "tower": "\\boxed{9^{9^{9^{9}}}}",
    "power_of_power": "\\boxed{10^{10^{10}}}",
    "nested_braces": "\\boxed{" + "{" * 3000 + "1" + "}" * 3000 + "}",
    "nested_fracs": "\\boxed{" + "\\frac{1}{" * 400 + "2" + "}" * 400 + "}",
    "long_sum": "\\boxed{" + "+".join(["x"] * 20000) + "}",
    "factorial": "\\boxed{(10^{8})!}",
}


def rss_kb() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


class _Timed:
    """The executor, with the seconds each thread spent waiting for it (the rest of a verdict is the host's work)."""

    def __init__(self, ex):
        self.ex, self.local = ex, threading.local()

    def run(self, code, **kw):
        t = time.monotonic()
        try:
            return self.ex.run(code, **kw)
        finally:
            self.local.s = getattr(self.local, "s", 0.0) + time.monotonic() - t


def as_method(program: str, name: str) -> str:
    """A function candidate made LCB's ``Solution().<name>``: the lines before the def stay at the top."""
    head, _, body = program.partition(f"def {name}(*args):\n")
    return (head + f"class Solution:\n    def {name}(self, *args):\n"
            + "".join("    " + line + "\n" for line in body.splitlines()))


def judge_mixed(judge, problem, named: dict[str, str]) -> dict:
    """Judge every candidate of ``named`` once (one batch, the judge's own workers), each hostile one followed by
    the honest one of the same name prefix. -> {name: {"pass", "error", "host_s"}}, and the batch's peak growth."""
    from lorapop import hostmem

    timed = _Timed(judge.executor)
    judge.executor = timed
    host: dict[str, float] = {}
    by_text = {text: name for name, text in named.items()}
    inner = judge.judge_one

    def judge_one(p, cand):
        timed.local.s = 0.0
        t = time.monotonic()
        v = inner(p, cand)
        host[by_text[cand]] = time.monotonic() - t - timed.local.s
        return v

    judge.judge_one = judge_one
    names = list(named)
    judge.expected(problem) if problem.benchmark != "livecodebench" else None
    before = rss_kb()
    window = hostmem.PeakWindow()
    t0 = time.monotonic()
    try:
        verdicts = judge.judge([problem] * len(names), [named[n] for n in names])
    finally:
        judge.judge_one, judge.executor = inner, timed.ex
    wall = time.monotonic() - t0
    peak = window.close()
    return {"verdicts": {n: {"pass": bool(v["pass"]), "error": str(v.get("error"))[:120], "host_s": host[n]}
                         for n, v in zip(names, verdicts)},
            "growth_kb": peak - before, "exact": window.exact, "wall_s": wall}


def code_probe() -> dict:
    from lorapop.eval.data import load_benchmark
    from lorapop.eval.harness import RESULT_MAX_CHARS, CodeJudge, candidate_program, make_executor, result_cap
    from lorapop.eval.sanitize import PARSE_BUDGET_FACTOR, PARSE_FLOOR_CHARS

    out: dict = {"limits": {"result_max_chars": RESULT_MAX_CHARS, "parse_budget_factor": PARSE_BUDGET_FACTOR,
                            "parse_floor_chars": PARSE_FLOOR_CHARS}}
    mbpp = {p.id: p for p in load_benchmark("mbppplus")[0]}
    he = load_benchmark("humanevalplus", str(FIX / "humanevalplus_tiny.jsonl"))[0]
    lcb = {p.id: p for p in load_benchmark("livecodebench", str(FIX / "lcb_tiny.jsonl"))[0]}
    lcb_sols = json.loads((FIX / "lcb_tiny_solutions.json").read_text())
    ex = make_executor(workers=2)
    try:
        judge = CodeJudge(ex, workers=2)
        cases = [("mbpp", mbpp["Mbpp/2"]), ("humaneval", he[0])]
        for label, p in cases:
            entry = p.gold["entry_point"]
            named = {}
            for k, text in hostile_returns(entry).items():
                named[k] = text
                named["honest_after_" + k] = (p.gold["canonical_solution"] if label == "mbpp"
                                              else p.gold["prompt"] + p.gold["canonical_solution"]) + f"\n# {k}\n"
                named["wrong_after_" + k] = returning(entry, "None") + f"# {k}\n"
            r = judge_mixed(judge, p, named)
            exp = judge.expected(p)
            r["cap_chars"] = max(result_cap(exp.chars[w]) for w in ("base", "plus"))
            out[label] = r
        functional = next(p for p in lcb.values() if p.gold["fn_name"])
        stdio = next(p for p in lcb.values() if not p.gold["fn_name"])
        for label, p in (("lcb_functional", functional), ("lcb_stdio", stdio)):
            honest = lcb_sols[p.id]
            if p.gold["fn_name"]:
                hostile = {k: as_method(v, p.gold["fn_name"]) for k, v in hostile_returns(p.gold["fn_name"]).items()
                           if not k.startswith(("fraction_subclass", "signaling_nan"))}
                hostile["signaling_nan"] = ("import decimal\nclass Solution:\n    def %s(self, *a):\n"
                                            "        return decimal.Decimal('sNaN')\n" % p.gold["fn_name"])
            else:
                hostile = {"print_signaling_nan": "print('sNaN')\n",
                           "forge_unhashable_literal": forge("main", "'{[1]: 2}'") + "main()\n",
                           "forge_list_literal_3mib": forge("main", "'[' + '0,' * (3 << 19) + ']'") + "main()\n"}
            named = {}
            for k, text in hostile.items():
                named[k] = text
                named["honest_after_" + k] = honest + f"# {k}\n"
            r = judge_mixed(judge, p, named)
            r["cap_chars"] = result_cap(sum(len(json.dumps(t["output"])) for t in p.gold["tests"]))
            out[label] = r
        # extraction and sanitizing of hostile texts, on the host
        texts = {}
        for k, text in HOSTILE_TEXTS.items():
            t = time.monotonic()
            try:
                err = None if isinstance(candidate_program(text, "f"), str) else "no program"
            except Exception as e:  # noqa: BLE001 - recorded: the test asserts there is none
                err = type(e).__name__
            texts[k] = {"s": time.monotonic() - t, "chars": len(text), "error": err}
        out["texts"] = texts
    finally:
        ex.close()
    return out


def math_probe(timeout_s: float = 10.0) -> dict:
    from lorapop import hostmem
    from lorapop.eval.mathcheck import MathChecker

    checker = MathChecker(timeout_s=timeout_s)
    res: dict = {"timeout_s": timeout_s, "memory_mb": checker.memory_mb, "answers": {}}
    try:
        checker.score(["2"], "\\boxed{2}")  # the helper's start-up, outside the measured window
        before = rss_kb()
        window = hostmem.PeakWindow()
        for k, text in HOSTILE_MATH.items():
            t = time.monotonic()
            v = checker.score(["2"], text)
            s = time.monotonic() - t
            honest = checker.score(["\\frac{1}{2}"], "so the answer is \\boxed{0.5}")
            wrong = checker.score(["3"], "\\boxed{2}")
            helper_hwm = hostmem.proc_status_kb("VmHWM", checker._proc.pid) if checker._proc else None
            res["answers"][k] = {"pass": v["pass"], "timeout": bool(v.get("timeout")), "s": s,
                                 "honest_after": honest["pass"], "wrong_after": wrong["pass"],
                                 "helper_hwm_kb": helper_hwm}
        res["growth_kb"] = window.close() - before
    finally:
        checker.close()
    return res


def main() -> None:
    out = {"euid": os.geteuid(), "code": code_probe()}
    if "--math" in sys.argv:
        out["math"] = math_probe()
    print(json.dumps(out))


if __name__ == "__main__":
    # run as a script with -S: the checkout's own virtual environment (numpy for lorapop.eval, math-verify) is found
    # beside it when it lives there
    for site in sorted((REPO / ".venv" / "lib").glob("python3*/site-packages")):
        sys.path.append(str(site))
    sys.path.insert(0, str(REPO))
    main()
