"""The `lorapop` command line. Subcommands import their heavy modules lazily so `--help` stays instant."""

# This module is the dispatch table (COMMANDS); each command lives in lorapop/commands/, one module each.

from __future__ import annotations

import argparse
import importlib
import sys

# The dispatch table: (name, module in lorapop/commands/, help, description, whether it takes --section.key=value
# overrides); a command is added by writing its module and one row here. Each command module has
# add_arguments(parser) and run(args); it is imported only to build the parser and imports what is heavy when it
# runs, so `lorapop --help` stays instant.
COMMANDS = (
    ("prepare-model", "prepare_model", "make a base model ready to train: convert the embedded model (or a .gguf) "
     "once to cached safetensors, download a hub id into the Hugging Face cache, check that it loads, print where "
     "it is and its size", None, False),
    ("train", "train", "run self-play training (population or single-agent baseline)",
     "lorapop train [CONFIG] [--section.key=value ...] | lorapop train --resume RUN_DIR", True),
    ("plan", "plan", "GPU memory of each phase of a config's run, measured under fake tensors (no GPU, no weights), "
     "and whether it fits", "lorapop plan CONFIG [--gpu-memory GIB] [--prompt-tokens N] [--section.key=value ...]",
     True),
    ("report", "report", "write a self-contained report.html for one or more run directories", None, False),
    ("eval", "eval", "greedy pass@1 of the base and every member on code/math benchmarks", None, False),
    ("compare", "compare", "train a population and its compute-matched single-agent baseline, evaluate both, write "
     "one report overlaying them", "lorapop compare [CONFIG] [--name N] [--eval-limit N] [--section.key=value ...]",
     True),
    ("retention", "retention", "how fast each PBT operator's child recovers its parent's solve rate", None, False),
    ("export", "export", "write a run's members as PEFT adapters (peft, vLLM) or merged transformers models",
     "lorapop export RUN_DIR --member best|ID|all --to DIR [--merge]", False),
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lorapop", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for name, module, help_, description, overrides in COMMANDS:
        command = importlib.import_module(f"lorapop.commands.{module}")
        sp = sub.add_parser(name, help=help_, description=description)
        command.add_arguments(sp)
        sp.set_defaults(func=command.run, subparser=sp, accepts_overrides=overrides)
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
