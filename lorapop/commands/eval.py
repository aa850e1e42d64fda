"""``lorapop eval RUN_DIR [RUN_DIR ...]``: greedy pass@1 of the base and every member, one engine pass per
benchmark; with ``--samples N --temperature T [--top-p P] --k 1,5,10``, pass@k from N sampled answers per problem.

The flags come from :class:`lorapop.eval.runner.EvalConfig`; the evaluation itself is
:func:`lorapop.eval.runner.run_eval`. Heavy modules (torch, the engine, the sandbox) load when it runs.
"""

from __future__ import annotations

import argparse
import sys

from lorapop.eval.data import BenchmarkError, get_spec
from lorapop.eval.prompts import PROMPT_CHOICES
from lorapop.eval.runner import EvalConfig, format_table, run_eval, select_benchmarks


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags come from :class:`EvalConfig` (lorapop.configlib.add_arguments): a new field is a new flag."""
    from lorapop.configlib import add_arguments as config_arguments

    p.add_argument("run_dirs", nargs="*", metavar="RUN_DIR", help="training runs (none: evaluate --model only)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="set both generation budgets")
    config_arguments(p, EvalConfig)


def config_from_args(a: argparse.Namespace) -> EvalConfig:
    from lorapop.configlib import ConfigError, from_args

    try:
        cfg = from_args(EvalConfig, a)
    except ConfigError as e:
        raise ValueError(str(e)) from e
    cfg.data = {get_spec(name).name: path for name, path in cfg.data.items()}
    if cfg.prompt not in PROMPT_CHOICES:
        raise ValueError(f"--prompt: {cfg.prompt!r} is not one of {', '.join(PROMPT_CHOICES)}")
    if a.max_new_tokens:
        cfg.max_new_tokens_code = cfg.max_new_tokens_math = a.max_new_tokens
    return cfg


def run(a: argparse.Namespace) -> int:
    from lorapop.records import RunDirError

    try:
        cfg = config_from_args(a)
        select_benchmarks(cfg)
        result = run_eval(a.run_dirs, cfg)
    except (BenchmarkError, RunDirError, ValueError) as e:
        print(f"lorapop eval: error: {e}", file=sys.stderr)
        return 2
    print(format_table(result))
    return 0 if not result["errors"] else 1
