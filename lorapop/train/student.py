"""A small student-training loop through the project's own update path, for the RL sanity experiment
(bench/learns.py, tests/test_learns.py) and the retention protocol (``lorapop retention``).

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lorapop.configlib import doc
from lorapop.rundir import Member
from lorapop.tasks.base import Task
from lorapop.train.stages import SolveJob, StepContext, reward, solve, update

if TYPE_CHECKING:
    from lorapop.engine.base import Engine
    from lorapop.executor.sandbox import Executor


@dataclass
class StudentLoopConfig:
    steps: int = doc(8, "update steps per arm")
    tasks_per_step: int = doc(8, "training tasks answered per step (drawn with the step's seed)")
    n_samples: int = doc(4, "answers per training task; all enter the TRR++-normalised update")
    lr: float = doc(1e-3, "AdamW learning rate of a trained arm. A sanity run may use far more than the paper's "
                           "~1e-6: it has a handful of steps and a 135M base, and must show movement, not a schedule")
    max_new_tokens: int = doc(96, "answer length cap (training and evaluation)")
    temperature: float = doc(0.7, "sampling temperature of training answers. For the 135M base with response_prefill: "
                                  "0.3 solves most easy tasks (22%; bench/learns.py 'solve'), 1.0 leaves about half "
                                  "the replies unclosed (its 'format' experiment)")
    eval_temperature: float = doc(0.7, "sampling temperature of held-out evaluation answers")
    eval_samples: int = doc(2, "answers per held-out task")
    seed: int = doc(0, "seed of task draws and sampling; arms share it, so they see the same tasks and seeds")
    response_prefill: bool = doc(False, "start every answer with its task type's opening block (selfplay."
                                        "response_prefill): the base then only has to write the value and close "
                                        "the block")

    def validate(self) -> None:
        for name in ("steps", "tasks_per_step", "n_samples", "max_new_tokens", "eval_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.steps and self.lr < 0:
            raise ValueError(f"lr: must be >= 0, got {self.lr}")
        if self.temperature <= 0 or self.eval_temperature <= 0:
            raise ValueError("temperature and eval_temperature must be > 0")


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
    """Held-out figures of one arm: rates and the mean student reward over all answers."""
    solve_rate: float
    format_error: float
    reward: float
    n: int

    def to_json(self) -> dict[str, float]:
        return {"solve_rate": self.solve_rate, "format_error": self.format_error, "reward": self.reward, "n": self.n}


def score(jobs: Sequence[SolveJob]) -> Score:
    rolls = [r for j in jobs for r in j.rollouts]
    n = max(len(rolls), 1)
    return Score(sum(r.status == "correct" for r in rolls) / n, sum(r.status == "format_error" for r in rolls) / n,
                 sum(r.reward for r in rolls) / n, len(rolls))


def evaluate(engine: Engine, executor: Executor, member: Member, tasks: Sequence[Task], cfg: StudentLoopConfig,
             salt: int = 0) -> Score:
    """Held-out score; ``salt`` varies the sampling seeds (same salt, same seeds for every arm)."""
    return score(answer(engine, executor, member, tasks, step=-1 - salt, seed=cfg.seed, n_samples=cfg.eval_samples,
                        temperature=cfg.eval_temperature, max_new_tokens=cfg.max_new_tokens,
                        response_prefill=cfg.response_prefill))


def train_step(engine: Engine, executor: Executor, arms: Sequence[Member], pool: Sequence[Task], step: int,
               cfg: StudentLoopConfig) -> dict[str, dict[str, float]]:
    """One step for every arm on the same ``tasks_per_step`` tasks (drawn from ``pool``) and seeds; one
    engine.train_step for all arms together. Returns per arm id: train reward, solve rate, format error, loss,
    grad norm."""
    rng = random.Random(f"{cfg.seed}:{step}:student-tasks")
    tasks = [pool[rng.randrange(len(pool))] for _ in range(cfg.tasks_per_step)]
    batch, out = [], {}
    for m in arms:
        jobs = answer(engine, executor, m, tasks, step=step, seed=cfg.seed, n_samples=cfg.n_samples,
                      temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                      response_prefill=cfg.response_prefill)
        rolls = [r for j in jobs for r in j.rollouts]
        batch += rolls
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


@dataclass
class SanityResult:
    """One seed of the sanity experiment: held-out scores before (the base: every adapter starts with B = 0) and
    after, for the trained arm and the lr-0 control, plus the per-step training curve of each arm."""
    seed: int
    before: dict[str, Score]
    trained: dict[str, Score]
    control: dict[str, Score]
    curve: list[dict[str, dict[str, float]]]

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "curve": self.curve,
                **{k: {name: s.to_json() for name, s in v.items()}
                   for k, v in (("before", self.before), ("trained", self.trained), ("control", self.control))}}


def heldout_seed_tasks(n: int) -> list[Task]:
    """The ``n`` shortest code_o tasks of the AZR seed file shipped in lorapop/data (short prompts keep CPU
    evaluation cheap; training never sees seed tasks, so all of them are held out)."""
    from lorapop.data import PACKAGE_DATA_DIR
    from lorapop.tasks.buffer import read_seed_file

    tasks = read_seed_file(PACKAGE_DATA_DIR / "seeds" / "azr_7b_coder_seed_io.jsonl", "code_o")
    return sorted(tasks, key=lambda t: (len(t.program) + len(t.inputs[0]), t.program))[:n]


def sanity_experiment(engine: Engine, executor: Executor, cfg: StudentLoopConfig, *, train_tasks: Sequence[Task],
                      heldout: dict[str, Sequence[Task]], trained_slot: int = 0, control_slot: int = 1,
                      log=None) -> SanityResult:
    """Trains ``trained_slot`` at ``cfg.lr`` and ``control_slot`` at lr 0 on the same tasks and seeds for
    ``cfg.steps`` steps; scores both on every held-out set (name -> tasks) before and after."""
    cfg.validate()
    for slot, i in ((trained_slot, 0), (control_slot, 1)):
        engine.reset_adapter(slot, seed=cfg.seed * 1_000_003 + i)
        engine.reset_optimizer(slot)
    set_lr(engine, trained_slot, cfg.lr)
    set_lr(engine, control_slot, 0.0)
    arm = Member("trained", trained_slot, "student")
    ctl = Member("control", control_slot, "student")
    before = {k: evaluate(engine, executor, arm, ts, cfg) for k, ts in heldout.items()}
    curve = []
    for step in range(cfg.steps):
        row = train_step(engine, executor, [arm, ctl], train_tasks, step, cfg)
        curve.append(row)
        if log is not None:
            log(step, row)
    trained = {k: evaluate(engine, executor, arm, ts, cfg) for k, ts in heldout.items()}
    control = {k: evaluate(engine, executor, ctl, ts, cfg) for k, ts in heldout.items()}
    return SanityResult(cfg.seed, before, trained, control, curve)
