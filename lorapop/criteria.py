"""The pre-registered criteria of the dynamics experiment (docs/RESULTS.md, "Dynamics: pre-registration"), computed
from two run directories, a population run and its single-agent (AZR) baseline: ``criteria.json``.

The paper's claim is a contrast: the single agent *self-calibrates* (its solve rate climbs toward 1 while the tasks
it proposes get simpler), the population enters an *arms race* (student solve rates stay away from 0 and 1 and
reverse, teachers' complexity and coverage keep rising). Each criterion is one number compared with one threshold,
computed by this module only from ``metrics.jsonl`` and ``tasks.jsonl`` (and ``probe.jsonl`` for capability, when a
run has one), so a user's own pair of runs is judged by the same code as ours.

Windows scale with the run: ``head``/``tail`` are the first and last ``min(10, n // 3)`` steps, ``late`` is the last
``min(30, n // 2)`` steps, ``last_third`` the last ``n // 3``. A run shorter than :data:`MIN_STEPS` steps gets
``"held": null`` with the reason, never a verdict.

| id | run | criterion |
| --- | --- | --- |
| ``self_calibration.solve`` | single | mean matched solve rate over ``tail`` >= 0.8 and >= its ``head`` mean + 0.3 |
| ``self_calibration.trivial`` | single | share of trivial proposals over ``tail`` >= 0.6 (see :func:`is_trivial`) |
| ``self_calibration.simpler`` | single | mean AST depth of valid proposals over ``tail`` < its ``head`` mean |
| ``arms_race.band`` | population | mean matched solve rate over ``late`` in [0.15, 0.75] |
| ``arms_race.reversals`` | population | >= 2 reversals of the 5-step moving average of matched solve rate over ``late`` |
| ``arms_race.complexity`` | population | OLS slope of mean AST depth on step > 0, bootstrap 95% lower bound over steps |
| ``arms_race.coverage`` | both | population coverage gain over ``last_third`` >= 0.02 and > 2x the single agent's |
| ``arms_race.not_tied`` | population | mean ``student/zero_adv_group_frac`` over ``late`` < 0.5 |
| ``capability`` | both | last probe: students' mean minus the agent's > 0, bootstrap 95% lower bound over tasks |

A criterion holds for the experiment when it holds in at least 2 of 3 seeds (:func:`across_seeds`).

Probe figures leave out the rows of PBT children younger than ``run.probe_min_age`` (``counted: false``), and every
probe-based verdict carries ``noise_floor``: each run's step-0 spread of identical members' probe scores
(lorapop/train/probe.py), so a difference can be read against what sampling alone moves a score by. The floor is shown,
not used: the pre-registered thresholds stay as registered.
"""

from __future__ import annotations

import ast
import random
import statistics
from pathlib import Path
from typing import Any

from lorapop.modeltext import NotLiteral, parse_text

MIN_STEPS = 15
BOOTSTRAP = 2000
# the matched solve-rate key: it now lives under student/; older runs logged it at the top level
SOLVE_KEYS = ("student/matched_solve_rate", "matched_solve_rate")
COMPLEXITY_KEY = "complexity/ast_depth"


def _read(run_dir: Path, name: str) -> list[dict[str, Any]]:
    from lorapop.records.rundir import iter_jsonl

    notes: list[str] = []
    return [row for _, row in iter_jsonl(Path(run_dir) / name, notes)]


def series(rows: list[dict[str, Any]], *keys: str) -> list[tuple[int, float]]:
    """(step, value) of the first of ``keys`` each row has, one per step (the last row of a step wins, as after a
    resume that repeated none)."""
    out: dict[int, float] = {}
    for row in rows:
        for k in keys:
            if isinstance(row.get(k), (int, float)):
                out[int(row["step"])] = float(row[k])
                break
    return sorted(out.items())


def windows(n: int) -> dict[str, int]:
    return {"head": min(10, n // 3), "tail": min(10, n // 3), "late": min(30, n // 2), "last_third": n // 3}


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def moving_average(xs: list[float], w: int = 5) -> list[float]:
    return [statistics.fmean(xs[i - w + 1:i + 1]) for i in range(w - 1, len(xs))]


def reversals(xs: list[float]) -> int:
    """Sign changes of the first difference, flat stretches skipped (a plateau between a rise and a fall counts once)."""
    signs = [1 if b > a else -1 for a, b in zip(xs, xs[1:]) if b != a]
    return sum(1 for a, b in zip(signs, signs[1:]) if a != b)


def ols_slope(points: list[tuple[float, float]]) -> float:
    mx = statistics.fmean(p[0] for p in points)
    my = statistics.fmean(p[1] for p in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def bootstrap_lower(stat, data: list, seed: int = 0, n: int = BOOTSTRAP) -> float:
    """2.5th percentile of ``stat`` over ``n`` resamples of ``data`` with replacement (seeded: reruns agree)."""
    rng = random.Random(seed)
    vals = sorted(stat([rng.choice(data) for _ in data]) for _ in range(n))
    return vals[int(0.025 * n)]


def _constants(tree: ast.AST) -> set[str]:
    return {repr(n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant)}


def is_trivial(row: dict[str, Any]) -> bool:
    """A task is trivial when its ``f`` reads none of its parameters (the output does not depend on the input), or,
    for ``code_o``/``code_i``, when the answer is on the page: the output equals an input, or is a literal constant
    of the program (``code_o``); an input equals the output or is a constant of the program (``code_i``). An
    unparsable program is not trivial (it was valid, so this does not happen for logged tasks)."""
    try:
        tree = parse_text(row["program"])
    except NotLiteral:
        return False
    fs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "f"]
    if fs:
        params = {a.arg for a in fs[0].args.args + fs[0].args.kwonlyargs + fs[0].args.posonlyargs}
        used = {n.id for n in ast.walk(fs[0]) if isinstance(n, ast.Name)}
        if fs[0].args.vararg:
            params.add(fs[0].args.vararg.arg)
        if params and not params & used:
            return True
    consts = _constants(tree)
    inputs, outputs = [str(x) for x in row.get("inputs") or []], [str(x) for x in row.get("outputs") or []]
    if row.get("type") == "code_o":
        return any(o in consts or o in inputs for o in outputs)
    if row.get("type") == "code_i":
        return any(i in consts or i in outputs for i in inputs)
    return False


def _verdict(held: bool | None, value: Any, threshold: str, why: str | None = None) -> dict[str, Any]:
    out = {"held": held, "value": value, "threshold": threshold}
    if why:
        out["why"] = why
    return out


def _too_short(n: int) -> dict[str, Any]:
    return _verdict(None, None, "-", f"run has {n} steps; the criteria need at least {MIN_STEPS}")


def self_calibration(single_dir: Path) -> dict[str, dict[str, Any]]:
    rows = _read(single_dir, "metrics.jsonl")
    solve = series(rows, *SOLVE_KEYS)
    n = len(solve)
    if n < MIN_STEPS:
        return {k: _too_short(n) for k in ("solve", "trivial", "simpler")}
    w = windows(n)
    vals = [v for _, v in solve]
    head, tail = statistics.fmean(vals[:w["head"]]), statistics.fmean(vals[-w["tail"]:])
    out = {"solve": _verdict(tail >= 0.8 and tail >= head + 0.3, {"head": head, "tail": tail},
                             "tail >= 0.8 and tail >= head + 0.3")}
    tail_steps = {s for s, _ in solve[-w["tail"]:]}
    tasks = [t for t in _read(single_dir, "tasks.jsonl") if t.get("step") in tail_steps]
    share = _mean([float(is_trivial(t)) for t in tasks])
    out["trivial"] = _verdict(None if share is None else share >= 0.6, share, "share >= 0.6",
                              None if tasks else "no valid task in the tail")
    cx = [v for _, v in series(rows, COMPLEXITY_KEY)]
    if len(cx) >= 2 * w["head"] and w["head"]:
        h, t = statistics.fmean(cx[:w["head"]]), statistics.fmean(cx[-w["tail"]:])
        out["simpler"] = _verdict(t < h, {"head": h, "tail": t}, "tail < head")
    else:
        out["simpler"] = _verdict(None, None, "tail < head", "too few steps with valid tasks")
    return out


def _coverage_gain(rows: list[dict[str, Any]]) -> float | None:
    cov = series(rows, "coverage")
    k = len(cov) // 3
    return cov[-1][1] - cov[-k - 1][1] if k else None


def arms_race(pop_dir: Path, single_dir: Path) -> dict[str, dict[str, Any]]:
    rows = _read(pop_dir, "metrics.jsonl")
    solve = series(rows, *SOLVE_KEYS)
    n = len(solve)
    if n < MIN_STEPS:
        return {k: _too_short(n) for k in ("band", "reversals", "complexity", "coverage", "not_tied")}
    w = windows(n)
    late = [v for _, v in solve[-w["late"]:]]
    m = statistics.fmean(late)
    out = {"band": _verdict(0.15 <= m <= 0.75, m, "0.15 <= mean <= 0.75")}
    r = reversals(moving_average(late, 5))
    out["reversals"] = _verdict(r >= 2, r, ">= 2")
    cx = [(float(s), v) for s, v in series(rows, COMPLEXITY_KEY)]
    if len(cx) >= 3:
        slope, low = ols_slope(cx), bootstrap_lower(ols_slope, cx)
        out["complexity"] = _verdict(low > 0, {"slope": slope, "ci_low": low}, "bootstrap 95% lower bound > 0")
    else:
        out["complexity"] = _verdict(None, None, "bootstrap 95% lower bound > 0", "fewer than 3 steps with tasks")
    gp, gs = _coverage_gain(rows), _coverage_gain(_read(single_dir, "metrics.jsonl"))
    if gp is None or gs is None:
        out["coverage"] = _verdict(None, {"population": gp, "single": gs}, "pop >= 0.02 and pop > 2 x single",
                                   "no coverage series")
    else:
        out["coverage"] = _verdict(gp >= 0.02 and gp > 2 * gs, {"population": gp, "single": gs},
                                   "pop >= 0.02 and pop > 2 x single")
    tied = [v for _, v in series(rows, "student/zero_adv_group_frac")][-w["late"]:]
    t = _mean(tied)
    out["not_tied"] = _verdict(None if t is None else t < 0.5, t, "< 0.5")
    return out


def capability(pop_dir: Path, single_dir: Path) -> dict[str, Any]:
    """``probe.jsonl`` rows: ``{"step", "member", "role", "task", "level", "score", "age", "counted"}`` (score: share
    of a task's answers that were correct) and step 0's noise floor. The last probe step both runs share is compared,
    per task: the mean over the population's counted students against the single agent's."""
    from lorapop.records.probe import read_noise_floor, score_rows

    pop_rows, single_rows = _read(pop_dir, "probe.jsonl"), _read(single_dir, "probe.jsonl")
    floor = {"population": read_noise_floor(pop_rows), "single": read_noise_floor(single_rows)}
    pop = [r for r in score_rows(pop_rows) if r.get("role") == "student"]
    single = score_rows(single_rows)
    steps = {r["step"] for r in pop} & {r["step"] for r in single}
    if not steps:
        return dict(_verdict(None, None, "bootstrap 95% lower bound > 0", "no probe.jsonl in both runs"),
                    noise_floor=floor)
    last = max(steps)
    per_task: dict[str, list[float]] = {}
    for r in pop:
        if r["step"] == last:
            per_task.setdefault(r["task"], []).append(float(r["score"]))
    agent = {r["task"]: float(r["score"]) for r in single if r["step"] == last}
    diffs = [statistics.fmean(v) - agent[t] for t, v in sorted(per_task.items()) if t in agent]
    if len(diffs) < 2:
        return dict(_verdict(None, None, "bootstrap 95% lower bound > 0", "fewer than 2 probe tasks in common"),
                    noise_floor=floor)
    d, low = statistics.fmean(diffs), bootstrap_lower(statistics.fmean, diffs)
    return dict(_verdict(low > 0, {"step": last, "diff": d, "ci_low": low, "n_tasks": len(diffs)},
                         "bootstrap 95% lower bound > 0"), noise_floor=floor)


def criteria(pop_dir: str | Path, single_dir: str | Path) -> dict[str, Any]:
    """criteria.json's content for one pair of runs."""
    out: dict[str, Any] = {"population": str(pop_dir), "single": str(single_dir)}
    out.update({f"self_calibration.{k}": v for k, v in self_calibration(Path(single_dir)).items()})
    out.update({f"arms_race.{k}": v for k, v in arms_race(Path(pop_dir), Path(single_dir)).items()})
    out["capability"] = capability(Path(pop_dir), Path(single_dir))
    return out


def across_seeds(per_seed: list[dict[str, Any]], need: int = 2) -> dict[str, dict[str, Any]]:
    """Per criterion: how many seeds held it, failed it or could not judge it, and whether it holds for the
    experiment (held in at least ``need`` seeds)."""
    keys = [k for k, v in per_seed[0].items() if isinstance(v, dict) and "held" in v] if per_seed else []
    out = {}
    for k in keys:
        vs = [s[k]["held"] for s in per_seed]
        out[k] = {"held_in": sum(v is True for v in vs), "failed_in": sum(v is False for v in vs),
                  "unjudged": sum(v is None for v in vs), "holds": sum(v is True for v in vs) >= need}
    return out


# ---- the second design's four arms (docs/RESULTS.md, "Dynamics, second design: pre-registration") ----------

# Registered from the step-0 gate before any arm ran (cpu_selection, six references, seeds 0-4, 159 valid tasks): the
# pooled step-0 matched solve rate, and the band's half-width, twice the standard deviation of the five seeds' step-0
# solve rates (0.048), rounded up to 0.10.
ARMS_STEP0_SOLVE = 0.256
ARMS_BAND = 0.10
ARMS = ("single", "1T+1S", "2T+2S", "null")


def bootstrap_diff_lower(a: list[float], b: list[float], seed: int = 0, n: int = BOOTSTRAP) -> float:
    """2.5th percentile of mean(a) - mean(b), each resampled on its own (two independent samples)."""
    rng = random.Random(seed)
    vals = sorted(statistics.fmean([rng.choice(a) for _ in a]) - statistics.fmean([rng.choice(b) for _ in b])
                  for _ in range(n))
    return vals[int(0.025 * n)]


def _probe_by_step(run_dir: Path) -> tuple[dict[int, dict[str, float]], float | None]:
    """Per probe step, each task's mean score over the counted learners (students, or the single agent), and the
    run's step-0 noise floor (the spread of identical replicates' mean scores)."""
    from lorapop.records.probe import read_noise_floor, score_rows

    rows = _read(run_dir, "probe.jsonl")
    per: dict[int, dict[str, list[float]]] = {}
    for r in score_rows(rows):
        if r.get("role") in ("student", "agent"):
            per.setdefault(int(r["step"]), {}).setdefault(r["task"], []).append(float(r["score"]))
    nf = read_noise_floor(rows)
    return ({s: {t: statistics.fmean(v) for t, v in d.items()} for s, d in per.items()},
            nf.get("spread") if nf else None)


def probe_gain(a_dir: Path, b_dir: Path) -> dict[str, Any]:
    """Arm a's learners against arm b's at the last probe step both have, per task: holds when the mean difference
    exceeds the larger of the two runs' step-0 noise floors and its bootstrap 95% lower bound over tasks is > 0."""
    (pa, fa), (pb, fb) = _probe_by_step(a_dir), _probe_by_step(b_dir)
    threshold = "diff > max(step-0 noise floors) and bootstrap 95% lower bound > 0"
    steps = set(pa) & set(pb)
    if not steps or max(steps) == 0:
        return _verdict(None, None, threshold, "no probe after step 0 in both runs")
    last = max(steps)
    diffs = [pa[last][t] - pb[last][t] for t in sorted(pa[last]) if t in pb[last]]
    floors = [f for f in (fa, fb) if f is not None]
    if len(diffs) < 2 or not floors:
        return _verdict(None, None, threshold, "fewer than 2 probe tasks in common, or no noise floor")
    d, low, floor = statistics.fmean(diffs), bootstrap_lower(statistics.fmean, diffs), max(floors)
    return _verdict(d > floor and low > 0, {"step": last, "diff": d, "ci_low": low, "noise_floor": floor,
                                            "n_tasks": len(diffs)}, threshold)


def arm_criteria(dirs: dict[str, str | Path], s0: float = ARMS_STEP0_SOLVE,
                 band: float = ARMS_BAND) -> dict[str, Any]:
    """The registered criteria for one seed's arms (``dirs``: arm name -> run directory; missing arms leave their
    criteria unjudged). Windows as :func:`windows` over the shortest arm's steps.

    | id | holds when |
    | --- | --- |
    | ``null.flat`` | null's tail matched solve rate within ``band`` of its head (copying alone moves no difficulty) |
    | ``learning.<arm>`` | :func:`probe_gain` of the arm over null (single, 1T+1S, 2T+2S) |
    | ``self_calibration.solve`` | single's tail solve >= s0 + band and >= null's tail + band |
    | ``self_calibration.simpler`` | null's tail AST depth minus single's: bootstrap 95% lower bound > 0 |
    | ``arms_race.band.<arm>`` | tail solve in [s0 - band, s0 + band] (1T+1S, 2T+2S) |
    | ``arms_race.harder.<arm>`` | the arm's tail AST depth minus null's: bootstrap 95% lower bound > 0 |
    | ``arms_race.reversals.<arm>`` | >= 2 reversals of the 5-step moving average of solve over ``late`` |
    | ``arms_race.not_tied.<arm>`` | mean ``student/zero_adv_group_frac`` over ``late`` < 0.5 |
    | ``population.vs_single`` | :func:`probe_gain` of 2T+2S over single |
    | ``population.vs_1T+1S`` | :func:`probe_gain` of 2T+2S over 1T+1S |
    | ``role_split.vs_single`` | :func:`probe_gain` of 1T+1S over single |
    """
    paths = {a: Path(d) for a, d in dirs.items() if d is not None and (Path(d) / "metrics.jsonl").is_file()}
    metrics = {a: _read(p, "metrics.jsonl") for a, p in paths.items()}  # each arm's file read once
    solves = {a: [v for _, v in series(rows, *SOLVE_KEYS)] for a, rows in metrics.items()}
    n = min((len(v) for v in solves.values()), default=0)
    out: dict[str, Any] = {"arms": {a: str(p) for a, p in paths.items()}, "s0": s0, "band": band, "steps": n}

    def missing(*need: str) -> str | None:
        gone = [a for a in need if a not in paths]
        if gone:
            return f"arm(s) {', '.join(gone)} not run"
        return f"runs have {n} steps; the criteria need at least {MIN_STEPS}" if n < MIN_STEPS else None

    w = windows(n)
    head = lambda a: statistics.fmean(solves[a][:w["head"]])  # noqa: E731
    tail = lambda a: statistics.fmean(solves[a][-w["tail"]:])  # noqa: E731
    lo, hi = s0 - band, s0 + band

    def deeper(x: str, y: str, why: str | None) -> dict[str, Any]:
        """x's tail AST depth above y's: the bootstrap lower bound of their difference > 0."""
        th = f"bootstrap 95% lower bound of {x} - {y} tail AST depth > 0"
        if why:
            return _verdict(None, None, th, why)
        a, b = ([v for _, v in series(metrics[r], COMPLEXITY_KEY)][-w["tail"]:] for r in (x, y))
        if len(a) < 2 or len(b) < 2:
            return _verdict(None, None, th, "too few steps with valid tasks")
        low = bootstrap_diff_lower(a, b)
        return _verdict(low > 0, {x: statistics.fmean(a), y: statistics.fmean(b), "ci_low": low}, th)

    why = missing("null")
    out["null.flat"] = (_verdict(None, None, f"|tail - head| <= {band}", why) if why else
                        _verdict(abs(tail("null") - head("null")) <= band,
                                 {"head": head("null"), "tail": tail("null")}, f"|tail - head| <= {band}"))
    for arm in ("single", "1T+1S", "2T+2S"):
        why = missing(arm, "null")
        out[f"learning.{arm}"] = (_verdict(None, None, "probe gain over null", why) if why
                                  else probe_gain(paths[arm], paths["null"]))

    why = missing("single", "null")
    th = f"tail >= {s0 + band:.3f} and tail >= null tail + {band}"
    out["self_calibration.solve"] = (_verdict(None, None, th, why) if why else _verdict(
        tail("single") >= s0 + band and tail("single") >= tail("null") + band,
        {"single_tail": tail("single"), "null_tail": tail("null")}, th))
    out["self_calibration.simpler"] = deeper("null", "single", why)

    for arm in ("1T+1S", "2T+2S"):
        why = missing(arm)  # band, reversals and not_tied read the arm alone; harder compares it with null
        th = f"{lo:.3f} <= tail <= {hi:.3f}"
        out[f"arms_race.band.{arm}"] = (_verdict(None, None, th, why) if why else
                                        _verdict(lo <= tail(arm) <= hi, tail(arm), th))
        out[f"arms_race.harder.{arm}"] = deeper(arm, "null", missing(arm, "null"))
        if why:
            out[f"arms_race.reversals.{arm}"] = _verdict(None, None, ">= 2", why)
            out[f"arms_race.not_tied.{arm}"] = _verdict(None, None, "< 0.5", why)
        else:
            r = reversals(moving_average(solves[arm][-w["late"]:], 5))
            out[f"arms_race.reversals.{arm}"] = _verdict(r >= 2, r, ">= 2")
            tied = _mean([v for _, v in series(metrics[arm], "student/zero_adv_group_frac")][-w["late"]:])
            out[f"arms_race.not_tied.{arm}"] = _verdict(None if tied is None else tied < 0.5, tied, "< 0.5")

    for cid, a, b in (("population.vs_single", "2T+2S", "single"), ("population.vs_1T+1S", "2T+2S", "1T+1S"),
                      ("role_split.vs_single", "1T+1S", "single")):
        why = missing(a, b)
        out[cid] = _verdict(None, None, f"probe gain of {a} over {b}", why) if why else probe_gain(paths[a], paths[b])
    return out
