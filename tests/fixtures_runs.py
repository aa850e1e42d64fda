"""Run directories for the report tests, written by the trainer's own writers so their format cannot drift.

Everything but the model is real: the config is a `Config`, the directory is made by `RunDir.create`, each step's
proposals and answers go through the trainer's `reward`, `update_batch`, `matches`, `task_records`,
`update_coverage` and `step_metrics` stages, ratings are real TrueSkill, PBT births go through
`Population.replace`, and `MetricsLogger` / `RunDir.write_population` / `RunDir.write_eval` write the files; probe.jsonl
rows come from lorapop/train/probe.py's `probe_row` and `noise_floor`, at the trainer's moments (step 0, then every
run.probe_interval steps after the update and before the replacements). Only what a model would say is drawn at
random: which proposals are valid, which answers correct (the single agent's solve rate climbs while its programs get
simpler, as in the paper), completion lengths, losses, probe scores.
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path

from lorapop.config import load_config
from lorapop.diagnostics.coverage import CoverageTracker
from lorapop.engine.base import Completion
from lorapop.evolve.pbt import Replacement
from lorapop.records.rundir import RunDir
from lorapop.tasks import Invalid, ParseError, Task
from lorapop.train import stages
from lorapop.train.logger import MetricsLogger
from lorapop.train.metrics import population_members, step_metrics, task_records, update_coverage
from lorapop.train.population import Population
from lorapop.train.probe import noise_floor, probe_row, probe_tasks
from lorapop.train.rating import Ratings

TIMED = ("matchmake", "propose", "validate", "solve", "reward", "update", "rate", "evolve", "coverage")


def make_program(rng: random.Random, level: int) -> tuple[str, list[str]]:
    lines, ind = ["def f(x, n):", "    acc = 0"], 1
    for i in range(level):
        c = rng.randrange(5)
        pad = "    " * ind
        if c == 0 and ind < 4:
            lines += [f"{pad}for i{i} in range(n):", f"{pad}    acc += i{i} * {rng.randint(1, 4)}"]
            ind += 1
        elif c == 1 and ind < 4:
            lines += [f"{pad}if acc % {rng.randint(2, 4)} == 0:", f"{pad}    acc = acc // 2 + len(x)"]
            ind += 1
        elif c == 2:
            lines.append(f"{pad}acc = max(acc, len(x) - {rng.randrange(9)})")
        elif c == 3:
            lines.append(f"{pad}acc += sum(v for v in x if v % 2)")
        else:
            lines.append(f"{pad}x = sorted(x, reverse={bool(rng.randrange(2))})")
    lines.append("    return acc")
    inputs = [f"{[rng.randrange(50) for _ in range(rng.randint(1, 2 + 2 * level))]}, {rng.randint(1, 5)}"
              for _ in range(2)]
    return "\n".join(lines) + "\n", inputs


def _completion(rng: random.Random, mean: float) -> Completion:
    return Completion([1, 2, 3], list(range(max(1, int(rng.gauss(mean, 15))))), "", "eos")


def write_run(run_dir: Path, *, overrides: list[str], steps: int = 30, seed: int = 0,
              replacements: list[dict] | None = None, tasks_per_type: int = 3, n_solve: int = 2,
              eval_json: dict | None = None) -> Path:
    """replacements: {"step", "replaced", "parents", "operator"}, applied in that step's evolve stage as PBT would
    (the child's id comes from the population)."""
    run_dir = Path(run_dir)
    cfg = load_config(None, overrides + [f"--run.steps={steps}", f"--run.seed={seed}",
                                         f"--selfplay.tasks_per_type={tasks_per_type}", f"--selfplay.n_solve={n_solve}",
                                         "--coverage.n_cells=64", "--coverage.kmeans_samples=2000", "--run.progress=none",
                                         "--run.probe_interval=10", "--run.probe_per_level=2",
                                         "--run.tensorboard=false", f"--run.output_dir={run_dir.parent}",
                                         f"--run.name={run_dir.name}"])
    rd = RunDir(run_dir)
    from lorapop.config import config_to_yaml

    rd.create(config_to_yaml(cfg))
    rng = random.Random(seed)
    sp = cfg.selfplay
    pop = Population.create(cfg.population.mode, cfg.population.n_teachers, cfg.population.n_students)
    ratings = Ratings()
    for m in pop.members:
        ratings.add(m.id)
    coverage = CoverageTracker(cfg.coverage, run_dir=run_dir)
    skill = {m.id: 0.0 for m in pop.members}
    logger = MetricsLogger(rd, report_to=[])
    probe_log, probe_rng = rd.open_probe(), random.Random(f"probe:{seed}")

    def probe(step: int, members: list) -> list[dict]:
        return [probe_row(m, step, k, level, min(1.0, max(0.0, probe_rng.gauss(0.2 + skill[m.id] - 0.05 * level, 0.1))),
                          cfg.run.probe_min_age)
                for m in members for k, (level, _) in enumerate(probe_tasks(cfg.run.probe_per_level))]

    try:
        first = probe(0, pop.students)
        replicates = [(m.id, [r for r in first if r["member"] == m.id]) for m in pop.students]
        if len(replicates) == 1:
            replicates.append((pop.students[0].id, probe(0, pop.students)))
        probe_log.write(*first, noise_floor(replicates, True, cfg.run.probe_samples))
        for step in range(1, steps + 1):
            progress = step / steps
            players = tuple(pop.members)
            teachers, students = pop.teachers, pop.students
            pairs = dict(zip((t.id for t in teachers), students[1:] + students[:1])) if not pop.single else \
                {teachers[0].id: students[0]}
            proposals, jobs = [], []
            for t in teachers:
                student = pairs[t.id]
                level = max(0, round((1 - progress) * 3)) if pop.single else 1 + int(progress * 5)
                for tt in sp.task_types:
                    for _ in range(sp.tasks_per_type):
                        c = _completion(rng, 180 + 60 * progress)
                        draw = rng.random()
                        if draw < 0.2 * (1 - progress):
                            proposals.append(stages.Rollout(t, "teacher", tt, [1], c, status="format_error",
                                                            result=ParseError("missing_block")))
                            continue
                        if draw > 0.55 + 0.3 * progress:
                            proposals.append(stages.Rollout(t, "teacher", tt, [1], c, status="invalid",
                                                            result=Invalid("not_deterministic")))
                            continue
                        program, inputs = make_program(rng, level + rng.randrange(2))
                        task = Task(tt, program, inputs, ["0", "1"], proposer=t.id, step=step)
                        proposals.append(stages.Rollout(t, "teacher", tt, [1], c, status="valid", task=task,
                                                        result=task))
                        p = (0.4 + 0.55 * progress if pop.single else 0.5) + skill[student.id] - 0.04 * level
                        jobs.append(stages.SolveJob(task, tt, student, t, tuple(
                            stages.Rollout(student, "student", tt, [1], _completion(rng, 120), task=task,
                                           status="correct" if rng.random() < p else "wrong")
                            for _ in range(sp.n_solve))))
            proposals, jobs = stages.reward(proposals, jobs, sp.teacher_reward)
            batch = stages.update_batch(proposals, jobs, sp.tasks_per_type, rng)
            train_stats = {m.slot: {"loss": rng.gauss(0, 0.05), "grad_norm": abs(rng.gauss(1, 0.2))}
                           for m in pop.members}
            for match in stages.matches(jobs):
                ratings.record(match)
            for m in pop.members:
                skill[m.id] += rng.gauss(0.002, 0.01)
            if step % cfg.run.probe_interval == 0:
                probe_log.write(*probe(step, pop.students))
            lineage = []
            for r in replacements or []:
                if r["step"] != step:
                    continue
                old = pop.get(r["replaced"])
                parents = tuple(r["parents"])
                rep = Replacement(old.slot, old.role, old.id, parents, tuple(pop.get(p).slot for p in parents),
                                  tuple(ratings.expose(p) for p in parents), r["operator"], step=step)
                child, record = pop.replace(rep, {"eps": 0.1}, step)
                ratings.add(child.id, mu=statistics.fmean(ratings.mu(p) for p in parents))
                skill[child.id] = skill[parents[0]]
                lineage.append(record)
            rows = task_records(step, jobs)
            update_coverage(coverage, rows)
            times = {name: 0.5 + i * 0.3 + abs(rng.gauss(0, 0.1)) for i, name in enumerate(TIMED)}
            result = stages.StepResult(step, players, tuple(proposals), tuple(jobs), tuple(batch), train_stats,
                                       tuple(lineage), times)
            logger.log_tasks(rows)
            logger.log_step(step, step_metrics(result, rows, ratings, coverage, sp.task_types))
            rd.write_population(step, population_members(pop, ratings, step), pop.lineage)
    finally:
        logger.close()
        probe_log.close()
    if eval_json is not None:
        rd.write_eval(eval_json)
    return run_dir


EVAL = {"benchmarks": {"mbpp_plus": {"base": 0.312, "members": {"s0": 0.334, "s2": 0.328}, "n": 378},
                       "humaneval_plus": {"base": 0.244, "members": {"s0": 0.262, "s2": 0.25}, "n": 164}},
        "aggregate": {"base": 0.278, "best_member": "s0", "best": 0.298}}


def write_population_run(run_dir: Path, steps: int = 30) -> Path:
    """2 teachers + 2 students; s1 is replaced at step 15 (svd_structured of s0), t1 at step 22 (average of t0 and
    t1): the children are s2 and t2. The probe at step 20 finds s2 5 steps old, under run.probe_min_age=10."""
    return write_run(run_dir, overrides=["--population.n_teachers=2", "--population.n_students=2",
                                         "--run.probe_min_age=10"], steps=steps,
                     seed=1, eval_json=EVAL,
                     replacements=[{"step": 15, "replaced": "s1", "parents": ["s0"], "operator": "svd_structured"},
                                   {"step": 22, "replaced": "t1", "parents": ["t0", "t1"], "operator": "average"}])


def write_single_run(run_dir: Path, steps: int = 30) -> Path:
    """The `single` baseline: one agent playing both roles, no replacements."""
    return write_run(run_dir, overrides=["--population.mode=single"], steps=steps, seed=2, tasks_per_type=4)
