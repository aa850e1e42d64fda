"""Unit tests pinning the self-play mechanics of docs/METHOD.md, The step with small fake inputs (no model)."""

from __future__ import annotations

import collections
import math
import random

import pytest

from lorapop.config import SelfPlayConfig
from lorapop.engine.base import Completion
from lorapop.tasks import Invalid, ParseError
from lorapop.train import stages
from lorapop.train.matchmaking import matchmake, pfsp_probabilities
from lorapop.records.members import Member
from lorapop.train.population import Population
from lorapop.train.rating import MatchResult, Ratings


def completion(n_tokens: int = 3, text: str = "") -> Completion:
    return Completion([1, 2], list(range(n_tokens)), text, "eos")


# ---- TrueSkill -------------------------------------------------------------------------------------------------------
def test_trueskill_one_rating_space_and_expose():
    r = Ratings()
    for m in ("t0", "s0"):
        r.add(m)
    assert r.expose("t0") == pytest.approx(25.0 - 3 * 25.0 / 3)
    r.record(MatchResult("t0", "s0", student_won=True))
    assert r.mu("s0") > 25.0 > r.mu("t0")
    assert r.sigma("s0") < 25.0 / 3
    before = (r.mu("s0"), r.mu("t0"))
    r.record(MatchResult("t0", "s0", student_won=False))
    assert r.mu("t0") > before[1] and r.mu("s0") < before[0]


def test_trueskill_child_starts_at_parents_mu_with_prior_sigma():
    r = Ratings(sigma=5.0)
    r.add("t0")
    r.add("t9", mu=31.5)
    assert r.mu("t9") == 31.5 and r.sigma("t9") == 5.0


def test_ratings_state_roundtrip():
    r = Ratings()
    for m in ("t0", "s0"):
        r.add(m)
    r.record(MatchResult("t0", "s0", True))
    r2 = Ratings()
    r2.load_state_dict(r.state_dict())
    assert r2.state_dict() == r.state_dict()
    assert r2.matches("t0") == r2.matches("s0") == 1


def test_ratings_count_rated_matches_per_member():
    r = Ratings()
    for m in ("t0", "s0", "s1"):
        r.add(m)
    for won in (True, False, True):
        r.record(MatchResult("t0", "s0", won))
    assert (r.matches("t0"), r.matches("s0"), r.matches("s1")) == (3, 3, 0)
    r.add("t2", mu=r.mu("t0"))  # a child starts counting from zero
    assert r.matches("t2") == 0
    old = Ratings()  # a checkpoint from before match counting: [mu, sigma] only, read as 0 matches
    old.load_state_dict({"t0": [27.0, 5.0]})
    assert old.mu("t0") == 27.0 and old.matches("t0") == 0


# ---- matchmaking -----------------------------------------------------------------------------------------------------
def test_pfsp_probabilities_follow_win_probability_weight_plus_floor():
    p_win = {("a", "t"): 0.5, ("b", "t"): 0.9, ("c", "t"): 1.0}  # P(student beats teacher)
    p = pfsp_probabilities("t", ["a", "b", "c"], lambda s, t: p_win[(s, t)], floor=0.05)
    w = [4 * 0.5 * 0.5 + 0.05, 4 * 0.9 * 0.1 + 0.05, 0.0 + 0.05]  # f_var scaled to 1 at a balanced match
    assert p == pytest.approx([x / sum(w) for x in w], rel=1e-12)


def test_trueskill_win_probability_is_the_1v1_model():
    r = Ratings(mu=25.0, sigma=25 / 3, beta=25 / 6)
    r.add("a", mu=30.0)
    r.add("b", mu=25.0)
    assert r.win_probability("a", "a") == 0.5
    z = 5.0 / math.sqrt(2 * (25 / 6) ** 2 + 2 * (25 / 3) ** 2)
    assert r.win_probability("a", "b") == pytest.approx(0.5 * (1 + math.erf(z / math.sqrt(2))), rel=1e-12)
    assert r.win_probability("a", "b") + r.win_probability("b", "a") == pytest.approx(1.0, abs=1e-12)


def test_matchmaking_2t2s_follows_pfsp_weights_with_replacement_not_a_permutation():
    """2 teachers, 2 students, s0 rated far above everyone: each teacher's draw follows the PFSP weights
    independently. A permutation (the old draw without replacement) would give s0 exactly one teacher every step."""
    r = Ratings()
    for m in ("t0", "t1", "s1"):
        r.add(m)
    r.add("s0", mu=60.0)
    r.ratings["s0"] = r.env.create_rating(mu=60.0, sigma=1.0)
    expected = {t: pfsp_probabilities(t, ["s0", "s1"], r.win_probability, 0.05)[0] for t in ("t0", "t1")}
    assert all(x < 0.1 for x in expected.values())  # s0 almost surely wins: only the floor keeps it drawable
    n = 4000
    got = collections.Counter()
    n_s0_per_step = collections.Counter()
    for step in range(n):
        pairs = matchmake(["t0", "t1"], ["s0", "s1"], r.win_probability, 0.05,
                          stages.step_rng(0, step, "matchmake"))
        got.update(t for t, s in pairs.items() if s == "s0")
        n_s0_per_step[sum(s == "s0" for s in pairs.values())] += 1
    for t, p in expected.items():
        # binomial: the count of s0 draws has sd sqrt(n p (1 - p)); 4 sd leaves a false failure at ~6e-5
        assert abs(got[t] - n * p) < 4 * math.sqrt(n * p * (1 - p)), (t, got[t], n * p)
    # independent draws: both teachers on s1 in most steps (about (1 - p)^2), which a permutation never does
    p0 = expected["t0"]
    assert abs(n_s0_per_step[0] - n * (1 - p0) ** 2) < 4 * math.sqrt(n * (1 - p0) ** 2 * (1 - (1 - p0) ** 2))


def test_matchmaking_draws_from_the_stage_rng_only():
    args = (["t0", "t1", "t2"], ["s0", "s1"], lambda s, t: 0.5, 0.05)
    assert matchmake(*args, stages.step_rng(3, 7, "matchmake")) == matchmake(*args, stages.step_rng(3, 7, "matchmake"))
    pairs = matchmake(["t0", "t1", "t2"], ["s0"], lambda s, t: 0.5, 0.05, random.Random(0))
    assert set(pairs.values()) == {"s0"}


# ---- jobs, rewards, advantages ----------------------------------------------------------------------------------------
class FakeBuffer:
    def __init__(self, name):
        self.items = [f"{name}-seed{i}" for i in range(3)]

    def __len__(self):
        return len(self.items)

    def sample(self, k, rng):
        return rng.sample(self.items, min(k, len(self.items)))


def make_pop():
    t0, t1 = Member("t0", 0, "teacher"), Member("t1", 1, "teacher")
    s0, s1 = Member("s0", 2, "student"), Member("s1", 3, "student")
    return t0, t1, s0, s1


def valid_rollout(member, tt, task):
    return stages.Rollout(member, "teacher", tt, [1], completion(), status="valid", task=task, result=task)


def test_students_never_solve_their_teachers_other_or_own_tasks_and_get_equal_work():
    t0, t1, s0, s1 = make_pop()
    valid = [valid_rollout(t0, "code_o", "t0-a"), valid_rollout(t0, "code_o", "t0-b"),
             valid_rollout(t1, "code_i", "t1-a")]
    buffers = {tt: FakeBuffer(tt) for tt in ("code_o", "code_i")}
    sp = SelfPlayConfig(task_types=["code_o", "code_i"], tasks_per_type=3)
    ctx = stages.StepContext(1, 0, None, None, sp, buffers)  # solve_jobs needs neither engine nor executor
    invalid = stages.Rollout(t1, "teacher", "code_o", [1], completion(), status="invalid", task=None)
    jobs = stages.solve_jobs(ctx, {"t0": s1, "t1": s0}, {"t0": t0, "t1": t1}, valid + [invalid], [s0, s1])
    per_student = collections.Counter((j.student.id, j.task_type) for j in jobs)
    assert per_student == {("s1", "code_o"): 3, ("s1", "code_i"): 3, ("s0", "code_o"): 3, ("s0", "code_i"): 3}
    matched = [(j.student.id, j.task) for j in jobs if j.teacher is not None]
    assert sorted(matched) == [("s0", "t1-a"), ("s1", "t0-a"), ("s1", "t0-b")]
    for j in jobs:
        assert j.student.role == "student"
        if j.teacher is None:
            assert str(j.task).endswith(("seed0", "seed1", "seed2"))  # top-up from the buffer


def test_a_student_drawn_by_two_teachers_answers_both_and_trains_on_t_per_type_one_drawn_by_none_on_top_ups():
    t0, t1, s0, s1 = make_pop()
    valid = [valid_rollout(t, "code_o", f"{t.id}-{k}") for t in (t0, t1) for k in range(3)]
    buffers = {"code_o": FakeBuffer("code_o")}
    sp = SelfPlayConfig(task_types=["code_o"], tasks_per_type=3)
    ctx = stages.StepContext(1, 0, None, None, sp, buffers)
    jobs = stages.solve_jobs(ctx, {"t0": s0, "t1": s0}, {"t0": t0, "t1": t1}, valid, [s0, s1])
    # every valid task is answered by its teacher's matched student (its reward and match need the solve rate)
    assert sorted((j.student.id, j.task) for j in jobs if j.teacher) == sorted(("s0", f"{t}-{k}") for t in ("t0", "t1")
                                                                                for k in range(3))
    assert [j.teacher for j in jobs if j.student.id == "s1"] == [None] * 3  # drawn by none: 3 top-ups
    jobs = [stages.SolveJob(j.task, j.task_type, j.student, j.teacher, tuple(_rollouts_for(j.student, "student",
                                                                                       "code_o", 2))) for j in jobs]
    batch = stages.update_batch(valid, jobs, 3, random.Random(0))
    groups = {k: len(v) for k, v in stages.trr_groups(batch).items()}
    assert groups == {("t0", "code_o", "teacher"): 3, ("t1", "code_o", "teacher"): 3,
                      ("s0", "code_o", "student"): 3, ("s1", "code_o", "student"): 3}


def test_teacher_reward_modes_and_student_rewards():
    t0, _, s0, _ = make_pop()
    tasks = ["A", "B", "C"]
    props = [valid_rollout(t0, "code_o", t) for t in tasks]
    props.append(stages.Rollout(t0, "teacher", "code_o", [1], completion(), status="invalid",
                                result=Invalid("no_f")))
    props.append(stages.Rollout(t0, "teacher", "code_o", [1], completion(), status="format_error",
                                result=ParseError("missing_block")))
    jobs = []
    for task, statuses in zip(tasks, [("correct", "correct"), ("correct", "wrong"), ("wrong", "format_error")]):
        jobs.append(stages.SolveJob(task, "code_o", s0, t0, tuple(
            stages.Rollout(s0, "student", "code_o", [1], completion(), status=s, task=task) for s in statuses)))
    rewarded, rjobs = stages.reward(props, jobs, "adversarial")
    assert [r.reward for r in rewarded] == [0.0, 0.5, 1.0, -0.5, -1.0]
    assert [r.reward for j in rjobs for r in j.rollouts] == [1.0, 1.0, 1.0, -0.5, -0.5, -1.0]
    assert [r.reward for r in props] == [0.0] * 5  # results are new values; the inputs are unchanged
    rewarded, _ = stages.reward(props, jobs, "learnability")
    assert [r.reward for r in rewarded] == [0.0, 0.5, 0.0, -0.5, -1.0]


def test_trr_plus_plus_groups_by_member_type_and_role():
    t0, _, s0, _ = make_pop()
    rs = [stages.Rollout(t0, "teacher", "code_o", [1], completion(), reward=x) for x in (1.0, 0.0)]
    rs += [stages.Rollout(s0, "student", "code_o", [1], completion(), reward=x) for x in (1.0, -1.0, -1.0)]
    rs += [stages.Rollout(s0, "student", "code_i", [1], completion(), reward=0.3)]
    adv = stages.trr_advantages(rs)
    assert adv[0] == pytest.approx(1.0, abs=1e-5) and adv[1] == pytest.approx(-1.0, abs=1e-5)
    std = math.sqrt(((1 + 1 / 3) ** 2 + 2 * (2 / 3) ** 2) / 3)
    assert adv[2] == pytest.approx((1 + 1 / 3) / std, rel=1e-5)
    assert adv[5] == 0.0  # a group of one has no baseline to beat


def test_zero_advantage_groups_counts_tied_groups_per_role():
    t0, _, s0, _ = make_pop()
    rs = [stages.Rollout(t0, "teacher", "code_o", [1], completion(), reward=-1.0) for _ in range(3)]
    rs += [stages.Rollout(t0, "teacher", "code_i", [1], completion(), reward=x) for x in (-1.0, 0.5)]
    rs += [stages.Rollout(s0, "student", "code_o", [1], completion(), reward=-0.5) for _ in range(2)]
    rs += [stages.Rollout(s0, "student", "code_f", [1], completion(), reward=1.0)]  # a group of one ties too
    assert stages.zero_advantage_groups(rs) == {"teacher": (1, 2), "student": (2, 2)}
    adv = stages.trr_advantages(rs)
    tied = [i for i, r in enumerate(rs) if (r.task_type, r.role) != ("code_i", "teacher")]
    assert all(adv[i] == 0.0 for i in tied) and adv[3] != 0.0  # a tied group is exactly a zero-advantage group


def _rollouts_for(member, role, tt, n):
    return [stages.Rollout(member, role, tt, [1], completion()) for _ in range(n)]


@pytest.mark.parametrize("tpt", [2, 4, 5, 64])
def test_update_batch_groups_are_t_samples_for_population_and_single(tpt):
    """Every TRR++ group (member, task type, role) holds T samples: a teacher's, a student's, and both of the single
    agent's (it trains, as AZR does, on T proposals and T answers per type: twice a population member's samples)."""
    types = ["code_o", "code_i", "code_f"]
    t0, _, s0, _ = make_pop()
    props = [r for tt in types for r in _rollouts_for(t0, "teacher", tt, tpt)]
    jobs = []
    for tt in types:
        for _ in range(tpt):
            jobs.append(stages.SolveJob("x", tt, s0, t0, tuple(_rollouts_for(s0, "student", tt, 3))))
    batch = stages.update_batch(props, jobs, tasks_per_type=tpt, rng=random.Random(0))
    assert collections.Counter(r.member.id for r in batch) == {"t0": 3 * tpt, "s0": 3 * tpt}
    assert {len(v) for v in stages.trr_groups(batch).values()} == {tpt}
    assert len(stages.trr_groups(batch)) == 6

    agent = Member("a0", 0, "agent")
    props = [r for tt in types for r in _rollouts_for(agent, "teacher", tt, tpt)]
    jobs = []
    for tt in types:
        for _ in range(tpt):
            jobs.append(stages.SolveJob("x", tt, agent, agent, tuple(_rollouts_for(agent, "student", tt, 3))))
    batch = stages.update_batch(props, jobs, tasks_per_type=tpt, rng=random.Random(0))
    assert len(batch) == 2 * 3 * tpt  # one teacher's plus one student's samples
    assert collections.Counter(r.role for r in batch) == {"teacher": 3 * tpt, "student": 3 * tpt}
    assert {len(v) for v in stages.trr_groups(batch).values()} == {tpt}
    assert len(stages.trr_groups(batch)) == 6


def test_matches_only_for_this_steps_valid_tasks_and_half_solved_wins():
    t0, _, s0, _ = make_pop()

    def job(statuses, teacher):
        return stages.SolveJob("x", "code_o", s0, teacher, tuple(
            stages.Rollout(s0, "student", "code_o", [1], completion(), status=s) for s in statuses))

    ms = stages.matches([job(["correct", "wrong"], t0), job(["wrong", "format_error"], t0),
                         job(["correct", "correct"], None)])
    assert [(m.teacher, m.student, m.student_won) for m in ms] == [("t0", "s0", True), ("t0", "s0", False)]


def test_step_rng_is_independent_of_hash_seed_and_differs_by_stage():
    a = stages.step_rng(3, 7, "propose").random()
    assert a == stages.step_rng(3, 7, "propose").random()
    assert a != stages.step_rng(3, 7, "solve").random()
    assert a != stages.step_rng(3, 8, "propose").random()


# ---- population ------------------------------------------------------------------------------------------------------
def test_population_replace_keeps_slot_and_role_and_records_lineage():
    from lorapop.evolve.pbt import Replacement

    pop = Population.create("population", 2, 2)
    rep = Replacement(slot=1, role="teacher", old_id="t1", parents=("t0",), parent_slots=(0,), fitness=(1.0,),
                      operator="svd_structured", step=5)
    child, record = pop.replace(rep, {"eps": 0.1}, step=5)
    assert (child.id, child.slot, child.role, child.born_step, child.parents) == ("t2", 1, "teacher", 5, ("t0",))
    assert [m.id for m in pop.teachers] == ["t0", "t2"]
    assert pop.lineage == [record]
    assert record == {"step": 5, "child": "t2", "replaced": "t1", "parents": ["t0"], "operator": "svd_structured",
                      "params": {"eps": 0.1}, "role": "teacher", "slot": 1, "id": rep.operator_id}
    again = Population.from_state_dict(pop.state_dict())
    assert again.state_dict() == pop.state_dict()
    single = Population.create("single", 4, 4)
    assert single.single and single.teachers == single.students == single.members


def test_matched_solve_rate_is_the_curve_and_top_ups_are_apart(tmp_path):
    import io

    from lorapop.diagnostics.coverage import CoverageConfig, CoverageTracker
    from lorapop.train.logger import Progress
    from lorapop.train.metrics import step_metrics

    t0, _, s0, _ = make_pop()

    def job(task, teacher, statuses):
        return stages.SolveJob(task, "code_o", s0, teacher, tuple(
            stages.Rollout(s0, "student", "code_o", [1], completion(), status=s, task=task) for s in statuses))
    jobs = (job("mine", t0, ("correct", "wrong")), job("buf1", None, ("correct", "correct")),
            job("buf2", None, ("correct", "correct")))
    ratings = Ratings()
    for m in (t0, s0):
        ratings.add(m.id)
    result = stages.StepResult(1, (t0, s0), (valid_rollout(t0, "code_o", "mine"),), jobs, (), {}, (), {})
    m = step_metrics(result, [], ratings, CoverageTracker(CoverageConfig(), run_dir=tmp_path), ["code_o"])
    assert m["student/matched_solve_rate"] == 0.5 and m["student/topup_solve_rate"] == 1.0
    assert m["student/solve_rate"] == 5 / 6 and m["student/topup_frac"] == 4 / 6
    assert m["member/s0/matched_solve_rate"] == 0.5 and m["code_o/matched_solve_rate"] == 0.5
    out = io.StringIO()
    Progress("plain", 1, stream=out).end_step(1, m, {})
    assert "student/matched_solve_rate=0.500 student/topup_solve_rate=1.000" in out.getvalue()
    # a step without valid tasks has no matched solve rate (absent, not 0)
    result = stages.StepResult(1, (t0, s0), (), jobs[1:], (), {}, (), {})
    m = step_metrics(result, [], ratings, CoverageTracker(CoverageConfig(), run_dir=tmp_path), ["code_o"])
    assert "student/matched_solve_rate" not in m and m["student/topup_frac"] == 1.0


def test_a_task_that_does_not_reproduce_is_dropped_and_invalid_for_its_teacher():
    """check_many answers ``void`` when the task's own program no longer gives its stored output: no verdict, so
    no reward, rating or update sample from it; the task leaves the buffer and its proposal pays the invalid reward."""
    from lorapop.tasks import Task
    from lorapop.tasks.buffer import TaskBuffer

    t0, _, s0, _ = make_pop()
    stable, unstable = (Task("code_o", f"def f(x):\n    return x + {k}", ["1"], [str(1 + k)]) for k in (1, 2))
    buffer = TaskBuffer("code_o")
    for task in (stable, unstable):
        buffer.add(task)
    ctx = stages.StepContext(1, 0, None, None, SelfPlayConfig(task_types=["code_o"]), {"code_o": buffer})
    props = [valid_rollout(t0, "code_o", stable), valid_rollout(t0, "code_o", unstable)]
    jobs = [stages.SolveJob(task, "code_o", s0, t0, tuple(
        stages.Rollout(s0, "student", "code_o", [1], completion(), status=s, task=task) for s in statuses))
        for task, statuses in ((stable, ("correct", "wrong")), (unstable, ("void", "void")))]
    props2, jobs2 = stages.drop_void(ctx, props, jobs)
    assert [j.task for j in jobs2] == [stable]
    assert props2[0] is props[0] and props2[1].status == "invalid" and props2[1].detail == "not_reproduced"
    assert isinstance(props2[1].result, Invalid) and props2[1].result.reason == "not_reproduced"
    assert stable in list(buffer) and unstable not in list(buffer)
    rewarded, _ = stages.reward(props2, jobs2, "adversarial")
    assert [r.reward for r in rewarded] == [0.5, -0.5]  # the unstable task pays what an invalid one pays
    assert stages.matches(jobs2) == [MatchResult("t0", "s0", True)]
    assert stages.drop_void(ctx, props[:1], jobs[:1]) == (props[:1], jobs[:1])  # nothing void: nothing changes
