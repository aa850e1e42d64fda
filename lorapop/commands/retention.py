"""`lorapop retention RUN_DIR`: how fast each PBT operator's child recovers its parent's solve rate (Appendix J): the
flags, then the study of lorapop/retention/ (planned in study.py, its arms run in arms.py, its rule in verdict.py)
and its lines printed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lorapop.retention.arms import run_retention
from lorapop.retention.study import RetentionConfig
from lorapop.retention.verdict import CLONE, CONTINUATION, arm_outcome, headline, registered_verdict, verdict_lines


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run directory with at least one checkpoint")
    p.add_argument("--operators", nargs="+", default=[], help="operators to test (default: all registered)")
    p.add_argument("--member", help="parent member id (default: the best student by TrueSkill expose)")
    p.add_argument("--second-parent", help="crossovers' second parent: a PEFT directory, RUN_DIR:best or "
                                           "RUN_DIR:<id> (default: the second-best member of the parent's role)")
    p.add_argument("--steps", type=int, default=20, help="training steps per arm (the paper's window: about 20)")
    p.add_argument("--answers", type=int, default=4, help="answers per probe task in every scoring")
    p.add_argument("--eval-every", type=int, default=1,
                   help="score after every this many steps (and after steps 0, 1, 2 and the last)")
    p.add_argument("--floor-replicates", type=int, default=4,
                   help="extra scorings of the parent at step 0 for the noise floor (beside continuation and clone)")
    p.add_argument("--stronger", type=float, default=0.0,
                   help="add arms with the operator's strength knob times this (0: none)")
    p.add_argument("--stronger-ops", nargs="+", default=["auto"],
                   help="operators that get a stronger arm, or auto: those within the noise floor at step 0")
    p.add_argument("--train-per-level", type=int, default=30, help="training tasks per probe level")
    p.add_argument("--probe-per-level", type=int, default=None,
                   help="probe tasks per level (default: the run's run.probe_per_level); fewer for a quick check")
    p.add_argument("--tasks-per-step", type=int, default=8, help="training tasks per step")
    p.add_argument("--n-samples", type=int, default=4, help="answers per training task")
    p.add_argument("--lr", type=float, default=None, help="learning rate of every arm (default: the run's engine.lr)")
    p.add_argument("--group-size", type=int, default=4, help="arms trained together (engine slots)")
    p.add_argument("--min-parent-steps", type=int, default=20,
                   help="refuse a checkpoint fewer self-play steps in than this (the parent must be trained in "
                        "self-play)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="directory of retention.json (default: the run directory); rerun to resume")
    p.add_argument("--backend", choices=("torch", "vllm"), default="torch",
                   help="what generates the arms' answers (engine.backend; vllm needs scripts/setup.sh --vllm)")


def run(args: argparse.Namespace) -> int:
    from lorapop.configlib import ConfigError
    from lorapop.records import RunDirError

    cfg = RetentionConfig(operators=list(args.operators), member=args.member, second_parent=args.second_parent,
                          steps=args.steps, answers=args.answers, floor_replicates=args.floor_replicates,
                          eval_every=args.eval_every,
                          stronger=args.stronger, stronger_ops=list(args.stronger_ops),
                          n_train_per_level=args.train_per_level, probe_per_level=args.probe_per_level,
                          group_size=args.group_size,
                          min_parent_steps=args.min_parent_steps, backend=args.backend, out=args.out)
    over = {"tasks_per_step": args.tasks_per_step, "n_samples": args.n_samples, "seed": args.seed}
    if args.lr is not None:
        over["lr"] = args.lr
    try:
        out = run_retention(args.run_dir, cfg, over)
    except (ValueError, RunDirError, ConfigError) as e:
        print(f"lorapop retention: {e}", file=sys.stderr)
        return 2
    nf = out["noise_floor"] or {}
    print(f"arms trained with the {out['training']}; scored on {out['probe']['n_tasks']} probe tasks x "
          f"{out['probe']['answers']} answers (resolution {out['probe']['resolution']:.4f}); noise floor (step-0 "
          f"spread of {nf.get('n')} replicates) {nf.get('spread') or 0:.3f}, std {nf.get('std') or 0:.3f}")
    for name, arm in out["arms"].items():
        # the continuation is judged like every arm, against the clone (the other replicate of the same weights)
        o = arm_outcome(out, name) if name != CONTINUATION or CLONE in out["arms"] else None
        rec = o["recovered_step"] if o else None
        status = ("reference" if o is None else "no loss" if not o["lost"] else
                  "step " + str(rec) if rec is not None else "not recovered")
        print(f"{name:30s} after operator {arm['heldout'][0]:.3f}  final {arm['heldout'][-1]:.3f}  "
              f"drop {(o or arm)['drop']:+.3f}  final gap {(o or arm)['final_gap']:+.3f}  recovered: {status}"
              + (f"  (against {o['against']})" if o and o["against"] != CONTINUATION else ""))
    if CLONE in out["arms"]:  # the registered rule on this one parent, the clone and continuation under it too
        v = registered_verdict([{**out, "_name": Path(out["path"]).parent.name}])
        print("\n".join(verdict_lines(v)))
        print(f"headline (this parent): {headline(v)}")
    print(json.dumps({"retention": out["path"], "seconds": out["seconds"]}))
    return 0
