"""Generation and scoring of one benchmark for many adapters at once.

All (problem x adapter) rows of a benchmark go to the multi-LoRA engine in one ``generate`` call (the engine sorts
them by prompt length and chunks them by its ``gen_batch_size``), so the base (adapter id -1) and every member share
each batch. Prompts come from :mod:`lorapop.eval.prompts`. Math answers are checked in a helper process with a
bounded time (:mod:`lorapop.eval.mathcheck`); code runs in the sandbox and is compared on the host
(:mod:`lorapop.eval.code`, :mod:`lorapop.eval.outputs`).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from lorapop.engine.base import Engine
from lorapop.eval import code as codeh
from lorapop.eval import outputs as cmp
from lorapop.eval.data import BenchmarkSpec, Problem
from lorapop.eval.mathcheck import MathChecker, default_checker, score_math
from lorapop.eval.prompts import Rendered, render, template_for
from lorapop.progress import progress

# Modules a benchmark program (or its canonical solution) may import inside the sandbox, on top of the executor's
# defaults; the judging programs themselves need pickle, io, time and sys.
EVAL_PRELOAD = ("pickle", "io", "time", "sys", "copy", "random", "statistics", "datetime", "hashlib", "fractions",
                "decimal", "cmath", "string", "calendar", "queue", "array", "struct", "base64", "zlib")


# The longest result a sandbox run may return: the executor refuses a longer one before the host parses anything
# (the largest of the shipped canonical results, Mbpp/630's, is 9.2 MiB). The executor reads up to 4 bytes a
# character of it, so a result can hold about 12 times this many bytes of the host while it is read; a candidate's
# run is read only up to its own cap (result_cap, passed to the executor), so a forged one holds at most about 12
# times that.
RESULT_MAX_CHARS = 16 << 20
# A candidate's result may be at most this many characters more than RESULT_FACTOR times the expected outputs' JSON
# (a right answer's outputs encode to about the expected ones' size: floats within tolerance up to 8 times longer,
# and repr may double a JSON text's backslashes); a longer one fails unread, so what the host spends rebuilding and
# comparing a candidate's outputs, and reading them, is bounded by the benchmark's own expected outputs, not by the
# candidate.
RESULT_FLOOR_CHARS = 1 << 20
RESULT_FACTOR = 16


def result_cap(expected_chars: int) -> int:
    """The longest result (``repr`` of its JSON) a candidate may return when the expected outputs take
    ``expected_chars`` characters of JSON."""
    return min(RESULT_MAX_CHARS, RESULT_FLOOR_CHARS + RESULT_FACTOR * expected_chars)


def make_executor(workers: int = 2, memory_mb: int = 4096) -> Any:
    """A SandboxExecutor sized for benchmark judging (large verdict/expected-output reprs, more memory). Its hash
    seeds are fixed (the trainer's are drawn per run): an answer, or a held-out task of a science figure, is judged
    alike in every evaluation, so figures recomputed from committed data come out the same."""
    from lorapop.tasks.common import DETERMINISM_SEEDS
    from lorapop.executor.base import DEFAULT_PRELOAD, ExecutorConfig
    from lorapop.executor.sandbox import SandboxExecutor

    preload = tuple(DEFAULT_PRELOAD) + tuple(m for m in EVAL_PRELOAD if m not in DEFAULT_PRELOAD)
    return SandboxExecutor(ExecutorConfig(n_workers=workers, memory_mb=memory_mb, preload=preload,
                                          max_repr_chars=RESULT_MAX_CHARS, max_output_chars=1 << 20, fsize_mb=16,
                                          hashseeds=DETERMINISM_SEEDS))


def _text(x: Any, n: int = 300) -> str | None:
    """A run's own error message, as it sent it (a string, cut short), or None."""
    return x[:n] if isinstance(x, str) and x else None


@dataclass(frozen=True)
class Sampling:
    """``lorapop eval --samples N``: N sampled answers per problem (for pass@k) instead of one greedy answer. A row's
    seed depends on its problem and sample index only, so every adapter draws with the same random numbers."""
    n: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def row_seed(self, row: int) -> int:
        return self.seed * 1_000_003 + row


@dataclass
class BenchResult:
    """Per adapter id: one 0/1 per problem (same order as the problems), plus what the pass cost. With sampling,
    ``correct`` holds per problem how many of the ``samples`` answers passed, and ``passed`` one 0/1 per answer
    (problem-major)."""
    passed: dict[int, list[int]]
    correct: dict[int, list[int]] = field(default_factory=dict)
    samples: int = 1
    extra: dict[int, list[dict]] = field(default_factory=dict)  # per-problem details (answers, errors)
    gen_tokens: dict[int, int] = field(default_factory=dict)
    gen_s: float = 0.0
    score_s: float = 0.0
    warnings: list[str] = field(default_factory=list)
    prompt_example: str = ""  # the first problem's prompt as text, for eval.json


def render_prompts(engine: Engine, problems: list[Problem], template: str, family: str,
                   cache: dict | None = None) -> list[Rendered]:
    """One :class:`~lorapop.eval.prompts.Rendered` prompt per problem, built from the engine's tokenizer."""
    cache = cache if cache is not None else {}
    out = []
    for p in problems:
        key = (p.benchmark, p.id, template)
        if key not in cache:
            cache[key] = render(engine.tokenizer, template, family, p.task)
        out.append(cache[key])
    return out


def generate_rows(engine: Engine, prompts: list[Rendered], adapter_ids: list[int], max_new_tokens: int,
                  sampling: Sampling | None = None) -> dict[int, list[Any]]:
    """Completions for every (prompt, adapter) pair in one engine call: {adapter_id: [Completion]}; greedy, or
    sampled with ``sampling``'s temperature/top_p and a seed per prompt row."""
    from lorapop.engine import SamplingParams

    ids, rows = [], []
    for i, r in enumerate(prompts):
        for a in adapter_ids:  # members interleaved per problem: every batch mixes adapters
            ids.append(r.ids)
            rows.append((i, a))
    if sampling is None:
        params, seeds = SamplingParams(max_new_tokens=max_new_tokens, greedy=True), [0] * len(ids)
    else:
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=sampling.temperature,
                                top_p=sampling.top_p)
        seeds = [sampling.row_seed(i) for i, _ in rows]
    comps = engine.generate(ids, [a for _, a in rows], params, seeds=seeds)
    out: dict[int, list[Any]] = {a: [None] * len(prompts) for a in adapter_ids}
    for (i, a), c in zip(rows, comps):
        out[a][i] = c
    return out


def _pmap(fn, items: list, workers: int) -> list:
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))


@dataclass
class Expected:
    """A problem's canonical outputs and times per input, and its inputs as the host rebuilt them."""
    outs: dict[str, list]  # "base" | "plus" -> decoded outputs
    times: dict[str, list[float]]
    inputs: dict[str, list]
    chars: dict[str, int]  # "base" | "plus" -> characters of the outputs' JSON (what a candidate's result is capped by)


def candidate_outputs(value: str | None, max_chars: int) -> tuple[dict, list]:
    """A candidate run's result (``repr`` of its JSON, at most ``max_chars`` characters) -> (the result object, its
    outputs rebuilt within :mod:`lorapop.eval.outputs`' bounds)."""
    res = cmp.read_result(value, max_chars)
    return res, cmp.decode_all(res.get("outs") or [])


def candidate_program(text: str, entry_point: str | None) -> str:
    """The program judged for a completion (:func:`~lorapop.eval.code.extract_solution`); a text that makes the
    extraction raise gives a program that fails with the reason, in the sandbox like any other."""
    try:
        return codeh.extract_solution(text, entry_point)
    except Exception as e:  # noqa: BLE001 - whatever an answer's text makes the host raise is that answer's failure
        return f"raise SyntaxError({('answer could not be extracted: ' + type(e).__name__)!r})\n"


def _failure(e: Exception) -> str:
    return str(e)[:300] if isinstance(e, cmp.WireError) else f"unjudgeable output: {type(e).__name__}"


class CodeJudge:
    """Judges candidate programs: each runs in the sandbox on the inputs alone, the host compares (see
    :mod:`lorapop.eval.code`). EvalPlus time limits per input: ``max(min_time_limit, gt_time_limit_factor * t)``."""

    def __init__(self, executor: Any, min_time_limit: float = 1.0, gt_time_limit_factor: float = 4.0,
                 lcb_timeout_s: float = 10.0, canonical_timeout_s: float = 120.0, workers: int = 2,
                 task_timeout_s: float = 60.0):
        self.executor, self.workers = executor, workers
        self.min_time_limit, self.gt_time_limit_factor = min_time_limit, gt_time_limit_factor
        self.lcb_timeout_s, self.canonical_timeout_s, self.task_timeout_s = \
            lcb_timeout_s, canonical_timeout_s, task_timeout_s
        self._expected: dict[tuple[str, str], Expected | str] = {}
        self._deserialize = codeh.mbpp_deserializer()

    def time_limits(self, times: list[float]) -> list[float]:
        return [max(self.min_time_limit, self.gt_time_limit_factor * t) for t in times]

    def expected(self, p: Problem) -> Expected | str:
        """The canonical solution's outputs (run in the sandbox once per problem), or an error string."""
        key = (p.benchmark, p.id)
        if key not in self._expected:
            r = self.executor.run(codeh.evalplus_expected_program(p.gold, p.benchmark),
                                  timeout_s=self.canonical_timeout_s)
            try:
                if r.status != "ok":
                    raise cmp.WireError(f"{r.status} {r.error}")
                res = cmp.read_result(r.value, RESULT_MAX_CHARS)
                dataset = codeh.dataset_of(p.benchmark)
                inputs = {w: (self._deserialize(p.gold["task_id"], p.gold[w + "_input"]) if dataset == "mbpp"
                              else p.gold[w + "_input"]) for w in ("base", "plus")}
                if p.gold["base_input"] is None:  # HumanEval: recorded from its check() (lorapop/eval/code.py)
                    inputs["base"] = res["inputs"]
                self._expected[key] = Expected(
                    {w: cmp.decode_all(res[w]["outs"], max_int_bits=None) for w in ("base", "plus")},
                    {w: [float(t) for t in res[w]["times"]] for w in ("base", "plus")}, inputs,
                    {w: len(json.dumps(res[w]["outs"])) for w in ("base", "plus")})
            except Exception as e:  # noqa: BLE001 - a broken canonical solution is that problem's harness error
                self._expected[key] = f"canonical solution of {p.id} failed in the sandbox: {type(e).__name__}: {e}"
        return self._expected[key]

    def _evalplus_part(self, p: Problem, cand: str, exp: Expected, which: str) -> tuple[bool, str | None]:
        if not exp.inputs[which]:
            return True, None
        limits = self.time_limits(exp.times[which])
        gold = p.gold if p.gold["base_input"] is not None else {**p.gold, "base_input": exp.inputs["base"]}
        # EvalPlus's per-task budget: min(60 s, sum of the limits) + 1 s, + 1 s to collect results; +1 s here for
        # starting the run (fork, reading the inputs).
        budget = min(self.task_timeout_s, sum(limits)) + 3.0
        cap = result_cap(exp.chars[which])
        r = self.executor.run(codeh.evalplus_candidate_program(gold, p.benchmark, cand, which, limits),
                              timeout_s=budget, max_result_chars=cap)
        if r.status != "ok":
            return False, f"{which}: {r.status}: {r.error or ''}"[:300]
        try:
            res, outs = candidate_outputs(r.value, cap)
            ok, err = cmp.evalplus_check(codeh.dataset_of(p.benchmark), p.gold["entry_point"], exp.inputs[which],
                                         outs, exp.outs[which], p.gold["atol"])
        except Exception as e:  # noqa: BLE001 - whatever a candidate's result makes the host raise is its failure
            return False, f"{which}: {_failure(e)}"
        if ok:
            return True, None
        # the run's own error (exception, timeout) explains a missing output better than "no output"
        return False, (_text(res.get("error")) if _text(res.get("error")) and len(outs) < len(exp.inputs[which])
                       else f"{which} {err}")

    def judge_one(self, p: Problem, cand: str) -> dict:
        """The verdict for one candidate program: ``{"pass", "base"?, "error"}``; pass is the benchmark's pass
        (EvalPlus: base and plus inputs)."""
        if p.benchmark == "livecodebench":
            cap = result_cap(sum(len(json.dumps(t["output"])) for t in p.gold["tests"]))
            r = self.executor.run(codeh.lcb_candidate_program(p.gold, cand), timeout_s=self.lcb_timeout_s,
                                  max_result_chars=cap)
            if r.status != "ok":
                return {"pass": False, "error": f"{r.status}: {r.error or ''}"[:300]}
            try:
                res, outs = candidate_outputs(r.value, cap)
                ok, err = cmp.lcb_check(p.gold["tests"], outs, functional=bool(p.gold["fn_name"]))
            except Exception as e:  # noqa: BLE001 - whatever a candidate's result makes the host raise is its failure
                return {"pass": False, "error": _failure(e)}
            return {"pass": ok, "error": None if ok else (_text(res.get("error")) or err)}
        exp = self.expected(p)
        if isinstance(exp, str):
            return {"pass": False, "base": False, "error": exp, "harness_error": True}
        base, err = self._evalplus_part(p, cand, exp, "base")
        plus = False
        if base:  # EvalPlus's plus pass needs the base pass too; a failed base makes the plus run moot
            plus, err = self._evalplus_part(p, cand, exp, "plus")
        return {"pass": plus, "base": base, "error": err}

    def judge(self, problems: list[Problem], candidates: list[str], desc: str = "judge") -> list[dict]:
        """One verdict per (problem, candidate program) pair, with progress for long work."""
        if problems and problems[0].benchmark in ("mbppplus", "humanevalplus", "humaneval"):
            todo = [p for p in {p.id: p for p in problems}.values() if (p.benchmark, p.id) not in self._expected]
            with progress(f"{desc}: canonical solutions", total=len(todo), unit="problems") as bar:
                lock = threading.Lock()

                def canon(p):
                    self.expected(p)
                    with lock:
                        bar.advance()

                _pmap(canon, todo, self.workers)
        with progress(f"{desc}: candidates", total=len(problems), unit="programs") as bar:
            lock = threading.Lock()

            def one(pc):
                v = self.judge_one(*pc)
                with lock:
                    bar.advance()
                return v

            return _pmap(one, list(zip(problems, candidates)), self.workers)


def evaluate_benchmark(engine: Engine, spec: BenchmarkSpec, problems: list[Problem], adapter_ids: list[int],
                       max_new_tokens: int, judge: CodeJudge | None = None, keep_text: bool = False,
                       template: str | None = None, prompt_cache: dict | None = None,
                       checker: MathChecker | None = None, sampling: Sampling | None = None) -> BenchResult:
    """Generate for every (problem, adapter) and score. ``template`` defaults to the family's default
    (:func:`lorapop.eval.prompts.template_for` with ``auto``). With ``sampling``, every problem is answered
    ``sampling.n`` times (each answer scored like a greedy one) and ``correct`` counts the passes per problem."""
    template = template or template_for("auto", spec.family)
    n = sampling.n if sampling is not None else 1
    problems = [p for p in problems for _ in range(n)]  # problem-major: rows i*n .. i*n+n-1 answer problem i
    prompts = render_prompts(engine, problems, template, spec.family, prompt_cache)
    t0 = time.perf_counter()
    comps = generate_rows(engine, prompts, adapter_ids, max_new_tokens, sampling)
    gen_s = time.perf_counter() - t0
    res = BenchResult({}, gen_s=gen_s, prompt_example=prompts[0].text if prompts else "")
    res.gen_tokens = {a: sum(len(c.token_ids) for c in cs) for a, cs in comps.items()}
    t1 = time.perf_counter()
    if spec.family == "math":
        checker = checker or default_checker()
        for a, cs in comps.items():
            with progress(f"check {spec.name}", total=len(cs), unit="answers") as bar:
                scored = []
                for p, c in zip(problems, cs):
                    scored.append(score_math(p.gold, c.text, checker))
                    bar.advance()
            res.passed[a] = [int(s["pass"]) for s in scored]
            res.extra[a] = [{"answer": s["answer"], **({"timeout": True} if s.get("timeout") else {})}
                            for s in scored]
    else:
        if judge is None:
            raise ValueError("code benchmarks need a CodeJudge")
        flat = [(a, i) for a in adapter_ids for i in range(len(problems))]
        programs = [candidate_program(prompts[i].response_prefix + comps[a][i].text,
                                      problems[i].gold.get("entry_point")) for a, i in flat]
        verdicts = judge.judge([problems[i] for _, i in flat], programs, desc=spec.name)
        for a in adapter_ids:
            res.passed[a], res.extra[a] = [], []
        for (a, i), v in zip(flat, verdicts):
            res.passed[a].append(int(bool(v.get("pass"))))
            res.extra[a].append({k: v.get(k) for k in ("base", "error") if k in v})
            if v.get("harness_error") and a == adapter_ids[0]:
                res.warnings.append(str(v.get("error")))
    if keep_text:
        for a, cs in comps.items():
            for e, c in zip(res.extra[a], cs):
                e["text"], e["gen_tokens"] = c.text, len(c.token_ids)
    res.score_s = time.perf_counter() - t1
    if sampling is not None:
        res.samples = n
        res.correct = {a: [sum(p[i:i + n]) for i in range(0, len(p), n)] for a, p in res.passed.items()}
    return res
