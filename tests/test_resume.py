"""A real run on the embedded model, SIGKILLed after a checkpoint and again in the middle of writing one, resumed,
and finished: nothing lost, nothing counted twice, weights restored bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.slow

TINY = [
    "--population.n_teachers=2", "--population.n_students=2",
    "--selfplay.task_types=[code_o]", "--selfplay.tasks_per_type=2", "--selfplay.n_solve=1",
    "--selfplay.n_references=1",
    "--selfplay.propose.max_new_tokens=24", "--selfplay.solve.max_new_tokens=12",
    "--engine.device=cpu", "--engine.gen_batch_size=8",
    "--evolve.perturbation_interval=2", "--evolve.burn_in_period=1", "--evolve.min_rated_matches=0",
    "--run.steps=3", "--run.save_interval=1", "--run.keep_checkpoints=0", "--run.progress=plain",
]
# the probe every step, a child counted from its 2nd trained step: PBT at step 2 makes one child per role, so step 2's
# probe is at a PBT step and step 3's probes a child of age 1
PROBE = ["--run.probe_interval=1", "--run.probe_per_level=1", "--run.probe_samples=1", "--run.probe_min_age=2"]


def _start(args: list[str], cwd: Path, env_extra: dict[str, str] | None = None) -> subprocess.Popen:
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.Popen([sys.executable, "-m", "lorapop.cli", "train", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _wait_for(pred, proc: subprocess.Popen, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        if proc.poll() is not None:
            raise AssertionError(f"run exited early ({proc.returncode}):\n{proc.stdout.read()}")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"timed out waiting:\n{proc.stdout.read()}")


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the whole group: the trainer and its sandbox workers
    proc.wait(timeout=30)


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_sigkill_after_checkpoint_and_mid_checkpoint_then_resume(tmp_path):
    run = tmp_path / "runs" / "killme"
    ckpts = run / "checkpoints"
    args = TINY + PROBE + [f"--run.output_dir={tmp_path / 'runs'}", "--run.name=killme"]

    # 1) killed after the first checkpoint is complete
    p = _start(args, tmp_path)
    _wait_for(lambda: (ckpts / "step_000001" / "COMPLETE").exists(), p, 300)
    _kill(p)

    # 2) resumed, then killed while step 2's checkpoint is being written (adapters on disk, not yet renamed)
    p = _start(["--resume", str(run)], tmp_path, {"LORAPOP_TEST_CHECKPOINT_PAUSE_S": "60"})
    _wait_for(lambda: any(x.name.startswith(".tmp-step_000002") and (x / "trainer_state.json").exists()
                          for x in ckpts.iterdir()), p, 300)
    _kill(p)
    assert not (ckpts / "step_000002").exists()
    assert 2 in _steps(run / "metrics.jsonl")  # step 2 was logged before its checkpoint died with the process

    # the restored state equals checkpoint 1 bit for bit (in-process, before the final resume)
    from lorapop.commands.train import load_run_config
    from lorapop.train.loop import Trainer

    state = json.loads((ckpts / "step_000001" / "trainer_state.json").read_text())
    resumed_cfg = load_run_config(run, [])
    seeds = tuple(resumed_cfg.executor.hashseeds)  # drawn when the run started, kept in its config.yaml
    assert len(set(seeds)) == 3
    with Trainer(resumed_cfg, run, resume=True) as trainer:
        assert trainer.step == 1 and trainer.executor.hashseeds == seeds
        assert not any(x.name.startswith(".tmp-") for x in ckpts.iterdir())
        assert _steps(run / "metrics.jsonl") == [1]
        assert sorted(set(_steps(run / "probe.jsonl"))) == [0, 1]  # step 2's probe rows went with its checkpoint
        assert trainer.ratings.state_dict() == {k: list(v) for k, v in state["ratings"].items()}
        assert {k: b.state_dict() for k, b in trainer.buffers.items()} == state["buffers"]
        assert trainer.population.state_dict() == state["population"]
        for m in trainer.population.members:
            saved = load_file(str(ckpts / "step_000001" / "adapters" / m.id / "adapter_model.safetensors"))
            live = trainer.engine.get_adapter(m.slot)
            for name, (a, b) in live.items():
                key = f"base_model.model.{name}"
                assert torch.equal(saved[f"{key}.lora_A.weight"], a)
                assert torch.equal(saved[f"{key}.lora_B.weight"], b)

    # 3) resumed again, runs to the end
    p = _start(["--resume", str(run)], tmp_path)
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out
    assert _steps(run / "metrics.jsonl") == [1, 2, 3]
    task_steps = _steps(run / "tasks.jsonl") if (run / "tasks.jsonl").read_text() else []
    assert task_steps == sorted(task_steps) and all(1 <= s <= 3 for s in task_steps)
    assert [c.name for c in sorted(ckpts.iterdir())] == ["step_000001", "step_000002", "step_000003"]
    pop = json.loads((run / "population.json").read_text())
    assert pop["step"] == 3 and len(pop["members"]) == 4
    assert any(f.name.startswith("events.out.tfevents") for f in run.iterdir())

    _check_probe(run, pop)

    # the report reads what the trainer really wrote, after two kills
    res = subprocess.run([sys.executable, "-m", "lorapop.cli", "report", str(run)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    html = (run / "report.html").read_text()
    for section in ("Rewards", "TrueSkill", "Lineage", "Coverage", "Capability probe"):
        assert f">{section}<" in html
    assert "noise floor (step 0, 2 identical members)" in html


def _check_probe(run: Path, pop: dict) -> None:
    """probe.jsonl after two kills, one of them between step 2's probe rows and its checkpoint: every probe written
    once; step 2's probe scored the students that trained at step 2, not the child its PBT round made; that child,
    probed at step 3 after one step of training, is marked out of the aggregate; step 0 carries the noise floor."""
    rows = [json.loads(line) for line in (run / "probe.jsonl").read_text().splitlines()]
    scores = [r for r in rows if "noise_floor" not in r]
    keys = [(r["step"], r["member"], r["task"]) for r in scores]
    assert len(keys) == len(set(keys)) and [r["step"] for r in rows] == sorted(r["step"] for r in rows)
    assert {s: sum(r["step"] == s for r in scores) for s in range(4)} == {0: 6, 1: 6, 2: 6, 3: 6}  # 2 students x 3
    born = [e for e in pop["lineage"] if e["role"] == "student"]
    assert [e["step"] for e in born] == [2], born
    child, replaced = born[0]["child"], born[0]["replaced"]
    at = {s: {r["member"]: (r["age"], r["counted"]) for r in scores if r["step"] == s} for s in range(4)}
    assert at[2] == {"s0": (2, True), "s1": (2, True)}  # the old order (evolve first) probed the child here, age 0
    survivor = ({"s0", "s1"} - {replaced}).pop()
    assert at[3] == {survivor: (3, True), child: (1, False)}
    floors = [r for r in rows if "noise_floor" in r]
    assert len(floors) == 1 and floors[0]["step"] == 0
    nf = floors[0]["noise_floor"]
    assert [x["member"] for x in nf["replicates"]] == ["s0", "s1"] and nf["identical"] and nf["n"] == 2
    for x in nf["replicates"]:
        mine = [r["score"] for r in scores if r["step"] == 0 and r["member"] == x["member"]]
        assert abs(x["score"] - sum(mine) / len(mine)) < 1e-12
    values = [x["score"] for x in nf["replicates"]]
    assert abs(nf["spread"] - (max(values) - min(values))) < 1e-12


def test_resume_refuses_incompatible_checkpoint(tmp_path):
    run = tmp_path / "runs" / "r"
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    from lorapop.config import Config, config_to_yaml
    from lorapop.configlib import to_dict

    cfg = Config()
    (run / "config.yaml").write_text(config_to_yaml(cfg))
    other = to_dict(cfg)
    other["engine"]["rank"] = 8
    ck = run / "checkpoints" / "step_000001"
    (ck / "trainer_state.json").write_text(json.dumps({"step": 1, "config": other}))
    (ck / "COMPLETE").write_text("1")
    res = subprocess.run([sys.executable, "-m", "lorapop.cli", "train", "--resume", str(run)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2
    assert "engine.rank: the checkpoint was made with 8, this config says 16" in res.stderr


def _killed_at(point: str, args: list[str], cwd: Path) -> str:
    """Run the CLI until it SIGKILLs itself (and its sandbox workers) at ``point``; returns its output."""
    p = _start(args, cwd, {"LORAPOP_TEST_KILL_AT": point})
    out, _ = p.communicate(timeout=900)  # a loaded 2-core machine needs minutes for a model load and two steps
    assert p.returncode == -signal.SIGKILL, f"expected a kill at {point}, got rc {p.returncode}:\n{out}"
    return out


def test_killed_at_every_point_of_startup_and_first_step_then_resumed(tmp_path):
    """Each kill leaves a directory that ``--resume`` (or starting again with the same name) takes forward."""
    run = tmp_path / "runs" / "startup"
    args = TINY + ["--run.steps=2", f"--run.output_dir={tmp_path / 'runs'}", "--run.name=startup"]
    resume = ["--resume", str(run), "--run.steps=2"]
    restarted = "held no complete checkpoint (killed before its first save); starting it again from step 0"

    _killed_at("run_dir", args, tmp_path)  # the directory exists, with its config and nothing else
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]
    assert restarted in _killed_at("coverage", resume, tmp_path)
    assert (run / "coverage_centroids.npy").is_file()

    # a directory left by a trainer that wrote its config late: no config.yaml, so --resume alone has nothing to go on
    (run / "config.yaml").unlink()
    res = subprocess.run([sys.executable, "-m", "lorapop.cli", "train", *resume], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and "holds nothing to resume and no config.yaml" in res.stderr
    # ... and starting it again under the same name restarts it
    assert restarted in _killed_at("engine", args, tmp_path)
    assert (run / "config.yaml").is_file()

    for point in ("step1:propose", "step1:log"):
        assert restarted in _killed_at(point, resume, tmp_path)
    assert _steps(run / "metrics.jsonl") == [1]  # logged before the kill; no checkpoint yet

    # killed in step 2 after step 1's checkpoint: a real resume, step 2's partial lines dropped
    out = _killed_at("step2:log", resume, tmp_path)
    assert restarted in out and (run / "checkpoints" / "step_000001" / "COMPLETE").is_file()
    assert _steps(run / "metrics.jsonl") == [1, 2]
    p = _start(resume, tmp_path)
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out
    assert restarted not in out
    assert _steps(run / "metrics.jsonl") == [1, 2]
    assert [c.name for c in sorted((run / "checkpoints").iterdir())] == ["step_000001", "step_000002"]


def test_a_foreign_directory_is_never_emptied(tmp_path):
    run = tmp_path / "runs" / "mine"
    run.mkdir(parents=True)
    (run / "notes.txt").write_text("my notes")
    res = subprocess.run([sys.executable, "-m", "lorapop.cli", "train", *TINY, f"--run.output_dir={tmp_path / 'runs'}",
                          "--run.name=mine"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "files a run does not write (notes.txt)" in res.stderr
    assert (run / "notes.txt").read_text() == "my notes"


def test_clear_empties_what_a_run_killed_before_its_first_checkpoint_wrote(tmp_path):
    # run.probe_interval writes probe.jsonl at step 0, before any checkpoint: a kill there must not strand the name
    from lorapop.records.rundir import RunDir
    from lorapop.records import RunDirError

    rd = RunDir(tmp_path / "r")
    rd.create("run: {}\n")
    for name in ("metrics.jsonl", "tasks.jsonl", "probe.jsonl", "trackers.json", "coverage_centroids.npy"):
        (rd.path / name).write_text("x")
    assert sorted(rd.clear()) == sorted(["config.yaml", "metrics.jsonl", "tasks.jsonl", "probe.jsonl", "trackers.json",
                                         "coverage_centroids.npy"])
    assert rd.is_empty()
    rd.path.rmdir()
    rd.create("run: {}\n")
    (rd.path / "probe.jsonl").write_text("x")
    (rd.path / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match=r"files a run does not write \(notes.txt\)"):
        rd.clear()
    assert (rd.path / "notes.txt").read_text() == "mine" and (rd.path / "probe.jsonl").is_file()
