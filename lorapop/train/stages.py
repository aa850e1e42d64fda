"""The stages of one self-play step (SPEC section 3), each a plain function over explicit inputs.

Compute matching (what "every member gets the same number of samples and updates as the baseline" means here):
with ``T = tasks_per_type`` and ``n_types`` task types, every adapter makes exactly one update per step from exactly
``n_types * T`` samples, ``T`` per task type.

* a teacher proposes ``T`` tasks per type and trains on all of them;
* a student answers ``T`` tasks per type ``n_solve`` times each: its matched teacher's valid tasks of this step
  first, topped up from that type's buffer when fewer were valid, so its work does not depend on the teacher's
  validity rate. All ``n_solve`` samples set solve rates, ratings and teacher rewards; one sample per task (drawn
  with the step's seed) enters the update;
* the single agent proposes ``T`` per type and answers its own ``T`` per type the same way; its update takes
  ``ceil(T/2)`` proposals and ``floor(T/2)`` answers per type.

Per-member sample and token counts are logged (``member/<id>/n_samples``, ``member/<id>/n_tokens``) so this can be
checked on any run.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from lorapop.engine.base import Completion, SamplingParams, TrainSample
from lorapop.tasks import TASK_TYPES, Invalid, Outcome, ParseError
from lorapop.tasks.rewards import student_reward, teacher_reward
from lorapop.train.population import Member
from lorapop.train.rating import MatchResult


@dataclass
class Rollout:
    member: Member
    role: str                      # "teacher" or "student" (what this sample trains)
    task_type: str
    prompt_ids: list[int]
    completion: Completion
    status: str = ""               # teacher: format_error | invalid | valid; student: format_error | wrong | correct
    reward: float = 0.0
    task: Any = None               # the Task (valid proposals and every student sample)
    detail: str = ""               # parse error or invalid reason
    result: Any = None             # teacher: the ParseError / Invalid / Task its proposal became
    source_program: str | None = None  # code_f: the buffer program the teacher was shown


@dataclass
class SolveJob:
    task: Any
    task_type: str
    student: Member
    teacher: Member | None         # the matched teacher when the task is its proposal of this step, else None
    rollouts: list[Rollout] = field(default_factory=list)

    @property
    def solve_rate(self) -> float:
        return sum(r.status == "correct" for r in self.rollouts) / max(len(self.rollouts), 1)


def step_rng(seed: int, step: int, stage: str) -> random.Random:
    # String seeds hash with SHA-512 in random.Random, independent of PYTHONHASHSEED, so resumes repeat exactly.
    return random.Random(f"{seed}:{step}:{stage}")


def _params(cfg: Any) -> SamplingParams:
    return SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                          min_new_tokens=cfg.min_new_tokens)


def propose(engine: Any, teachers: list[Member], buffers: dict[str, Any], task_types: list[str], tasks_per_type: int,
            n_references: int, sampling: Any, rng: random.Random) -> list[Rollout]:
    """Every teacher writes ``tasks_per_type`` proposals per type, all in one multi-LoRA generate call."""
    prompts, meta = [], []
    for t in teachers:
        for tt in task_types:
            for _ in range(tasks_per_type):
                refs = reference_tasks(buffers, tt, n_references, rng)
                text = TASK_TYPES[tt].teacher_prompt(refs, rng)
                prompts.append(engine.chat_prompt(text))
                meta.append((t, tt, refs[0].program if tt == "code_f" and refs else None))
    seeds = [rng.getrandbits(31) for _ in prompts]
    outs = engine.generate(prompts, [t.slot for t, _, _ in meta], _params(sampling), seeds=seeds)
    return [Rollout(t, "teacher", tt, p, c, source_program=src) for (t, tt, src), p, c in zip(meta, prompts, outs)]


def reference_tasks(buffers: dict[str, Any], task_type: str, k: int, rng: random.Random) -> list[Any]:
    # code_f is conditioned on one program from the deduction/abduction buffers (AZR), the others on K of their own
    if task_type == "code_f":
        pool = [b for name, b in buffers.items() if name in ("code_o", "code_i") and len(b)]
        return pool[rng.randrange(len(pool))].sample(1, rng) if pool else buffers["code_f"].sample(1, rng)
    return buffers[task_type].sample(k, rng)


def validate(rollouts: list[Rollout], executor: Any, buffers: dict[str, Any], step: int) -> list[Rollout]:
    """Parse and check every proposal (one batched executor pass per task type); valid tasks enter their buffer.
    Returns the valid rollouts."""
    by_type: dict[str, list[tuple[Rollout, Any]]] = defaultdict(list)
    for r in rollouts:
        proposal = TASK_TYPES[r.task_type].parse_proposal(r.completion.text, program=r.source_program)
        if isinstance(proposal, ParseError):
            r.status, r.detail, r.result = "format_error", proposal.reason, proposal
        else:
            by_type[r.task_type].append((r, proposal))
    valid = []
    for tt, items in by_type.items():
        results = TASK_TYPES[tt].validate_many([p for _, p in items], executor)
        for (r, _), res in zip(items, results):
            r.result = res
            if isinstance(res, Invalid):
                r.status, r.detail = "invalid", res.reason
                continue
            res.proposer, res.step = r.member.id, step
            r.status, r.task = "valid", res
            buffers[tt].add(res)
            valid.append(r)
    return valid


def solve_jobs(pairs: dict[str, Member], teachers: dict[str, Member], valid: list[Rollout], buffers: dict[str, Any],
               task_types: list[str], tasks_per_type: int, rng: random.Random) -> list[SolveJob]:
    """What each student answers: its teacher's valid tasks (never its own, except the single agent), topped up
    from the buffer to exactly ``tasks_per_type`` per type."""
    own: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for r in valid:
        own[(r.member.id, r.task_type)].append(r.task)
    jobs = []
    for t_id, student in pairs.items():
        teacher = teachers[t_id]
        for tt in task_types:
            tasks = own[(t_id, tt)][:tasks_per_type]
            jobs += [SolveJob(task, tt, student, teacher) for task in tasks]
            for _ in range(tasks_per_type - len(tasks)):  # with replacement: the buffer may hold a single seed
                jobs.append(SolveJob(buffers[tt].sample(1, rng)[0], tt, student, None))
    return jobs


def solve(engine: Any, jobs: list[SolveJob], executor: Any, n_solve: int, sampling: Any,
          rng: random.Random) -> None:
    """Each job's student answers ``n_solve`` times (one generate call for everyone), then answers are checked."""
    prompts, slots, owners = [], [], []
    for job in jobs:
        ids = engine.chat_prompt(TASK_TYPES[job.task_type].student_prompt(job.task))
        for _ in range(n_solve):
            prompts.append(ids)
            slots.append(job.student.slot)
            owners.append(job)
    seeds = [rng.getrandbits(31) for _ in prompts]
    outs = engine.generate(prompts, slots, _params(sampling), seeds=seeds) if prompts else []
    for job, p, c in zip(owners, prompts, outs):
        job.rollouts.append(Rollout(job.student, "student", job.task_type, p, c, task=job.task))
    for job in jobs:
        tt = TASK_TYPES[job.task_type]
        answers = [tt.parse_answer(r.completion.text) for r in job.rollouts]
        for r, outcome in zip(job.rollouts, tt.check_many(job.task, answers, executor)):
            r.status, r.detail = outcome.status, outcome.detail


def reward(proposals: list[Rollout], jobs: list[SolveJob], mode: str) -> None:
    """Student samples: +1 / -0.5 / -1. Teacher proposals: -1 format, -0.5 invalid, else by the matched student's
    solve rate on that task (``adversarial`` or ``learnability``)."""
    rates = {id(j.task): j.solve_rate for j in jobs if j.teacher is not None}
    for job in jobs:
        for r in job.rollouts:
            r.reward = student_reward(Outcome(r.status))
    for r in proposals:
        r.reward = teacher_reward(r.result, rates.get(id(r.task)) if r.status == "valid" else None, mode)


def update_batch(proposals: list[Rollout], jobs: list[SolveJob], single: bool, tasks_per_type: int,
                 rng: random.Random) -> list[Rollout]:
    """The compute-matched samples each member trains on this step (see the module docstring)."""
    chosen: list[Rollout] = []
    by_type: dict[tuple[str, str], list[Rollout]] = defaultdict(list)
    for r in proposals:
        by_type[(r.member.id, r.task_type)].append(r)
    n_prop = math.ceil(tasks_per_type / 2) if single else tasks_per_type
    for group in by_type.values():
        chosen += group if len(group) <= n_prop else rng.sample(group, n_prop)
    answers: dict[tuple[str, str], list[Rollout]] = defaultdict(list)
    for job in jobs:
        if job.rollouts:
            answers[(job.student.id, job.task_type)].append(job.rollouts[rng.randrange(len(job.rollouts))])
    n_ans = tasks_per_type // 2 if single else tasks_per_type
    for group in answers.values():
        chosen += group if len(group) <= n_ans else rng.sample(group, n_ans)
    return chosen


def trr_advantages(rollouts: list[Rollout], eps: float = 1e-6) -> list[float]:
    """TRR++: normalise rewards within each (member, task type, role) group; a group of one gets advantage 0."""
    groups: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(rollouts):
        groups[(r.member.id, r.task_type, r.role)].append(i)
    adv = [0.0] * len(rollouts)
    for idx in groups.values():
        vals = [rollouts[i].reward for i in idx]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
        for i in idx:
            adv[i] = (rollouts[i].reward - mean) / (std + eps)
    return adv


def update(engine: Any, batch: list[Rollout]) -> dict[int, dict[str, float]]:
    adv = trr_advantages(batch)
    samples = [TrainSample(r.prompt_ids, r.completion.token_ids, r.member.slot, a) for r, a in zip(batch, adv)]
    return engine.train_step(samples) if samples else {}


def matches(jobs: list[SolveJob]) -> list[MatchResult]:
    """One TrueSkill match per (valid task of this step, matched student); the student wins on >= half solved."""
    out = []
    for job in jobs:
        if job.teacher is not None and job.teacher.id != job.student.id and job.rollouts:
            out.append(MatchResult(job.teacher.id, job.student.id, job.solve_rate >= 0.5))
    return out
