"""The `lorapop` command line. Subcommands import their heavy modules lazily so `--help` stays instant."""

from __future__ import annotations

import argparse
import sys


def _cmd_prepare_model(args: argparse.Namespace) -> int:
    from lorapop.model import prepare_model

    path = prepare_model(args.model)
    print(f"model ready: {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lorapop", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    pm = sub.add_parser("prepare-model", help="resolve a base model and cache it as safetensors (embedded default)")
    pm.add_argument("model", nargs="?", default="embedded", help="'embedded', a Hugging Face id, or a local path")
    pm.set_defaults(func=_cmd_prepare_model)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    args.overrides = rest
    if rest and not getattr(args, "accepts_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
