"""The two generation backends, torch and vLLM, measured in one run; on CUDA, the vLLM backend's GPU check.

    .venv/bin/python bench/engines.py [--rows 32] [--new-tokens 64] [--adapters 4] [--reps 3] [--demo-steps 2]
    .venv/bin/python bench/engines.py                  # on a CUDA machine with the official vllm wheel: the GPU check

The GPU check (the default where CUDA is; --gpu-check / --no-gpu-check choose), in under 7 minutes on one 80 GB GPU:
Qwen2.5-Coder-7B's shape (lorapop.plan.SHAPES; random weights: vLLM starts from the config with load_format dummy,
the TorchEngine from the config; nothing downloaded, speed and memory do not depend on the values) under 4T+4S's
engine settings with engine.backend vllm, --rows rows x --new-tokens tokens:
  vllm_mixed_tok_s, vllm_base_tok_s, vllm_mixed_over_base
                                    greedy tok/s over 8 adapters mixed in one batch, and of the base alone
  first_sync_s, sync_s_per_adapter  the first sync of all 8 adapters; then every slot written and synced again
  sleep_s, wake_s, plan_sleep_s     one level-1 sleep and one wake; the plan's estimate for both
  gen_used_gib, plan_generation_gib GPU memory in use (every process, the CUDA context included) in generation,
                                    against `lorapop plan`'s peak in generation for these settings
  vllm_asleep_gib, plan_vllm_graph_gib
                                    what vLLM keeps on the GPU while asleep, against the plan's CUDA-graph pool
  demo_vllm_*, sync_s_per_step, demo_max_memory_allocated_gib, demo_plan_peak_gib
                                    `lorapop train cpu_demo --engine.backend=vllm --engine.device=cuda` for
                                    --demo-steps (3) steps through the real trainer: step and stage times, and the
                                    torch allocator's peak against the plan of that run
  check_s                           the whole check's wall time

Prints, in one run (elsewhere):
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
import gc
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


def demo(args, backend: str, out_dir: Path, extra: tuple[str, ...] | list[str] = ()) -> dict:
    """``lorapop train cpu_demo`` for --demo-steps steps on ``backend``; its per-step stage times."""
    name = f"bench-{backend}"
    cmd = [sys.executable, "-m", "lorapop.cli", "train", "cpu_demo", f"--engine.backend={backend}",
           f"--run.steps={args.demo_steps}", f"--run.output_dir={out_dir}", f"--run.name={name}",
           "--run.progress=plain", f"--engine.vllm_enforce_eager={str(args.enforce_eager).lower()}", *extra]
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


def _gib(b: float) -> float:
    return round(b / 2**30, 2)


def _used() -> int:
    """GPU memory in use on this device by every process (what the plan's fit is about)."""
    free, total = torch.cuda.mem_get_info()
    return total - free


def gpu_check(args) -> dict:
    """The vLLM backend on CUDA at the 7B shape (see the module docstring); then the demo through the trainer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from lorapop import plan as planmod
    from lorapop.config import load_config, resolve_config_path
    from lorapop.engine import SamplingParams, TorchEngine
    from lorapop.engine.vllm_engine import VLLMEngine
    from lorapop.model import prepare_model

    t_check = time.perf_counter()
    total = torch.cuda.get_device_properties(0).total_memory
    new = args.new_tokens
    cfg = load_config(str(resolve_config_path("4T+4S")), [
        "--engine.backend=vllm", "--engine.device=cuda", f"--engine.gen_batch_size={args.rows}",
        f"--engine.vllm_gpu_memory_utilization={args.gpu_memory_utilization}",
        f"--selfplay.propose.max_new_tokens={new}", f"--selfplay.solve.max_new_tokens={new}"])
    ecfg, n = cfg.engine, cfg.population.n_members
    tok = AutoTokenizer.from_pretrained(args.tokenizer or str(prepare_model("embedded")))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    shape = dict(planmod.SHAPES[cfg.model.name])
    mcfg = AutoConfig.for_model(shape.pop("model_type"), **shape, bos_token_id=tok.bos_token_id,
                                eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    mcfg.architectures = ["Qwen2ForCausalLM"]  # the class vLLM builds (from config.json)
    ecfg.dtype = ecfg.dtype if ecfg.dtype != "auto" else "bfloat16"  # what `auto` is on a bf16 GPU
    res: dict = {"device": torch.cuda.get_device_name(), "shape": cfg.model.name, "adapters": n, "rows": args.rows,
                 "new_tokens": new, "vllm_gpu_memory_utilization": ecfg.vllm_gpu_memory_utilization}
    with tempfile.TemporaryDirectory() as d:
        mdir = Path(d) / "model"
        mcfg.save_pretrained(mdir)  # config.json: all vLLM reads under load_format dummy
        tok.save_pretrained(mdir)
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(mcfg, dtype=getattr(torch, ecfg.dtype))
        trainer = TorchEngine(model, tok, n, ecfg, seed=0)
        before_vllm = _used()
        eng = VLLMEngine(trainer, str(mdir), ecfg, llm_kwargs={"load_format": "dummy"})
        res["vllm_start_s"] = round(eng.start_s, 1)
        print(f"vLLM started in {eng.start_s:.0f} s", file=sys.stderr, flush=True)
        g = torch.Generator().manual_seed(0)
        for i in range(n):  # B != 0: every adapter's LoRA path does real work
            w = eng.get_adapter(i)
            eng.set_adapter(i, {k: (a, torch.randn(b.shape, generator=g) * 0.01) for k, (a, b) in w.items()})
        t, _ = _timed(eng.sync)
        res["first_sync_s"] = round(t, 2)
        prompt = eng.chat_prompt(PROMPTS[0])
        full = SamplingParams(max_new_tokens=new, min_new_tokens=new, greedy=True)
        mixed, base = [k % n for k in range(args.rows)], [-1] * args.rows
        eng.generate([prompt] * args.rows, mixed, full)  # warm-up
        for name, ids in (("mixed", mixed), ("base", base)):
            t, out = _timed(lambda ids=ids: eng.generate([prompt] * args.rows, ids, full))
            assert all(len(c.token_ids) == new for c in out), "a row ended early: tok/s would be biased"
            res[f"vllm_{name}_tok_s"] = round(args.rows * new / t, 1)
        res["vllm_mixed_over_base"] = round(res["vllm_mixed_tok_s"] / res["vllm_base_tok_s"], 3)
        res["gen_used_gib"] = _gib(_used())
        for i in range(n):  # every slot written: each is saved and handed to vLLM again
            eng.set_adapter(i, eng.get_adapter(i))
        t, slots = _timed(eng.sync)
        res["sync_s_per_adapter"] = round(t / len(slots), 3)
        torch.cuda.synchronize()
        res["sleep_s"], _ = _timed(eng.sleep)
        res["vllm_asleep_gib"] = _gib(_used() - before_vllm)
        res["wake_s"], _ = _timed(eng.wake)
        res["sleep_s"], res["wake_s"] = round(res["sleep_s"], 2), round(res["wake_s"], 2)
        eng.close()
        del eng, trainer, model
        gc.collect()
        torch.cuda.empty_cache()  # the demo's process gets the whole GPU
    p = planmod.plan(cfg, total / 2**30, len(prompt))
    res.update(plan_generation_gib=_gib(p.generation_bytes), plan_vllm_graph_gib=_gib(p.vllm_graph_bytes),
               plan_sleep_s=round(planmod.vllm_sleep_seconds(p.vllm_sleep_host_bytes), 2))
    print(json.dumps(res), file=sys.stderr, flush=True)  # the 7B half, should the demo fail
    if args.demo_steps > 0:
        with tempfile.TemporaryDirectory() as d:
            res.update(demo(args, "vllm", Path(d), ["--engine.device=cuda"]))
            lines = [json.loads(x) for x in (Path(d) / "bench-vllm" / "metrics.jsonl").read_text().splitlines()]
        res["demo_max_memory_allocated_gib"] = max(m.get("perf/max_memory_allocated_gb", float("nan")) for m in lines)
        demo_cfg = load_config(str(resolve_config_path("cpu_demo")), ["--engine.backend=vllm", "--engine.device=cuda"])
        dp = planmod.plan(demo_cfg, total / 2**30, planmod.default_prompt_tokens(demo_cfg))
        res["demo_plan_peak_gib"] = _gib(max(dp.generation_bytes, dp.train_bytes))
    res["check_s"] = round(time.perf_counter() - t_check, 1)
    return res


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
    ap.add_argument("--gpu-memory-utilization", type=float, default=None,
                    help="vLLM's fraction on CUDA (default: 4T+4S's in the GPU check, else 0.3)")
    ap.add_argument("--demo-steps", type=int, default=None, help="cpu_demo steps per backend (0: skip; default 2, "
                                                                 "3 in the GPU check)")
    ap.add_argument("--gpu-check", action=argparse.BooleanOptionalAction, default=None,
                    help="the vLLM backend's GPU check (default: where CUDA is)")
    ap.add_argument("--tokenizer", default=None, help="GPU check: tokenizer directory (default: the embedded "
                                                      "model's)")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    if args.enforce_eager is None:
        args.enforce_eager = not cuda
    if args.gpu_check if args.gpu_check is not None else cuda:
        if not cuda:
            ap.error("--gpu-check needs CUDA")
        args.demo_steps = 3 if args.demo_steps is None else args.demo_steps
        if args.rows == 32 and args.new_tokens == 64:  # the CPU defaults: the GPU check's are larger
            args.rows, args.new_tokens = 256, 128
        if args.gpu_memory_utilization is None:
            from lorapop.config import load_config, resolve_config_path

            args.gpu_memory_utilization = load_config(str(resolve_config_path("4T+4S")), []).engine.\
                vllm_gpu_memory_utilization
        print(json.dumps(gpu_check(args)))
        return
    args.demo_steps = 2 if args.demo_steps is None else args.demo_steps
    args.gpu_memory_utilization = 0.3 if args.gpu_memory_utilization is None else args.gpu_memory_utilization
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
