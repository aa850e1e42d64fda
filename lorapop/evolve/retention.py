"""`lorapop retention RUN_DIR`: how fast does a PBT child get back to its parent (the paper's Appendix J protocol as
far as it is described)?

From a trained parent (a member of the run's latest checkpoint; by default the student with the best TrueSkill
expose ``mu - 3 sigma``) one child is made per operator through :func:`lorapop.evolve.operators.make_child`
(crossovers take the second-best member of the same role as the other parent), plus a ``continuation`` arm that is
the parent itself. Every arm is then trained for ``steps`` steps with the student loop of
:mod:`lorapop.train.student` on the same easy tasks with the same seeds. Recorded per arm: the verifier (training)
reward of each step's answers, and a held-out mini-eval (solve rate and reward on easy tasks never trained on) right
after the operator (step 0) and after every step. An arm has *recovered* at the first step whose held-out solve
rate is back within ``threshold`` (95%) of the parent's pre-operator solve rate; never within the budget is
"not recovered" (``null`` in the JSON).

Output: ``retention.json`` in the run directory, which ``lorapop report`` renders (one curve per operator).
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
    threshold: float = doc(0.95, "recovered = held-out solve rate >= threshold * the parent's pre-operator rate")
    n_train: int = doc(64, "distinct easy training tasks")
    n_heldout: int = doc(12, "easy held-out tasks of the mini-eval")
    group_size: int = doc(4, "arms trained together in one engine (slots = group_size)")


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


def recovered_step(curve: list[float], target: float, threshold: float) -> int | None:
    """First step (0 = right after the operator) whose value is >= threshold * target, else None."""
    for step, v in enumerate(curve):
        if v >= threshold * target:
            return step
    return None


def run_retention(run_dir: str | Path, cfg: RetentionConfig, loop=None, *, log=print) -> dict[str, Any]:
    import torch

    from lorapop.engine.base import EngineConfig
    from lorapop.engine.torch_engine import TorchEngine
    from lorapop.eval.harness import make_executor
    from lorapop.evolve.operators import OPERATORS, make_child
    from lorapop.rundir import Member, RunDir, write_json_atomic
    from lorapop.tasks.easy import split_tasks
    from lorapop.train.student import StudentLoopConfig, evaluate, set_lr, train_step

    t0 = time.perf_counter()
    loop = loop or StudentLoopConfig(steps=cfg.steps)
    loop.steps = cfg.steps
    loop.validate()
    ops = list(cfg.operators or OPERATORS)
    unknown = [o for o in ops if o not in OPERATORS]
    if unknown:
        raise ValueError(f"unknown operator(s) {unknown}; known: {', '.join(OPERATORS)}")
    rd = RunDir(run_dir)
    ckpt = rd.find_checkpoint()
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
                        device="cpu" if not torch.cuda.is_available() else "auto")
    engine = TorchEngine.from_config(rd.model_name(), size, ecfg, seed=loop.seed)
    executor = make_executor()
    train, held = split_tasks(cfg.n_train, cfg.n_heldout, seed=loop.seed)
    out: dict[str, Any] = {"run": str(rd.path), "checkpoint": ckpt.name, "parent": parent.id,
                           "second_parent": second[0].id if second else None, "threshold": cfg.threshold,
                           "steps": cfg.steps, "loop": {k: getattr(loop, k) for k in loop.__dataclass_fields__},
                           "arms": {}}
    try:
        engine.load_adapter(0, parent.adapter_dir)
        w_parent = engine.get_adapter(0)
        w_second = None
        if second is not None:
            engine.load_adapter(1, second[0].adapter_dir)
            w_second = engine.get_adapter(1)
        pre = evaluate(engine, executor, Member(parent.id, 0, "student"), held, loop)
        out["parent_heldout"] = pre.to_json()
        log(f"retention: parent {parent.id} (expose {p_fit:.2f}) held-out solve rate {pre.solve_rate:.3f}")
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
    for arm in out["arms"].values():
        arm["recovered_step"] = recovered_step(arm["heldout"], pre.solve_rate, cfg.threshold)
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
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from lorapop.rundir import RunDirError
    from lorapop.train.student import StudentLoopConfig

    cfg = RetentionConfig(operators=list(args.operators), member=args.member, steps=args.steps,
                          n_heldout=args.heldout, group_size=args.group_size)
    loop = StudentLoopConfig(steps=args.steps, tasks_per_step=args.tasks_per_step, n_samples=args.n_samples,
                             lr=args.lr, max_new_tokens=args.max_new_tokens, eval_samples=1, seed=args.seed,
                             temperature=args.temperature, eval_temperature=args.temperature,
                             response_prefill=args.prefill)
    try:
        out = run_retention(args.run_dir, cfg, loop)
    except (ValueError, RunDirError) as e:
        print(f"lorapop retention: {e}", file=sys.stderr)
        return 2
    for name, arm in out["arms"].items():
        rec = arm["recovered_step"]
        print(f"{name:26s} after operator {arm['heldout'][0]:.3f}  final {arm['heldout'][-1]:.3f}  "
              f"recovered: {'step ' + str(rec) if rec is not None else 'not recovered'}")
    print(json.dumps({"retention": str(Path(out["run"]) / RETENTION), "seconds": out["seconds"]}))
    return 0
