"""The `lorapop` command line. Subcommands import their heavy modules lazily so `--help` stays instant."""

from __future__ import annotations

import argparse
import sys


def _cmd_prepare_model(args: argparse.Namespace) -> int:
    from lorapop.model import ModelNotFoundError, checkpoint_summary, download_model, prepare_model

    try:
        path = prepare_model(args.model)
        if not path.exists():  # a hub id: into the Hugging Face cache now, not inside the first train
            path = download_model(args.model)
        summary = checkpoint_summary(path)
    except ModelNotFoundError as e:
        print(f"lorapop prepare-model: {e}", file=sys.stderr)
        return 2
    print(f"model ready: {path} ({summary})")
    return 0


def resolve_config_path(name: str) -> str:
    """A YAML path, or the name of a shipped config: :func:`lorapop.config.resolve_config_path`, imported on call
    so that ``--help`` stays light (it lives there because ``compare`` needs it and must not import the CLI)."""
    from lorapop.config import resolve_config_path as resolve

    return resolve(name)


def shipped_configs() -> list[str]:
    """The names of the configs in lorapop/configs/, read from the directory (so --help lists what ships)."""
    from pathlib import Path

    return sorted(p.stem for p in (Path(__file__).parent / "configs").glob("*.yaml"))


def _cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from lorapop.configlib import ConfigError
    from lorapop.engine.vllm_engine import VLLMUnavailable, vllm_missing  # light: vllm itself loads on use

    if args.help_config:
        from lorapop.config import Config, load_config
        from lorapop.configlib import describe

        # Defaults as a run gets them: a section's default instance (Config's engine is EngineConfig(dtype="auto")),
        # and where validation resolves a value (selfplay.teacher_reward: auto) what it resolves to.
        print("\n".join(describe(Config, obj=Config(), loaded=load_config(None, []))))
        return 0
    from lorapop.config import load_config
    from lorapop.configlib import to_dict
    from lorapop.train.loop import check_compatible, load_run_config, prepare_run_dir, restart_config

    try:
        if args.resume and (Path(args.resume) / "config.yaml").is_file():
            cfg = load_run_config(Path(args.resume), args.overrides)
            if args.config:  # a config given beside --resume must describe the same run
                check_compatible(load_config(resolve_config_path(args.config), []), to_dict(cfg))
        elif args.resume:  # killed before its config was written (older versions wrote it late): start it again
            cfg = restart_config(Path(args.resume), resolve_config_path(args.config) if args.config else None,
                                 args.overrides)
        else:
            cfg = load_config(resolve_config_path(args.config) if args.config else None, args.overrides)
        if cfg.engine.backend == "vllm":  # before the run directory exists: one clear error, nothing left behind
            missing = vllm_missing()
            if missing:
                raise VLLMUnavailable(f"engine.backend vllm: {missing}; or set --engine.backend=torch")
        run_dir, resume = prepare_run_dir(cfg, resume=bool(args.resume))
    except (ConfigError, FileNotFoundError, VLLMUnavailable) as e:
        print(f"lorapop train: {e}", file=sys.stderr)
        return 2
    from lorapop.train.loop import Trainer

    from lorapop.executor.sandbox import IsolationError
    from lorapop.rundir import RunDirError

    try:
        with Trainer(cfg, run_dir, resume=resume) as trainer:
            trainer.run()
    except IsolationError as e:  # before any step: says what is missing and names executor.allow_unisolated
        print(f"lorapop train: {e}", file=sys.stderr)
        return 2
    except RunDirError as e:  # e.g. a full disk at checkpoint time: the message says what is intact and what to do
        print(f"lorapop train: {e}", file=sys.stderr)
        return 1
    print(f"run finished: {run_dir}")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from lorapop import plan

    try:
        path = resolve_config_path(args.config)
    except FileNotFoundError as e:
        print(f"lorapop plan: {e}", file=sys.stderr)
        return 2
    return plan.run(args, path)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lorapop", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    pm = sub.add_parser("prepare-model", help="make a base model ready to train: convert the embedded model (or a "
                        ".gguf) once to cached safetensors, download a hub id into the Hugging Face cache, check that "
                        "it loads, print where it is and its size")
    pm.add_argument("model", nargs="?", default="embedded", help="'embedded' (default), a Hugging Face hub id "
                    "(e.g. Qwen/Qwen2.5-Coder-7B: needs the network once), a local checkpoint directory or a .gguf")
    pm.set_defaults(func=_cmd_prepare_model, subparser=pm)
    tr = sub.add_parser("train", help="run self-play training (population or single-agent baseline)",
                        description="lorapop train [CONFIG] [--section.key=value ...] | lorapop train --resume RUN_DIR")
    tr.add_argument("config", nargs="?", help=f"YAML file or shipped config name ({', '.join(shipped_configs())})")
    tr.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last complete checkpoint")
    tr.add_argument("--help-config", action="store_true", help="list every config field (type, default, meaning)")
    tr.set_defaults(func=_cmd_train, accepts_overrides=True)
    from lorapop import plan  # torch loads when it runs

    pl = sub.add_parser("plan", help="GPU memory of each phase of a config's run, measured under fake tensors "
                        "(no GPU, no weights), and whether it fits", description="lorapop plan CONFIG "
                        "[--gpu-memory GIB] [--prompt-tokens N] [--section.key=value ...]")
    plan.add_arguments(pl)
    pl.set_defaults(func=_cmd_plan, subparser=pl, accepts_overrides=True)
    from lorapop import report  # light: stdlib only until a report is written

    rp = sub.add_parser("report", help="write a self-contained report.html for one or more run directories")
    report.add_arguments(rp)
    rp.set_defaults(func=report.run, subparser=rp)
    from lorapop.eval import runner as evaluation  # torch-free import; heavy modules load lazily

    ep = sub.add_parser("eval", help="greedy pass@1 of the base and every member on code/math benchmarks")
    evaluation.add_arguments(ep)
    ep.set_defaults(func=evaluation.run, subparser=ep)
    from lorapop import compare  # stdlib only at import; training and eval load when it runs

    cp = sub.add_parser("compare", help="train a population and its compute-matched single-agent baseline, evaluate "
                        "both, write one report overlaying them",
                        description="lorapop compare [CONFIG] [--name N] [--eval-limit N] [--section.key=value ...]")
    compare.add_arguments(cp)
    cp.set_defaults(func=compare.run, subparser=cp, accepts_overrides=True)
    from lorapop.evolve import retention  # torch-free import; the engine loads inside run()

    rt = sub.add_parser("retention", help="how fast each PBT operator's child recovers its parent's solve rate")
    retention.add_arguments(rt)
    rt.set_defaults(func=retention.run, subparser=rt)
    from lorapop import export  # torch-free import; torch and transformers load when it writes

    xp = sub.add_parser("export", help="write a run's members as PEFT adapters (peft, vLLM) or merged transformers "
                        "models", description="lorapop export RUN_DIR --member best|ID|all --to DIR [--merge]")
    export.add_arguments(xp)
    xp.set_defaults(func=export.run, subparser=xp)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    args.overrides = rest
    if rest and not getattr(args, "accepts_overrides", False):
        from lorapop.configlib import suggest

        known = list(getattr(args, "subparser", parser)._option_string_actions)
        parser.error(f"unrecognized arguments: {' '.join(rest)}{suggest(rest[0].split('=')[0], known)}")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
