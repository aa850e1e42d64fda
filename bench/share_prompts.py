"""The update with shared prompts (engine.share_prompts) against one row per sample, on the embedded model.

    .venv/bin/python bench/share_prompts.py [--tasks 8] [--samples 4] [--prompt 84] [--reply 12] [--reps 3]

The student loop's batch (bench/learns.py, `lorapop retention`): ``--tasks`` prompts answered ``--samples`` times
each by one adapter, advantages of both signs, the default micro-batch size (4). Token ids are seeded random draws
(the weights and ids do not change the cost; the lengths do): prompts of ``--prompt`` tokens, replies of
``--reply``, the sizes of the embedded model's easy code_o tasks. The two settings alternate, one untimed warm-up
each, and the median of ``--reps`` timed updates is reported with the positions each computes. Last line: JSON
with ``packed_over_rows`` (update seconds, packed / a row per sample) and ``positions_ratio``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lorapop.engine import EngineConfig, TorchEngine, TrainSample  # noqa: E402
from lorapop.engine.scoring import layout_rows, train_micro_batches  # noqa: E402
from lorapop.model import load_base_model  # noqa: E402


def batch(tasks: int, samples: int, prompt: int, reply: int) -> list[TrainSample]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(tasks):
        p = torch.randint(100, 20000, (prompt,), generator=g).tolist()
        for k in range(samples):
            out.append(TrainSample(p, torch.randint(100, 20000, (reply,), generator=g).tolist(), 0,
                                   1.0 if k % 2 else -1.0))
    return out


def positions(eng: TorchEngine, samples: list[TrainSample], share: bool) -> int:
    total = 0
    for mb in train_micro_batches(samples, eng.cfg.train_micro_batch_size, share_prompts=share):
        lay = layout_rows([s.prompt_ids for s in mb], [s.completion_ids for s in mb], [0] * len(mb), eng.pad_id,
                          share_prompts=share)
        total += lay.input_ids.numel()
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=84)
    ap.add_argument("--reply", type=int, default=12)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    eng = TorchEngine(*load_base_model("embedded"), 1, EngineConfig(rank=8, lora_alpha=16, device="cpu"))
    samples = batch(args.tasks, args.samples, args.prompt, args.reply)
    times: dict[bool, list[float]] = {False: [], True: []}
    for rep in range(args.reps + 1):
        for share in (False, True):
            eng.cfg.share_prompts = share
            t0 = time.perf_counter()
            eng.train_step(samples)
            if rep:  # the first round warms both up
                times[share].append(time.perf_counter() - t0)
    eng.close()
    med = {s: statistics.median(v) for s, v in times.items()}
    pos = {s: positions(eng, samples, s) for s in (False, True)}
    for s, name in ((False, "a row per sample"), (True, "packed")):
        print(f"{name:>16}: {med[s]:.2f} s per update (median of {args.reps}), {pos[s]} positions")
    print(json.dumps({"packed_over_rows": round(med[True] / med[False], 3),
                      "positions_ratio": round(pos[True] / pos[False], 3), "rows_s": round(med[False], 3),
                      "packed_s": round(med[True], 3), "tasks": args.tasks, "samples": args.samples,
                      "prompt": args.prompt, "reply": args.reply, "threads": args.threads}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
