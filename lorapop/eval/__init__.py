"""Benchmarks and what ``lorapop eval`` runs on them: data, prompts, the sandboxed code judge, pass@k, run_eval.
May import engine, executor, tasks, rundir, config; never the commands or the CLI (lorapop/commands/eval.py parses
the flags). Heavy modules (torch, the engine, the sandbox) load lazily.
"""

from lorapop.eval.data import BENCHMARKS, BenchmarkError, load_benchmark
from lorapop.eval.runner import EvalConfig, format_table, run_eval
from lorapop.eval.runs import RunDirError, find_checkpoint, load_members

__all__ = ["BENCHMARKS", "BenchmarkError", "EvalConfig", "RunDirError", "find_checkpoint", "format_table",
           "load_benchmark", "load_members", "run_eval"]
