"""RL sanity experiment (issue 15, item 1): does a student adapter trained through the project's own update path
beat an lr-0 control on held-out tasks?

    PYTHONPATH=. .venv/bin/python bench/learns.py [--seeds 0 1 2] [--experiments solve format] [--threads 2]
        [--solve-steps 8 --solve-lr 1e-3 --solve-tokens 16] [--format-steps 6 --format-temperature 1.0] ...

Per seed and experiment, one engine slot is trained, another is held at lr 0 (same tasks, same sampling seeds), both
on easy code_o tasks (lorapop/tasks/easy.py) through lorapop/train/student.py (stages.solve -> stages.reward ->
stages.update = TRR++ + engine.train_step). The two experiments are the issue's two things a base can be rewarded
for, each in the setting where the base gets that reward some of the time:

- ``solve``: replies prefilled with the ```output fence (selfplay.response_prefill), temperature 0.3, 16 tokens;
  held-out: easy tasks never trained on, scored by solve rate (the base solves ~15-25% of them).
- ``format``: prefilled too, temperature 1.0, 24 tokens; held-out: the 8 shortest AZR seed code_o tasks, scored
  by the format-error rate (a reply that never closes its block with one literal; the base fails so ~50% of the
  time at 1.0). Without the prefill the base (student prompt without an example block) never opened the
  ```output block at all in 4 steps x 12 answers, so every group tied and there was nothing to learn from.

Curves: per step and arm, the training reward, format error and solve rate of that step's answers.

The last line printed is one JSON object: ``solve_rate_before``, ``solve_rate_after``, ``control_after`` (solve
experiment) and ``format_error_before``, ``format_error_after``, ``control_format_error_after`` (format
experiment), means over seeds; per-seed lists; ``margin`` (trained - control solve rate, mean) and ``margin_sd`` (its
sample standard deviation over seeds), ``format_margin``/``format_margin_sd`` likewise (control - trained);
``steps`` (per experiment), ``seconds``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# experiment -> its setting (see the docstring); each key is a --<experiment>-<key> flag
EXPERIMENTS = {
    "solve": {"steps": 8, "lr": 1e-3, "tokens": 16, "temperature": 0.3, "prefill": True, "tasks_per_step": 8,
              "n_samples": 4, "eval_samples": 2},
    "format": {"steps": 6, "lr": 1e-3, "tokens": 24, "temperature": 1.0, "prefill": True, "tasks_per_step": 8,
               "n_samples": 4, "eval_samples": 2},
}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--experiments", nargs="+", choices=list(EXPERIMENTS), default=list(EXPERIMENTS))
    for name, setting in EXPERIMENTS.items():
        for key, default in setting.items():
            flag = f"--{name}-{key.replace('_', '-')}"
            if isinstance(default, bool):
                ap.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
            else:
                ap.add_argument(flag, type=type(default), default=default)
    ap.add_argument("--n-train", type=int, default=64, help="distinct easy training tasks")
    ap.add_argument("--heldout-easy", type=int, default=24)
    ap.add_argument("--heldout-seed", type=int, default=8)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (on a CPU shared with other jobs, 1 can "
                                                             "be several times faster than 2)")
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
    heldout = {"solve": ("easy", held), "format": ("seed", heldout_seed_tasks(args.heldout_seed))}
    results: dict[str, list] = {e: [] for e in args.experiments}

    def log(step, row):
        cells = "  ".join(f"{arm}: reward {v['reward']:+.3f} format_error {v['format_error']:.3f} "
                          f"solve {v['solve_rate']:.3f}" for arm, v in row.items())
        print(f"step {step + 1:3d}  {cells}", flush=True)

    def setting(exp: str, key: str):
        return getattr(args, f"{exp}_{key}")

    try:
        for seed in args.seeds:
            for exp in args.experiments:
                cfg = StudentLoopConfig(steps=setting(exp, "steps"), tasks_per_step=setting(exp, "tasks_per_step"),
                                        n_samples=setting(exp, "n_samples"), lr=setting(exp, "lr"),
                                        max_new_tokens=setting(exp, "tokens"),
                                        eval_samples=setting(exp, "eval_samples"), seed=seed,
                                        response_prefill=setting(exp, "prefill"),
                                        temperature=setting(exp, "temperature"),
                                        eval_temperature=setting(exp, "temperature"))
                key, tasks = heldout[exp]
                print(f"seed {seed}, experiment {exp}", flush=True)
                r = sanity_experiment(engine, executor, cfg, train_tasks=train, heldout={key: tasks}, log=log)
                results[exp].append(r)
                b, t, c = r.before[key], r.trained[key], r.control[key]
                print(f"seed {seed} {exp}: held-out {key} solve {b.solve_rate:.3f} -> trained {t.solve_rate:.3f} / "
                      f"control {c.solve_rate:.3f}; format error {b.format_error:.3f} -> trained "
                      f"{t.format_error:.3f} / control {c.format_error:.3f}", flush=True)
    finally:
        executor.close()
    seconds = time.perf_counter() - t0

    def per(exp: str, arm: str, attr: str) -> list[float]:
        key = heldout[exp][0]
        return [round(getattr(getattr(r, arm)[key], attr), 4) for r in results.get(exp, [])]

    def mean(xs):
        return statistics.mean(xs) if xs else None

    def sd(xs):
        return statistics.stdev(xs) if len(xs) > 1 else 0.0

    margins = [t - c for t, c in zip(per("solve", "trained", "solve_rate"), per("solve", "control", "solve_rate"))]
    fmargins = [c - t for t, c in zip(per("format", "trained", "format_error"),
                                      per("format", "control", "format_error"))]
    out = {
        "solve_rate_before": mean(per("solve", "before", "solve_rate")),
        "solve_rate_after": mean(per("solve", "trained", "solve_rate")),
        "control_after": mean(per("solve", "control", "solve_rate")),
        "format_error_before": mean(per("format", "before", "format_error")),
        "format_error_after": mean(per("format", "trained", "format_error")),
        "control_format_error_after": mean(per("format", "control", "format_error")),
        "margin": mean(margins), "margin_sd": sd(margins),
        "format_margin": mean(fmargins), "format_margin_sd": sd(fmargins),
        "solve_rate_before_per_seed": per("solve", "before", "solve_rate"),
        "solve_rate_after_per_seed": per("solve", "trained", "solve_rate"),
        "control_after_per_seed": per("solve", "control", "solve_rate"),
        "format_error_after_per_seed": per("format", "trained", "format_error"),
        "control_format_error_after_per_seed": per("format", "control", "format_error"),
        "seeds": args.seeds, "steps": {e: setting(e, "steps") for e in args.experiments},
        "seconds": round(seconds, 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
