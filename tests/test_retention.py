"""`lorapop retention`: arms scored on the run's own probe family with a noise floor from replicates of the
parent (continuation, clone, extra scorings). End to end at a tiny size on the real embedded model, a real PEFT
checkpoint, real operators and sandbox; then `lorapop report` renders the retention section. The pure parts (floor,
verdicts, strength knobs, task split) are tested without a model."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A real self-play run (1 teacher, 2 students, 2 steps on the embedded model, tiny amounts, a probe family of 2
    tasks per level): the parent is a student trained in self-play, as the protocol wants; the test lowers
    --min-parent-steps to its 2 steps."""
    from lorapop.config import load_config
    from lorapop.commands.train import prepare_run_dir
    from lorapop.train.loop import Trainer

    cfg = load_config(None, [
        "--population.n_teachers=1", "--population.n_students=2", "--selfplay.task_types=[code_o]",
        "--selfplay.tasks_per_type=2", "--selfplay.n_solve=1", "--selfplay.n_references=1",
        "--selfplay.propose.max_new_tokens=24", "--selfplay.solve.max_new_tokens=12", "--engine.rank=4",
        "--engine.lora_alpha=8", "--engine.device=cpu", "--run.progress=none", "--run.tensorboard=false",
        "--run.steps=2", "--run.save_interval=2", "--run.probe_per_level=2",
        f"--run.output_dir={tmp_path_factory.mktemp('ret')}", "--run.name=run"])
    path, _ = prepare_run_dir(cfg, resume=False)
    with Trainer(cfg, path) as trainer:
        trainer.run()
    return path


ARGS = ["--operators", "clone", "average", "--stronger", "3", "--stronger-ops", "full_gaussian",
        "--steps", "1", "--answers", "2", "--floor-replicates", "1", "--train-per-level", "2", "--tasks-per-step",
        "2", "--n-samples", "2", "--group-size", "4"]


@pytest.mark.slow
def test_retention_scores_the_probe_family_with_a_noise_floor_and_resumes(run_dir, tmp_path, capsys):
    from lorapop.cli import main
    from lorapop.retention.study import rank_members
    from lorapop.records.rundir import RunDir

    rd = RunDir(run_dir)
    ranked = rank_members(run_dir, rd.find_checkpoint(), "student")
    args = ["retention", str(run_dir), *ARGS]
    # the protocol starts from a parent trained in self-play for at least 20 steps by default: this run has 2
    assert main(args) == 2
    assert "2 self-play step(s)" in capsys.readouterr().err
    assert not (run_dir / "retention.json").exists()
    assert main(args + ["--min-parent-steps", "2"]) == 0
    printed = capsys.readouterr().out
    out = json.loads((run_dir / "retention.json").read_text())
    assert out["parent"] == ranked[0][0].id and out["second_parent"] == ranked[1][0].id
    # scored on the run's probe family (3 levels x the run's probe_per_level 2), 2 answers each
    assert out["probe"]["n_tasks"] == 6 and out["probe"]["answers"] == 2 and out["probe"]["resolution"] == 1 / 12
    assert "probe family" in out["training"] and "noise floor" in printed
    # the registered rule on this parent, the clone and the continuation (against the clone) judged by it too
    assert "(against clone)" in printed and "| clone | 1 | " in printed and "headline (this parent): " in printed
    assert list(out["arms"]) == ["continuation", "clone", "average", "full_gaussian@3x"]  # one group of 4
    assert out["arms"]["full_gaussian@3x"]["record"]["params"]["eps"] == pytest.approx(0.45)
    # the noise floor: the probe's spread over the step-0 replicates of the parent (continuation, clone, 1 more)
    reps = [statistics.fmean(out["arms"][a]["step0_tasks"]) for a in ("continuation", "clone")]
    reps.append(statistics.fmean(out["parent_replicates"][0]))
    nf = out["noise_floor"]
    assert nf["n"] == 3 and [r["member"] for r in nf["replicates"]] == ["continuation", "clone", "parent#1"]
    assert nf["spread"] == pytest.approx(max(reps) - min(reps)) and nf["std"] == pytest.approx(statistics.stdev(reps))
    cont = out["arms"]["continuation"]["heldout"]
    for name, arm in out["arms"].items():
        assert len(arm["heldout"]) == 2 and len(arm["train_reward"]) == 1 and len(arm["step0_tasks"]) == 6, name
        assert arm["heldout"][0] == pytest.approx(statistics.fmean(arm["step0_tasks"]))
        assert arm["gap"] == [c - v for c, v in zip(cont, arm["heldout"])]
        if name != "continuation":  # lost = a drop beyond the floor; recovered = back within it, same step
            assert arm["lost"] == (arm["drop"] > nf["spread"])
            first = next((k for k, g in enumerate(arm["gap"]) if g <= nf["spread"]), None)
            assert arm["recovered_step"] == first, (name, arm["gap"])
    assert out["clone_gap"] == out["arms"]["clone"]["gap"]
    # the raw samples: every scoring's replies and statuses, one file per arm, agreeing with the scores
    for name, arm in out["arms"].items():
        rows = [json.loads(x) for x in (run_dir / "answers" / f"{name}.jsonl").read_text().splitlines()]
        own = [r for r in rows if r["scoring"] == "arm"]
        assert [r["step"] for r in own] == [0] * 6 + [1] * 6, name
        assert [r["score"] for r in own if r["step"] == 0] == arm["step0_tasks"]
        for r in rows:
            assert len(r["answers"]) == len(r["statuses"]) == 2 and r["arm"] == name
            assert r["score"] == r["statuses"].count("correct") / 2
        assert {r["scoring"] for r in rows} == ({"arm", "#replicate1"} if name == "continuation" else {"arm"})

    # resumable: an unfinished arm is trained again, finished ones are kept as they are
    before = {n: a["heldout"] for n, a in out["arms"].items()}
    del out["arms"]["average"]
    (run_dir / "retention.json").write_text(json.dumps(out))
    assert main(args + ["--min-parent-steps", "2"]) == 0
    again = json.loads((run_dir / "retention.json").read_text())
    assert list(again["arms"]) == list(before) and len(again["arms"]["average"]["heldout"]) == 2
    assert all(again["arms"][n]["heldout"] == h for n, h in before.items() if n != "average")
    # a changed setting is refused before any work, naming what changed
    assert main(args + ["--min-parent-steps", "2", "--answers", "3"]) == 2
    err = capsys.readouterr().err
    assert "other settings" in err and "probe" in err and "delete it or give another --out" in err

    assert main(["report", str(run_dir)]) == 0
    html = (run_dir / "report.html").read_text()
    section = html.split('<section id="retention">')[1].split("</section>")[0]
    assert "Held-out solve rate after the operator" in section and "resolution 0.083" in section
    # the rule the file was judged by: the noise floor it measured, not an older file's threshold
    spread = json.loads((run_dir / "retention.json").read_text())["noise_floor"]["spread"]
    assert f"noise floor {spread:.3f}" in section and "None" not in section.split("</p>")[0]
    assert section.count('<g class="series"') >= 4
    assert "always the " in section  # the probe family's trivial yardsticks, dashed


def test_noise_floor_and_verdicts_come_from_the_replicates():
    from lorapop.retention.study import summarise

    arms = {"continuation": {"heldout": [0.5, 0.6, 0.7], "step0_tasks": [0.5, 0.5]},
            "clone": {"heldout": [0.45, 0.6, 0.65], "step0_tasks": [0.5, 0.4]},
            "full_gaussian": {"heldout": [0.3, 0.5, 0.68]},  # lost 0.2, back within 0.05 at step 2
            "average": {"heldout": [0.48, 0.5, 0.55]}}  # drop within the floor: no loss
    out = {"arms": arms, "parent_replicates": [[0.55, 0.5]], "probe": {"answers": 2}}
    summarise(out)
    nf = out["noise_floor"]
    assert [r["score"] for r in nf["replicates"]] == [0.5, 0.45, 0.525] and nf["n"] == 3
    assert nf["spread"] == pytest.approx(0.075) and nf["identical"] is True
    fg, av = arms["full_gaussian"], arms["average"]
    assert fg["lost"] is True and fg["recovered_step"] == 2 and fg["final_gap"] == pytest.approx(0.02)
    assert av["lost"] is False and av["recovered_step"] == 0
    assert arms["continuation"]["lost"] is None and out["clone_gap"] == arms["clone"]["gap"]


def test_recovered_step_compares_with_the_reference_at_the_same_step():
    from lorapop.retention.verdict import recovered_step

    cont = [0.5, 0.6, 0.8, 0.8]
    assert recovered_step([0.2, 0.58, 0.7, 0.8], cont, 0.05) == 1
    # back to the parent's old 0.5 at step 2 is not recovery while the continuation is at 0.8
    assert recovered_step([0.1, 0.3, 0.5, 0.7], cont, 0.05) is None
    assert recovered_step([0.1, 0.3, 0.5, 0.76], cont, 0.05) == 3


def test_stronger_settings_turn_each_knob():
    from lorapop.evolve.config import STRENGTH_KNOBS, scaled_params
    from lorapop.evolve.operators import OPERATORS, check_params

    assert scaled_params("full_gaussian", 3) == {"eps": pytest.approx(0.45)}
    assert scaled_params("dare", 3)["p"] == pytest.approx(0.9)  # keeps a third of the 30% it kept
    assert scaled_params("component_masking", 4)["fraction"] == 1.0
    assert scaled_params("extrapolative", 3) == {"eta_min": 1.0, "eta_max": pytest.approx(2.5)}
    assert scaled_params("full_gaussian", 3, {"eps": 0.1}) == {"eps": pytest.approx(0.3)}
    for name in STRENGTH_KNOBS:
        check_params(name, scaled_params(name, 3))  # every knob is a parameter the operator takes
    assert set(STRENGTH_KNOBS) < set(OPERATORS)
    with pytest.raises(ValueError, match="no strength knob"):
        scaled_params("average", 3)
    with pytest.raises(ValueError, match="> 0"):
        scaled_params("dare", 0)


def test_training_tasks_are_the_probe_family_less_the_held_out():
    from lorapop.retention.study import family_tasks
    from lorapop.train.probe import probe_tasks

    held, train = family_tasks("selection", 30, 30, seed=0)
    assert [(t.program, t.inputs) for t in held] == [(t.program, t.inputs) for _, t in probe_tasks(30, style="selection")]
    assert len(held) == 90 and len(train) >= 80
    assert not {(t.program, tuple(t.inputs)) for t in held} & {(t.program, tuple(t.inputs)) for t in train}


@pytest.mark.slow
def test_retention_rejects_bad_input_clearly(run_dir, capsys):
    from lorapop.cli import main

    assert main(["retention", str(run_dir), "--operators", "nope", "--steps", "1"]) == 2
    assert "unknown operator" in capsys.readouterr().err
    assert main(["retention", str(run_dir), "--stronger", "3", "--stronger-ops", "average", "--steps", "1"]) == 2
    assert "no strength knob" in capsys.readouterr().err
    assert main(["retention", str(run_dir), "--member", "t0", "--steps", "1", "--min-parent-steps", "0"]) == 2
    assert "not a student" in capsys.readouterr().err
    assert main(["retention", str(run_dir.parent / "missing"), "--steps", "1"]) == 2


@pytest.mark.slow
def test_keep_final_copies_a_parent_run_directory_nothing_prunes(run_dir, tmp_path):
    import importlib.util

    from lorapop.adapters import resolve_source
    from lorapop.records.rundir import RunDir

    spec = importlib.util.spec_from_file_location("bench_arms", Path(__file__).resolve().parents[1] / "bench" / "arms.py")
    arms = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(arms)
    src = RunDir(run_dir).latest_checkpoint()
    kept = arms.keep_final(run_dir, tmp_path / "seed0" / "single")
    assert kept == tmp_path / "seed0" / "single" / "checkpoints" / src.name
    copy = RunDir(tmp_path / "seed0" / "single")
    assert copy.latest_checkpoint() == kept and copy.read_config() == RunDir(run_dir).read_config()
    for d in (src / "adapters").iterdir():
        assert (kept / "adapters" / d.name / "adapter_model.safetensors").read_bytes() == \
            (d / "adapter_model.safetensors").read_bytes()
    assert resolve_source(f"{copy.path}:best").dir.parent.parent == kept  # what --second-parent names
    assert arms.keep_final(run_dir, tmp_path / "seed0" / "single") == kept  # already kept: left as it is


def test_a_sparse_scoring_schedule_leaves_unscored_steps_out_of_the_verdicts():
    from lorapop.retention.study import eval_steps, summarise

    assert eval_steps(20, 4) == [0, 1, 2, 4, 8, 12, 16, 20] and eval_steps(3, 1) == [0, 1, 2, 3]
    assert eval_steps(1, 4) == [0, 1]
    arms = {"continuation": {"heldout": [0.5, None, 0.6, 0.7], "step0_tasks": [0.5, 0.5]},
            "clone": {"heldout": [0.5, None, 0.6, 0.7], "step0_tasks": [0.5, 0.4]},
            "dare": {"heldout": [0.2, None, 0.58, 0.7]}}
    out = {"arms": arms, "parent_replicates": [], "probe": {"answers": 2}}
    summarise(out)
    assert out["noise_floor"]["spread"] == pytest.approx(0.05)
    assert arms["dare"]["gap"][1] is None and arms["dare"]["recovered_step"] == 2 and arms["dare"]["lost"] is True
