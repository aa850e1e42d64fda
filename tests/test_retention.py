"""`lorapop retention` end to end at a tiny size: real embedded model, real PEFT checkpoint, real operators and sandbox;
then `lorapop report` renders the retention section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A real self-play run (1 teacher, 2 students, 2 steps on the embedded model, tiny amounts): the parent is a
    student trained in self-play, as the protocol wants; the test lowers --min-parent-steps to its 2 steps."""
    from lorapop.config import load_config
    from lorapop.train.loop import Trainer, prepare_run_dir

    cfg = load_config(None, [
        "--population.n_teachers=1", "--population.n_students=2", "--selfplay.task_types=[code_o]",
        "--selfplay.tasks_per_type=2", "--selfplay.n_solve=1", "--selfplay.n_references=1",
        "--selfplay.propose.max_new_tokens=24", "--selfplay.solve.max_new_tokens=12", "--engine.rank=4",
        "--engine.lora_alpha=8", "--engine.device=cpu", "--run.progress=none", "--run.tensorboard=false",
        "--run.steps=2", "--run.save_interval=2", f"--run.output_dir={tmp_path_factory.mktemp('ret')}",
        "--run.name=run"])
    path, _ = prepare_run_dir(cfg, resume=False)
    with Trainer(cfg, path) as trainer:
        trainer.run()
    return path


def test_retention_cli_writes_json_and_report_section(run_dir, capsys):
    from lorapop.cli import main
    from lorapop.evolve.retention import rank_members
    from lorapop.rundir import RunDir

    rd = RunDir(run_dir)
    ckpt = rd.find_checkpoint()
    ranked = rank_members(run_dir, ckpt, "student")
    ratings = rd.read_trainer_state(ckpt)["ratings"]
    exposes = [ratings[m.id][0] - 3 * ratings[m.id][1] for m, _ in ranked]
    assert [m.id for m, _ in ranked] in (["s0", "s1"], ["s1", "s0"]) and exposes == sorted(exposes, reverse=True)
    args = ["retention", str(run_dir), "--operators", "full_gaussian", "average", "--steps", "2",
            "--tasks-per-step", "2", "--n-samples", "2", "--heldout", "3", "--max-new-tokens", "12",
            "--group-size", "3"]
    # the protocol starts from a parent trained in self-play for at least 20 steps by default: this run has 2
    assert main(args) == 2
    assert "2 self-play step(s)" in capsys.readouterr().err
    assert not (run_dir / "retention.json").exists()
    rc = main(args + ["--min-parent-steps", "2"])
    assert rc == 0
    printed = capsys.readouterr().out
    out = json.loads((run_dir / "retention.json").read_text())
    assert out["parent"] == ranked[0][0].id and out["second_parent"] == ranked[1][0].id
    assert out["parent_selfplay_steps"] == 2 and out["reference"] == "continuation"
    # the mini-eval's resolution and the training loop are stated, in the JSON and in what is printed
    assert out["mini_eval"] == {"n_tasks": 3, "samples_per_task": 1, "resolution": 1 / 3}
    assert "student loop" in out["training"] and "not self-play" in out["training"]
    assert "student loop" in printed and "resolution 0.333" in printed
    assert list(out["arms"]) == ["continuation", "full_gaussian", "average"]
    cont = out["arms"]["continuation"]["heldout"]
    for name, arm in out["arms"].items():
        assert len(arm["heldout"]) == 3 and len(arm["train_reward"]) == 2, name  # after operator + each step
        assert all(0.0 <= v <= 1.0 for v in arm["heldout"])
        # compared with the continuation at the same step, at every step
        assert arm["gap"] == [c - v for c, v in zip(cont, arm["heldout"])]
        assert arm["drop"] == arm["gap"][0] and arm["final_gap"] == arm["gap"][-1]
        rec = arm["recovered_step"]
        if name == "continuation":
            assert rec is None
            continue
        first = next((k for k, (v, c) in enumerate(zip(arm["heldout"], cont)) if v >= 0.95 * c), None)
        assert rec == first, (name, arm["heldout"], cont)
    assert out["arms"]["average"]["record"]["n_parents"] == 2
    assert out["arms"]["full_gaussian"]["record"]["id"] == "M4"

    assert main(["report", str(run_dir)]) == 0
    html = (run_dir / "report.html").read_text()
    section = html.split('<section id="retention">')[1].split("</section>")[0]
    assert "Held-out solve rate after the operator" in section
    assert "the continuation arm&#x27;s at the same step" in section and "resolution 0.333" in section
    for name in out["arms"]:
        assert f"<title>{name}</title>" in section or name in section
    assert section.count('<g class="series"') >= 3


def test_recovered_step_compares_with_the_reference_at_the_same_step():
    from lorapop.evolve.retention import recovered_step

    cont = [0.5, 0.6, 0.8, 0.8]
    assert recovered_step([0.2, 0.6, 0.7, 0.8], cont, 0.95) == 1
    # back to the parent's old 0.5 at step 2 is not recovery while the continuation is at 0.8
    assert recovered_step([0.1, 0.3, 0.5, 0.7], cont, 0.95) is None
    assert recovered_step([0.1, 0.3, 0.5, 0.76], cont, 0.95) == 3  # 0.76 >= 0.95 x 0.8


def test_retention_rejects_bad_input_clearly(run_dir, capsys):
    from lorapop.cli import main

    assert main(["retention", str(run_dir), "--operators", "nope", "--steps", "1"]) == 2
    assert "unknown operator" in capsys.readouterr().err
    assert main(["retention", str(run_dir), "--member", "t0", "--steps", "1", "--min-parent-steps", "0"]) == 2
    assert "not a student" in capsys.readouterr().err
    assert main(["retention", str(run_dir.parent / "missing"), "--steps", "1"]) == 2
