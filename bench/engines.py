"""The two generation backends, torch and vLLM, measured in one run (issue 37).

    .venv/bin/python bench/engines.py [--rows 32] [--new-tokens 64] [--adapters 4] [--reps 3] [--demo-steps 2]
    .venv/bin/python bench/engines.py --model DIR --adapters 8 --rows 256 --new-tokens 128 --demo-steps 0   # a GPU

Prints, in one run:
  torch_gen_tok_s, vllm_gen_tok_s   greedy tokens per second of --rows rows over --adapters adapters (mixed in one
                                    batch), every row exactly --new-tokens long (EOS held back), median of --reps
                                    alternating reps after one warm-up call each; the two backends share one
                                    process and one set of adapter weights (the vLLM engine's TorchEngine)
  vllm_over_torch_gen               vllm_gen_tok_s / torch_gen_tok_s
  vllm_start_s                      vLLM engine start (the model load and KV cache), once per run
  demo_<backend>_step_s, demo_<backend>_time/<stage>
                                    one `lorapop train cpu_demo` step's wall time and stage times per backend, the
                                    mean over steps 2..--demo-steps (step 1 carries warm-ups: the first sync of every
                                    adapter, vLLM's first batches), each backend in its own process, one after the other
  sync_s_per_step                   engine/sync_s of the vllm demo run, mean over its steps
The last line is one JSON object with those keys.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from multilora import PROMPTS, _timed  # bench/multilora.py: the same prompts and timer

def generation(args) -> dict:
    from lorapop.engine import EngineConfig, SamplingParams
    from lorapop.engine.factory import make_engine

    cfg = EngineConfig(backend="vllm", dtype=args.dtype, device=args.device, rank=args.rank,
                       lora_alpha=2 * args.rank, gen_batch_size=args.rows, vllm_enforce_eager=args.enforce_eager,
                       vllm_gpu_memory_utilization=args.gpu_memory_utilization)
    t0 = time.perf_counter()
    eng = make_engine(args.model, args.adapters, cfg, seed=0)
    build_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)
    for i in range(args.adapters):  # B != 0: every adapter's LoRA path does real work on both backends
        w = eng.get_adapter(i)
        eng.set_adapter(i, {n: (a, torch.randn(b.shape, generator=g) * 0.02) for n, (a, b) in w.items()})
    prompts = [eng.chat_prompt(PROMPTS[k % len(PROMPTS)]) for k in range(args.rows)]
    ids = [k % args.adapters for k in range(args.rows)]
    p = SamplingParams(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, greedy=True)
    backends = {"torch": lambda: eng.trainer.generate(prompts, ids, p), "vllm": lambda: eng.generate(prompts, ids, p)}
    for fn in backends.values():
        fn()  # warm-up: vLLM's first sync and batches, the torch engine's KV cache
    times: dict[str, list[float]] = {b: [] for b in backends}
    for _ in range(args.reps):
        for b, fn in backends.items():
            dt, out = _timed(fn)
            assert all(len(c.token_ids) == args.new_tokens for c in out), "a row ended early: tok/s would be biased"
            times[b].append(dt)
    tokens = args.rows * args.new_tokens
    res = {f"{b}_gen_tok_s": round(tokens / statistics.median(t), 2) for b, t in times.items()}
    res["vllm_over_torch_gen"] = round(res["vllm_gen_tok_s"] / res["torch_gen_tok_s"], 3)
    res["vllm_start_s"] = round(eng.start_s, 2)
    res["engine_build_s"] = round(build_s, 2)
    for b, t in times.items():
        print(f"{b:6s} {args.rows} rows x {args.new_tokens} tokens over {args.adapters} adapters: "
              f"{res[f'{b}_gen_tok_s']:.1f} tok/s (runs {', '.join(f'{x:.2f}' for x in t)} s)", flush=True)
    eng.close()
    return res


def demo(args, backend: str, out_dir: Path) -> dict:
    """``lorapop train cpu_demo`` for --demo-steps steps on ``backend``; its per-step stage times."""
    name = f"bench-{backend}"
    cmd = [sys.executable, "-m", "lorapop.cli", "train", "cpu_demo", f"--engine.backend={backend}",
           f"--run.steps={args.demo_steps}", f"--run.output_dir={out_dir}", f"--run.name={name}",
           "--run.progress=plain", "--engine.vllm_enforce_eager=true"]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    wall = time.perf_counter() - t0
    lines = [json.loads(x) for x in (out_dir / name / "metrics.jsonl").read_text().splitlines()]
    warm = lines[1:] or lines
    out = {f"demo_{backend}_run_s": round(wall, 1),
           f"demo_{backend}_step_s": round(statistics.mean(m["time"] - p["time"] for p, m in zip(lines, lines[1:]))
                                           if len(lines) > 1 else float("nan"), 2)}
    stages = sorted({k for m in warm for k in m if k.startswith("time/")})
    for k in stages:
        out[f"demo_{backend}_{k}"] = round(statistics.mean(m.get(k, 0.0) for m in warm), 2)
    if backend == "vllm":
        out["sync_s_per_step"] = round(statistics.mean(m.get("engine/sync_s", 0.0) for m in lines), 3)
        out["adapters_synced_per_step"] = round(statistics.mean(m.get("engine/adapters_synced", 0) for m in lines), 2)
    print(f"cpu_demo on {backend}: {wall:.0f} s for {args.demo_steps} steps; " +
          ", ".join(f"{k.split('_', 2)[2]} {v}" for k, v in out.items() if "/" in k), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                    help="vLLM without CUDA graphs / compile (default: on for CPU, off on CUDA)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--demo-steps", type=int, default=2, help="cpu_demo steps per backend (0: skip)")
    args = ap.parse_args()
    if args.enforce_eager is None:
        args.enforce_eager = not torch.cuda.is_available()
    res = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "threads": torch.get_num_threads(), "rows": args.rows, "new_tokens": args.new_tokens,
           "adapters": args.adapters}
    res.update(generation(args))
    if args.demo_steps > 0:
        with tempfile.TemporaryDirectory() as d:
            for backend in ("torch", "vllm"):
                res.update(demo(args, backend, Path(d)))
        res["vllm_over_torch_demo_step"] = round(res["demo_vllm_step_s"] / res["demo_torch_step_s"], 3)
    print(json.dumps(res))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
