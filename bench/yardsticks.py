"""Trivial yardsticks of every probe family and held-out set a figure in docs/RESULTS.md or the README rests on:
what always answering the shown list's first, last, largest or smallest element, the set's most common answer, or
the call's argument copied back scores, each answer checked as the real answers are (lorapop/train/yardsticks.py).

    PYTHONPATH=. .venv/bin/python bench/yardsticks.py [--gsm8k]

Sets: the capability probe of ``selection`` (cpu_selection, the dynamics second design and the retention
experiment: 90 tasks) and of ``expression`` (cpu_dynamics: 90 tasks); bench/learns.py's held-out set of each seed
(96 tasks each); with ``--gsm8k``, the shipped GSM8K (1319 problems, judged by lorapop eval's math checker).
MBPP+ and the other code benchmarks have none: their answer is a program, and no fixed answer passes their tests.
For bench/learns.py's seeds, the three kinds of yardstick (lorapop/train/yardsticks.py's ``three_kinds``): each rule
fixed in advance, the rule chosen on the other seeds, and the best rule of each seed picked in hindsight (a ceiling).
The last line is one JSON object: per set, each strategy's score.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gsm8k", action="store_true",
                    help="also GSM8K's 1319 problems (one math check per strategy and problem)")
    ap.add_argument("--learns-seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args(argv)

    from learns import SETTING, heldout_yardsticks

    from lorapop.eval.harness import make_executor
    from lorapop.train.yardsticks import describe, math_yardsticks, probe_yardsticks

    t0 = time.perf_counter()
    out: dict = {}
    executor = make_executor()
    try:
        for style in ("selection", "expression"):
            ys = probe_yardsticks(style, 30, executor, by_level=True)
            print(describe(ys, f"of the {style} probe"))
            for lv, st in ys["by_level"].items():
                print(f"  level {lv}: " + ", ".join(f"{k} {v['score']:.3f}" for k, v in st.items()))
            out[f"probe_{style}"] = {k: v["score"] for k, v in ys["strategies"].items()}
        learns = heldout_yardsticks(args.learns_seeds, SETTING, executor)
        for seed, ys in learns["per_seed"].items():
            print(f"bench/learns.py seed {seed}: " + describe(ys))
            out[f"learns_seed{seed}"] = {k: v["score"] for k, v in ys["strategies"].items()}
        print("bench/learns.py, mean over seeds: " + ", ".join(f"{k} {v:.3f}" for k, v in learns["mean"].items())
              + f"; each seed's best strategy, mean {learns['best_per_seed_mean']:.3f}")
        k = learns["three_kinds"]
        print("bench/learns.py, the three kinds of yardstick: each rule fixed in advance, mean over seeds: "
              + ", ".join(f"{r} {v:.3f}" for r, v in k["fixed"].items())
              + f"; the rule fixed in advance chosen on the other seeds: {k['chosen_on_other_seeds']:.3f}"
              + f"; the best rule of each seed picked in hindsight (a ceiling): {k['hindsight_best']:.3f}")
        out["learns_mean"] = learns["mean"]
        out["learns_best_per_seed_mean"] = learns["best_per_seed_mean"]
        out["learns_fixed_in_advance"] = k["fixed"]
        out["learns_chosen_on_other_seeds"] = k["chosen_on_other_seeds"]
        out["learns_hindsight_best"] = k["hindsight_best"]
    finally:
        executor.close()
    if args.gsm8k:
        from lorapop.eval.data import load_benchmark

        problems, _ = load_benchmark("gsm8k")
        ys = math_yardsticks([p.task for p in problems], [p.gold for p in problems])
        print(describe(ys, "of GSM8K"))
        out["gsm8k"] = {k: v["score"] for k, v in ys["strategies"].items()}
        out["gsm8k_correct"] = {k: v["correct"] for k, v in ys["strategies"].items()}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
