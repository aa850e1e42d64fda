"""Benchmarks and what ``lorapop eval`` runs on them: data, prompts, the sandboxed code judge, pass@k, run_eval.
May import engine, executor, tasks, records, config; never the commands or the CLI (lorapop/commands/eval.py parses
the flags). Heavy modules (torch, the engine, the sandbox) load lazily.
"""

from lorapop.eval.data import BENCHMARKS, BenchmarkError, load_benchmark
from lorapop.eval.runner import EvalConfig, format_table, run_eval

__all__ = ["BENCHMARKS", "BenchmarkError", "EvalConfig", "format_table", "load_benchmark", "run_eval"]
