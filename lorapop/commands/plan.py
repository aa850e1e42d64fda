"""`lorapop plan CONFIG`: the GPU memory of each phase of a config's run, measured under fake tensors (no GPU, no
weights), and whether it fits (lorapop/plan/gpu.py); `--cpu`: a CPU run's peak resident memory (lorapop/plan/cpu.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lorapop.plan.measure import AZR_PROMPT_TOKENS, DEFAULT_PROMPT_TOKENS, REPLY_TOKENS


def run(args: argparse.Namespace) -> int:
    """``lorapop plan``: print the plan; exit status 0 when it fits, 1 when not, 2 on a bad config."""
    from lorapop.config import resolve_config_path

    try:
        path = resolve_config_path(args.config)
    except FileNotFoundError as e:
        print(f"lorapop plan: {e}", file=sys.stderr)
        return 2
    return run_config(args, path)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("config", help="YAML file or shipped config name (4T+4S, single, ...)")
    ap.add_argument("--gpu-memory", type=float, default=80.0, metavar="GIB", help="GPU memory in GiB (default 80)")
    ap.add_argument("--prompt-tokens", type=int, default=None,
                    help=f"longest prompt to plan for (default {DEFAULT_PROMPT_TOKENS}; {AZR_PROMPT_TOKENS}, AZR's "
                         "prompt cap, under selfplay.prompt_format azr)")
    ap.add_argument("--reply-tokens", type=int, default=None,
                    help=f"also count the rows of prompt + this many reply tokens the cache "
                         f"holds (default {REPLY_TOKENS}, an assumed typical reply, capped at max_new_tokens)")
    ap.add_argument("--cpu", action="store_true",
                    help="plan the run on CPU instead: its peak resident memory on this machine (lorapop/plan/cpu.py)")
    ap.add_argument("--memory", type=float, default=None, metavar="GIB",
                    help="with --cpu: the memory to plan against (default: what this machine has available now)")
    ap.add_argument("--backends", default=None, metavar="torch,vllm",
                    help="plan for these engine.backend values, one plan each (default: the config's own); exit "
                         "status 0 only when every one fits")


def run_config(args: argparse.Namespace, config_path: str) -> int:
    """The plan of the config at ``config_path`` (one per ``--backends`` value, or the CPU plan) printed."""
    from lorapop.config import load_config
    from lorapop.configlib import ConfigError
    from lorapop.plan import PlanError, default_prompt_tokens, plan

    try:
        cfg = load_config(config_path, args.overrides)
        if getattr(args, "cpu", False):
            return _run_cpu(args, cfg)
        backends = args.backends.split(",") if getattr(args, "backends", None) else [cfg.engine.backend]
        plans = []
        for backend in backends:  # each measured on its own: what is measured depends on the backend
            one = load_config(config_path, [*args.overrides, f"--engine.backend={backend}"])
            plans.append(plan(one, args.gpu_memory, args.prompt_tokens or default_prompt_tokens(one),
                              getattr(args, "reply_tokens", None) or REPLY_TOKENS))
    except (ConfigError, PlanError) as e:
        print(f"lorapop plan: {e}", file=sys.stderr)
        return 2
    print("\n\n".join(p.render() for p in plans))
    return 0 if all(p.fits for p in plans) else 1


def _run_cpu(args: argparse.Namespace, cfg: Any) -> int:
    from lorapop.configlib import ConfigError
    from lorapop.plan import GIB
    from lorapop.plan.cpu import machine_bytes, plan_cpu

    memory = int(args.memory * GIB) if args.memory else machine_bytes()
    if memory is None:
        raise ConfigError("--cpu: this machine's memory cannot be read; give it with --memory GIB")
    p = plan_cpu(cfg, memory, args.prompt_tokens)
    print(p.render())
    return 0 if p.fits else 1
