"""What a step records: the metric names of docs/ARCHITECTURE.md (TRL-style where they fit) and tasks.jsonl rows,
as functions of the step's :class:`~lorapop.train.stages.StepResult`, the ratings and the coverage archive."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lorapop.train.population import Population
from lorapop.train.rating import Ratings
from lorapop.train.stages import Rollout, SolveJob, StepResult, zero_advantage_groups

if TYPE_CHECKING:
    from lorapop.diagnostics.coverage import CoverageTracker


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else 0.0


def _std(xs: list[float]) -> float:
    return statistics.pstdev(xs) if len(xs) > 1 else 0.0


# engine.train_step's per-adapter means and the token count each is a mean over.
_TRAIN_MEANS = (("entropy", "n_scored"), ("logprob_mismatch", "n_compared"), ("is_capped_frac", "n_compared"),
                ("is_ratio_mean", "n_compared"))


def train_means(train_stats: Mapping[int, Mapping[str, float]]) -> dict[str, float]:
    """``train/entropy``, ``train/logprob_mismatch``, ``train/is_capped_frac`` and ``train/is_ratio_mean``:
    engine.train_step's per-adapter means pooled over the adapters, weighted by the tokens each was measured on;
    absent when no adapter measured any. The mismatch is the mean |update's - sampler's| log-prob of the sampled
    tokens: ~0 when the update is on-policy (docs/METHOD.md); the importance ratio exp(update's - sampler's) is then
    ~1 and the cap truncates none of them."""
    out = {}
    for k, n in _TRAIN_MEANS:
        have = [st for st in train_stats.values() if k in st]  # an engine that does not report k adds no figure
        tokens = sum(st.get(n, 0) for st in have)
        if tokens:
            out[f"train/{k}"] = sum(st[k] * st.get(n, 0) for st in have) / tokens
    return out


def step_metrics(result: StepResult, task_rows: Sequence[dict[str, Any]], ratings: Ratings,
                 coverage: CoverageTracker, task_types: Sequence[str]) -> dict[str, Any]:
    """One metrics.jsonl line (without ``step``/``time``). ``result.players`` are the members who played this step
    (before evolve), so a member replaced at this step still gets its last numbers; children born at this step only
    get their starting rating. ``coverage`` must already hold this step's tasks (:func:`update_coverage`)."""
    # The arms-race curve: the matched students' rate on this step's valid tasks of their teachers (the single
    # agent's own). Top-ups from the buffer train the student but are another distribution (old tasks, mostly the
    # seeds and what was easy enough to be valid early): their rate is logged apart, and both are absent on a step
    # without such tasks rather than 0. student/solve_rate is every answer of the step, both kinds mixed.
    matched = [r for j in result.jobs if j.teacher is not None for r in j.rollouts]
    topups = [r for j in result.jobs if j.teacher is None for r in j.rollouts]
    m = _step_rates(result, matched, topups, task_types)
    m.update(train_means(result.train_stats))
    for mem in result.players:
        m.update(_member_metrics(result, mem, matched, ratings))
    for rec in result.lineage:
        cid = rec["child"]
        m[f"trueskill/{cid}/mu"] = ratings.mu(cid)
        m[f"trueskill/{cid}/sigma"] = ratings.sigma(cid)
        m[f"trueskill/{cid}/expose"] = ratings.expose(cid)
    m["evolve/replacements"] = len(result.lineage)
    m["evolve/too_few_matches"] = len(result.evolve_skipped)
    m.update(_complexity(task_rows))
    # this step's players only, so a replaced member's coverage series ends where it was replaced
    m.update(coverage.metrics(members=[mem.id for mem in result.players]))
    m.update({f"time/{k}": v for k, v in result.times.items()})
    return m


def _step_rates(result: StepResult, matched: list[Rollout], topups: list[Rollout],
                task_types: Sequence[str]) -> dict[str, Any]:
    """The step's rewards, lengths and rates over every rollout, then per task type."""
    proposals, answers = list(result.proposals), result.answers
    m: dict[str, Any] = {}
    student_rewards = [r.reward for r in answers]
    m["reward"] = _mean(student_rewards)
    m["reward_std"] = _std(student_rewards)
    lengths = [len(r.completion.token_ids) for r in proposals + answers]
    m["completions/mean_length"] = _mean(lengths)
    m["teacher/reward"] = _mean([r.reward for r in proposals])
    m["student/reward"] = m["reward"]
    m["student/solve_rate"] = _mean([r.status == "correct" for r in answers])
    if matched:
        m["student/matched_solve_rate"] = _mean([r.status == "correct" for r in matched])
    if topups:
        m["student/topup_solve_rate"] = _mean([r.status == "correct" for r in topups])
    m["student/topup_frac"] = len(topups) / len(answers) if answers else 0.0
    m["valid_rate"] = _mean([r.status == "valid" for r in proposals])
    m["format_error_rate"] = _mean([r.status == "format_error" for r in proposals + answers])
    m["teacher/format_error_rate"] = _mean([r.status == "format_error" for r in proposals])
    m["student/format_error_rate"] = _mean([r.status == "format_error" for r in answers])
    # TRL-style name: the share of TRR++ groups in the update whose rewards all tie (advantage 0, nothing learnt)
    for role, (n_tied, n) in sorted(zero_advantage_groups(result.batch).items()):
        m[f"{role}/zero_adv_group_frac"] = n_tied / n
    m["n_valid_tasks"] = sum(r.status == "valid" for r in proposals)
    for tt in task_types:
        props = [r for r in proposals if r.task_type == tt]
        m[f"{tt}/valid_rate"] = _mean([r.status == "valid" for r in props])
        m[f"{tt}/solve_rate"] = _mean([r.status == "correct" for r in answers if r.task_type == tt])
        mine = [r.status == "correct" for r in matched if r.task_type == tt]
        if mine:
            m[f"{tt}/matched_solve_rate"] = _mean(mine)
    return m


def _member_metrics(result: StepResult, mem: Any, matched: list[Rollout], ratings: Ratings) -> dict[str, Any]:
    """One player's numbers: a teacher's from its proposals, a student's from its answers, the agent has both; its
    share of the update and its rating."""
    rs = [r for r in list(result.proposals) + result.answers if r.member.id == mem.id]
    props = [r for r in rs if r.role == "teacher"]
    ans = [r for r in rs if r.role == "student"]
    key = f"member/{mem.id}"
    m: dict[str, Any] = {}
    m[f"{key}/reward"] = _mean([r.reward for r in rs])
    m[f"{key}/mean_length"] = _mean([len(r.completion.token_ids) for r in rs])
    m[f"{key}/format_error_rate"] = _mean([r.status == "format_error" for r in rs])
    if props:
        m[f"{key}/valid_rate"] = _mean([r.status == "valid" for r in props])
        m[f"{key}/teacher_reward"] = _mean([r.reward for r in props])
    if ans:
        m[f"{key}/solve_rate"] = _mean([r.status == "correct" for r in ans])
        mine = [r.status == "correct" for r in matched if r.member.id == mem.id]
        if mine:
            m[f"{key}/matched_solve_rate"] = _mean(mine)
        m[f"{key}/student_reward"] = _mean([r.reward for r in ans])
    trained = [r for r in result.batch if r.member.id == mem.id]
    m[f"{key}/n_samples"] = len(trained)
    m[f"{key}/n_tokens"] = sum(len(r.completion.token_ids) for r in trained)
    m[f"{key}/n_generated_tokens"] = sum(len(r.completion.token_ids) for r in rs)
    stats = result.train_stats.get(mem.slot, {})
    for k in ("loss", "grad_norm"):
        if k in stats:
            m[f"{key}/{k}"] = float(stats[k])
    for k, n in (("entropy", "n_scored"), ("logprob_mismatch", "n_compared"), ("is_capped_frac", "n_compared")):
        if stats.get(n) and k in stats:  # a member whose update scored (compared) no token has no figure, not 0
            m[f"{key}/{k}"] = float(stats[k])
    m[f"{key}/age"] = mem.age(result.step)
    m[f"{key}/rated_matches"] = ratings.matches(mem.id)
    m[f"trueskill/{mem.id}/mu"] = ratings.mu(mem.id)
    m[f"trueskill/{mem.id}/sigma"] = ratings.sigma(mem.id)
    m[f"trueskill/{mem.id}/expose"] = ratings.expose(mem.id)
    return m


def _complexity(task_rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Program descriptors of this step's valid tasks, overall and per proposing teacher."""
    per_teacher: dict[str, list[dict[str, float]]] = defaultdict(list)
    for row in task_rows:
        per_teacher[row["proposer"]].append(row["diagnostics"])
    all_desc = [d for ds in per_teacher.values() for d in ds]
    m: dict[str, float] = {}
    for stat in sorted({k for d in all_desc for k in d}):
        m[f"complexity/{stat}"] = _mean([float(d[stat]) for d in all_desc if stat in d])
        for t_id, ds in per_teacher.items():
            m[f"complexity/{t_id}/{stat}"] = _mean([float(d[stat]) for d in ds if stat in d])
    return m


def sandbox_record(executor: Any) -> dict[str, Any] | None:
    """population.json's ``sandbox``: the executor's protections and ``isolated`` (None for an executor that does
    not report them)."""
    from lorapop.executor.base import isolated

    prot = getattr(executor, "protections", None)
    return None if not isinstance(prot, dict) else {**prot, "isolated": isolated(prot)}


def unisolated_note(sandbox: dict[str, Any]) -> str:
    """The line shown at every start of a run whose sandbox does not isolate."""
    from lorapop.executor.base import ISOLATION_KEYS

    missing = ", ".join(k for k in ISOLATION_KEYS if not sandbox.get(k))
    return (f"WARNING: the sandbox is NOT ISOLATED (executor.allow_unisolated; mechanism {sandbox.get('mechanism')}, "
            f"missing {missing}): model-written programs run with this user's access to its files and the network; "
            "population.json and the report record it")


def population_members(population: Population, ratings: Ratings, step: int) -> list[dict[str, Any]]:
    """The ``members`` of population.json: each member's record with its rating and age."""
    return [{**m.to_json(), "mu": ratings.mu(m.id), "sigma": ratings.sigma(m.id), "expose": ratings.expose(m.id),
             "age": m.age(step)} for m in population.members]


def update_coverage(coverage: CoverageTracker, task_rows: Sequence[dict[str, Any]]) -> None:
    """Feed the coverage archive exactly the tasks that were logged."""
    for row in task_rows:
        coverage.add(row["diagnostics"], row["proposer"], row["solver"])


def task_records(step: int, jobs: Sequence[SolveJob]) -> list[dict[str, Any]]:
    """One tasks.jsonl row per valid task proposed this step, with who solved it, how well, each of its answers
    (the student's reply and its status: what a reader needs to see why a task was or was not solved) and the
    program's descriptors."""
    from lorapop.diagnostics.complexity import program_descriptors

    rows = []
    for job in jobs:
        if job.teacher is None:
            continue
        task = job.task
        desc = program_descriptors(task.program, list(task.inputs))
        rows.append({"step": step, "type": job.task_type, "proposer": job.teacher.id, "solver": job.student.id,
                     "program": task.program, "inputs": list(task.inputs), "outputs": list(task.outputs),
                     "message": getattr(task, "message", None), "solve_rate": job.solve_rate,
                     "answers": [{"text": r.reply, "status": r.status} for r in job.rollouts],
                     "diagnostics": desc})
    return rows
