"""Benchmarks and ``lorapop eval``. Heavy modules (torch, the engine, the sandbox) load lazily.

Public API: :class:`~lorapop.eval.runner.EvalConfig`, :func:`~lorapop.eval.runner.run_eval`,
:func:`~lorapop.eval.runner.cli_main` (``lorapop eval``), :func:`~lorapop.eval.runs.find_checkpoint`,
:func:`~lorapop.eval.runs.load_members`, :func:`~lorapop.eval.data.load_benchmark`, ``BENCHMARKS``.
"""

from lorapop.eval.data import BENCHMARKS, BenchmarkError, load_benchmark
from lorapop.eval.runner import (EvalConfig, add_arguments, build_parser, cli_main, format_table, run, run_eval,
                                 run_from_args)
from lorapop.eval.runs import RunDirError, find_checkpoint, load_members

__all__ = ["BENCHMARKS", "BenchmarkError", "EvalConfig", "RunDirError", "add_arguments", "build_parser", "cli_main",
           "run", "find_checkpoint", "format_table", "load_benchmark", "load_members", "run_eval", "run_from_args"]
