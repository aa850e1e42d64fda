"""Step 0 of a self-play config, measured without training: the base model, through the config's
own prompts, prefills, sampling and sandbox, proposes ``--proposals`` tasks; every valid one is answered
``n_solve`` times by the base. Prints the valid rate with the reasons proposals failed, the solve rate on valid
tasks (overall and by AST depth of the program), the share of valid tasks solved sometimes but not always
(``mixed_share``: 0 < s < 1), the share of trivial tasks, the same figures per task type (``by_type``), and ends
with one line of JSON.

    PYTHONPATH=. .venv/bin/python bench/dynamics_setting.py cpu_dynamics [--proposals 64] [--key=value ...]

Every adapter starts as the base (LoRA B = 0), so which member proposes or answers does not matter; the stages are
the trainer's (lorapop/train/stages.py), called once with ``tasks_per_type`` raised to cover ``--proposals``.
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lorapop.config import load_config, resolve_config_path  # noqa: E402
from lorapop.criteria import is_trivial  # noqa: E402
from lorapop.diagnostics.complexity import ast_depth  # noqa: E402
from lorapop.train import stages  # noqa: E402
from lorapop.train.loop import Trainer  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--proposals", type=int, default=64, help="proposals to draw (split over the teachers)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=6, help="print this many replies of each status")
    args, overrides = ap.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(resolve_config_path(args.config), overrides + [
            f"--run.output_dir={tmp}", "--run.name=step0", "--run.progress=none", f"--run.seed={args.seed}"])
        teachers_n = cfg.population.n_teachers if cfg.population.mode == "population" else 1
        per = -(-args.proposals // (teachers_n * len(cfg.selfplay.task_types)))
        cfg.selfplay.tasks_per_type = max(per, 2)
        with Trainer(cfg, Path(tmp) / "step0") as tr:
            ctx = stages.StepContext(0, cfg.run.seed, tr.engine, tr.executor, cfg.selfplay, tr.buffers)
            teachers = list(tr.population.teachers)
            props = stages.validate(ctx, stages.propose(ctx, teachers))
            student = tr.population.students[0]
            jobs = [stages.SolveJob(r.task, r.task_type, student, r.member) for r in props if r.status == "valid"]
            jobs = stages.solve(ctx, jobs)
    status = Counter(r.status for r in props)
    reasons = Counter(f"{r.status}:{r.detail.split(':')[0][:40]}" for r in props if r.status != "valid")
    by_depth: dict[int, list[float]] = defaultdict(list)
    trivial = []
    for j in jobs:
        depth = ast_depth(ast.parse(j.task.program)) if _parses(j.task.program) else 0
        by_depth[depth].append(j.solve_rate)
        trivial.append(is_trivial({"type": j.task_type, "program": j.task.program, "inputs": j.task.inputs, "outputs": j.task.outputs}))
    n = len(props)
    out = {
        "config": args.config, "overrides": overrides, "proposals": n,
        "valid_rate": status["valid"] / n if n else 0.0,
        "solve_rate": statistics.fmean(j.solve_rate for j in jobs) if jobs else None,
        # the tasks a learnability reward can tell apart (AZR's r = 1 - s only for 0 < s < 1)
        "mixed_share": statistics.fmean(0.0 < j.solve_rate < 1.0 for j in jobs) if jobs else None,
        "n_valid": len(jobs), "n_answers": sum(len(j.rollouts) for j in jobs),
        "answer_format_error_rate": (sum(r.status == "format_error" for j in jobs for r in j.rollouts)
                                     / max(1, sum(len(j.rollouts) for j in jobs))),
        "trivial_share": sum(trivial) / len(trivial) if trivial else None,
        "distinct_programs": len({j.task.program for j in jobs}),
        "solve_by_depth": {str(d): [round(statistics.fmean(v), 3), len(v)] for d, v in sorted(by_depth.items())},
        "failures": dict(reasons.most_common()),
        # the same figures per task type (code_o and code_i see the same proposals' layout, not the same question)
        "by_type": {tt: _figures([r for r in props if r.task_type == tt], [j for j in jobs if j.task_type == tt])
                    for tt in cfg.selfplay.task_types},
    }
    shown: Counter = Counter()
    for r in props:
        if shown[r.status] < args.show:
            shown[r.status] += 1
            print(f"--- {r.status} {r.detail[:60]!r}\n{r.prefill + r.completion.text}")
    for j in [j for tt in cfg.selfplay.task_types for j in [j for j in jobs if j.task_type == tt][:args.show]]:
        print(f"--- {j.task_type} task {j.task.program!r} f({j.task.inputs[0]}) = {j.task.outputs[0]}: "
              f"{[r.completion.text.strip()[:20] for r in j.rollouts]} -> {j.solve_rate}")
    print(json.dumps(out))
    return out


def _figures(props: list, jobs: list) -> dict:
    rates = [j.solve_rate for j in jobs]
    answers = [r for j in jobs for r in j.rollouts]
    return {"proposals": len(props), "valid_rate": round(len(jobs) / len(props), 3) if props else 0.0,
            "solve_rate": round(statistics.fmean(rates), 3) if rates else None,
            "mixed_share": round(statistics.fmean(0.0 < s < 1.0 for s in rates), 3) if rates else None,
            "n_valid": len(jobs),
            "answer_format_error_rate": round(sum(r.status == "format_error" for r in answers) / len(answers), 3)
            if answers else None,
            "failures": dict(Counter(f"{r.status}:{r.detail.split(':')[0][:40]}" for r in props
                                     if r.status != "valid").most_common())}


def _parses(src: str) -> bool:
    try:
        ast.parse(src)
        return True
    except SyntaxError:
        return False


if __name__ == "__main__":
    main()
