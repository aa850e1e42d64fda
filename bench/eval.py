"""Evaluation benchmark: is evaluating 8 members + the base one batched multi-LoRA pass, at base-model speed?

Default mode (MBPP+, first 32 problems, greedy, max_new_tokens capped at 48 by default to keep the run short on a
2-core CPU; pass --max-new-tokens 128 or more on a faster machine):

* mixed pass: 32 problems x (base + 8 members with random non-zero LoRA B) = 288 rows in one engine call, chunked by
  the engine's gen_batch_size (--batch-size, default 32), then judged in the sandbox;
* base alone: the 32 problems with adapter id -1 at the same batch size;
* sequential: the nine models evaluated one after another (base alone + each member alone).

Prints ``mixed_throughput_ratio`` = generated tokens/s of the mixed pass / tokens/s of the base alone (generation
time only; target >= 0.9) and ``speedup`` = wall clock of the nine sequential evaluations / the mixed one (generation
plus judging). The last line is one JSON object with both keys and the raw figures.

Other modes:
  --canonical            judge all 378 MBPP+ canonical solutions in the sandbox (harness sanity; prints the count)
  --measure-base B[,B]   greedy pass@1 of the bare base model on full benchmarks (default templates: evalplus for
                         code, azr for math; --prompt), in chunks, progress to stdout; --results FILE.jsonl
                         keeps one line per problem and resumes a stopped run (--offset N skips problems)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lorapop.data import data_dir  # noqa: E402

DATA = data_dir()


def _engine(n_adapters: int, batch_size: int, seed: int = 0):
    import torch

    from lorapop.engine import EngineConfig, TorchEngine

    eng = TorchEngine.from_config("embedded", n_adapters, EngineConfig(gen_batch_size=batch_size, dtype="auto"))
    g = torch.Generator().manual_seed(seed)
    for i in range(n_adapters):  # random non-zero B so every member really differs from the base and each other
        w = eng.get_adapter(i)
        eng.set_adapter(i, {n: (a, torch.randn(b.shape, generator=g) * 0.01) for n, (a, b) in w.items()})
    return eng


def speed(args) -> dict:
    from lorapop.eval.data import BENCHMARKS, load_benchmark
    from lorapop.eval.harness import CodeJudge, evaluate_benchmark, make_executor

    spec = BENCHMARKS["mbppplus"]
    probs, _ = load_benchmark("mbppplus", data_dir=args.data_dir, limit=args.n_problems)
    eng = _engine(8, args.batch_size)
    ex = make_executor(2)
    judge = CodeJudge(ex)
    for p in probs:  # expected outputs once, outside every timed section
        judge.expected(p)
    mnt = args.max_new_tokens
    evaluate_benchmark(eng, spec, probs[:2], [-1, 0], 4, judge)  # warm-up

    def timed(ids):
        t = time.perf_counter()
        r = evaluate_benchmark(eng, spec, probs, ids, mnt, judge)
        return r, time.perf_counter() - t

    mixed, mixed_wall = timed([-1] + list(range(8)))
    seq = [timed([a]) for a in [-1] + list(range(8))]
    base = seq[0][0]
    mixed_tps = sum(mixed.gen_tokens.values()) / mixed.gen_s
    base_tps = sum(base.gen_tokens.values()) / base.gen_s
    seq_wall = sum(w for _, w in seq)
    # the mixed pass must give every model the same answers as evaluating it alone (greedy)
    agree = sum(mixed.passed[a] == r.passed[a] for (r, _), a in zip(seq, [-1] + list(range(8))))
    ex.close()
    return {"mixed_throughput_ratio": round(mixed_tps / base_tps, 4), "speedup": round(seq_wall / mixed_wall, 3),
            "mixed_tokens_per_s": round(mixed_tps, 2), "base_tokens_per_s": round(base_tps, 2),
            "mixed_wall_s": round(mixed_wall, 2), "sequential_wall_s": round(seq_wall, 2),
            "mixed_gen_tokens": sum(mixed.gen_tokens.values()), "base_gen_tokens": sum(base.gen_tokens.values()),
            "models_with_same_pass_list_mixed_vs_alone": f"{agree}/9", "n_problems": len(probs),
            "max_new_tokens": mnt, "batch_size": args.batch_size}


def canonical(args) -> dict:
    from lorapop.eval.data import load_benchmark
    from lorapop.eval.harness import CodeJudge, make_executor

    probs, _ = load_benchmark("mbppplus", data_dir=args.data_dir)
    ex = make_executor(2)
    t = time.perf_counter()
    v = CodeJudge(ex).judge(probs, [p.gold["canonical_solution"] for p in probs])
    ex.close()
    failed = [p.id for p, x in zip(probs, v) if not x["pass"]]
    return {"canonical_pass": len(probs) - len(failed), "n": len(probs), "failed": failed,
            "seconds": round(time.perf_counter() - t, 1)}


def _done_rows(path: Path | None, bench: str, setting: dict) -> dict[str, dict]:
    """Rows already in a ``--results`` file for ``bench``, by problem id. A row written under other settings
    (template, token cap, dtype) is an error, not something to mix into the figure."""
    if path is None or not path.exists():
        return {}
    rows = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill mid-write: its problem is simply measured again
            print(f"{path}:{n}: unreadable line skipped", file=sys.stderr)
            continue
        if r.get("benchmark") != bench:
            continue
        other = {k: r.get(k) for k in setting if r.get(k) != setting[k]}
        if other:
            raise SystemExit(f"{path}:{n}: row for {bench} {r.get('id')} was measured with {other}, this run uses "
                             f"{ {k: setting[k] for k in other} }; use another --results file")
        rows[r["id"]] = r
    return rows


def measure_base(args) -> dict:
    from lorapop.engine import EngineConfig, TorchEngine
    from lorapop.eval.data import BENCHMARKS, load_benchmark
    from lorapop.eval.harness import CodeJudge, evaluate_benchmark, make_executor
    from lorapop.eval.prompts import template_for

    eng = TorchEngine.from_config("embedded", 1, EngineConfig(gen_batch_size=args.batch_size, dtype="auto"))
    results = Path(args.results) if args.results else None
    if results is not None and results.exists() and results.stat().st_size:
        with results.open("rb+") as f:  # a kill mid-write left a partial line: new rows start on a fresh one
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                f.write(b"\n")
    out = {}
    for b in args.measure_base.split(","):
        spec = BENCHMARKS[b]
        probs, warns = load_benchmark(b, data_dir=args.data_dir, limit=args.limit)
        probs = probs[args.offset:]  # resume a measurement that was stopped: add up the progress lines
        template = template_for(args.prompt, spec.family)
        setting = {"template": template, "max_new_tokens": args.max_new_tokens, "dtype": eng.cfg.dtype}
        done = _done_rows(results, b, setting)  # --results: a killed measurement resumes where it stopped
        todo = [p for p in probs if p.id not in done]
        ex = make_executor(2) if spec.family == "code" and todo else None
        judge = CodeJudge(ex) if ex else None
        prior = [done[p.id] for p in probs if p.id in done]
        passed, toks = [int(r["pass"]) for r in prior], sum(int(r["gen_tokens"]) for r in prior)
        t0 = time.perf_counter()
        for i in range(0, len(todo), args.chunk):
            chunk = todo[i:i + args.chunk]
            r = evaluate_benchmark(eng, spec, chunk, [-1], args.max_new_tokens, judge, keep_text=results is not None,
                                   template=template)
            passed += r.passed[-1]
            toks += r.gen_tokens[-1]
            if results is not None:
                # one line per problem, written after its chunk is judged: a kill loses at most the chunk under way
                with results.open("a") as f:
                    for p, ok, e in zip(chunk, r.passed[-1], r.extra[-1]):
                        f.write(json.dumps({"benchmark": b, "id": p.id, "pass": ok, **setting, **e}) + "\n")
            print(json.dumps({"benchmark": b, "offset": args.offset, "done": len(passed), "of": len(probs), "passed": sum(passed),
                              "pass@1_so_far": round(sum(passed) / len(passed), 4), "gen_tokens": toks,
                              "elapsed_s": round(time.perf_counter() - t0, 1)}), flush=True)
        if ex:
            ex.close()
        out[b] = {"pass@1": sum(passed) / max(1, len(passed)), "passed": sum(passed), "n": len(passed),
                  "resumed": len(prior), "offset": args.offset, **setting, "warnings": warns}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=str(DATA))
    p.add_argument("--n-problems", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--canonical", action="store_true")
    p.add_argument("--measure-base", default=None, metavar="BENCH[,BENCH]")
    p.add_argument("--limit", type=int, default=None, help="--measure-base: first N problems only")
    p.add_argument("--offset", type=int, default=0, help="--measure-base: skip the first N problems (resume)")
    p.add_argument("--chunk", type=int, default=64, help="--measure-base: problems per progress line")
    p.add_argument("--results", default=None, metavar="JSONL",
                   help="--measure-base: append one line per judged problem (its verdict and completion) and skip "
                        "the problems already there, so a stopped measurement resumes exactly")
    p.add_argument("--prompt", default="auto", help="--measure-base: prompt template (auto, evalplus, azr, plain)")
    args = p.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.canonical:
        res = canonical(args)
    elif args.measure_base:
        res = measure_base(args)
    else:
        res = speed(args)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
