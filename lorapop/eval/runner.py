"""What ``lorapop eval`` runs (lorapop/commands/eval.py parses its flags): greedy pass@1 of the base and every
member, one engine pass per benchmark; with ``--samples N --temperature T [--top-p P] --k 1,5,10``, pass@k from N
sampled answers per problem (the unbiased estimator of Chen et al. 2021, :mod:`lorapop.eval.passk`) beside pass@1
estimated the same way.

Runs that share a base model and LoRA rank share one engine: all their members are loaded into its slots, and each
benchmark's problems x (base + all members) rows go through one ``generate`` call. The **baseline** is the run
named by ``--baseline``, else the run whose config says ``population.mode: single`` (the first such run). Population
statistics (mean/min/max over members) are reported for students (the solvers; single-mode "agent" members count as
students) and for all members. ``aggregate`` is the unweighted mean over the evaluated benchmarks, computed per
member first (so its min/max are over members).

With no ``--benchmarks`` every benchmark whose data is present is evaluated and one line names the skipped ones;
nothing is fetched from the hub unless ``--data NAME=HUB_ID`` names a hub dataset. Prompts follow ``--prompt``
(:mod:`lorapop.eval.prompts`); the templates used, one rendered example per benchmark and the EvalPlus time-limit
factors are recorded in ``eval.json``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lorapop.configlib import ConfigError, doc
from lorapop.eval.passk import mean_pass_at_k, parse_ks
from lorapop.eval.data import (BENCHMARKS, BenchmarkError, default_data_dir, get_spec, is_available, load_benchmark,
                               parse_benchmarks)
from lorapop.eval.prompts import describe, template_for
from lorapop.records.members import Member
from lorapop.records.rundir import RunDir

BASE = -1


@dataclass
class EvalConfig:
    benchmarks: str = doc("available",
        f"comma-separated benchmark names ({', '.join(BENCHMARKS)}), or 'all', 'code', 'math'; "
        "'available' (default): every benchmark whose data is present, naming the ones it skips")
    prompt: str = doc("auto",
        "prompt template: auto (evalplus for code, azr for math), evalplus, azr or plain; see "
        "lorapop/eval/prompts.py and docs/USAGE.md for the exact text")
    limit: int | None = doc(None, "evaluate only the first N problems of each benchmark", ge=1)
    step: int | None = doc(None, "checkpoint step to evaluate (default: latest complete)")
    max_new_tokens_code: int = doc(512, "generation budget for code benchmarks", ge=1)
    max_new_tokens_math: int = doc(512, "generation budget for math benchmarks", ge=1)
    batch_size: int = doc(32, "rows per generation forward (engine gen_batch_size)", ge=1)
    data_dir: str | None = doc(None,
        "directory with code/*.jsonl and math/*.jsonl (default: $LORAPOP_DATA_DIR or the data shipped in "
        "lorapop/data)")
    data: dict[str, str] = doc({},
        "per-benchmark source: a local JSONL file or a hub dataset id (name=PATH, repeatable)")
    min_time_limit: float = doc(1.0,
        "EvalPlus: least seconds a candidate may take on one input (evalplus --min-time-limit, default 1; "
        "AZR's evaluation uses 10)", ge=0)
    gt_time_limit_factor: float = doc(4.0,
        "EvalPlus: a candidate may take this many times the canonical solution's time on each input "
        "(evalplus --gt-time-limit-factor, default 4; AZR's evaluation uses 8)", gt=0)
    code_timeout_s: float = doc(10.0,
        "LiveCodeBench: sandbox wall clock per candidate for all of its tests", gt=0)
    math_timeout_s: float = doc(20.0,
        "longest wait for one math answer check (math-verify runs in a helper process that is replaced "
        "when it overruns; the answer then counts as wrong)", gt=0)
    code_workers: int = doc(2, "sandbox workers judging code in parallel", ge=1)
    device: str = doc("auto", "engine device: auto | cpu | cuda")
    dtype: str = doc("auto",
        "base model dtype: auto (bfloat16 on a bf16 GPU or a CPU where bf16 measures faster, else float32), "
        "float32, bfloat16 or float16")
    backend: str = doc("torch",
        "what generates the answers: torch (lorapop's engine) or vllm (one multi-LoRA vLLM engine over "
        "every member, as engine.backend vllm; needs scripts/setup.sh --vllm)", choices=("torch", "vllm"))
    baseline: str | None = doc(None,
        "run dir to treat as the baseline (default: the run whose config has population.mode: single)")
    out: str | None = doc(None, "path of the combined eval.json (default: none)")
    keep_text: bool = doc(False, "store every generated text in eval.json")
    write_run_files: bool = doc(True, "write eval.json into each run dir")
    threads: int | None = doc(None,
        "torch CPU threads (1 is fastest on a CPU shared with other jobs); default: torch's choice", ge=1)
    model: str = doc("embedded",
        "base model when no run dir is given (base-only evaluation)")
    samples: int | None = doc(None,
        "sample this many answers per problem and report pass@k (Chen et al. 2021's unbiased estimator) "
        "instead of greedy pass@1 (default: greedy, one answer)", ge=1)
    temperature: float = doc(1.0, "sampling temperature with --samples")
    top_p: float = doc(1.0, "nucleus sampling mass with --samples")
    k: str | None = doc(None,
        "comma-separated k for pass@k with --samples, each at most --samples (default: those of 1,5,10 "
        "that --samples allows)")
    seed: int = doc(0, "sampling seed with --samples (a row's seed is derived from it "
                       "and the problem and sample index, the same for every member)")

    def sampling(self):
        """The :class:`~lorapop.eval.harness.Sampling` of ``--samples``, or None (greedy)."""
        from lorapop.eval.harness import Sampling

        return None if self.samples is None else Sampling(self.samples, self.temperature, self.top_p, self.seed)

    def ks(self) -> list[int]:
        return parse_ks(self.k, self.samples) if self.samples is not None else []

    def validate(self) -> None:
        if self.samples is None:
            if self.k is not None:
                raise ConfigError("--k: pass@k needs sampled answers; add --samples N (N >= the largest k)")
            return
        if self.temperature <= 0:
            raise ConfigError(f"--temperature: must be > 0 with --samples (greedy is the default without "
                              f"--samples), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"--top-p: must be in (0, 1], got {self.top_p}")
        self.ks()


@dataclass
class _Run:
    path: Path
    checkpoint: Path
    step: int
    members: list[Member]
    model: str
    slots: dict[str, int] = field(default_factory=dict)


def _stats(values: list[float]) -> dict | None:
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values), "n": len(values)} \
        if values else None


def _engine_for(group: list[_Run], cfg: EvalConfig):
    from lorapop.engine import DEFAULT_TARGET_MODULES, EngineConfig
    from lorapop.engine.factory import make_engine

    ms = [m for r in group for m in r.members]
    common = dict(gen_batch_size=cfg.batch_size, device=cfg.device, dtype=cfg.dtype, backend=cfg.backend)
    if not ms:
        return make_engine(group[0].model, 1, EngineConfig(**common))
    targets: list[str] = []
    for m in ms:
        targets += [t for t in m.target_modules if t not in targets]
    ecfg = EngineConfig(rank=ms[0].rank, lora_alpha=ms[0].lora_alpha,
                        target_modules=targets or list(DEFAULT_TARGET_MODULES), **common)
    engine = make_engine(group[0].model, len(ms), ecfg)
    slot = 0
    try:
        for r in group:
            for m in r.members:
                engine.load_adapter(slot, m.adapter_dir)
                r.slots[m.id] = slot
                slot += 1
    except BaseException:  # a bad adapter dir: the engine goes with the error (one vLLM engine per process)
        engine.close()
        raise
    return engine


def _discover(run_dirs: list[str], step: int | None) -> list[_Run]:
    runs = []
    for d in run_dirs:
        p, rd = Path(d), RunDir(d)
        ck = rd.find_checkpoint(step)
        runs.append(_Run(p, ck, int(ck.name.split("_")[-1]), rd.checkpoint_members(ck), rd.model_name()))
    return runs


def select_benchmarks(cfg: EvalConfig) -> tuple[list[str], list[str]]:
    """(benchmarks to evaluate, benchmarks skipped for want of data). Only ``available`` skips: a benchmark named
    explicitly without data fails with an error that says where to get it."""
    if cfg.benchmarks.strip() != "available":
        return parse_benchmarks(cfg.benchmarks), []
    names = [b for b, s in BENCHMARKS.items() if b in cfg.data or is_available(s, None, cfg.data_dir)]
    return names, [b for b in BENCHMARKS if b not in names]


def skipped_line(skipped: list[str], data_dir: str | None) -> str:
    where = data_dir or default_data_dir()
    return (f"skipped {', '.join(skipped)}: no data file in {where}; add one with --data NAME=PATH "
            "(a local JSONL file, or a hub dataset id to download)")


def _load_problems(names: list[str], cfg: EvalConfig) -> tuple[dict[str, list], dict[str, str], list[str]]:
    """(problems per benchmark, errors per benchmark that could not load, warnings)."""
    problems: dict[str, list] = {}
    errors: dict[str, str] = {}
    warnings: list[str] = []
    for b in names:
        try:
            problems[b], w = load_benchmark(b, cfg.data.get(b), cfg.data_dir, cfg.limit)
            warnings += w
            if not problems[b]:
                errors[b] = "no problems loaded"
        except (BenchmarkError, OSError) as e:
            errors[b] = str(e)
    return problems, errors, warnings


def _engine_groups(runs: list[_Run], cfg: EvalConfig, warnings: list[str]) -> dict[tuple, list[_Run]]:
    """Runs by (model, rank): each group shares one engine. No run: the base alone, one (unused) slot."""
    groups: dict[tuple, list[_Run]] = {}
    for r in runs:
        groups.setdefault((r.model, r.members[0].rank), []).append(r)
    if not runs:
        groups[(cfg.model, 0)] = [_Run(Path("."), Path("."), 0, [], cfg.model)]
    if len({k[0] for k in groups}) > 1 or len(groups) > 1:
        warnings.append(f"runs use {len(groups)} (model, rank) combinations: evaluated in separate engine passes")
    return groups


@dataclass
class _Tally:
    """What the benchmark passes gather: scores per run and member and of the base, timings, warnings, errors."""
    per_member: dict[str, dict[str, dict]]
    errors: dict[str, str]
    warnings: list[str]
    base_scores: dict[str, dict] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    prompt_examples: dict[str, str] = field(default_factory=dict)


@dataclass
class _Pass:
    """How every benchmark is asked and judged: prompts, sampling, the judges."""
    cfg: EvalConfig
    templates: dict[str, Any]
    sampling: Any
    ks: list[int] | None
    judge: Any
    checker: Any


def _evaluate_group(gi: int, group: list[_Run], engine: Any, problems: dict[str, list], how: _Pass,
                    tally: _Tally, with_runs: bool) -> None:
    """Every benchmark through one engine holding the group's members (the base's scores from the first group)."""
    from lorapop.eval.harness import evaluate_benchmark

    cfg = how.cfg
    ids = [BASE] + [s for r in group for s in r.slots.values()]
    for b, probs in problems.items():
        if b in tally.errors:
            continue
        spec = BENCHMARKS[b]
        mnt = cfg.max_new_tokens_code if spec.family == "code" else cfg.max_new_tokens_math
        t = time.perf_counter()
        try:
            res = evaluate_benchmark(engine, spec, probs, ids, mnt, how.judge, cfg.keep_text,
                                     template=how.templates[spec.family], checker=how.checker, sampling=how.sampling)
        except Exception as e:  # one broken benchmark must not sink the others
            tally.errors[b] = f"{type(e).__name__}: {e}"
            continue
        tally.timings[f"{b}/group{gi}"] = time.perf_counter() - t
        tally.warnings += res.warnings
        tally.prompt_examples.setdefault(b, res.prompt_example)
        if gi == 0:
            tally.base_scores[b] = _entry(res, BASE, probs, how.ks)
        for r in (group if with_runs else []):
            for m in r.members:
                tally.per_member[str(r.path)].setdefault(m.id, {})[b] = _entry(res, r.slots[m.id], probs, how.ks)


def run_eval(run_dirs: list[str], cfg: EvalConfig | None = None) -> dict:
    """Evaluate the runs; writes eval.json files and returns the combined result (see :func:`format_table`)."""
    from lorapop.eval.harness import CodeJudge, make_executor
    from lorapop.eval.mathcheck import MathChecker

    cfg = cfg or EvalConfig()
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    templates = {f: template_for(cfg.prompt, f) for f in ("code", "math")}
    sampling, ks = cfg.sampling(), cfg.ks()
    names, skipped = select_benchmarks(cfg)
    for b in cfg.data:
        get_spec(b)
    runs = _discover(run_dirs, cfg.step)
    problems, errors, warnings = _load_problems(names, cfg)
    groups = _engine_groups(runs, cfg, warnings)
    tally = _Tally({str(r.path): {} for r in runs}, errors, warnings)
    executor = make_executor(cfg.code_workers) if any(BENCHMARKS[b].family == "code" for b in problems) else None
    checker = MathChecker(cfg.math_timeout_s) if any(BENCHMARKS[b].family == "math" for b in problems) else None
    try:
        judge = CodeJudge(executor, cfg.min_time_limit, cfg.gt_time_limit_factor, lcb_timeout_s=cfg.code_timeout_s,
                          workers=cfg.code_workers) if executor else None
        how = _Pass(cfg, templates, sampling, ks, judge, checker)
        for gi, group in enumerate(groups.values()):
            # One engine at a time, closed before the next group's starts, also when a group fails: under
            # --backend vllm a second in-process vLLM engine may not start while the first lives (VLLMEngine's
            # "one engine per process", which refuses it).
            engine = _engine_for(group, cfg)
            try:
                _evaluate_group(gi, group, engine, problems, how, tally, bool(runs))
            finally:
                engine.close()
    finally:
        if executor is not None:
            executor.close()
        if checker is not None:
            checker.close()
    families = sorted({BENCHMARKS[b].family for b in names})
    setup = {"skipped": skipped, "prompt": cfg.prompt,
             "templates": {f: describe(templates[f], f) for f in families}, "prompt_examples": tally.prompt_examples,
             "code_time_limits": {"min_time_limit": cfg.min_time_limit,
                                  "gt_time_limit_factor": cfg.gt_time_limit_factor}}
    return _assemble(runs, names, problems, tally.errors, tally.warnings, tally.base_scores, tally.per_member,
                     tally.timings, cfg, setup)


def _entry(res, aid: int, probs, ks: list[int] | None = None) -> dict:
    """One adapter on one benchmark. Greedy: pass@1 and a 0/1 per problem. Sampled (``ks``): ``pass@1`` and
    ``pass@k`` by the unbiased estimator, ``correct`` (passes per problem out of ``samples``), and a 0/1 per
    answer in ``passed`` (problem-major)."""
    passed, n = res.passed[aid], res.samples
    e = {"pass@1": sum(passed) / len(passed), "n": len(probs), "passed": passed,
         "gen_tokens": res.gen_tokens.get(aid, 0)}
    if ks:
        correct = res.correct[aid]
        e.update({"pass@1": mean_pass_at_k(n, correct, 1), "samples": n, "correct": correct,
                  "pass@k": {str(k): mean_pass_at_k(n, correct, k) for k in ks}})
    if res.extra.get(aid) and any("base" in x for x in res.extra[aid]):
        e["base_tests_pass@1"] = sum(bool(x.get("base")) for x in res.extra[aid]) / len(passed)
    if res.extra.get(aid):
        rows = [(p, j) for p in probs for j in range(n)]
        e["details"] = [dict(x, id=p.id, **({"sample": j} if ks else {})) for x, (p, j) in zip(res.extra[aid], rows)]
    return e


def _summary(scores: dict[str, dict], benches: list[str], k: str | None = None) -> dict:
    """pass@1 per benchmark (pass@k with ``k``) and their unweighted mean, ``aggregate``."""
    out = {b: (scores[b]["pass@1"] if k is None else scores[b]["pass@k"][k]) for b in benches if b in scores}
    if out:
        out["aggregate"] = sum(out.values()) / len(out)
    return out


def _population(members: list[dict], ok: list[str], key: str = "scores") -> dict:
    pop = {}
    for label, sel in (("students", lambda m: m["role"] in ("student", "agent")), ("all", lambda m: True)):
        chosen = [m for m in members if sel(m)]
        pop[label] = {b: _stats([m[key][b] for m in chosen if b in m[key]]) for b in ok + (["aggregate"] if ok else [])}
    return pop


def _assemble(runs, names, problems, errors, warnings, base_scores, per_member, timings, cfg, setup) -> dict:
    ok = [b for b in names if b not in errors]
    base_sum = _summary(base_scores, ok)
    ks = cfg.ks()
    baseline_path = None
    if cfg.baseline:
        baseline_path = str(Path(cfg.baseline))
        if baseline_path not in per_member:
            raise ValueError(f"--baseline {cfg.baseline} is not one of the evaluated run dirs")
    else:
        singles = [str(r.path) for r in runs if RunDir(r.path).is_single()]
        baseline_path = singles[0] if singles else None
    run_objs = []
    for r in runs:
        pm = per_member[str(r.path)]
        members = []
        for m in r.members:
            members.append({"id": m.id, "role": m.role, "scores": _summary(pm.get(m.id, {}), ok),
                            "benchmarks": pm.get(m.id, {})})
            for k in ks:
                members[-1][f"pass@{k}"] = _summary(pm.get(m.id, {}), ok, str(k))
        pop = _population(members, ok)
        if ks:
            pop["pass@k"] = {str(k): _population(members, ok, f"pass@{k}") for k in ks}
        run_objs.append({"run_dir": str(r.path), "checkpoint": str(r.checkpoint), "step": r.step, "model": r.model,
                         "is_baseline": str(r.path) == baseline_path, "members": members, "population": pop})
    result = {"data_dir": cfg.data_dir, "benchmarks": ok, "n_problems": {b: len(problems.get(b, [])) for b in ok}, "errors": errors,
              "warnings": warnings, "limit": cfg.limit, "greedy": cfg.samples is None,
              "sampling": None if cfg.samples is None else {
                  "samples": cfg.samples, "temperature": cfg.temperature, "top_p": cfg.top_p, "k": ks,
                  "seed": cfg.seed, "estimator": "unbiased pass@k, Chen et al. 2021: 1 - C(n-c, k) / C(n, k)"},
              "max_new_tokens": {"code": cfg.max_new_tokens_code, "math": cfg.max_new_tokens_math},
              "base": {"scores": base_sum, "benchmarks": base_scores,
                       **({"pass@k": {str(k): _summary(base_scores, ok, str(k)) for k in ks}} if ks else {})},
              "baseline": baseline_path,
              "runs": run_objs, "timings_s": timings, "time": time.time(), **setup}
    if cfg.write_run_files:
        for ro in run_objs:
            one = dict(result, runs=[ro])
            RunDir(ro["run_dir"]).write_eval(one)
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps(result, indent=1))
    return result


def _pct(x) -> str:
    return "    -" if x is None else f"{100 * x:5.1f}"


def format_table(result: dict) -> str:
    """Per population run: rows = benchmarks + aggregate; columns = base, baseline, students and all members. With
    sampling, one such table per k (pass@1 first)."""
    lines = []
    ok = result["benchmarks"]
    sampling = result.get("sampling")
    # (label, base scores, population of a run entry): greedy pass@1, or pass@k for each sampled k
    metrics = [("pass@1", result["base"]["scores"], lambda r: r["population"])]
    if sampling:
        lines.append(f"pass@k from {sampling['samples']} samples per problem (temperature {sampling['temperature']}, "
                     f"top_p {sampling['top_p']}; unbiased estimator, Chen et al. 2021)")
        metrics = [(f"pass@{k}", result["base"]["pass@k"][str(k)],
                    lambda r, k=k: r["population"]["pass@k"][str(k)]) for k in sampling["k"]]
    baseline = next((r for r in result["runs"] if r["is_baseline"]), None)
    targets = [r for r in result["runs"] if not r["is_baseline"]] or result["runs"]
    if not targets:
        lines.append(f"base model only; {'benchmark':<14}{'n':>5} " + " ".join(f"{m:>7}" for m, _, _ in metrics))
        for b in ok + (["aggregate"] if ok else []):
            lines.append(f"{b:<14}{result['n_problems'].get(b, '')!s:>5} "
                         + " ".join(f"{_pct(base.get(b)):>7}" for _, base, _ in metrics))
    for r in targets:
        lines.append(f"run {r['run_dir']} (step {r['step']}, {len(r['members'])} members); baseline: "
                     f"{baseline['run_dir'] if baseline else 'none'}")
        for label, base, pop_of in metrics:
            lines.append(f"{label + ' ' * (14 - len(label)) if sampling else 'benchmark':<14}{'n':>5} {'base':>6} "
                         f"{'basel.':>6}  {'students mean/min/max':>21}  {'all members mean/min/max':>24}")
            for b in ok + (["aggregate"] if ok else []):
                bl = (pop_of(baseline)["students"].get(b) or {}).get("mean") if baseline else None
                s, a = pop_of(r)["students"].get(b), pop_of(r)["all"].get(b)
                trip = lambda st: "    -      -      -" if not st else \
                    f"{_pct(st['mean'])} {_pct(st['min'])} {_pct(st['max'])}"
                n = result["n_problems"].get(b, "")
                lines.append(f"{b:<14}{n!s:>5} {_pct(base.get(b)):>6} {_pct(bl):>6}  {trip(s):>21}  {trip(a):>24}")
        lines.append("")
    for b, e in result["errors"].items():
        lines.append(f"error: {b}: {e}")
    if result.get("skipped"):
        lines.append(skipped_line(result["skipped"], result.get("data_dir")))
    if result["warnings"]:
        lines.append(f"{len(result['warnings'])} warning(s) recorded in eval.json, first: {result['warnings'][0]}")
    return "\n".join(lines)
