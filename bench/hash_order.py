"""How often a program whose output is a hash order gets a valid task that survives its check.

    python bench/hash_order.py [--pairs 200] [--words 2] [--seed 7]

Each trial is a code_o proposal ``def f(a): return list(set(a))`` on a fresh random list of ``--words`` strings,
validated by the trainer's own ``validate_many`` and, when valid, checked with the right prediction (the stored
output) by ``check_many``, on one default executor (its hash seeds drawn at random where this tree draws them).
Accepted: valid and not voided by the check. A student cannot compute a hash order, so every accepted task of this
kind is one no student can be expected to solve. Last line: one JSON object (``trials``, ``valid``, ``accepted``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lorapop.executor import ExecutorConfig, SandboxExecutor  # noqa: E402
from lorapop.tasks import TASK_TYPES, Task  # noqa: E402


def hash_order_trials(ex, trials: int, words: int, seed: int) -> tuple[int, int]:
    """(valid, accepted) of ``trials`` such proposals on ``ex`` (tests/test_channels.py runs it too)."""
    code_o, rng = TASK_TYPES["code_o"], random.Random(seed)
    valid = accepted = 0
    for _ in range(trials):
        strings = [f"w{rng.randrange(10 ** 6)}" for _ in range(words)]
        prop = f"```python\ndef f(a):\n    return list(set(a))\n```\n```input\n{strings!r}\n```"
        task = code_o.validate_many([code_o.parse_proposal(prop)], ex)[0]
        if isinstance(task, Task):
            valid += 1
            got = code_o.check_many(task, [code_o.parse_answer(f"```output\n{task.outputs[0]}\n```")], ex)[0]
            accepted += got.status != "void"
    return valid, accepted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=200, help="trials")
    ap.add_argument("--words", type=int, default=2, help="strings in each set")
    ap.add_argument("--seed", type=int, default=7, help="seed of the strings drawn")
    args = ap.parse_args()
    with SandboxExecutor(ExecutorConfig()) as ex:
        valid, accepted = hash_order_trials(ex, args.pairs, args.words, args.seed)
        seeds = list(getattr(ex, "hashseeds", ()))
    print(f"{args.pairs} sets of {args.words} strings: {valid} valid, {accepted} accepted (hash seeds {seeds})")
    print(json.dumps({"trials": args.pairs, "words": args.words, "valid": valid, "accepted": accepted}))


if __name__ == "__main__":
    main()
