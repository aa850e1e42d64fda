"""`lorapop report RUN_DIR [RUN_DIR ...]`: one self-contained report.html for one run or several overlaid
(lorapop/report/)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `report` subcommand's arguments, for lorapop/cli.py's subparser."""
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    p.add_argument("--out", type=Path, default=None,
                   help="output file (or directory); default RUN_DIR/report.html of the first run")


def run(args: argparse.Namespace) -> int:
    """Exit status: 0 with the report's path on stdout, or 1 with one error line on stderr."""
    from lorapop.records import RunDirError
    from lorapop.report.html import write_report

    try:
        path = write_report(args.run_dirs, args.out)
    except (RunDirError, OSError) as e:
        print(f"lorapop report: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"report: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lorapop report", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
