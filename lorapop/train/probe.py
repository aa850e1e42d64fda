"""The capability probe of the dynamics experiment (docs/RESULTS.md, "Dynamics: pre-registration"): every
``run.probe_interval`` steps each student (the agent in single mode) answers a fixed set of held-out ``code_o``
tasks at three levels, of the family of ``selfplay.proposal_style`` (integer expressions; list selections under
``selection``), ``probe_samples`` times each, and one ``probe.jsonl`` row per (member, task) records the share
answered correctly.
``lorapop/criteria.py`` compares the population's students with the single agent on it; lorapop/records/probe.py
reads the rows back.

The probe tasks are drawn from :func:`probe_tasks` with their own seed (the same in every run and seed, so two runs
are scored on the same tasks), from shapes the style's family module writes (``PROBE_SHAPES`` of
lorapop/tasks/expression_family.py and selection_family.py), and none is a reference task of
``seeds/expr_seed_io.jsonl`` (``seeds/select_seed_io.jsonl`` for selections, whose lists they do not reuse either).
The probe only generates (no gradient, no rating, no buffer entry) and draws its sampling seeds from its own stage
RNG, so a run with the probe on trains exactly like one with it off.

What a probe figure is made of:

* the probe of step N runs after that step's update and before its PBT replacement, so it scores the members that
  trained at step N, never a child made that step;
* a PBT child is probed as soon as it exists but counts in the aggregate (criteria, report) only once it has trained
  ``run.probe_min_age`` steps: its rows carry ``age`` and ``counted`` (:func:`counts`); rows written before these
  fields existed count;
* before step 1 every member is the same base model (a fresh LoRA adapter has ``B = 0``), so the spread of their
  scores is what the probe's sampling alone moves a member's score by: the *noise floor*, one row
  ``{"step": 0, "noise_floor": {...}}`` beside the step-0 rows (:func:`noise_floor`). With one member (the single
  agent) the member is scored a second time, with fresh seeds, to have two replicates. Probe figures are shown
  beside it (lorapop/criteria.py, the report, docs/RESULTS.md).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from typing import Any

from lorapop.tasks.base import Task
from lorapop.tasks.styles import proposal_style

PROBE_SEED = 2026


def probe_tasks(per_level: int = 30, seed: int = PROBE_SEED, style: str = "expression") -> list[tuple[int, Task]]:
    """(level, task) pairs, ``per_level`` distinct tasks at each level, the same for the same arguments: the probe
    family of proposal style ``style`` (integer expressions, lorapop/tasks/expression_family.py; list selections under
    ``selection``, lorapop/tasks/selection_family.py)."""
    return proposal_style(style).probe_tasks(per_level, seed)


def counts(member: Any, step: int, min_age: int) -> bool:
    """Whether ``member``'s probe score at ``step`` enters the aggregate: a member of step 0 always (each curve starts
    from all of them), a PBT child once it has trained ``min_age`` steps. Every member trains in every step
    (docs/METHOD.md, "Same per-adapter compute"), so the steps a child has trained are its age: steps since the evolve
    stage that made it, which its ``born_step`` (kept in every checkpoint) gives."""
    return member.born_step == 0 or member.age(step) >= min_age


def run_probe(engine: Any, executor: Any, members: Sequence[Any], step: int, params: Any, n_samples: int,
              prefill: str, rng: random.Random, per_level: int = 30, min_age: int = 0, style: str = "expression",
              answers: bool = False) -> list[dict[str, Any]]:
    """One probe.jsonl row per (member, task): ``step, member, role, task, level, score, age, counted``. ``style``
    (selfplay.proposal_style) picks the probe's family and code_o's student prompt; the probe asks in the short
    chat prompt whatever selfplay.prompt_format is. ``answers``: each row also holds the raw replies (``answers``,
    the prefill included) and their checker statuses (``statuses``), for an experiment that saves its samples."""
    from lorapop.tasks import TASK_TYPES
    from lorapop.tasks.formats import prompt_format

    code_o, chat, family = TASK_TYPES["code_o"], prompt_format("short"), proposal_style(style)
    tasks = family.probe_tasks(per_level, PROBE_SEED)
    prompts, slots, who = [], [], []
    for m in members:
        for k, (_, task) in enumerate(tasks):
            ids = chat.prompt_ids(engine, family.student_prompt(code_o, task), prefill)
            prompts += [ids] * n_samples
            slots += [m.slot] * n_samples
            who += [(m, k)] * n_samples
    outs = engine.generate(prompts, slots, params, seeds=[rng.getrandbits(31) for _ in prompts])
    rows = []
    for i in range(0, len(outs), n_samples):
        m, k = who[i]
        level, task = tasks[k]
        replies = [prefill + c.text for c in outs[i:i + n_samples]]
        parsed = [chat.parse_answer(code_o, r) for r in replies]
        statuses = [o.status for o in code_o.check_many(task, parsed, executor)]
        rows.append(probe_row(m, step, k, level, statuses.count("correct") / n_samples, min_age))
        if answers:
            rows[-1].update(answers=replies, statuses=statuses)
    return rows


def probe_row(member: Any, step: int, k: int, level: int, score: float, min_age: int) -> dict[str, Any]:
    """One probe.jsonl row: ``member``'s score on probe task ``k`` (of ``level``) at ``step``."""
    return {"step": step, "member": member.id, "role": member.role, "task": f"L{level}:{k}", "level": level,
            "score": score, "age": member.age(step), "counted": counts(member, step, min_age)}


def noise_floor(replicates: Sequence[tuple[str, Sequence[dict[str, Any]]]], identical: bool,
                n_samples: int) -> dict[str, Any]:
    """The step-0 row: per replicate (a member's id and its rows) its mean score over the probe's tasks, and their
    spread (max - min) and sample standard deviation. ``identical`` says whether the replicates were the same
    weights (no member started from ``population.init_from``); when not, the spread is more than sampling noise."""
    scores = [{"member": mid, "score": statistics.fmean(r["score"] for r in rows)} for mid, rows in replicates]
    values = [s["score"] for s in scores]
    return {"step": 0, "noise_floor": {
        "replicates": scores, "n": len(values), "spread": max(values) - min(values) if values else None,
        "std": statistics.stdev(values) if len(values) >= 2 else None, "identical": identical,
        "tasks": len(replicates[0][1]) if replicates else 0, "samples": n_samples}}
