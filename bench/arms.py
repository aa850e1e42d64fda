"""The four arms of the dynamics experiment's second design, every seed in one command:

    PYTHONPATH=. .venv/bin/python bench/arms.py [--config cpu_selection] [--seeds 0,1,2]
        [--arms single,1T+1S,2T+2S,null] [--out runs/arms] [--steps N] [--report-only] [--keep-final DIR]
        [--section.key=value ...]

Per seed ``s`` and arm ``a`` one ordinary run directory ``<out>/seed<s>/<a>/``, trained by
``lorapop.commands.compare.train`` (killed, the same command continues it from its last checkpoint; a run whose
checkpoint already holds ``run.steps`` is not loaded again). Every arm is the config (and the command line's
overrides) plus:

- ``single``: ``population.mode=single`` with ``teacher_reward=auto``, AZR's learnability-paid agent;
- ``1T+1S``: one teacher and one student, adversarial reward; per step the two adapters make the agent's samples
  between them (lorapop/commands/compare.py says why that is the same total compute). PBT is off: with one member per
  role a round could only log that it skipped;
- ``2T+2S``: two and two with the config's PBT schedule (cpu_selection: rounds at steps 15 and 30 of 40) and
  ``run.probe_min_age`` keeping untrained children out of the probe's aggregate;
- ``null``: ``2T+2S`` with ``engine.lr=0`` and PBT off, the same sampling: adapters stay the base (LoRA B = 0), so
  whatever its curves do is drift from the task buffers (teachers copying references) alone.

PBT off means ``evolve.burn_in_period`` one past ``run.steps`` (lorapop/evolve/pbt.py: no round before it).

Every run ends with a checkpoint at ``run.steps`` (``<out>/seed<s>/<arm>/checkpoints/step_<steps>/``, its members'
PEFT adapters under ``adapters/<id>/``), which ``run.keep_checkpoints`` keeps until the run trains further.
``--keep-final DIR`` also copies each finished arm's ``config.yaml`` and final checkpoint to ``DIR/seed<s>/<arm>/``, a
run directory of its own that nothing prunes, for ``lorapop retention`` (retention's parents) and ``RUN_DIR:best``.

Wall clock per arm (summed over invocations, with each invocation's step range) goes to
``<out>/seed<s>/<arm>/wall.json`` and is printed. At the end, and alone with ``--report-only``, ``<out>/arms.json``
holds per seed and arm the measured curves, saved raw (no verdicts in it): matched solve rate, mixed share (share of
the step's valid tasks, tasks.jsonl's ``solve_rate``, with 0 < s < 1), valid rate, mean AST depth of valid
proposals, the probe's mean score per step over counted rows, and the last of these; each arm's stage seconds summed
from its metrics (``compute_s``, which also counts the steps of an invocation killed before it wrote its wall clock);
and a reading of its saved tasks (:func:`reading`). ``<out>/arms.svg`` draws the curves; ``<out>/criteria.json``
holds the registered criteria (lorapop/criteria.py, ``arm_criteria``) per seed and across seeds. The last line
printed is one JSON object: seeds, compute seconds per seed, and each criterion's across-seeds verdict.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lorapop.report.svg import PALETTE, Series, figure_svg, plot_svg, yardstick_series  # noqa: E402

ARMS: dict[str, list[str]] = {
    "single": ["--population.mode=single", "--selfplay.teacher_reward=auto"],
    "1T+1S": ["--population.n_teachers=1", "--population.n_students=1"],
    "2T+2S": ["--population.n_teachers=2", "--population.n_students=2"],
    "null": ["--population.n_teachers=2", "--population.n_students=2", "--engine.lr=0"],
}
NO_PBT = ("1T+1S", "null")
STYLE = {"single": (PALETTE[0], "6 3"), "1T+1S": (PALETTE[2], "2 2"), "2T+2S": (PALETTE[1], ""),
         "null": ("#888888", "1 3")}
PANELS = (("matched_solve_rate", "matched solve rate", (0.0, 1.0)),
          ("mixed_share", "mixed share (0 < s < 1)", (0.0, 1.0)),
          ("ast_depth", "AST depth of valid proposals", None),
          ("probe", "probe score (counted rows)", (0.0, 1.0)))
SOLVE_KEYS = ("student/matched_solve_rate", "matched_solve_rate")


def arm_config(config: str, arm: str, overrides: list[str], seed: int, out: Path, steps: int | None):
    """The arm's resolved config: the config, the command line's overrides, then the arm's own (which win)."""
    from lorapop.config import load_config, resolve_config_path

    path = resolve_config_path(config)
    common = overrides + ([f"--run.steps={steps}"] if steps is not None else []) + [
        f"--run.seed={seed}", f"--run.output_dir={out / f'seed{seed}'}",
        f"--run.name={json.dumps(arm)}"]  # quoted: the override's value is YAML, where a bare null is None
    cfg = load_config(path, common + ARMS[arm])
    if arm in NO_PBT:
        cfg = load_config(path, common + ARMS[arm] + [f"--evolve.burn_in_period={cfg.run.steps + 1}"])
    return cfg


def done_steps(run_dir: Path) -> int:
    """The step of the run's latest complete checkpoint (0 when none)."""
    from lorapop.records.rundir import RunDir, checkpoint_step

    ckpt = RunDir(run_dir).latest_checkpoint() if run_dir.is_dir() else None
    return checkpoint_step(ckpt) if ckpt is not None else 0


def keep_final(run_dir: Path, dest: Path) -> Path:
    """Copy ``run_dir``'s config and latest complete checkpoint to ``dest`` (replaced whole when its checkpoint is
    older): a minimal run directory that a later resume or prune of ``run_dir`` leaves alone."""
    import shutil

    from lorapop.records.rundir import CHECKPOINTS, CONFIG, RunDir, checkpoint_step

    ckpt = RunDir(run_dir).latest_checkpoint()
    if ckpt is None:
        raise ValueError(f"{run_dir}: no complete checkpoint to keep")
    kept = RunDir(dest).latest_checkpoint() if dest.is_dir() else None
    if kept is not None and checkpoint_step(kept) >= checkpoint_step(ckpt):
        return kept
    tmp = dest.with_name(f".{dest.name}.{time.time_ns()}.tmp")
    (tmp / CHECKPOINTS).mkdir(parents=True)
    shutil.copy2(run_dir / CONFIG, tmp / CONFIG)
    shutil.copytree(ckpt, tmp / CHECKPOINTS / ckpt.name)
    if dest.exists():
        shutil.rmtree(dest)
    tmp.replace(dest)
    return dest / CHECKPOINTS / ckpt.name


def train_arms(config: str, seeds: list[int], arms: list[str], overrides: list[str], out: Path,
               steps: int | None, keep: Path | None = None) -> None:
    from lorapop.commands.compare import train

    for s in seeds:
        for arm in arms:
            cfg = arm_config(config, arm, overrides, s, out, steps)
            run_dir = out / f"seed{s}" / arm
            start = done_steps(run_dir)
            if start >= cfg.run.steps:  # finished: loading the model again would cost a minute for nothing
                print(f"seed {s} {arm}: done ({start} steps), skipped", flush=True)
                if keep is not None:
                    print(f"seed {s} {arm}: final checkpoint kept at {keep_final(run_dir, keep / f'seed{s}' / arm)}")
                continue
            t0 = time.perf_counter()
            train(cfg)
            wall = time.perf_counter() - t0
            # one file per arm, in its run directory: two processes may train two arms of one seed at once
            times_path = run_dir / "wall.json"
            rec = json.loads(times_path.read_text()) if times_path.is_file() else {"wall_s": 0.0, "sessions": []}
            rec["wall_s"] = round(rec["wall_s"] + wall, 1)
            rec["sessions"].append({"from_step": start, "to_step": cfg.run.steps, "wall_s": round(wall, 1),
                                    "s_per_step": round(wall / max(1, cfg.run.steps - start), 1)})
            times_path.write_text(json.dumps(rec, indent=1))
            print(f"seed {s} {arm}: steps {start}-{cfg.run.steps} in {wall / 60:.1f} min "
                  f"({wall / max(1, cfg.run.steps - start):.1f} s/step)", flush=True)
            if keep is not None:
                print(f"seed {s} {arm}: final checkpoint kept at {keep_final(run_dir, keep / f'seed{s}' / arm)}")


def _by_step(rows: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    out: dict[int, float] = {}
    for r in rows:
        if isinstance(r.get("step"), int) and isinstance(r.get(key), (int, float)):
            out[r["step"]] = float(r[key])
    return sorted(out.items())


def arm_figures(run_dir: Path) -> dict[str, Any]:
    """One arm's measured quantities, raw: per-step curves as [step, value] pairs and the last probe score."""
    from lorapop.records.rundir import iter_jsonl
    from lorapop.records.probe import step_means

    notes: list[str] = []
    metrics = [r for _, r in iter_jsonl(run_dir / "metrics.jsonl", notes)]
    solve: dict[int, float] = {}
    for r in metrics:
        v = next((r[k] for k in SOLVE_KEYS if isinstance(r.get(k), (int, float))), None)
        if isinstance(r.get("step"), int) and v is not None:
            solve[r["step"]] = float(v)
    tasks = [t for _, t in iter_jsonl(run_dir / "tasks.jsonl", notes) if isinstance(t.get("step"), int)]
    rates: dict[int, list[float]] = {}
    for t in tasks:
        if isinstance(t.get("solve_rate"), (int, float)):
            rates.setdefault(t["step"], []).append(float(t["solve_rate"]))
    probe = step_means([r for _, r in iter_jsonl(run_dir / "probe.jsonl", notes)])
    return {
        "steps": max((r["step"] for r in metrics if isinstance(r.get("step"), int)), default=0),
        "matched_solve_rate": sorted(solve.items()),
        # the tasks a learnability reward pays (0 < s < 1), as a share of the step's valid tasks
        "mixed_share": [(st, statistics.fmean(0.0 < x < 1.0 for x in v)) for st, v in sorted(rates.items())],
        "n_valid_tasks": [(st, len(v)) for st, v in sorted(rates.items())],
        "valid_rate": _by_step(metrics, "valid_rate"),
        "ast_depth": _by_step(metrics, "complexity/ast_depth"),
        "probe": [(st, v) for st, v in probe],
        "last_probe": {"step": probe[-1][0], "score": probe[-1][1]} if probe else None,
        # compute per step: the sum of its stages' seconds (model loads and waits between invocations left out),
        # which also covers steps of an invocation that was killed before it could write wall.json
        "step_s": [(r["step"], round(sum(v for k, v in r.items() if k.startswith("time/")
                                         and isinstance(v, (int, float))), 2))
                   for r in metrics if isinstance(r.get("step"), int)],
        "reading": reading(run_dir, tasks),
        "notes": notes,
    }


def shape_of(program: str) -> str:
    """The kind of selection a valid task's ``return`` expression makes: copy (``nums`` or a constant), index
    (``nums[k]`` with a literal k), aggregate (max/min/len/sum of nums), sorted_or_slice (``sorted(..)[k]``, a
    slice, or an aggregate of one), conditional (``a if c else b``), arithmetic (any + - * // % on the way), other."""
    import ast

    try:
        ret = next(n for n in ast.walk(ast.parse(program)) if isinstance(n, ast.Return)).value
    except (SyntaxError, StopIteration, ValueError):
        return "unparsable"
    nodes = list(ast.walk(ret))
    if any(isinstance(n, ast.BinOp) for n in nodes):
        return "arithmetic"
    if any(isinstance(n, ast.IfExp) for n in nodes):
        return "conditional"
    if isinstance(ret, (ast.Name, ast.Constant)):
        return "copy"
    if any(isinstance(n, ast.Slice) for n in nodes) or any(
            isinstance(n, ast.Call) and getattr(n.func, "id", "") == "sorted" for n in nodes):
        return "sorted_or_slice"
    if isinstance(ret, ast.Subscript) and isinstance(ret.value, ast.Name) and isinstance(ret.slice, (
            ast.Constant, ast.UnaryOp)):
        return "index"
    if isinstance(ret, ast.Call) and getattr(ret.func, "id", "") in ("max", "min", "len", "sum"):
        return "aggregate"
    return "other"


def reading(run_dir: Path, rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Counts from a run's saved tasks (tasks.jsonl: every valid task with its answers), per window of steps (the
    first and last third): what the teachers proposed (shape, list length, exact copies of a level-1 reference
    expression) and what the students answered (statuses; for code_o, wrong answers that are the list's first
    element, the base model's most common misreading). ``rows``: the file's rows when the caller has read it."""
    import ast

    from lorapop.records.rundir import iter_jsonl
    from lorapop.tasks.selection_family import LEVELS

    if rows is None:
        rows = [t for _, t in iter_jsonl(run_dir / "tasks.jsonl", []) if isinstance(t.get("step"), int)]
    if not rows:
        return {}
    n = max(t["step"] for t in rows)
    k = max(1, n // 3)
    level1 = {f"def f(nums):\n    return {e}" for e in LEVELS[1]}
    out: dict[str, Any] = {}
    for name, lo, hi in (("first_third", 1, k), ("last_third", n - k + 1, n)):
        ts = [t for t in rows if lo <= t["step"] <= hi]
        shapes: dict[str, int] = {}
        lengths: dict[str, int] = {}
        status: dict[str, dict[str, int]] = {}
        first_guess = wrong_o = 0
        for t in ts:
            shape = shape_of(t["program"])
            shapes[shape] = shapes.get(shape, 0) + 1
            try:
                length = str(len(ast.literal_eval(t["inputs"][0])))
            except (ValueError, SyntaxError, TypeError, IndexError):
                length = "?"
            lengths[length] = lengths.get(length, 0) + 1
            st = status.setdefault(t["type"], {})
            for a in t.get("answers") or []:
                st[a["status"]] = st.get(a["status"], 0) + 1
                if t["type"] == "code_o" and a["status"] == "wrong":
                    wrong_o += 1
                    try:
                        first = str(ast.literal_eval(t["inputs"][0])[0])
                    except (ValueError, SyntaxError, TypeError, IndexError):
                        first = None
                    body = a["text"].removeprefix("```output").strip().removesuffix("```").strip()
                    first_guess += body == first
        out[name] = {"steps": [lo, hi], "tasks": len(ts), "by_type": {ty: sum(t["type"] == ty for t in ts)
                                                                      for ty in ("code_o", "code_i")},
                     "shapes": dict(sorted(shapes.items())), "list_lengths": dict(sorted(lengths.items())),
                     "level1_copies": sum(t["program"].strip() in level1 for t in ts),
                     "distinct_programs": len({t["program"] for t in ts}),
                     "answers": status, "code_o_wrong_first_element": [first_guess, wrong_o]}
    return out


def _write_json(path: Path, obj: Any) -> None:
    # replaced whole: two arms.py processes (two arms of a seed at once) may both report at their end
    tmp = path.with_name(f".{path.name}.{time.time_ns()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    tmp.replace(path)


def report(out: Path, config: str) -> dict[str, Any]:
    per_seed: dict[str, dict[str, Any]] = {}
    for seed_dir in sorted(out.glob("seed*"), key=lambda p: p.name):
        arms = {a: arm_figures(seed_dir / a) for a in ARMS if (seed_dir / a / "metrics.jsonl").is_file()}
        if arms:
            wall = {a: json.loads((seed_dir / a / "wall.json").read_text()) for a in arms
                    if (seed_dir / a / "wall.json").is_file()}
            compute = {a: round(sum(v for _, v in f["step_s"]), 1) for a, f in arms.items()}
            per_seed[seed_dir.name] = {"arms": arms, "wall": wall, "compute_s": compute,
                                       "seed_compute_s": round(sum(compute.values()), 1)}
    result = {"config": config, "per_seed": per_seed}
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "arms.json", result)
    # the registered criteria (lorapop/criteria.py, arm_criteria), per seed and across seeds (2 of 3)
    from lorapop.criteria import across_seeds, arm_criteria

    crit = {seed: arm_criteria({a: out / seed / a for a in d["arms"]}) for seed, d in per_seed.items()}
    _write_json(out / "criteria.json", {"per_seed": crit, "across_seeds": across_seeds(list(crit.values()))})
    if per_seed:
        from lorapop.config import load_config, resolve_config_path
        from lorapop.train.yardsticks import describe, probe_yardsticks

        cfg = load_config(resolve_config_path(config), [])
        ys = probe_yardsticks(cfg.selfplay.proposal_style, cfg.run.probe_per_level)
        print(describe(ys, f"of the {cfg.selfplay.proposal_style} probe"))
        (out / "arms.svg").write_text(figure(per_seed, config, ys))
    for seed, d in per_seed.items():
        for arm, f in d["arms"].items():
            last = lambda k: f"{f[k][-1][1]:.3g}" if f[k] else "-"  # noqa: E731
            print(f"{seed} {arm:<6} steps {f['steps']:>3}  solve {last('matched_solve_rate')}  mixed "
                  f"{last('mixed_share')}  valid {last('valid_rate')}  depth {last('ast_depth')}  probe "
                  f"{last('probe')}")
    return result


def figure(per_seed: dict[str, dict[str, Any]], config: str, ys: dict[str, Any] | None = None) -> str:
    """Per seed, one plot per panel; the probe panel also draws the probe's two best trivial yardsticks (``ys``,
    lorapop/train/yardsticks.py) as dashed grey lines."""
    plots, marks = [], []
    for seed, d in per_seed.items():
        for key, label, y_range in PANELS:
            series = [Series(arm, [(float(x), y) for x, y in f[key]], color=STYLE[arm][0], dash=STYLE[arm][1])
                      for arm, f in d["arms"].items()]
            if key == "probe" and ys:
                last = max((float(x) for f in d["arms"].values() for x, _ in f[key]), default=0.0)
                marks = yardstick_series(ys, 0.0, last)
                series += marks
            plots.append((f"{seed}: {label}", plot_svg(series, f"{seed}: {label}", y_range=y_range)))
    return figure_svg(plots, cols=len(PANELS), title=f"{config}: the four arms",
                      legend=[Series(a, [], color=c, dash=dash) for a, (c, dash) in STYLE.items()] + marks)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cpu_selection")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--out", default="runs/arms")
    ap.add_argument("--steps", type=int, default=None, help="run.steps for every arm (timing a short version)")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--keep-final", type=Path, default=None,
                    help="also copy each finished arm's config and final checkpoint to DIR/seed<s>/<arm>/")
    args, overrides = ap.parse_known_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        ap.error(f"--arms: unknown {unknown}; known: {', '.join(ARMS)}")
    for o in overrides:
        if o.startswith(("--run.name=", "--run.output_dir=", "--run.seed=", "--population.mode=")):
            ap.error(f"override '{o}': bench/arms.py sets run.name, run.output_dir, run.seed and population.mode "
                     "itself (use --out, --seeds, --arms)")
    out = Path(args.out)
    if not args.report_only:
        train_arms(args.config, [int(s) for s in args.seeds.split(",")], arms, overrides, out, args.steps,
                   args.keep_final)
    result = report(out, args.config)
    crit = json.loads((out / "criteria.json").read_text())["across_seeds"] if result["per_seed"] else {}
    print(json.dumps({"seeds": sorted(result["per_seed"]), "seed_compute_s": {
        k: v["seed_compute_s"] for k, v in result["per_seed"].items()},
        "holds": {k: v["holds"] for k, v in crit.items()},
        "held_in": {k: v["held_in"] for k, v in crit.items()}}))
    return result


if __name__ == "__main__":
    main()
