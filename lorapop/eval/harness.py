"""Generation and scoring of one benchmark for many adapters at once.

All (problem x adapter) rows of a benchmark go to the multi-LoRA engine in one ``generate`` call (the engine sorts
them by prompt length and chunks them by its ``gen_batch_size``), so the base (adapter id -1) and every member share
each batch. Scoring then runs on the host (math) or in the sandbox (code).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from lorapop.eval import code as codeh
from lorapop.eval.data import BenchmarkSpec, Problem
from lorapop.eval.mathcheck import score_math

# Modules a benchmark program (or its canonical solution) may import inside the sandbox, on top of the executor's
# defaults; the judging programs themselves need pickle, io, time and sys.
EVAL_PRELOAD = ("pickle", "io", "time", "sys", "copy", "random", "statistics", "datetime", "hashlib", "fractions",
                "decimal", "cmath", "string", "calendar", "queue", "array", "struct", "base64", "zlib")


def make_executor(workers: int = 2, memory_mb: int = 4096) -> Any:
    """A SandboxExecutor sized for benchmark judging (large verdict/expected-output reprs, more memory)."""
    from lorapop.executor.sandbox import DEFAULT_PRELOAD, ExecutorConfig, SandboxExecutor

    preload = tuple(DEFAULT_PRELOAD) + tuple(m for m in EVAL_PRELOAD if m not in DEFAULT_PRELOAD)
    return SandboxExecutor(ExecutorConfig(n_workers=workers, memory_mb=memory_mb, preload=preload,
                                          max_repr_chars=64 << 20, max_output_chars=1 << 20, fsize_mb=16))


@dataclass
class BenchResult:
    """Per adapter id: one 0/1 per problem (same order as the problems), plus what the pass cost."""
    passed: dict[int, list[int]]
    extra: dict[int, list[dict]] = field(default_factory=dict)  # per-problem details (answers, errors)
    gen_tokens: dict[int, int] = field(default_factory=dict)
    gen_s: float = 0.0
    score_s: float = 0.0
    warnings: list[str] = field(default_factory=list)


def generate_rows(engine: Any, problems: list[Problem], adapter_ids: list[int], max_new_tokens: int,
                  prompt_cache: dict | None = None) -> dict[int, list[Any]]:
    """Greedy completions for every (problem, adapter) pair in one engine call: {adapter_id: [Completion]}."""
    from lorapop.engine import SamplingParams

    cache = prompt_cache if prompt_cache is not None else {}
    ids = []
    for p in problems:
        key = (p.benchmark, p.id, p.prompt)
        if key not in cache:
            cache[key] = engine.chat_prompt(p.prompt)
        ids.append(cache[key])
    prompts, rows = [], []
    for i, p_ids in enumerate(ids):
        for a in adapter_ids:  # members interleaved per problem: every batch mixes adapters
            prompts.append(p_ids)
            rows.append((i, a))
    params = SamplingParams(max_new_tokens=max_new_tokens, greedy=True)
    comps = engine.generate(prompts, [a for _, a in rows], params, seeds=[0] * len(prompts))
    out: dict[int, list[Any]] = {a: [None] * len(problems) for a in adapter_ids}
    for (i, a), c in zip(rows, comps):
        out[a][i] = c
    return out


def _pmap(fn, items: list, workers: int) -> list:
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))


class CodeJudge:
    """Judges candidate programs in the sandbox; caches EvalPlus expected outputs per problem."""

    def __init__(self, executor: Any, timeout_s: float = 10.0, canonical_timeout_s: float = 120.0,
                 time_factor: float = 4.0, workers: int = 2):
        self.executor, self.timeout_s, self.canonical_timeout_s = executor, timeout_s, canonical_timeout_s
        self.time_factor, self.workers = time_factor, workers
        self._expected: dict[tuple[str, str], tuple[bytes | None, float] | str] = {}

    def expected(self, p: Problem) -> tuple[bytes | None, float] | str:
        """(pickled outputs or None when they must be recomputed inline, canonical seconds) or an error string."""
        key = (p.benchmark, p.id)
        if key not in self._expected:
            r = self.executor.run(codeh.evalplus_expected_program(p.gold, p.benchmark),
                                  timeout_s=self.canonical_timeout_s)
            parsed = codeh.parse_expected(r.value) if r.status == "ok" else None
            if parsed is not None:
                self._expected[key] = parsed
            elif r.status in ("output_limit", "memory"):  # too large to ship back: the judge recomputes them
                self._expected[key] = (None, r.duration_s)
            else:
                self._expected[key] = f"canonical solution of {p.id} failed in the sandbox: {r.status} {r.error}"
        return self._expected[key]

    def judge(self, problems: list[Problem], candidates: list[str]) -> list[dict]:
        """One verdict per (problem, candidate program) pair; verdict["pass"] is the benchmark's pass."""
        if problems and problems[0].benchmark in ("mbppplus", "humanevalplus"):
            for p in {p.id: p for p in problems}.values():
                self.expected(p)

        def one(pc):
            p, cand = pc
            if p.benchmark == "livecodebench":
                prog, t = codeh.lcb_judge_program(p.gold, cand), self.timeout_s
            else:
                exp = self._expected[(p.benchmark, p.id)]
                if isinstance(exp, str):
                    return {"pass": False, "error": exp, "harness_error": True}
                blob, secs = exp
                prog = codeh.evalplus_judge_program(p.gold, p.benchmark, cand, blob)
                t = max(self.timeout_s, self.time_factor * secs + 1.0) * (1 if blob is not None else 2)
            r = self.executor.run(prog, timeout_s=t)
            v = codeh.parse_verdict(r.status, r.value, r.error)
            if "plus" in v:
                v["pass"] = bool(v.get("plus"))
            return v

        return _pmap(one, list(zip(problems, candidates)), self.workers)


def evaluate_benchmark(engine: Any, spec: BenchmarkSpec, problems: list[Problem], adapter_ids: list[int],
                       max_new_tokens: int, judge: CodeJudge | None = None,
                       keep_text: bool = False) -> BenchResult:
    t0 = time.perf_counter()
    comps = generate_rows(engine, problems, adapter_ids, max_new_tokens)
    gen_s = time.perf_counter() - t0
    res = BenchResult({}, gen_s=gen_s)
    res.gen_tokens = {a: sum(len(c.token_ids) for c in cs) for a, cs in comps.items()}
    t1 = time.perf_counter()
    if spec.family == "math":
        for a, cs in comps.items():
            scored = [score_math(p.gold, c.text) for p, c in zip(problems, cs)]
            res.passed[a] = [int(s["pass"]) for s in scored]
            res.extra[a] = [{"answer": s["answer"]} for s in scored]
    else:
        if judge is None:
            raise ValueError("code benchmarks need a CodeJudge")
        flat = [(a, i) for a in adapter_ids for i in range(len(problems))]
        verdicts = judge.judge([problems[i] for _, i in flat], [codeh.extract_code(comps[a][i].text) for a, i in flat])
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
                e["text"] = c.text
    res.score_s = time.perf_counter() - t1
    return res
