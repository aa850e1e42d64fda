"""`lorapop retention RUN_DIR`: how fast does a PBT child get back to where its parent would have been (the paper's
Appendix J protocol)?

From a parent trained in self-play (a member of the run's latest checkpoint, at least ``min_parent_steps`` = 20
self-play steps in by default; by default the student with the best TrueSkill expose ``mu - 3 sigma``) one child is
made per operator through :func:`lorapop.evolve.operators.make_child` (crossovers take the second-best member of the
same role as the other parent), plus a ``continuation`` arm: the parent itself, trained on. Every arm is trained
for ``steps`` steps on the same tasks with the same seeds. Recorded per arm: the verifier (training) reward of each
step's answers, and a held-out mini-eval (solve rate and reward on easy tasks never trained on) right after the
operator (step 0) and after every step. A child is compared at every step with the continuation arm *at the same
step* (not with the parent's value before the operator: the parent keeps learning, and the question is whether the
child keeps up): it has *recovered* at the first step whose held-out solve rate is within ``threshold`` of the
continuation's, i.e. >= threshold x continuation (95%); never within the budget is "not recovered" (``null``).
``gap`` is continuation minus child per step (``drop`` = the gap right after the operator, ``final_gap`` the last).

The mini-eval's resolution is one task in ``n_heldout x eval_samples`` answers (1/12 at the defaults): a gap
smaller than that cannot be seen, and one task's difference is already more than 5% of a rate below 0.9.

The arms are trained with the student loop of :mod:`lorapop.train.student` (answers to easy code_o tasks, TRR++,
``lr``), not in self-play: every arm then sees the same tasks with the same seeds, so a child's gap to the
continuation is the operator's doing, not a different draw of teachers and tasks. The output and ``retention.json``
say so.

Output: ``retention.json`` in the run directory, which ``lorapop report`` renders (one curve per operator, the
continuation drawn as the reference).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lorapop.configlib import doc
from lorapop.rundir import RETENTION

CONTINUATION = "continuation"


@dataclass
class RetentionConfig:
    operators: list[str] = doc([], "operators to test (default: every registered one)")
    member: str | None = doc(None, "parent member id (default: the student with the best TrueSkill expose)")
    steps: int = doc(4, "training steps per arm after the operator")
    threshold: float = doc(0.95, "recovered = held-out solve rate >= threshold * the continuation arm's at the "
                                 "same step")
    n_train: int = doc(64, "distinct easy training tasks")
    n_heldout: int = doc(12, "easy held-out tasks of the mini-eval (its resolution is 1 / (n_heldout x the loop's "
                             "eval_samples))")
    group_size: int = doc(4, "arms trained together in one engine (slots = group_size)")
    min_parent_steps: int = doc(20, "refuse a checkpoint fewer self-play steps in than this: the protocol starts "
                                    "from a parent trained in self-play")
    backend: str = doc("torch", "what generates the arms' answers: torch or vllm (engine.backend)")

    def validate(self) -> None:
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold: must be in (0, 1], got {self.threshold}")
        if self.steps < 1 or self.n_heldout < 1 or self.min_parent_steps < 0:
            raise ValueError("steps and heldout must be >= 1, min-parent-steps >= 0")

TRAINING = ("student loop (lorapop/train/student.py: answers to easy code_o tasks, TRR++), not self-play: every arm "
            "sees the same tasks and seeds, so a child's gap to the continuation is the operator's")


def rank_members(run_dir: Path, ckpt: Path, role: str) -> list[tuple[Any, float]]:
    """Members of ``role`` in the checkpoint (an ``agent`` counts as a student), best expose first."""
    from lorapop.rundir import POPULATION, RunDir, RunDirError, read_json

    rd = RunDir(run_dir)
    try:  # the checkpoint's own ratings; else population.json's (written every step); else the prior's
        ratings = {k: float(mu) - 3 * float(sigma)
                   for k, (mu, sigma) in (rd.read_trainer_state(ckpt).get("ratings") or {}).items()}
    except (RunDirError, TypeError, ValueError):
        pop = read_json(rd.file(POPULATION), []) or {}
        ratings = {str(m.get("id")): float(m["expose"]) for m in pop.get("members") or []
                   if isinstance(m, dict) and isinstance(m.get("expose"), (int, float))}
    members = [m for m in rd.checkpoint_members(ckpt) if m.role == role or (role == "student" and m.role == "agent")]

    def expose(mid: str) -> float:
        return ratings.get(mid, 0.0)  # the TrueSkill prior's expose: 25 - 3 * 25/3

    return sorted(((m, expose(m.id)) for m in members), key=lambda x: (-x[1], x[0].id))


def recovered_step(curve: list[float], reference: list[float], threshold: float) -> int | None:
    """First step (0 = right after the operator) whose value is >= threshold * the reference's (the continuation
    arm's) value at the same step, else None."""
    for step, (v, ref) in enumerate(zip(curve, reference)):
        if v >= threshold * ref:
            return step
    return None


def parent_steps(rd: Any, ckpt: Path) -> int:
    """Self-play steps behind the checkpoint (its trainer state's ``step``, else its directory's number)."""
    from lorapop.rundir import RunDirError, checkpoint_step

    try:
        return int(rd.read_trainer_state(ckpt).get("step"))
    except (RunDirError, TypeError, ValueError):
        return checkpoint_step(ckpt)


def run_retention(run_dir: str | Path, cfg: RetentionConfig, loop=None, *, log=print) -> dict[str, Any]:
    import torch

    from lorapop.engine.base import EngineConfig
    from lorapop.engine.factory import make_engine
    from lorapop.eval.harness import make_executor
    from lorapop.evolve.operators import OPERATORS, make_child
    from lorapop.rundir import Member, RunDir, write_json_atomic
    from lorapop.tasks.easy import split_tasks
    from lorapop.train.student import StudentLoopConfig, evaluate, set_lr, train_step

    t0 = time.perf_counter()
    cfg.validate()
    loop = loop or StudentLoopConfig(steps=cfg.steps)
    loop.steps = cfg.steps
    loop.validate()
    ops = list(cfg.operators or OPERATORS)
    unknown = [o for o in ops if o not in OPERATORS]
    if unknown:
        raise ValueError(f"unknown operator(s) {unknown}; known: {', '.join(OPERATORS)}")
    rd = RunDir(run_dir)
    ckpt = rd.find_checkpoint()
    trained = parent_steps(rd, ckpt)
    if trained < cfg.min_parent_steps:
        raise ValueError(f"{ckpt}: the parent has {trained} self-play step(s); the protocol (Appendix J) starts from "
                         f"a parent trained in self-play, at least {cfg.min_parent_steps} steps: train the run longer "
                         f"(lorapop train --resume {rd.path} --run.steps={cfg.min_parent_steps}) or lower "
                         "--min-parent-steps")
    ranked = rank_members(rd.path, ckpt, "student")
    if cfg.member is not None:
        chosen = [x for x in ranked if x[0].id == cfg.member]
        if not chosen:
            raise ValueError(f"member {cfg.member!r} is not a student of {ckpt} ({[m.id for m, _ in ranked]})")
        role = chosen[0][0].role
        ranked = chosen + [x for x in ranked if x[0].id != cfg.member and x[0].role == role]
    if not ranked:
        raise ValueError(f"{ckpt}: no student or agent member to take as the parent")
    (parent, p_fit), second = ranked[0], (ranked[1] if len(ranked) > 1 else None)
    crossovers = [o for o in ops if OPERATORS[o].kind == "crossover"]
    if crossovers and second is None:
        log(f"retention: only one {parent.role} in {ckpt.name}; skipping crossovers {crossovers}")
        ops = [o for o in ops if o not in crossovers]
    arms = [CONTINUATION] + ops
    size = max(2, min(cfg.group_size, len(arms)))
    ecfg = EngineConfig(rank=parent.rank, lora_alpha=parent.lora_alpha, target_modules=parent.target_modules,
                        device="cpu" if not torch.cuda.is_available() else "auto", backend=cfg.backend)
    engine = make_engine(rd.model_name(), size, ecfg, seed=loop.seed)
    executor = make_executor()
    train, held = split_tasks(cfg.n_train, cfg.n_heldout, seed=loop.seed)
    n_answers = len(held) * loop.eval_samples
    out: dict[str, Any] = {"run": str(rd.path), "checkpoint": ckpt.name, "parent": parent.id,
                           "parent_selfplay_steps": trained,
                           "second_parent": second[0].id if second else None, "threshold": cfg.threshold,
                           "reference": CONTINUATION, "training": TRAINING,
                           "mini_eval": {"n_tasks": len(held), "samples_per_task": loop.eval_samples,
                                         "resolution": 1.0 / n_answers},
                           "steps": cfg.steps, "loop": {k: getattr(loop, k) for k in loop.__dataclass_fields__},
                           "arms": {}}
    log(f"retention: arms trained with the {TRAINING}")
    log(f"retention: mini-eval {len(held)} held-out tasks x {loop.eval_samples} answer(s): resolution "
        f"1/{n_answers} = {1.0 / n_answers:.3f}; recovered = held-out solve rate >= {cfg.threshold} x the "
        f"continuation's at the same step")
    try:
        engine.load_adapter(0, parent.adapter_dir)
        w_parent = engine.get_adapter(0)
        w_second = None
        if second is not None:
            engine.load_adapter(1, second[0].adapter_dir)
            w_second = engine.get_adapter(1)
        pre = evaluate(engine, executor, Member(parent.id, 0, "student"), held, loop)
        out["parent_heldout"] = pre.to_json()
        log(f"retention: parent {parent.id} ({trained} self-play steps, expose {p_fit:.2f}) held-out solve rate "
            f"{pre.solve_rate:.3f}")
        gen = torch.Generator().manual_seed(loop.seed)
        for g in range(0, len(arms), size):
            group = arms[g:g + size]
            members = []
            for slot, name in enumerate(group):
                record: dict[str, Any] = {"operator": CONTINUATION}
                if name == CONTINUATION:
                    child = w_parent
                else:
                    op = OPERATORS[name]
                    parents = [w_parent, w_second] if op.kind == "crossover" else [w_parent]
                    fitness = [p_fit, second[1]] if op.kind == "crossover" else [p_fit]
                    child, record = make_child(name, parents, generator=gen, scaling=engine.scaling,
                                               fitness=fitness if op.needs_fitness else None)
                engine.set_adapter(slot, child)
                engine.reset_optimizer(slot)  # a PBT child starts with fresh optimizer state
                set_lr(engine, slot, loop.lr)
                members.append(Member(name, slot, "student"))
                out["arms"][name] = {"record": record, "train_reward": [], "heldout": [],
                                     "heldout_reward": []}
            for m in members:
                s = evaluate(engine, executor, m, held, loop)
                out["arms"][m.id]["heldout"].append(s.solve_rate)
                out["arms"][m.id]["heldout_reward"].append(s.reward)
            for step in range(cfg.steps):
                row = train_step(engine, executor, members, train, step, loop)
                for m in members:
                    s = evaluate(engine, executor, m, held, loop)
                    arm = out["arms"][m.id]
                    arm["train_reward"].append(row[m.id]["reward"])
                    arm["heldout"].append(s.solve_rate)
                    arm["heldout_reward"].append(s.reward)
                log(f"retention: step {step + 1}/{cfg.steps} " + "  ".join(
                    f"{m.id} {out['arms'][m.id]['heldout'][-1]:.3f}" for m in members))
    finally:
        executor.close()
        engine.close()
    ref = out["arms"][CONTINUATION]["heldout"]
    for name, arm in out["arms"].items():
        arm["gap"] = [c - v for c, v in zip(ref, arm["heldout"])]
        arm["drop"], arm["final_gap"] = arm["gap"][0], arm["gap"][-1]
        arm["recovered_step"] = None if name == CONTINUATION else recovered_step(arm["heldout"], ref, cfg.threshold)
    if not any(ref):
        out["note"] = ("the continuation arm solved no held-out task at any step: every child 'recovers' at step 0 "
                       "and the comparison says nothing; use a stronger parent, more --heldout tasks or another "
                       "--temperature")
        log(f"retention: note: {out['note']}")
    out["seconds"] = round(time.perf_counter() - t0, 1)
    write_json_atomic(rd.path / RETENTION, out)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run directory with at least one checkpoint")
    p.add_argument("--operators", nargs="+", default=[], help="operators to test (default: all registered)")
    p.add_argument("--member", help="parent member id (default: the best student by TrueSkill expose)")
    p.add_argument("--steps", type=int, default=4, help="training steps per arm")
    p.add_argument("--tasks-per-step", type=int, default=4, help="training tasks per step")
    p.add_argument("--n-samples", type=int, default=3, help="answers per training task")
    p.add_argument("--heldout", type=int, default=12, help="held-out easy tasks of the mini-eval")
    # The defaults are bench/learns.py's "solve" experiment, where the embedded base solves ~15-25% of held-out easy
    # tasks and training moves that rate (docs/RESULTS.md, "Evidence that it learns"): a mini-eval that reads 0 for
    # every arm measures nothing.
    p.add_argument("--max-new-tokens", type=int, default=16, help="answer length cap")
    p.add_argument("--temperature", type=float, default=0.3, help="sampling temperature (training and mini-eval)")
    p.add_argument("--prefill", action=argparse.BooleanOptionalAction, default=True,
                   help="start answers inside their ```output block (selfplay.response_prefill)")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate of every arm")
    p.add_argument("--group-size", type=int, default=4, help="arms trained together (engine slots)")
    p.add_argument("--threshold", type=float, default=0.95,
                   help="recovered = held-out solve rate >= threshold x the continuation arm's at the same step")
    p.add_argument("--min-parent-steps", type=int, default=20,
                   help="refuse a checkpoint fewer self-play steps in than this (the parent must be trained in "
                        "self-play)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=("torch", "vllm"), default="torch",
                   help="what generates the arms' answers (engine.backend; vllm needs scripts/setup.sh --vllm)")


def run(args: argparse.Namespace) -> int:
    from lorapop.rundir import RunDirError
    from lorapop.train.student import StudentLoopConfig

    cfg = RetentionConfig(operators=list(args.operators), member=args.member, steps=args.steps,
                          n_heldout=args.heldout, group_size=args.group_size, threshold=args.threshold,
                          min_parent_steps=args.min_parent_steps, backend=args.backend)
    loop = StudentLoopConfig(steps=args.steps, tasks_per_step=args.tasks_per_step, n_samples=args.n_samples,
                             lr=args.lr, max_new_tokens=args.max_new_tokens, eval_samples=1, seed=args.seed,
                             temperature=args.temperature, eval_temperature=args.temperature,
                             response_prefill=args.prefill)
    try:
        out = run_retention(args.run_dir, cfg, loop)
    except (ValueError, RunDirError) as e:
        print(f"lorapop retention: {e}", file=sys.stderr)
        return 2
    print(f"arms trained with the {out['training']}; mini-eval resolution {out['mini_eval']['resolution']:.3f} "
          f"({out['mini_eval']['n_tasks']} tasks x {out['mini_eval']['samples_per_task']}); recovered = within "
          f"{out['threshold']} x the continuation at the same step")
    for name, arm in out["arms"].items():
        rec = arm["recovered_step"]
        status = "reference" if name == CONTINUATION else "step " + str(rec) if rec is not None else "not recovered"
        print(f"{name:26s} after operator {arm['heldout'][0]:.3f}  final {arm['heldout'][-1]:.3f}  "
              f"drop {arm['drop']:+.3f}  final gap {arm['final_gap']:+.3f}  recovered: {status}")
    print(json.dumps({"retention": str(Path(out["run"]) / RETENTION), "seconds": out["seconds"]}))
    return 0
