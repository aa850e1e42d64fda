"""The stages of one self-play step (docs/METHOD.md, "The step"). Each stage is a function of a typed
:class:`StepContext` (the engine and executor by their Protocols, the self-play config, the buffers, the step's seed)
and its inputs, and returns new frozen values: :class:`Rollout`, :class:`SolveJob`, and the step's
:class:`StepResult`. Only the buffers (valid tasks enter them) and the engine's adapters change in place.

Compute matching (what "every member gets the same number of samples and updates as the baseline" means here):
with ``T = tasks_per_type`` and ``n_types`` task types, every adapter makes exactly one update per step, and each of
its TRR++ groups (task type, role) holds exactly ``T`` samples.

* a teacher proposes ``T`` tasks per type and trains on all of them;
* a student answers, ``n_solve`` times each, the valid tasks of this step of every teacher that drew it (PFSP
  draws with replacement: none, one or several), topped up from that type's buffer to ``T`` per type when fewer, so
  what it trains on depends neither on validity rates nor on the draw. All ``n_solve`` samples set solve rates,
  ratings and teacher rewards; one sample of each of ``T`` answered tasks per type (drawn with the step's seed)
  enters the update;
* the single agent proposes ``T`` per type and answers its own ``T`` per type the same way, and, as AZR does, trains
  on both: ``T`` proposals and ``T`` answers per type, ``2 * n_types * T`` samples, one teacher's plus one student's
  work. So every TRR++ group (member, task type, role) holds ``T`` samples in both modes, and the agent's update
  counts twice a population member's samples (docs/METHOD.md, "The step", Update, says why).

Per-member sample and token counts are logged (``member/<id>/n_samples``, ``member/<id>/n_tokens``) so this can be
checked on any run.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from lorapop.engine.base import Completion, Engine, SamplingParams, TrainSample
from lorapop.records.members import Member
from lorapop.tasks import TASK_TYPES, Invalid, Outcome, ParseError, Task
from lorapop.tasks.buffer import TaskBuffer
from lorapop.tasks.code_f import shown_program
from lorapop.tasks.formats import prompt_format
from lorapop.tasks.rewards import student_reward, teacher_reward
from lorapop.tasks.shown import proposal_texts, reserved_strings, shown_invalid
from lorapop.tasks.styles import proposal_style
from lorapop.train.rating import MatchResult

if TYPE_CHECKING:  # the config module imports the executor's; the stages only need the types
    from lorapop.config import SamplingConfig, SelfPlayConfig
    from lorapop.executor.base import Executor


@dataclass(frozen=True)
class Rollout:
    member: Member
    role: str                      # "teacher" or "student" (what this sample trains)
    task_type: str
    prompt_ids: list[int]
    completion: Completion
    status: str = ""               # teacher: format_error | invalid | valid; student: format_error | wrong | correct
    reward: float = 0.0
    task: Task | None = None       # the Task (valid proposals and every student sample)
    detail: str = ""               # parse error or invalid reason
    result: Task | Invalid | ParseError | None = None  # teacher: what its proposal became
    prefill: str = ""              # the assistant turn's prefilled start (in prompt_ids)
    source_program: str | None = None  # code_f: the buffer program the teacher was shown

    @property
    def reply(self) -> str:
        """The whole assistant turn: the prefill, then what the model generated (what parsers read)."""
        return self.prefill + self.completion.text


@dataclass(frozen=True)
class SolveJob:
    task: Task
    task_type: str
    student: Member
    teacher: Member | None         # the matched teacher when the task is its proposal of this step, else None
    rollouts: tuple[Rollout, ...] = ()

    @property
    def solve_rate(self) -> float:
        return sum(r.status == "correct" for r in self.rollouts) / max(len(self.rollouts), 1)


@dataclass(frozen=True)
class StepContext:
    """What the stages of one step work with."""
    step: int
    seed: int
    engine: Engine
    executor: Executor
    cfg: SelfPlayConfig
    buffers: Mapping[str, TaskBuffer]

    def rng(self, stage: str) -> random.Random:
        return step_rng(self.seed, self.step, stage)


@dataclass(frozen=True)
class StepResult:
    """Everything a step produced; metrics and tasks.jsonl rows are functions of it (lorapop/train/metrics.py)."""
    step: int
    players: tuple[Member, ...]            # who played (before evolve replaced anyone)
    proposals: tuple[Rollout, ...]
    jobs: tuple[SolveJob, ...]
    batch: tuple[Rollout, ...]             # what each member trained on
    train_stats: Mapping[int, Mapping[str, float]]  # engine slot -> engine.train_step's statistics
    lineage: tuple[dict[str, Any], ...]    # births of this step's evolve stage
    times: Mapping[str, float]             # seconds per stage
    evolve_skipped: tuple[str, ...] = ()   # members this step's PBT round left out (too few rated matches)

    @property
    def answers(self) -> list[Rollout]:
        return [r for j in self.jobs for r in j.rollouts]


def step_rng(seed: int, step: int, stage: str) -> random.Random:
    # String seeds hash with SHA-512 in random.Random, independent of PYTHONHASHSEED, so resumes repeat exactly.
    return random.Random(f"{seed}:{step}:{stage}")


def sampling_params(cfg: SamplingConfig) -> SamplingParams:
    return SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                          min_new_tokens=cfg.min_new_tokens, stop=tuple(cfg.stop))


def prompt_budget(engine: Engine, max_new_tokens: int) -> int | None:
    """Most tokens a prompt may have: ``engine.max_model_len`` less the reply's budget (the 7B configs' 14240 =
    AZR's 6144-token prompt cap + its 8096-token replies); None when max_model_len is unset (0)."""
    limit = int(getattr(getattr(engine, "cfg", None), "max_model_len", 0) or 0)
    return limit - int(max_new_tokens) if limit > 0 else None


def propose(ctx: StepContext, teachers: Sequence[Member]) -> list[Rollout]:
    """Every teacher writes ``tasks_per_type`` proposals per type, all in one multi-LoRA generate call.

    A prompt over :func:`prompt_budget` is cut, never sent: its reference snippets are dropped, last first, until it
    fits. (AZR drops a prompt over its max_prompt_length instead; here every teacher keeps its ``tasks_per_type``
    proposals per type, the compute matching the population relies on.) The engine's KV cache is sized once for
    prompts inside the budget, so a longer one would otherwise be refused there."""
    engine, sp, rng = ctx.engine, ctx.cfg, ctx.rng("propose")
    style, fmt = proposal_style(sp.proposal_style), prompt_format(sp.prompt_format)
    budget = prompt_budget(engine, sp.propose.max_new_tokens)
    prompts, meta = [], []
    for t in teachers:
        for tt in sp.task_types:
            ty = TASK_TYPES[tt]
            prefill = fmt.proposal_start(style, ty, sp.response_prefill)
            for _ in range(sp.tasks_per_type):
                refs = reference_tasks(ctx.buffers, tt, sp.n_references, rng)
                ids = fmt.prompt_ids(engine, fmt.teacher_prompt(style, ty, refs, rng), prefill)
                while budget is not None and len(ids) > budget and refs:
                    refs = refs[:-1]
                    ids = fmt.prompt_ids(engine, fmt.teacher_prompt(style, ty, refs, rng), prefill)
                if budget is not None and len(ids) > budget:
                    raise ValueError(f"the {tt} proposer prompt without references is {len(ids)} tokens, over the "
                                     f"prompt budget {budget} (engine.max_model_len less propose.max_new_tokens)")
                prompts.append(ids)
                # the program the prompt showed: with every reference dropped to fit, the identity program, which the
                # reply must then be parsed with (recording none made any reply a format error)
                meta.append((t, tt, shown_program(refs) if tt == "code_f" else None, prefill))
    seeds = [rng.getrandbits(31) for _ in prompts]
    outs = engine.generate(prompts, [m[0].slot for m in meta], sampling_params(sp.propose), seeds=seeds)
    return [Rollout(t, "teacher", tt, p, c, source_program=src, prefill=pre)
            for (t, tt, src, pre), p, c in zip(meta, prompts, outs)]


def reference_tasks(buffers: Mapping[str, TaskBuffer], task_type: str, k: int, rng: random.Random) -> list[Task]:
    # code_f is conditioned on one program from the deduction/abduction buffers (AZR), the others on K of their own
    if task_type == "code_f":
        pool = [b for name, b in buffers.items() if name in ("code_o", "code_i") and len(b)]
        return pool[rng.randrange(len(pool))].sample(1, rng) if pool else buffers["code_f"].sample(1, rng)
    return buffers[task_type].sample(k, rng)


def validate(ctx: StepContext, proposals: Sequence[Rollout]) -> list[Rollout]:
    """Parse and check every proposal (one batched executor pass per task type); returns the proposals with their
    status, in order. Valid tasks enter their buffer. The style's own checks get the student's answer budget,
    selfplay.solve's max_new_tokens counted with the engine's own tokenizer (what the answer will be generated in).
    A task whose student prompt would be over :func:`prompt_budget` is invalid (``too_long``): it is refused here,
    at propose time, so no generate call meets a row longer than the engine's cache. Text the student's tokenizer
    would show otherwise than it runs (not NFC, or holding an added token's string) is invalid
    (``not_tokenizer_stable``, lorapop/tasks/shown.py): the program, inputs and message before anything runs, the
    outputs once validated."""
    style, fmt = proposal_style(ctx.cfg.proposal_style), prompt_format(ctx.cfg.prompt_format)
    budget = prompt_budget(ctx.engine, ctx.cfg.solve.max_new_tokens)
    tok = getattr(ctx.engine, "tokenizer", None)
    reserved = reserved_strings(tok)
    out: list[Rollout] = list(proposals)
    by_type: dict[str, list[tuple[int, Any]]] = defaultdict(list)
    for i, r in enumerate(proposals):
        proposal = fmt.parse_proposal(style, TASK_TYPES[r.task_type], r.reply, program=r.source_program)
        if isinstance(proposal, ParseError):
            out[i] = replace(r, status="format_error", detail=proposal.reason, result=proposal)
        elif (bad := shown_invalid(proposal_texts(proposal), reserved)) is not None:
            out[i] = replace(r, status="invalid", detail=bad.reason, result=bad)
        else:
            by_type[r.task_type].append((i, proposal))

    def count_tokens(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False))

    for tt, items in by_type.items():
        results = style.validate_many(TASK_TYPES[tt], [p for _, p in items], ctx.executor,
                                      count_tokens=count_tokens if tok is not None else None,
                                      answer_budget=ctx.cfg.solve.max_new_tokens)
        for (i, _), res in zip(items, results):
            r = out[i]
            res = shown_invalid(proposal_texts(res), reserved) or res if isinstance(res, Task) else res
            if isinstance(res, Invalid):
                out[i] = replace(r, status="invalid", detail=res.reason, result=res)
                continue
            n = _student_prompt_tokens(ctx, fmt, style, tt, res) if budget is not None else 0
            if budget is not None and n > budget:
                bad = Invalid("too_long", f"its student prompt is {n} tokens, over the prompt budget {budget}")
                out[i] = replace(r, status="invalid", detail=bad.reason, result=bad)
                continue
            res.proposer, res.step = r.member.id, ctx.step
            out[i] = replace(r, status="valid", task=res, result=res)
            ctx.buffers[tt].add(res)
    return out


def _student_prompt_tokens(ctx: StepContext, fmt: Any, style: Any, tt: str, task: Task) -> int:
    ty = TASK_TYPES[tt]
    prefill = fmt.answer_start(style, ty, ctx.cfg.response_prefill)
    return len(fmt.prompt_ids(ctx.engine, fmt.student_prompt(style, ty, task), prefill))


def solve_jobs(ctx: StepContext, pairs: Mapping[str, Member], teachers: Mapping[str, Member],
               proposals: Sequence[Rollout], students: Sequence[Member]) -> list[SolveJob]:
    """What each student answers: every valid task of this step of each teacher that drew it (never its own, except
    the single agent; a teacher's reward and ratings need its matched student's solve rate on every valid task),
    topped up from the buffer to ``tasks_per_type`` per type when fewer. A student no teacher drew answers
    ``tasks_per_type`` buffer tasks per type; one drawn by several answers all their valid tasks, and its update
    takes ``tasks_per_type`` of them per type (:func:`update_batch`)."""
    sp, rng = ctx.cfg, ctx.rng("jobs")
    own: dict[tuple[str, str], list[Task]] = defaultdict(list)
    for r in proposals:
        if r.status == "valid" and r.task is not None:
            own[(r.member.id, r.task_type)].append(r.task)
    jobs = []
    for student in students:
        mine = [teachers[t_id] for t_id, s in pairs.items() if s.id == student.id]
        for tt in sp.task_types:
            n = 0
            for teacher in mine:
                tasks = own[(teacher.id, tt)][:sp.tasks_per_type]
                jobs += [SolveJob(task, tt, student, teacher) for task in tasks]
                n += len(tasks)
            for _ in range(sp.tasks_per_type - n):  # with replacement: the buffer may hold a single seed
                jobs.append(SolveJob(ctx.buffers[tt].sample(1, rng)[0], tt, student, None))
    return jobs


def solve(ctx: StepContext, jobs: Sequence[SolveJob]) -> list[SolveJob]:
    """Each job's student answers ``n_solve`` times (one generate call for everyone), then answers are checked;
    returns the jobs with their rollouts."""
    engine, n_solve, rng = ctx.engine, ctx.cfg.n_solve, ctx.rng("solve")
    prompts, slots = [], []
    style, fmt = proposal_style(ctx.cfg.proposal_style), prompt_format(ctx.cfg.prompt_format)
    prefills = {tt: fmt.answer_start(style, TASK_TYPES[tt], ctx.cfg.response_prefill)
                for tt in ctx.cfg.task_types}
    for job in jobs:
        ty = TASK_TYPES[job.task_type]
        ids = fmt.prompt_ids(engine, fmt.student_prompt(style, ty, job.task), prefills[job.task_type])
        prompts += [ids] * n_solve
        slots += [job.student.slot] * n_solve
    seeds = [rng.getrandbits(31) for _ in prompts]
    outs = engine.generate(prompts, slots, sampling_params(ctx.cfg.solve), seeds=seeds) if prompts else []
    done = []
    for k, job in enumerate(jobs):
        tt = TASK_TYPES[job.task_type]
        mine = list(zip(prompts[k * n_solve:(k + 1) * n_solve], outs[k * n_solve:(k + 1) * n_solve]))
        pre = prefills[job.task_type]
        outcomes = tt.check_many(job.task, [fmt.parse_answer(tt, pre + c.text) for _, c in mine], ctx.executor)
        done.append(replace(job, rollouts=tuple(
            Rollout(job.student, "student", job.task_type, p, c, task=job.task, status=o.status, detail=o.detail,
                    prefill=pre)
            for (p, c), o in zip(mine, outcomes))))
    return done


def drop_void(ctx: StepContext, proposals: Sequence[Rollout], jobs: Sequence[SolveJob]
              ) -> tuple[list[Rollout], list[SolveJob]]:
    """Tasks whose own program did not give back its stored output when checked (answers ``void``:
    lorapop/tasks/common.py, check_answers) have no verdict: they leave the buffer, their jobs are dropped (no
    reward, rating or update sample comes from them), and a proposal of this step that made one counts as invalid
    (``not_reproduced``), the teacher's invalid-task reward. A teacher cannot profit from a program whose output
    changes between validation and checking."""
    void = {id(j.task): j for j in jobs if any(r.status == "void" for r in j.rollouts)}
    if not void:
        return list(proposals), list(jobs)
    for job in void.values():
        if job.task_type in ctx.buffers:
            ctx.buffers[job.task_type].discard(job.task)
    out = []
    for r in proposals:
        job = void.get(id(r.task)) if r.status == "valid" else None
        if job is None:
            out.append(r)
            continue
        detail = next(x.detail for x in job.rollouts if x.status == "void")
        out.append(replace(r, status="invalid", detail="not_reproduced",
                           result=Invalid("not_reproduced", detail[:200])))
    return out, [j for j in jobs if id(j.task) not in void]


def reward(proposals: Sequence[Rollout], jobs: Sequence[SolveJob], mode: str, reading: str = "azr_paper"
           ) -> tuple[list[Rollout], list[SolveJob]]:
    """Student samples: +1 / -0.5 / -1. Teacher proposals: -1 format, -0.5 invalid, else by the matched student's
    solve rate on that task (``adversarial`` or ``learnability``); ``reading`` ``azr_code`` pays invalid -1 and a
    valid task paid nothing -0.5 (lorapop/tasks/rewards.py). Returns both with their rewards."""
    rates = {id(j.task): j.solve_rate for j in jobs if j.teacher is not None}
    jobs = [replace(job, rollouts=tuple(replace(r, reward=student_reward(Outcome(r.status))) for r in job.rollouts))
            for job in jobs]
    proposals = [replace(r, reward=teacher_reward(r.result, rates.get(id(r.task)) if r.status == "valid" else None,
                                                  mode, reading)) for r in proposals]
    return proposals, jobs


def update_batch(proposals: Sequence[Rollout], jobs: Sequence[SolveJob], tasks_per_type: int,
                 rng: random.Random) -> list[Rollout]:
    """The compute-matched samples each member trains on this step (see the module docstring): per member and task
    type, its ``T`` proposals and ``T`` of its answered tasks (one sample each; drawn with ``rng`` when a student
    answered more, i.e. when several teachers drew it), so every TRR++ group holds ``T`` samples. The single agent
    gets both roles' groups, as AZR trains its proposer and solver together."""
    chosen: list[Rollout] = []
    by_type: dict[tuple[str, str], list[Rollout]] = defaultdict(list)
    for r in proposals:
        by_type[(r.member.id, r.task_type)].append(r)
    for group in by_type.values():
        chosen += group if len(group) <= tasks_per_type else rng.sample(group, tasks_per_type)
    answers: dict[tuple[str, str], list[Rollout]] = defaultdict(list)
    for job in jobs:
        if job.rollouts:
            answers[(job.student.id, job.task_type)].append(job.rollouts[rng.randrange(len(job.rollouts))])
    for group in answers.values():
        chosen += group if len(group) <= tasks_per_type else rng.sample(group, tasks_per_type)
    return chosen


def trr_groups(rollouts: Sequence[Rollout]) -> dict[tuple[str, str, str], list[int]]:
    """TRR++'s groups: indices of ``rollouts`` per (member, task type, role)."""
    groups: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(rollouts):
        groups[(r.member.id, r.task_type, r.role)].append(i)
    return groups


def zero_advantage_groups(rollouts: Sequence[Rollout]) -> dict[str, tuple[int, int]]:
    """Per role, (groups whose rewards all tie, groups): a tied group gets advantage 0 for every sample, so it
    teaches nothing. A step where every group ties looks exactly like a broken update; this is how to tell."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for (_, _, role), idx in trr_groups(rollouts).items():
        out[role][1] += 1
        out[role][0] += len({rollouts[i].reward for i in idx}) == 1
    return {role: (n_tied, n) for role, (n_tied, n) in out.items()}


def trr_advantages(rollouts: Sequence[Rollout], eps: float = 1e-6) -> list[float]:
    """TRR++: normalise rewards within each (member, task type, role) group; a group of one gets advantage 0."""
    adv = [0.0] * len(rollouts)
    for idx in trr_groups(rollouts).values():
        vals = [rollouts[i].reward for i in idx]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
        for i in idx:
            adv[i] = (rollouts[i].reward - mean) / (std + eps)
    return adv


def update(engine: Engine, batch: Sequence[Rollout]) -> dict[int, dict[str, float]]:
    adv = trr_advantages(batch)
    # scored at the temperature each sample was drawn at, so the update is the sampling policy's gradient
    samples = [TrainSample(r.prompt_ids, r.completion.token_ids, r.member.slot, a, r.completion.temperature,
                           r.completion.logprobs) for r, a in zip(batch, adv)]
    return engine.train_step(samples) if samples else {}


def matches(jobs: Sequence[SolveJob]) -> list[MatchResult]:
    """One TrueSkill match per (valid task of this step, matched student); the student wins on >= half solved."""
    out = []
    for job in jobs:
        if job.teacher is not None and job.teacher.id != job.student.id and job.rollouts:
            out.append(MatchResult(job.teacher.id, job.student.id, job.solve_rate >= 0.5))
    return out
