"""The registered learning experiment's readings (docs/results/learning/REGISTRATION.md), computed from its answer
files alone: per (seed, arm) and evaluation step, the held-out compute solve rate and how the page-family answers
read; the registered decision rule over the units; the per-step figure with the rules as lines; and the copy of
finished units into docs/results/learning/. bench/learns.py (which runs the units) and bench/claims.py (which checks
the docs' sentences against the committed files) both use it.

    PYTHONPATH=. .venv/bin/python bench/learning_report.py RUN_DIR [--copy docs/results/learning] [--svg FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _mean(xs):
    return round(statistics.mean(xs), 4) if xs else None


def _sd(xs):
    return round(statistics.stdev(xs), 4) if len(xs) > 1 else 0.0


def eval_step(row: dict, steps: int) -> int | None:
    """The number of update steps behind a held-out answer (None for a training answer): the final evaluation is
    after ``steps`` steps, the control's (no step) after 0."""
    if row["phase"] == "heldout_step":
        return row["step"]
    if row["phase"] == "heldout":
        return 0 if row["arm"] == "control" else steps
    return None


def compute_readings(rows: list[dict], steps: int) -> dict[int, dict]:
    """The registered readings of one (seed, arm), from its answer rows alone (docs/results/learning/REGISTRATION.md),
    per evaluation step: ``compute`` (held-out compute-family answers: n, correct, format_error, solve_rate) and
    ``page`` (held-out page-family answers read as the right shown value, another shown value, another literal, or
    unreadable; ``right_of_shown`` = right / (right + other_shown)), and per family the solve rate."""
    from lorapop.tasks.base import Task
    from lorapop.tasks.compute_family import CANDIDATES as FAMILIES, read_answer

    out: dict[int, dict] = {}
    for r in rows:
        k = eval_step(r, steps)
        if k is None:
            continue
        d = out.setdefault(k, {"compute": {"n": 0, "correct": 0, "format_error": 0},
                               "page": {"n": 0, "right": 0, "other_shown": 0, "other": 0, "unreadable": 0},
                               "per_family": {}})
        fam = d["per_family"].setdefault(r["template"], {"n": 0, "correct": 0})
        fam["n"] += 1
        fam["correct"] += r["status"] == "correct"
        if FAMILIES[r["template"]].kind == "compute":
            c = d["compute"]
            c["n"] += 1
            c["correct"] += r["status"] == "correct"
            c["format_error"] += r["status"] == "format_error"
        else:
            task = Task(type="code_o", program=r["program"], inputs=[r["input"]], outputs=[r["expected"]])
            d["page"]["n"] += 1
            d["page"][read_answer(task, r["answer"])] += 1
    for d in out.values():
        c, p = d["compute"], d["page"]
        c["solve_rate"] = round(c["correct"] / c["n"], 4) if c["n"] else None
        p["right_share"] = round(p["right"] / p["n"], 4) if p["n"] else None
        p["right_of_shown"] = round(p["right"] / (p["right"] + p["other_shown"]), 4) if p["right"] + p["other_shown"] \
            else None
        for f in d["per_family"].values():
            f["solve_rate"] = round(f["correct"] / f["n"], 4)
    return dict(sorted(out.items()))


REGISTERED_SEEDS = (0, 1, 2, 3, 4)
REGISTERED_ARMS = ("trained", "shuffled", "control")


def final_reading(unit: dict) -> dict:
    """A compute-design unit's readings at its last evaluation (after all steps; the control's only one)."""
    readings = {int(k): v for k, v in unit["readings"].items()}
    return readings[max(readings)]


def paired(per_seed_x: dict, per_seed_y: dict) -> dict:
    """Margins x - y over the seeds both have: mean, SD, per seed, and in how many seeds x > y and x < y."""
    both = sorted(set(per_seed_x) & set(per_seed_y))
    d = [per_seed_x[s] - per_seed_y[s] for s in both]
    return {"seeds": both, "per_seed": [round(x, 4) for x in d], "mean": _mean(d), "sd": _sd(d),
            "x_higher": sum(x > 0 for x in d), "x_lower": sum(x < 0 for x in d)}


def registered_verdict(units: list[dict], seeds=REGISTERED_SEEDS, arms=REGISTERED_ARMS) -> dict:
    """The decision rule of docs/results/learning/REGISTRATION.md applied to ``units`` (compute design).

    Primary: H1 "learning beyond the rules" is shown when the trained arm's held-out compute solve rate after all
    steps is above the control's on every registered seed AND above the shuffled arm's on every registered seed
    (each a one-sided sign test at 1/2^5 = 0.031 over 5 seeds); "harm shown" when it is below the control's on every
    seed; otherwise "not shown". Secondary (page families): the same rule on right / (right + other shown value).
    With any (seed, arm) unit missing, the verdict is "incomplete: N of M units" and no reading is decided."""
    have = {(u["seed"], u["arm"]): u for u in units if u["seed"] in seeds and u["arm"] in arms}
    total = len(seeds) * len(arms)
    out: dict = {"units": len(have), "of": total}
    readings = {"primary": ("compute", "solve_rate"), "secondary": ("page", "right_of_shown")}
    for name, (part, key) in readings.items():
        per_arm = {a: {s: final_reading(have[s, a])[part][key] for s in seeds if (s, a) in have
                       and final_reading(have[s, a])[part][key] is not None} for a in arms}
        r = {"per_arm": {a: {"per_seed": v, "mean": _mean(list(v.values()))} for a, v in per_arm.items()},
             "trained-control": paired(per_arm["trained"], per_arm["control"]),
             "trained-shuffled": paired(per_arm["trained"], per_arm["shuffled"])}
        if len(have) < total:
            r["verdict"] = f"incomplete: {len(have)} of {total} units"
        else:
            tc, ts, n = r["trained-control"], r["trained-shuffled"], len(seeds)
            r["verdict"] = ("shown" if tc["x_higher"] == n and ts["x_higher"] == n else
                            "harm shown" if tc["x_lower"] == n else "not shown")
        out[name] = r
    return out


def rule_scores(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Each fixed rule's score (lorapop/train/yardsticks.py's strategies) on the held-out compute tasks and on the
    held-out page tasks of one seed, from any of its answer files (the tasks are in every row): each rule's answer
    compared with the expected output by value, as code_o's checker compares an answer."""
    from lorapop.tasks.base import Task
    from lorapop.tasks.compute_family import CANDIDATES as FAMILIES
    from lorapop.train.yardsticks import rule_scores as score

    tasks: dict[str, dict[str, Task]] = {"compute": {}, "page": {}}
    for r in rows:
        if r["phase"] in ("heldout", "heldout_step"):
            tasks[FAMILIES[r["template"]].kind][r["task_id"]] = Task(type="code_o", program=r["program"],
                                                                       inputs=[r["input"]], outputs=[r["expected"]])
    return {part: {k: round(v, 4) for k, v in score(list(ts.values())).items()} if ts else {}
            for part, ts in tasks.items()}


def load_run(run: Path) -> tuple[list[dict], dict[tuple[int, str], list[dict]]]:
    """The compute-design units in ``run`` (its units/ and answers/) and their answer rows, by (seed, arm). Each
    unit's readings are recomputed from its answers here, so every figure drawn from them rests on the raw answers,
    not on what the run wrote into the unit file."""
    from learns import read_answers

    units, rows = [], {}
    for path in sorted((run / "units").glob("seed*-*.json")):
        u = json.loads(path.read_text(encoding="utf-8"))
        if u["setting"].get("design") != "compute":
            continue
        rows[u["seed"], u["arm"]] = read_answers(run / "answers" / f"seed{u['seed']}-{u['arm']}.jsonl.gz")
        readings = compute_readings(rows[u["seed"], u["arm"]], u["setting"]["steps"])
        u["readings"] = {str(k): v for k, v in readings.items()}
        units.append(u)
    return units, rows


def yardsticks(rows: dict[tuple[int, str], list[dict]]) -> dict[str, dict]:
    """Per part (compute, page): each seed's rule scores and the three kinds over the seeds
    (lorapop/train/yardsticks.py's three_kinds)."""
    from lorapop.train.yardsticks import three_kinds

    per_seed = {}
    for (seed, _), r in sorted(rows.items()):
        per_seed.setdefault(seed, rule_scores(r))
    return {part: {"per_seed": {s: v[part] for s, v in per_seed.items()},
                   "three_kinds": three_kinds({s: v[part] for s, v in per_seed.items()})}
            for part in ("compute", "page")} if per_seed else {}


def curves(units: list[dict]) -> dict[str, dict[str, dict[int, dict[int, float]]]]:
    """Per reading (compute solve rate, page solve rate, page right_of_shown), per arm, per seed: step -> value. An
    arm's step 0 is the control's (same adapter draw, same sampling seeds); the control is flat."""
    control = {u["seed"]: u for u in units if u["arm"] == "control"}
    steps = max((u["setting"]["steps"] for u in units), default=0)
    keys = {"compute_solve": ("compute", "solve_rate"), "page_solve": ("page", "right_share"),
            "page_right_of_shown": ("page", "right_of_shown")}
    out: dict = {k: {} for k in keys}
    for u in units:
        reads = {int(k): v for k, v in u["readings"].items()}
        if u["arm"] == "control":
            reads = {0: reads[0], steps: reads[0]}
        elif u["seed"] in control:
            reads = {0: {int(k): v for k, v in control[u["seed"]]["readings"].items()}[0], **reads}
        for name, (part, key) in keys.items():
            out[name].setdefault(u["arm"], {})[u["seed"]] = {k: r[part][key] for k, r in sorted(reads.items())
                                                             if r[part][key] is not None}
    return out


def figure(units: list[dict], ys: dict, status: str) -> str:
    """Each arm's held-out readings per step (mean over the seeds that have the arm; thin: each seed), with the rules
    as lines: every rule fixed in advance, the rule chosen on the other seeds, the hindsight best (a ceiling)."""
    from lorapop.report.svg import PALETTE, Series, figure_svg, plot_svg

    arm_color = {"trained": PALETTE[0], "shuffled": PALETTE[1], "control": "#000000"}
    cs = curves(units)
    steps = max((u["setting"]["steps"] for u in units), default=16)
    plots, legend = [], {}
    titles = {"compute_solve": ("held-out compute tasks (answer not on the page): solve rate", "compute"),
              "page_solve": ("held-out page tasks (answer one of the shown values): solve rate", "page"),
              "page_right_of_shown": ("page tasks: right value / (right + another shown value)", None)}
    for name, (title, part) in titles.items():
        series = []
        for arm, per_seed in cs[name].items():
            xs = sorted({k for v in per_seed.values() for k in v})
            mean = [(float(k), statistics.mean(v[k] for v in per_seed.values() if k in v)) for k in xs]
            series.append(Series(f"{arm} (mean of {len(per_seed)} seeds)", mean, color=arm_color[arm]))
        if part and ys.get(part):
            k = ys[part]["three_kinds"]
            fixed_top = max(k["fixed"], key=lambda r: k["fixed"][r]) if k["fixed"] else None
            top = k["fixed"].get(fixed_top, 0.0)
            label = (f"{part}: best rule fixed in advance ({fixed_top})" if top else
                     f"{part}: every rule fixed in advance (first, last, max, min, copy)")
            lines = [(label, top, "#888888", "4 2"),
                     (f"{part}: rule chosen on the other seeds", k["chosen_on_other_seeds"], "#aa7700", "2 2"),
                     (f"{part}: hindsight best rule per seed (a ceiling)", k["hindsight_best"], "#cc0000", "6 3")]
            for label, v, col, dash in lines:
                if v is not None:
                    series.append(Series(label, [(0.0, v), (float(steps), v)], color=col, dash=dash))
        for s in series:
            legend.setdefault(s.label, s)
        top = max((y for sr in series for _, y in sr.points if y is not None), default=0.0)
        plots.append((title, plot_svg(series, title, xlabel="update steps", ylabel="share of answers",
                                      y_range=(0.0, min(1.0, max(0.2, round(top * 1.2 + 0.05, 1)))))))
    return figure_svg(plots, cols=3, legend=list(legend.values()),
                      title=f"Registered learning experiment: held-out readings per step ({status})")


def copy_finished(run: Path, dest: Path) -> list[str]:
    """Copy every finished (seed, arm) of ``run`` (its unit file and gzipped answers) into ``dest``; returns the
    names copied that were not there already, or differ."""
    new = []
    for unit in sorted((run / "units").glob("seed*-*.json")):
        ans = run / "answers" / (unit.stem + ".jsonl.gz")
        for src, sub in ((unit, "units"), (ans, "answers")):
            target = dest / sub / src.name
            if not target.exists() or target.read_bytes() != src.read_bytes():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, target)
                new.append(f"{sub}/{src.name}")
    return new


def descriptive(units: list[dict], rows: dict[tuple[int, str], list[dict]]) -> dict:
    """The registration's descriptive readings (no verdict), per (seed, arm) at its last evaluation: the solve rate
    per group of families (arithmetic, composition, selection), and the compute solve rate on the held-out tasks
    whose expected output is no output of the seed's training pool (drawn again from the seed by committed code)."""
    from learns import draw

    from lorapop.tasks.compute_family import CANDIDATES

    out: dict = {}
    pools: dict[int, set[str]] = {}
    for u in units:
        seed, arm, steps = u["seed"], u["arm"], u["setting"]["steps"]
        if seed not in pools:
            pools[seed] = {t.outputs[0] for t in draw(seed, u["setting"])[2]}
        last = max(int(k) for k in u["readings"])
        final = [r for r in rows[seed, arm] if eval_step(r, steps) == last]
        groups: dict[str, list[bool]] = {}
        for r in final:
            groups.setdefault(CANDIDATES[r["template"]].group, []).append(r["status"] == "correct")
        novel = [r["status"] == "correct" for r in final
                 if CANDIDATES[r["template"]].kind == "compute" and r["expected"] not in pools[seed]]
        out[f"seed{seed}-{arm}"] = {"groups": {g: {"n": len(v), "solve_rate": _mean([float(x) for x in v])}
                                               for g, v in sorted(groups.items())},
                                    "novel_output_compute": {"n": len(novel),
                                                             "solve_rate": _mean([float(x) for x in novel])}}
    return out


def report(run: Path) -> dict:
    """The registered verdict, the yardsticks and the curves of the units in ``run``."""
    units, rows = load_run(run)
    ys = yardsticks(rows)
    return {"registered": registered_verdict(units), "yardsticks": ys, "curves": curves(units),
            "descriptive": descriptive(units, rows), "units": sorted(f"seed{u['seed']}-{u['arm']}" for u in units)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a bench/learns.py --design compute output directory (or its copy)")
    ap.add_argument("--copy", type=Path, help="copy the finished units and answers here first (docs/results/learning)")
    ap.add_argument("--svg", type=Path, help="write the per-step figure here")
    args = ap.parse_args(argv)
    if args.copy:
        for name in copy_finished(args.run, args.copy):
            print(f"copied {name}")
    r = report(args.copy or args.run)
    units, _ = load_run(args.copy or args.run)
    status = r["registered"]["primary"]["verdict"] if units else "no units yet"
    if args.svg:
        if units:
            svg = figure(units, r["yardsticks"], status)
        else:
            from lorapop.report.svg import no_data

            svg = no_data("Registered learning experiment: held-out readings per step",
                          "awaits data: no (seed, arm) unit has finished yet")
        args.svg.write_text(svg, encoding="utf-8")
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
