"""Writes realistic run directories (the files of docs/ARCHITECTURE.md "Run directory") for the report tests.

The programs are real Python, their diagnostics come from `program_descriptors` and the coverage numbers from a real
`CoverageTracker`, so the report is exercised on what a trainer would write. Rewards and ratings are synthetic
random walks shaped like the paper's curves (the single agent's solve rate climbs while its programs get simpler).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import yaml

from lorapop.diagnostics.complexity import program_descriptors
from lorapop.diagnostics.coverage import CoverageConfig, CoverageTracker

STAGES = ("propose", "validate", "solve", "check", "update", "rate", "evolve")
STATS = ("ast_depth", "cyclomatic", "loc", "n_node_types", "input_size")


def make_program(rng: np.random.Generator, level: int) -> tuple[str, list[str]]:
    lines, ind = ["def f(x, n):", "    acc = 0"], 1
    for i in range(level):
        c = int(rng.integers(5))
        pad = "    " * ind
        if c == 0 and ind < 4:
            lines += [f"{pad}for i{i} in range(n):", f"{pad}    acc += i{i} * {int(rng.integers(1, 5))}"]
            ind += 1
        elif c == 1 and ind < 4:
            lines += [f"{pad}if acc % {int(rng.integers(2, 5))} == 0:", f"{pad}    acc = acc // 2 + len(x)"]
            ind += 1
        elif c == 2:
            lines.append(f"{pad}acc = max(acc, len(x) - {int(rng.integers(0, 9))})")
        elif c == 3:
            lines.append(f"{pad}acc += sum(v for v in x if v % 2)")
        else:
            lines.append(f"{pad}x = sorted(x, reverse={bool(rng.integers(2))})")
    lines.append("    return acc")
    inputs = [f"{[int(v) for v in rng.integers(0, 50, int(rng.integers(1, 3 + 2 * level)))]}, "
              f"{int(rng.integers(1, 6))}" for _ in range(2)]
    return "\n".join(lines) + "\n", inputs


def _clip(v: float) -> float:
    return float(min(1.0, max(0.0, v)))


def write_run(run_dir: Path, *, members: list[tuple[str, str]], steps: int = 30, seed: int = 0,
              replacements: list[dict] | None = None, tasks_per_teacher: int = 3, single: bool = False,
              eval_json: dict | None = None) -> Path:
    """members: (id, role) of the initial population; replacements: {"step", "replaced", "child", "parents",
    "operator"} applied after that step's update, as the PBT stage would."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    cfg = {"name": run_dir.name, "seed": seed, "model": "embedded",
           "population": {"mode": "single" if single else "population",
                          "n_teachers": sum(r in ("teacher", "both") for _, r in members),
                          "n_students": sum(r in ("student", "both") for _, r in members)},
           "train": {"steps": steps, "lr": 1e-4, "batch_per_member": 8},
           "coverage": {"n_cells": 64, "seed": seed}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    tracker = CoverageTracker(CoverageConfig(n_cells=64, seed=seed, kmeans_samples=2000), run_dir=run_dir)
    alive = {mid: {"id": mid, "slot": i, "role": role, "mu": 25.0, "sigma": 25 / 3, "age": 0, "born_step": 0,
                   "parents": [], "operator": None} for i, (mid, role) in enumerate(members)}
    lineage: list[dict] = []
    skill = {mid: 0.0 for mid in alive}
    t0 = time.time() - steps * 10
    with open(run_dir / "metrics.jsonl", "w") as mf, open(run_dir / "tasks.jsonl", "w") as tf:
        for step in range(1, steps + 1):
            progress = step / steps
            teachers = [m for m, a in alive.items() if a["role"] in ("teacher", "both")]
            students = [m for m, a in alive.items() if a["role"] in ("student", "both")]
            row: dict = {"step": step, "time": t0 + step * 10, "elapsed_s": step * 10.0}
            all_rewards, diag_all = [], {s: [] for s in STATS}
            solve_by_student: dict[str, list[float]] = {s: [] for s in students}
            for t in teachers:
                level = max(0, int(round((1 - progress) * 3))) if single else 1 + int(progress * 5)
                diag_t = {s: [] for s in STATS}
                for _ in range(tasks_per_teacher):
                    program, inputs = make_program(rng, level + int(rng.integers(0, 2)))
                    d = program_descriptors(program, inputs)
                    solvers = students if single else [s for s in students if s != t]
                    rates = {}
                    for s in solvers:
                        p = _clip((0.4 + 0.55 * progress if single else 0.5 + 0.25 * np.sin(step / 3 + len(s)))
                                  + skill[s] - 0.04 * level + rng.normal(0, 0.05))
                        rates[s] = p
                        solve_by_student[s].append(p)
                        tracker.add(d, t, s)
                    for s in STATS:
                        diag_t[s].append(d[s])
                        diag_all[s].append(d[s])
                    tf.write(json.dumps({"step": step, "type": ["code_o", "code_i", "code_f"][int(rng.integers(3))],
                                         "proposer": t, "solver": solvers[0] if solvers else None,
                                         "program": program, "inputs": inputs, "outputs": ["0", "1"],
                                         "message": "", "solve_rate": float(np.mean(list(rates.values()) or [0])),
                                         "diagnostics": d}) + "\n")
                for s in STATS:
                    row[f"complexity/{t}/{s}"] = float(np.mean(diag_t[s]))
                valid = _clip(0.55 + 0.3 * progress + rng.normal(0, 0.05))
                row[f"member/{t}/valid_rate"] = valid
                row[f"member/{t}/format_error_rate"] = _clip(0.2 * (1 - progress) + rng.normal(0, 0.02))
                row[f"member/{t}/reward"] = float(valid * (1 - 0.5 * progress) + rng.normal(0, 0.03))
                row[f"member/{t}/teacher_reward"] = row[f"member/{t}/reward"]
            for s in STATS:
                row[f"complexity/{s}"] = float(np.mean(diag_all[s]))
            for s in students:
                sr = float(np.mean(solve_by_student[s])) if solve_by_student[s] else 0.0
                row[f"member/{s}/solve_rate"] = sr
                row[f"member/{s}/student_reward"] = sr
                t_r = row.get(f"member/{s}/teacher_reward")  # the single agent plays both roles
                row[f"member/{s}/reward"] = sr if t_r is None else (sr + t_r) / 2
                row[f"member/{s}/format_error_rate"] = _clip(0.1 * (1 - progress) + rng.normal(0, 0.02))
                all_rewards.append(sr)
                skill[s] += rng.normal(0.002, 0.01)
            for m in alive:
                row[f"member/{m}/mean_length"] = float(180 + 60 * progress + rng.normal(0, 10))
                row[f"member/{m}/n_samples"] = 8
                row[f"member/{m}/loss"] = float(rng.normal(0, 0.05))
                row[f"member/{m}/n_tokens"] = int(row[f"member/{m}/mean_length"] * 8)
                a = alive[m]
                a["mu"] += float(rng.normal(0, 0.6))
                a["sigma"] = max(1.5, a["sigma"] * 0.95)
                a["age"] += 1
                row[f"trueskill/{m}/mu"], row[f"trueskill/{m}/sigma"] = a["mu"], a["sigma"]
                row[f"trueskill/{m}/expose"] = a["mu"] - 3 * a["sigma"]
            row["reward"] = float(np.mean(all_rewards))
            row["reward_std"] = float(np.std(all_rewards))
            row["student/reward"] = row["reward"]
            row["student/solve_rate"] = row["reward"]
            row["teacher/reward"] = float(np.mean([row[f"member/{t}/reward"] for t in teachers]))
            row["valid_rate"] = float(np.mean([row[f"member/{t}/valid_rate"] for t in teachers]))
            row["format_error_rate"] = float(np.mean([row[f"member/{m}/format_error_rate"] for m in alive]))
            row["teacher/format_error_rate"] = float(np.mean([row[f"member/{t}/format_error_rate"] for t in teachers]))
            row["student/format_error_rate"] = float(np.mean([row[f"member/{m}/format_error_rate"] for m in students]))
            for i, tt in enumerate(("code_o", "code_i", "code_f")):
                row[f"{tt}/valid_rate"] = _clip(row["valid_rate"] - 0.1 * i + rng.normal(0, 0.03))
                row[f"{tt}/solve_rate"] = _clip(row["student/solve_rate"] + 0.1 * (1 - i) + rng.normal(0, 0.03))
            row["completions/mean_length"] = float(np.mean([row[f"member/{m}/mean_length"] for m in alive]))
            row.update(tracker.metrics(alive))
            for i, st in enumerate(STAGES):
                row[f"time/{st}"] = float(0.5 + i * 0.3 + abs(rng.normal(0, 0.1)))
            mf.write(json.dumps(row) + "\n")
            for rep in replacements or []:
                if rep["step"] != step:
                    continue
                old = alive.pop(rep["replaced"])
                parent = alive[rep["parents"][0]]
                alive[rep["child"]] = {"id": rep["child"], "slot": old["slot"], "role": old["role"],
                                       "mu": parent["mu"], "sigma": 25 / 3, "age": 0, "born_step": step,
                                       "parents": list(rep["parents"]), "operator": rep["operator"]}
                skill[rep["child"]] = skill.get(rep["parents"][0], 0.0)
                lineage.append({"step": step, "child": rep["child"], "replaced": rep["replaced"],
                                "parents": list(rep["parents"]), "operator": rep["operator"],
                                "params": {"eps": 0.1}, "role": old["role"]})
    (run_dir / "population.json").write_text(json.dumps(
        {"step": steps, "members": list(alive.values()), "lineage": lineage}, indent=1))
    if eval_json is not None:
        (run_dir / "eval.json").write_text(json.dumps(eval_json))
    return run_dir


EVAL = {"benchmarks": {"mbpp_plus": {"base": 0.312, "members": {"s0": 0.334, "s2": 0.328}, "n": 378},
                       "humaneval_plus": {"base": 0.244, "members": {"s0": 0.262, "s2": 0.25}, "n": 164}},
        "aggregate": {"base": 0.278, "best_member": "s0", "best": 0.298}}


def write_population_run(run_dir: Path, steps: int = 30) -> Path:
    """2 teachers + 2 students; s1 is replaced at step 15 (M1 from s0), t1 at step 22 (average of t0 and t1)."""
    return write_run(run_dir, members=[("t0", "teacher"), ("t1", "teacher"), ("s0", "student"), ("s1", "student")],
                     steps=steps, seed=1, eval_json=EVAL,
                     replacements=[{"step": 15, "replaced": "s1", "child": "s2", "parents": ["s0"],
                                    "operator": "svd_structured"},
                                   {"step": 22, "replaced": "t1", "child": "t2", "parents": ["t0", "t1"],
                                    "operator": "average"}])


def write_single_run(run_dir: Path, steps: int = 30) -> Path:
    """The `single` baseline: one member playing both roles, no replacements."""
    return write_run(run_dir, members=[("a0", "both")], steps=steps, seed=2, single=True, tasks_per_teacher=4)
