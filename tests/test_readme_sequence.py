"""The README's CPU commands, run for real and in the README's order, in a fresh directory: each
command that reads a run reads one an earlier command made. Small overrides keep it to minutes: every training is
one step of 2 `code_o` tasks with short replies (the resume continues to step 2), evaluations take 1 problem of one
benchmark, retention trains one step per arm of two operators on a parent 2 steps in (`--min-parent-steps=2`
stands in for the README's 20-step parent). Not run here: `pip install -e '.[EXTRA]'` (tests/test_readme.py checks
the extra exists; the test extra installs wandb) and `train --help-config` (run there too).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_readme import shell_commands

REPO = Path(__file__).resolve().parents[1]
TINY = ["--selfplay.task_types=[code_o]", "--selfplay.tasks_per_type=2", "--selfplay.n_solve=2",
        "--selfplay.propose.max_new_tokens=24", "--selfplay.solve.max_new_tokens=12", "--run.progress=none",
        "--run.probe_interval=0"]
EVAL = ["--benchmarks", "mbppplus", "--limit", "1", "--max-new-tokens", "16"]
PLAN = ["--prompt-tokens", "64", "--selfplay.propose.max_new_tokens=32", "--selfplay.solve.max_new_tokens=32",
        "--engine.train_micro_batch_size=1"]


def readme_cpu_commands() -> list[list[str]]:
    """The `lorapop` commands of the README's "Using it" section, in order (its text up to the next `###`)."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Using it"):]
    section = section[:section.index("\n### ")]
    return [argv[1:] for argv in shell_commands(section) if Path(argv[0]).name == "lorapop"]


def small(args: list[str]) -> list[str] | None:
    """The README command with the small overrides; None for one this test leaves out (see the module docstring)."""
    sub = args[0]
    if args[:2] == ["train", "--help-config"]:
        return None
    if sub == "train" and "--resume" in args:  # a resume keeps its run's settings; only its length changes
        return [a for a in args if not a.startswith("--run.steps=")] + ["--run.steps=2"]
    if sub == "train":
        return [a for a in args if not a.startswith("--run.steps=")] + TINY + ["--run.steps=1"]
    if sub == "compare":
        return [a for a in args if not a.startswith("--run.steps=")] + TINY + [
            "--run.steps=1", "--eval-benchmarks=mbppplus", "--eval-limit=1", "--eval-max-new-tokens=16"]
    if sub == "eval":
        out, skip = [], False
        for a in args:  # the README's --limit/--samples/--k, smaller
            if skip:
                skip = False
                continue
            if a in ("--limit", "--samples", "--k"):
                skip = True
                continue
            out.append(a)
        return out + EVAL + (["--samples", "2", "--k", "1,2"] if "--samples" in args else [])
    if sub == "retention":
        return args + ["--min-parent-steps=2", "--steps", "1", "--operators", "full_gaussian", "average",
                       "--tasks-per-step", "2", "--n-samples", "2", "--probe-per-level", "1", "--answers", "1",
                       "--floor-replicates", "0", "--train-per-level", "2"]
    if sub == "plan":
        return args + PLAN
    return args  # report, export, prepare-model: as written


def test_the_readme_shows_the_commands_this_test_runs():
    cmds = readme_cpu_commands()
    subs = [c[0] for c in cmds]
    assert subs.count("train") >= 5 and {"report", "eval", "compare", "retention", "export", "plan"} <= set(subs)
    made = {a.split("=", 1)[1] for c in cmds for a in c if a.startswith("--run.name=")}
    for c in cmds:  # every run directory a command reads is one an earlier command names
        for a in c[1:]:
            if a.startswith("runs/"):
                assert a.split(":")[0].removeprefix("runs/") in made, (c, made)


@pytest.mark.slow
def test_readme_cpu_commands_run_in_order(tmp_path, monkeypatch, capsys):
    from lorapop.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    ran = []
    for args in readme_cpu_commands():
        run = small(args)
        if run is None:
            continue
        if "wandb" in " ".join(run):
            pytest.importorskip("wandb")  # the test extra installs it
        code = main(run)
        out = capsys.readouterr()
        assert code == 0, f"lorapop {' '.join(run)} -> {code}\n{out.out[-2000:]}\n{out.err[-2000:]}"
        ran.append(run[0])
    runs = tmp_path / "runs"
    assert {p.name for p in runs.iterdir()} >= {"cpu_demo", "exp1", "baseline", "c1", "tracked", "warm"}
    state = json.loads((runs / "exp1" / "metrics.jsonl").read_text().splitlines()[-1])
    assert state["step"] == 2  # the resume continued it
    assert (runs / "exp1" / "report.html").is_file() and (runs / "exp1" / "retention.json").is_file()
    assert (tmp_path / "exports" / "best" / "adapter_config.json").is_file()
    assert ran.count("train") >= 5
