"""`lorapop plan CONFIG`: the GPU memory of each phase of a config's run, measured under fake tensors, and whether it
fits (lorapop/plan.py); `--cpu`: a CPU run's peak resident memory (lorapop/plan_cpu.py)."""

from __future__ import annotations

import argparse
import sys


def add_arguments(ap: argparse.ArgumentParser) -> None:
    from lorapop import plan  # torch loads when it runs

    plan.add_arguments(ap)


def run(args: argparse.Namespace) -> int:
    from lorapop import plan
    from lorapop.config import resolve_config_path

    try:
        path = resolve_config_path(args.config)
    except FileNotFoundError as e:
        print(f"lorapop plan: {e}", file=sys.stderr)
        return 2
    return plan.run(args, path)
