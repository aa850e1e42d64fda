"""A small student-training loop through the project's own update path, for the learning evidence
(bench/learns.py, tests/test_learns.py: :func:`run_arm`) and the retention protocol (``lorapop retention``).

Every piece is production's: answers are generated, parsed and checked by :func:`lorapop.train.stages.solve` (the
task types' prompt builders and parsers, the sandbox executor), rewarded by :func:`lorapop.train.stages.reward`
(``tasks/rewards.student_reward``), normalised by TRR++ (:func:`lorapop.train.stages.trr_advantages`, one group per
member and task type) and applied by :func:`lorapop.train.stages.update` (``engine.train_step``). Only the task
source differs from self-play: a fixed list of tasks instead of a teacher's proposals.

Arms are engine slots. Each arm answers the same tasks with the same sampling seeds (one ``solve`` call per arm with
the same step context), so an arm whose learning rate is 0 is an exact control: it sees the samples the trained arm
would have seen had it not learned. Unlike self-play's compute-matched batch (one answer per task), every one of the
``n_samples`` answers enters the update, which gives a 135M model on CPU more signal per generated token.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from lorapop.configlib import check_fields, doc
from lorapop.records.members import Member
from lorapop.tasks.base import Task
from lorapop.train.stages import Rollout, SolveJob, StepContext, reward, solve, trr_groups, update

if TYPE_CHECKING:
    from lorapop.engine.base import Engine
    from lorapop.executor.base import Executor


@dataclass
class StudentLoopConfig:
    steps: int = doc(8, "update steps per arm", ge=1)
    tasks_per_step: int = doc(8, "training tasks answered per step (drawn with the step's seed)", ge=1)
    n_samples: int = doc(4, "answers per training task; all enter the TRR++-normalised update", ge=1)
    lr: float = doc(1e-3, "AdamW learning rate of a trained arm. A sanity run may use far more than the paper's "
                           "~1e-6: it has a handful of steps and a 135M base, and must show movement, not a schedule",
                   ge=0)
    max_new_tokens: int = doc(96, "answer length cap (training and evaluation)", ge=1)
    temperature: float = doc(0.7, "sampling temperature of training answers. For the 135M base with response_prefill: "
                                  "0.3 solves most easy tasks (22%; bench/learns.py), 1.0 leaves about half the "
                                  "replies unclosed", gt=0)
    eval_temperature: float = doc(0.7, "sampling temperature of held-out evaluation answers", gt=0)
    eval_samples: int = doc(2, "answers per held-out task", ge=1)
    seed: int = doc(0, "seed of task draws and sampling; arms share it, so they see the same tasks and seeds")
    response_prefill: bool = doc(False, "start every answer with its task type's opening block (selfplay."
                                        "response_prefill): the base then only has to write the value and close "
                                        "the block")

    def validate(self) -> None:
        check_fields(self, "student")


def _context(engine: Engine, executor: Executor, step: int, seed: int, n_samples: int, temperature: float,
             max_new_tokens: int, response_prefill: bool = False) -> StepContext:
    from lorapop.config import SamplingConfig, SelfPlayConfig

    cfg = SelfPlayConfig(n_solve=n_samples, solve=SamplingConfig(max_new_tokens=max_new_tokens,
                                                                 temperature=temperature),
                         response_prefill=response_prefill)
    return StepContext(step=step, seed=seed, engine=engine, executor=executor, cfg=cfg, buffers={})


def answer(engine: Engine, executor: Executor, member: Member, tasks: Sequence[Task], *, step: int, seed: int,
           n_samples: int, temperature: float, max_new_tokens: int, response_prefill: bool = False) -> list[SolveJob]:
    """``member`` answers every task ``n_samples`` times through stages.solve; rollouts carry their rewards.
    The sampling seeds depend on (seed, step) and the task list only, not on the member."""
    ctx = _context(engine, executor, step, seed, n_samples, temperature, max_new_tokens, response_prefill)
    jobs = solve(ctx, [SolveJob(t, t.type, member, None) for t in tasks])
    return reward([], jobs, "adversarial")[1]


@dataclass(frozen=True)
class Score:
    """Held-out figures of one arm: rates and the mean student reward over all answers. ``accuracy`` is the solve
    rate among well-formed answers (correct / (correct + wrong)): a gain there is not a formatting gain."""
    solve_rate: float
    format_error: float
    reward: float
    n: int
    accuracy: float = 0.0

    def to_json(self) -> dict[str, float]:
        return {"solve_rate": self.solve_rate, "format_error": self.format_error, "accuracy": self.accuracy,
                "reward": self.reward, "n": self.n}


def score(jobs: Sequence[SolveJob]) -> Score:
    rolls = [r for j in jobs for r in j.rollouts]
    n = max(len(rolls), 1)
    correct, bad = sum(r.status == "correct" for r in rolls), sum(r.status == "format_error" for r in rolls)
    return Score(correct / n, bad / n, sum(r.reward for r in rolls) / n, len(rolls),
                 correct / max(len(rolls) - bad, 1))


def evaluate(engine: Engine, executor: Executor, member: Member, tasks: Sequence[Task], cfg: StudentLoopConfig,
             salt: int = 0) -> Score:
    """Held-out score; ``salt`` varies the sampling seeds (same salt, same seeds for every arm)."""
    return score(answer(engine, executor, member, tasks, step=-1 - salt, seed=cfg.seed, n_samples=cfg.eval_samples,
                        temperature=cfg.eval_temperature, max_new_tokens=cfg.max_new_tokens,
                        response_prefill=cfg.response_prefill))


REWARD_TRANSFORMS = ("shuffle", "flip")


def transform_rewards(rolls: Sequence[Rollout], how: str, rng: random.Random) -> list[Rollout]:
    """The rollouts with their rewards changed before TRR++ sees them. ``shuffle``: permuted within each TRR++ group
    (member, task type, role), so the update has the same advantages in number and size but none tied to what was
    answered (the shuffled-reward control). ``flip``: negated, which flips the sign of every TRR++ advantage
    ((-r - mean(-r)) / std = -adv): learning deliberately broken, for checking that a test catches it."""
    if how == "flip":
        return [replace(r, reward=-r.reward) for r in rolls]
    if how != "shuffle":
        raise ValueError(f"unknown reward transform {how!r}; known: {', '.join(REWARD_TRANSFORMS)}")
    out = list(rolls)
    for idx in trr_groups(rolls).values():
        rewards = [rolls[i].reward for i in idx]
        rng.shuffle(rewards)
        for i, v in zip(idx, rewards):
            out[i] = replace(rolls[i], reward=v)
    return out


def train_step(engine: Engine, executor: Executor, arms: Sequence[Member], pool: Sequence[Task], step: int,
               cfg: StudentLoopConfig, *, transforms: Mapping[str, str] | None = None,
               sink: Callable[[Member, list[SolveJob]], None] | None = None) -> dict[str, dict[str, float]]:
    """One step for every arm on the same ``tasks_per_step`` tasks (drawn from ``pool``) and seeds; one
    engine.train_step for all arms together. ``transforms``: arm id -> :func:`transform_rewards` mode applied to
    that arm's rewards before the update (the logged reward stays the true one); ``sink`` gets each arm's answered
    jobs. Returns per arm id: train reward, solve rate, format error, loss, grad norm."""
    rng = random.Random(f"{cfg.seed}:{step}:student-tasks")
    tasks = [pool[rng.randrange(len(pool))] for _ in range(cfg.tasks_per_step)]
    batch, out = [], {}
    for m in arms:
        jobs = answer(engine, executor, m, tasks, step=step, seed=cfg.seed, n_samples=cfg.n_samples,
                      temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                      response_prefill=cfg.response_prefill)
        if sink is not None:
            sink(m, jobs)
        rolls = [r for j in jobs for r in j.rollouts]
        how = (transforms or {}).get(m.id)
        batch += transform_rewards(rolls, how, random.Random(f"{cfg.seed}:{step}:{m.id}:{how}")) if how else rolls
        s = score(jobs)
        out[m.id] = {"reward": sum(r.reward for r in rolls) / max(len(rolls), 1), "solve_rate": s.solve_rate,
                     "format_error": s.format_error}
    stats = update(engine, batch)
    for m in arms:
        st = stats.get(m.slot, {})
        out[m.id].update(loss=float(st.get("loss", 0.0)), grad_norm=float(st.get("grad_norm", 0.0)))
    return out


def set_lr(engine: Engine, slot: int, lr: float) -> None:
    """Per-slot learning rate (StackedAdamW keeps one per slot); lr 0 makes the slot a frozen control."""
    engine.optimizer.lr[slot] = float(lr)  # type: ignore[attr-defined]


ARMS = ("trained", "shuffled", "control")  # bench/learns.py's arms; see run_arm


@dataclass
class ArmResult:
    """One arm of one seed of the learning experiment: its held-out score and its per-step training curve."""
    seed: int
    arm: str
    heldout: Score
    curve: list[dict[str, float]]

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "arm": self.arm, "heldout": self.heldout.to_json(), "curve": self.curve}


def run_arm(engine: Engine, executor: Executor, cfg: StudentLoopConfig, arm: str, *, train_tasks: Sequence[Task],
            heldout: Sequence[Task], slot: int = 0, sink: Callable[[str, int, list[SolveJob]], None] | None = None,
            log: Callable[[int, dict[str, float]], None] | None = None, flip: bool = False,
            eval_every: int = 0) -> ArmResult:
    """One arm of the learning experiment (bench/learns.py) in engine slot ``slot``, then its held-out score.

    ``trained``: ``cfg.steps`` steps at ``cfg.lr``. ``shuffled``: the same steps with the rewards permuted within
    each TRR++ group before the advantages (:func:`transform_rewards`), so a gain from updating at all is told apart
    from a gain from the reward. ``control``: no step, which is what lr 0 gives (an AdamW step at lr 0 moves
    nothing, and every adapter starts with B = 0), i.e. the base. Every arm starts from the same adapter draw and
    answers the held-out tasks with the same sampling seeds; the trained and shuffled arms draw the same training
    tasks and sampling seeds per step. ``sink(phase, step, jobs)`` gets every answered job ("train" per step,
    "heldout" at step -1). ``flip`` negates the trained arm's rewards (learning broken on purpose, for checking
    that a test notices). ``eval_every`` > 0 also answers the held-out tasks after every ``eval_every``-th step
    before the last (``sink("heldout_step", k, jobs)`` after k steps), with the final evaluation's sampling seeds, so
    a per-step curve differs between points only by the adapter: an arm's step 0 is the control's answers."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; known: {', '.join(ARMS)}")
    cfg.validate()
    engine.reset_adapter(slot, seed=cfg.seed * 1_000_003)
    engine.reset_optimizer(slot)
    set_lr(engine, slot, 0.0 if arm == "control" else cfg.lr)
    member = Member(arm, slot, "student")
    how = {"shuffled": "shuffle", "trained": "flip" if flip else None}.get(arm)
    curve = []
    for step in range(cfg.steps if arm != "control" else 0):
        row = train_step(engine, executor, [member], train_tasks, step, cfg, transforms={arm: how} if how else None,
                         sink=None if sink is None else (lambda m, jobs, step=step: sink("train", step, jobs)))
        curve.append(row[arm])
        if log is not None:
            log(step, row[arm])
        if eval_every > 0 and (step + 1) % eval_every == 0 and step + 1 < cfg.steps and sink is not None:
            sink("heldout_step", step + 1, answer(engine, executor, member, heldout, step=-1, seed=cfg.seed,
                                                  n_samples=cfg.eval_samples, temperature=cfg.eval_temperature,
                                                  max_new_tokens=cfg.max_new_tokens,
                                                  response_prefill=cfg.response_prefill))
    jobs = answer(engine, executor, member, heldout, step=-1, seed=cfg.seed, n_samples=cfg.eval_samples,
                  temperature=cfg.eval_temperature, max_new_tokens=cfg.max_new_tokens,
                  response_prefill=cfg.response_prefill)
    if sink is not None:
        sink("heldout", -1, jobs)
    return ArmResult(cfg.seed, arm, score(jobs), curve)
