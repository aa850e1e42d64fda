"""The capability probe of the dynamics experiment (docs/RESULTS.md, "Dynamics: pre-registration"): every
``run.probe_interval`` steps each student (the agent in single mode) answers a fixed set of held-out ``code_o``
expression tasks at three levels, ``probe_samples`` times each, and one ``probe.jsonl`` row per (member, task)
records the share answered correctly. ``lorapop/criteria.py`` compares the population's students with the single
agent on it.

The probe tasks are drawn from :func:`probe_tasks` with their own seed (the same in every run and seed, so two runs
are scored on the same tasks), from expression shapes written here, and none is a reference task of
``seeds/expr_seed_io.jsonl``. The probe only generates (no gradient, no rating, no buffer entry) and draws its
sampling seeds from its own stage RNG, so a run with the probe on trains exactly like one with it off.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from lorapop.tasks.base import Task

PROBE_SEED = 2026
# level -> expression shapes; {a}, {b}, {c} are small constants drawn per task
SHAPES: dict[int, tuple[str, ...]] = {
    1: ("x + {a}", "x - {a}", "x * {b}", "x % {b}", "x // {b}"),
    2: ("x * {b} + {a}", "(x + {a}) * {b}", "x % {b} + {a}", "abs(x - {c})", "x * x - {a}"),
    3: ("(x * {b} + {a}) % {c}", "abs(x - {c}) * {b} + {a}", "(x + {a}) * (x % {b})", "max(x * {b}, {c}) - x",
        "x % {b} * {a} + x // {b}"),
}


def probe_tasks(per_level: int = 30, seed: int = PROBE_SEED) -> list[tuple[int, Task]]:
    """(level, task) pairs, ``per_level`` distinct tasks at each level, the same for the same arguments."""
    from lorapop.tasks.expressions import LEVELS, program

    refs = {program(e) for exprs in LEVELS.values() for e in exprs}
    rng = random.Random(f"probe:{seed}")
    out: list[tuple[int, Task]] = []
    for level, shapes in sorted(SHAPES.items()):
        seen: set[tuple[str, int]] = set()
        while len(seen) < per_level:
            expr = rng.choice(shapes).format(a=rng.randint(1, 9), b=rng.randint(2, 5), c=rng.randint(3, 11))
            x, prog = rng.randint(0, 12), program(expr)
            if prog in refs or (prog, x) in seen:
                continue
            seen.add((prog, x))
            ns: dict = {}
            exec(prog, ns)  # noqa: S102 - our own expressions, never model output
            out.append((level, Task(type="code_o", program=prog, inputs=[str(x)], outputs=[repr(ns["f"](x))],
                                    proposer="probe", step=0)))
    return out


def run_probe(engine: Any, executor: Any, members: Sequence[Any], step: int, params: Any, n_samples: int,
              prefill: str, rng: random.Random, per_level: int = 30) -> list[dict[str, Any]]:
    """One probe.jsonl row per (member, task): ``step, member, role, task, level, score``."""
    from lorapop.tasks import TASK_TYPES
    from lorapop.train.stages import prompt_ids

    code_o, tasks = TASK_TYPES["code_o"], probe_tasks(per_level)
    prompts, slots, who = [], [], []
    for m in members:
        for k, (_, task) in enumerate(tasks):
            ids = prompt_ids(engine, code_o.student_prompt(task), prefill)
            prompts += [ids] * n_samples
            slots += [m.slot] * n_samples
            who += [(m, k)] * n_samples
    outs = engine.generate(prompts, slots, params, seeds=[rng.getrandbits(31) for _ in prompts])
    rows = []
    for i in range(0, len(outs), n_samples):
        m, k = who[i]
        level, task = tasks[k]
        answers = [code_o.parse_answer(prefill + c.text) for c in outs[i:i + n_samples]]
        correct = sum(o.status == "correct" for o in code_o.check_many(task, answers, executor))
        rows.append({"step": step, "member": m.id, "role": m.role, "task": f"L{level}:{k}", "level": level,
                     "score": correct / n_samples})
    return rows
