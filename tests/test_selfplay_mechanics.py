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
from lorapop.train.population import Member, Population
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
def test_pfsp_probabilities_follow_quality_plus_floor():
    q = {("t", "a"): 0.8, ("t", "b"): 0.2, ("t", "c"): 0.0}
    p = pfsp_probabilities("t", ["a", "b", "c"], lambda t, s: q[(t, s)], floor=0.05)
    total = 0.85 + 0.25 + 0.05
    assert p == pytest.approx([0.85 / total, 0.25 / total, 0.05 / total])


def test_matchmaking_without_replacement_gives_every_student_one_teacher():
    teachers, students = [f"t{i}" for i in range(4)], [f"s{i}" for i in range(4)]
    for seed in range(20):
        pairs = matchmake(teachers, students, lambda t, s: 0.5, 0.05, random.Random(seed))
        assert sorted(pairs) == teachers
        assert sorted(pairs.values()) == students


def test_matchmaking_prefers_high_quality_matches():
    quality = lambda t, s: 0.9 if s == "s0" else 0.01  # noqa: E731
    counts = collections.Counter()
    for seed in range(400):
        counts.update(matchmake(["t0"], ["s0", "s1", "s2"], quality, 0.05, random.Random(seed)).values())
    # expected share of s0: 0.95 / (0.95 + 0.06 + 0.06) = 0.89
    assert 0.8 < counts["s0"] / 400 < 0.97
    assert counts["s1"] > 0 and counts["s2"] > 0  # the floor keeps everyone reachable


def test_matchmaking_with_replacement_when_unequal():
    pairs = matchmake(["t0", "t1", "t2"], ["s0"], lambda t, s: 0.5, 0.05, random.Random(0))
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
    jobs = stages.solve_jobs(ctx, {"t0": s1, "t1": s0}, {"t0": t0, "t1": t1}, valid + [invalid])
    per_student = collections.Counter((j.student.id, j.task_type) for j in jobs)
    assert per_student == {("s1", "code_o"): 3, ("s1", "code_i"): 3, ("s0", "code_o"): 3, ("s0", "code_i"): 3}
    matched = [(j.student.id, j.task) for j in jobs if j.teacher is not None]
    assert sorted(matched) == [("s0", "t1-a"), ("s1", "t0-a"), ("s1", "t0-b")]
    for j in jobs:
        assert j.student.role == "student"
        if j.teacher is None:
            assert str(j.task).endswith(("seed0", "seed1", "seed2"))  # top-up from the buffer


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


@pytest.mark.parametrize("tpt", [1, 2, 4, 5])
def test_update_batch_is_compute_matched_between_population_and_single(tpt):
    types = ["code_o", "code_i", "code_f"]
    t0, _, s0, _ = make_pop()
    props = [r for tt in types for r in _rollouts_for(t0, "teacher", tt, tpt)]
    jobs = []
    for tt in types:
        for _ in range(tpt):
            jobs.append(stages.SolveJob("x", tt, s0, t0, tuple(_rollouts_for(s0, "student", tt, 3))))
    batch = stages.update_batch(props, jobs, single=False, tasks_per_type=tpt, rng=random.Random(0))
    counts = collections.Counter(r.member.id for r in batch)
    assert counts == {"t0": 3 * tpt, "s0": 3 * tpt}

    agent = Member("a0", 0, "agent")
    props = [r for tt in types for r in _rollouts_for(agent, "teacher", tt, tpt)]
    jobs = []
    for tt in types:
        for _ in range(tpt):
            jobs.append(stages.SolveJob("x", tt, agent, agent, tuple(_rollouts_for(agent, "student", tt, 3))))
    batch = stages.update_batch(props, jobs, single=True, tasks_per_type=tpt, rng=random.Random(0))
    assert len(batch) == 3 * tpt  # the single agent's one adapter gets exactly what each population member gets
    roles = collections.Counter(r.role for r in batch)
    assert roles == collections.Counter({"teacher": 3 * math.ceil(tpt / 2), "student": 3 * (tpt // 2)}) - collections.Counter()


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
