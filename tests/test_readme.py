"""Every command the README (and docs/USAGE.md) shows works: each line of their ```bash blocks is run here in a dry
form that exercises the same code a real run starts with, so a renamed flag, config field or subcommand fails here.

- ``lorapop SUB ...``: parsed by lorapop's own parser; ``train``/``compare`` then load and validate their configs
  with the overrides shown, ``eval`` validates its options and benchmark selection, ``train --help-config`` runs
  for real; every subcommand's ``--help`` runs. What they would then do (train, evaluate) is covered by the
  integration tests and the demo.
- ``bash scripts/X.sh``: the script exists and parses (``bash -n``); the demo and the suite are what they run;
  ``setup.sh``'s options go through its ``--dry-run``.
- ``pip install -e '.[EXTRA]'``: the extra exists in pyproject.toml.
- ``ray SUB ...``: Ray's own CLI parses the options shown (without running), where the ray extra is installed.

A line this test does not know fails it: add a case rather than skip the line.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/USAGE.md")
FENCE = re.compile(r"^```(\w*)\s*$")


def shell_commands(text: str) -> list[list[str]]:
    """The commands of every ```bash/```sh block: continuation lines joined, comments and blank lines dropped."""
    out, lang, buf = [], None, ""
    for line in text.splitlines():
        m = FENCE.match(line.strip())
        if m and lang is None:
            lang = m.group(1)
            continue
        if line.strip().startswith("```") and lang is not None:
            lang = None
            continue
        if lang not in ("bash", "sh"):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        argv = shlex.split(buf + line, comments=True)
        buf = ""
        if argv:
            out.append(argv)
    return out


def _cases() -> list:
    seen, cases = set(), []
    for doc in DOCS:
        for argv in shell_commands((REPO / doc).read_text()):
            if tuple(argv) not in seen:  # a command shown twice is checked once
                seen.add(tuple(argv))
                cases.append(pytest.param(doc, argv, id=f"{doc}:{' '.join(argv)[:70]}"))
    return cases


def test_the_extractor_reads_blocks_continuations_and_comments():
    text = "x\n```bash\na --b=1 \\\n    --c   # note\n\n# only a comment\n```\n```text\nnot a command\n```\n"
    assert shell_commands(text) == [["a", "--b=1", "--c"]]


def test_the_readme_shows_the_two_commands_and_stays_short():
    readme = (REPO / "README.md").read_text()
    cmds = shell_commands(readme)
    assert ["bash", "scripts/demo.sh"] in cmds and ["bash", "scripts/test.sh"] in cmds
    # About 200 lines; measurements live in docs/RESULTS.md (230: the configs table's columns, the
    # baseline run and the extra's install that the commands need)
    assert len(readme.splitlines()) <= 230
    for link in re.findall(r"\]\(([^)#]+)\)", readme):  # every linked file and picture exists
        assert (REPO / link).exists(), link


def _dry_lorapop(args: list[str], capsys) -> None:
    from lorapop.cli import build_parser, main
    from lorapop.config import resolve_config_path

    parser = build_parser()
    try:
        ns, rest = parser.parse_known_args(args)
    except SystemExit as e:  # argparse reports a bad option by exiting
        raise AssertionError(f"lorapop {' '.join(args)}: {capsys.readouterr().err}") from e
    assert not rest or getattr(ns, "accepts_overrides", False), f"unknown arguments {rest}"
    ns.overrides = rest
    if ns.command == "train" and ns.help_config:
        assert main(args) == 0 and "selfplay.n_solve" in capsys.readouterr().out
    elif ns.command == "train" and not ns.resume:
        from lorapop.config import load_config

        load_config(resolve_config_path(ns.config) if ns.config else None, ns.overrides)
    elif ns.command == "compare":
        from lorapop.commands.compare import CompareConfig, compare_configs
        from lorapop.configlib import from_args

        ccfg = from_args(CompareConfig, ns)
        compare_configs(ns.config, ns.overrides, ccfg.name, ccfg.output_dir)
    elif ns.command == "eval":
        from lorapop.commands.eval import config_from_args
        from lorapop.eval.runner import select_benchmarks

        select_benchmarks(config_from_args(ns))
    # report, retention, prepare-model and train --resume take paths only: parsing them is their dry form


@pytest.mark.parametrize("doc,argv", _cases())
def test_documented_command(doc, argv, capsys):
    exe = Path(argv[0]).name
    if exe == "lorapop":
        _dry_lorapop(argv[1:], capsys)
    elif exe == "bash" and argv[1].startswith("scripts/"):
        script = REPO / argv[1]
        assert script.is_file(), script
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
        if argv[1] == "scripts/demo.sh" and argv[2:]:  # its arguments are train overrides
            _dry_lorapop(["train", "cpu_demo", *argv[2:]], capsys)
        if argv[1] == "scripts/setup.sh":  # its options, through its own --dry-run (which changes nothing)
            res = subprocess.run(["bash", str(script), *argv[2:], "--dry-run"], capture_output=True, text=True)
            assert res.returncode == 0, res.stderr
    elif exe == "pip" and argv[1:3] == ["install", "-e"]:
        extras = re.fullmatch(r"\.\[([\w,]+)\]", argv[3])
        assert extras, argv
        pyproject = (REPO / "pyproject.toml").read_text()
        for extra in extras.group(1).split(","):
            assert re.search(rf"^{extra} = \[", pyproject, re.M), f"no extra {extra!r} in pyproject.toml"
    elif exe == "ray":
        pytest.importorskip("ray")  # the ray extra (scripts/setup.sh --test installs it)
        from ray.scripts.scripts import cli  # the `ray` command's click group

        sub = cli.commands[argv[1]]
        sub.make_context(argv[1], argv[2:])  # parses the options shown (click raises on an unknown one); runs nothing
    else:
        pytest.fail(f"{doc} shows `{' '.join(argv)}`, which no test runs: add a case to tests/test_readme.py")


@pytest.mark.parametrize("sub", ["train", "report", "eval", "compare", "retention", "prepare-model"])
def test_every_subcommand_has_help(sub, capsys):
    from lorapop.cli import main

    with pytest.raises(SystemExit) as e:
        main([sub, "--help"])
    assert e.value.code == 0 and "usage: lorapop" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["train", "cpu_demo", "--selfplay.n_slove=2"], ["train", "no_such_config"],
                                  ["eval", "runs/x", "--limitt", "5"], ["compare", "cpu_single"], ["evaluate"]])
def test_the_dry_form_catches_a_wrong_command(args, capsys):
    with pytest.raises(Exception):
        _dry_lorapop(args, capsys)
