"""RL sanity experiment (issue 15, item 1): does a student adapter trained through the project's own update path
beat an lr-0 control on held-out tasks?

    PYTHONPATH=. .venv/bin/python bench/learns.py [--seeds 0 1 2] [--steps 8] [--tasks-per-step 8] [--n-samples 4]
        [--lr 1e-3] [--heldout-easy 16] [--heldout-seed 8] [--max-new-tokens 96]

Per seed: one engine slot is trained at ``--lr``, another at lr 0 (same tasks, same sampling seeds), both on easy
code_o tasks (lorapop/tasks/easy.py) through lorapop/train/student.py (stages.solve -> stages.reward ->
stages.update = TRR++ + engine.train_step). Held-out: easy code_o tasks never trained on (solve rate) and the
shortest AZR seed code_o tasks (format-error rate). Curves: per step and arm, the training reward, format error and
solve rate of that step's answers.

The last line printed is one JSON object: ``solve_rate_before``, ``solve_rate_after``, ``control_after``,
``format_error_before``, ``format_error_after``, ``control_format_error_after`` (means over seeds), per-seed lists,
``margin`` (trained - control solve rate, mean), ``margin_sd`` (its sample standard deviation over seeds),
``steps``, ``seconds``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--tasks-per-step", type=int, default=8)
    ap.add_argument("--n-samples", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--n-train", type=int, default=64, help="distinct easy training tasks")
    ap.add_argument("--heldout-easy", type=int, default=16)
    ap.add_argument("--heldout-seed", type=int, default=8)
    ap.add_argument("--eval-samples", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (on a shared CPU, 1 is several times "
                                                             "faster than 2; see tests/test_eval_cli.py)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)

    from lorapop.engine.base import EngineConfig
    from lorapop.engine.torch_engine import TorchEngine
    from lorapop.eval.harness import make_executor
    from lorapop.tasks.easy import split_tasks
    from lorapop.train.student import StudentLoopConfig, heldout_seed_tasks, sanity_experiment

    t0 = time.perf_counter()
    engine = TorchEngine.from_config("embedded", 2, EngineConfig(device="cpu", rank=args.rank,
                                                                  lora_alpha=2 * args.rank, gen_batch_size=64))
    executor = make_executor()
    train, held = split_tasks(args.n_train, args.heldout_easy, seed=0)
    heldout = {"easy": held, "seed": heldout_seed_tasks(args.heldout_seed)}
    results = []

    def log(step, row):
        cells = "  ".join(f"{arm}: reward {v['reward']:+.3f} format_error {v['format_error']:.3f} "
                          f"solve {v['solve_rate']:.3f}" for arm, v in row.items())
        print(f"step {step + 1:3d}  {cells}", flush=True)

    try:
        for seed in args.seeds:
            cfg = StudentLoopConfig(steps=args.steps, tasks_per_step=args.tasks_per_step, n_samples=args.n_samples,
                                    lr=args.lr, max_new_tokens=args.max_new_tokens, eval_samples=args.eval_samples,
                                    seed=seed)
            print(f"seed {seed}", flush=True)
            r = sanity_experiment(engine, executor, cfg, train_tasks=train, heldout=heldout, log=log)
            results.append(r)
            print(f"seed {seed}: held-out easy solve {r.before['easy'].solve_rate:.3f} -> trained "
                  f"{r.trained['easy'].solve_rate:.3f} / control {r.control['easy'].solve_rate:.3f}; seed-task "
                  f"format error {r.before['seed'].format_error:.3f} -> trained {r.trained['seed'].format_error:.3f}"
                  f" / control {r.control['seed'].format_error:.3f}", flush=True)
    finally:
        executor.close()
    seconds = time.perf_counter() - t0

    def per(arm: str, key: str, attr: str) -> list[float]:
        return [round(getattr(getattr(r, arm)[key], attr), 4) for r in results]

    margins = [t - c for t, c in zip(per("trained", "easy", "solve_rate"), per("control", "easy", "solve_rate"))]
    out = {
        "solve_rate_before": statistics.mean(per("before", "easy", "solve_rate")),
        "solve_rate_after": statistics.mean(per("trained", "easy", "solve_rate")),
        "control_after": statistics.mean(per("control", "easy", "solve_rate")),
        "format_error_before": statistics.mean(per("before", "seed", "format_error")),
        "format_error_after": statistics.mean(per("trained", "seed", "format_error")),
        "control_format_error_after": statistics.mean(per("control", "seed", "format_error")),
        "margin": statistics.mean(margins),
        "margin_sd": statistics.stdev(margins) if len(margins) > 1 else 0.0,
        "solve_rate_after_per_seed": per("trained", "easy", "solve_rate"),
        "control_after_per_seed": per("control", "easy", "solve_rate"),
        "format_error_after_per_seed": per("trained", "seed", "format_error"),
        "seeds": args.seeds, "steps": args.steps, "seconds": round(seconds, 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
