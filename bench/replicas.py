"""Data-parallel engine replicas on Ray (engine.replicas): a demo-shaped engine step on 2 replicas x 1 thread vs
1 replica x 2 threads, and what Ray itself costs per step.

    .venv/bin/python bench/replicas.py [--tasks-per-type 2] [--propose-tokens 64] [--solve-tokens 48]
                                       [--prompt-words 150] [--steps 1]

A "demo-shaped step" is the engine work of one step of the shipped cpu_demo config (2T+2S, three task types):
every teacher proposes ``tasks_per_type`` tasks per type (one generate call), every student answers each of them
``n_solve`` = 2 times (one generate call; the two answers share their prompt, so they stay on one replica), and
every member trains on ``tasks_per_type`` samples per type (one train_step). Rows are forced to their full length
(min_new_tokens) so every configuration does the same token work. The defaults are a quarter of the demo's token
work (cpu_demo: --tasks-per-type 4 --propose-tokens 128 --solve-tokens 96) so the bench stays short on 2 cores.

Configurations, each after one untimed warm-up step, the fastest of ``--steps`` timed steps:
* ``one_engine``: TorchEngine in this process, all cores' threads (the replicas: 1 path, no Ray);
* ``ray_1x``: ReplicatedEngine with 1 replica holding all cores' threads (same compute, through Ray);
* ``ray_2x``: ReplicatedEngine with 2 replicas x cores/2 threads (rows split, gradients all-reduced).

Figures: ``replicas2_speedup`` = one_engine / ray_2x step time (> 1: two single-thread replicas beat one
two-thread engine); ``ray_overhead_s_per_step`` = ray_1x - one_engine step time (Ray's cost per step: dispatch,
serialising rows and completions, the tokenizer-free driver); ``ray_call_overhead_s`` = the fastest round trip of a
1-row, 1-token generate through Ray minus the same call in process. Timings on a shared machine are noisy.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lorapop.engine.base import EngineConfig, SamplingParams, TrainSample  # noqa: E402

N_TEACHERS, N_STUDENTS, N_TYPES, N_SOLVE = 2, 2, 3, 2


def _text(rng: random.Random, words: int) -> str:
    vocab = ["def", "f(x):", "return", "x", "+", "1", "input", "output", "the", "program", "list", "sorted", "for",
             "in", "range", "if", "else", "while", "print", "value", "string", "count", "task", "answer"]
    return " ".join(rng.choice(vocab) for _ in range(words))


def demo_step(engine, args, rng: random.Random) -> None:
    """One demo-shaped step of engine work (see the module docstring)."""
    t = args.tasks_per_type
    propose = SamplingParams(max_new_tokens=args.propose_tokens, min_new_tokens=args.propose_tokens, temperature=1.0)
    solve = SamplingParams(max_new_tokens=args.solve_tokens, min_new_tokens=args.solve_tokens, temperature=1.0)
    # teacher prompts carry a reference program, student prompts a task: longer and shorter, as in the demo
    t_prompts = [engine.chat_prompt(_text(rng, args.prompt_words)) for _ in range(N_TEACHERS * N_TYPES * t)]
    t_ids = [k // (N_TYPES * t) for k in range(len(t_prompts))]
    props = engine.generate(t_prompts, t_ids, propose, seeds=[rng.getrandbits(31) for _ in t_prompts])
    tasks = [engine.chat_prompt(_text(rng, args.prompt_words // 2)) for _ in range(N_STUDENTS * N_TYPES * t)]
    s_prompts = [p for p in tasks for _ in range(N_SOLVE)]
    s_ids = [N_TEACHERS + k // (N_TYPES * t * N_SOLVE) for k in range(len(s_prompts))]
    answers = engine.generate(s_prompts, s_ids, solve, seeds=[rng.getrandbits(31) for _ in s_prompts])
    samples = [TrainSample(p, c.token_ids, a, rng.gauss(0, 1)) for p, c, a in zip(t_prompts, props, t_ids)]
    samples += [TrainSample(p, c.token_ids, a, rng.gauss(0, 1))
                for p, c, a in list(zip(s_prompts, answers, s_ids))[::N_SOLVE]]
    engine.train_step(samples)


def timed(engine, args, label: str) -> float:
    rng = random.Random(0)
    demo_step(engine, args, rng)  # warm-up: first calls allocate caches, build decoders
    best = float("inf")
    for _ in range(args.steps):
        t0 = time.perf_counter()
        demo_step(engine, args, rng)
        best = min(best, time.perf_counter() - t0)
    print(f"{label}: {best:.2f} s per step", file=sys.stderr, flush=True)
    return best


def call_overhead(engine) -> float:
    p = [engine.chat_prompt("hi")]
    params = SamplingParams(max_new_tokens=1, greedy=True)
    engine.generate(p, [0], params)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        engine.generate(p, [0], params)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks-per-type", type=int, default=2)
    ap.add_argument("--propose-tokens", type=int, default=64)
    ap.add_argument("--solve-tokens", type=int, default=48)
    ap.add_argument("--prompt-words", type=int, default=150, help="words of a teacher prompt (students: half)")
    ap.add_argument("--steps", type=int, default=1, help="timed steps per configuration (the fastest counts)")
    args = ap.parse_args()

    import ray
    import torch

    from lorapop.engine.replicas import ReplicatedEngine
    from lorapop.engine.torch_engine import TorchEngine

    cores = os.cpu_count() or 1
    n_members = N_TEACHERS + N_STUDENTS
    # The demo's engine settings, but 4-row micro-batches with activation checkpointing: the demo's 8 rows took
    # ~7 GB per replica in the update and Ray's OOM killer stopped a replica on a shared 23 GB machine.
    base = dict(device="cpu", dtype="float32", gen_batch_size=64, train_micro_batch_size=4, logprob_chunk_size=128,
                gradient_checkpointing=True)
    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False, object_store_memory=512 * 2**20)
    try:
        # Ray's first: closing a replica frees its memory, an in-process engine's stays with this process
        with ReplicatedEngine("embedded", n_members, EngineConfig(**base, replicas=2)) as r2:
            t_r2 = timed(r2, args, f"ray_2x (2 replicas x {max(1, cores // 2)} threads)")
        with ReplicatedEngine("embedded", n_members, EngineConfig(**base, replicas=1)) as r1:
            t_r1, c_r1 = timed(r1, args, f"ray_1x (1 replica x {cores} threads)"), call_overhead(r1)
        torch.set_num_threads(cores)
        one = TorchEngine.from_config("embedded", n_members, EngineConfig(**base))
        t_one, c_one = timed(one, args, f"one_engine (1 x {cores} threads, in process)"), call_overhead(one)
        one.close()
    finally:
        ray.shutdown()
    out = {
        "replicas2_speedup": round(t_one / t_r2, 3),
        "ray_overhead_s_per_step": round(t_r1 - t_one, 3),
        "ray_call_overhead_s": round(c_r1 - c_one, 4),
        "one_engine_s": round(t_one, 2), "ray_1x_s": round(t_r1, 2), "ray_2x_s": round(t_r2, 2),
        "cores": cores, "tasks_per_type": args.tasks_per_type, "propose_tokens": args.propose_tokens,
        "solve_tokens": args.solve_tokens,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
