"""run.report_to: wandb (offline), trackio and mlflow (local sqlite stores) get every metrics.jsonl step once, in one
run that --resume continues, and a failing tracker never stops the run. Each library's own files are read back:
wandb's offline .wandb log, trackio's sqlite database, mlflow's store through its client.

The trackers are optional extras (.venv/bin/pip install -e '.[wandb]' ...): a test needing one skips where it is absent.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from lorapop.config import load_config
from lorapop.configlib import ConfigError
from lorapop.records.rundir import RunDir
from lorapop.train.logger import MetricsLogger
from lorapop.train.trackers import wandb_records

INSTALLED = [n for n in ("wandb", "trackio", "mlflow") if importlib.util.find_spec(n) is not None]
needs = {n: pytest.mark.skipif(n not in INSTALLED, reason=f"{n} is not installed (.venv/bin/pip install -e '.[{n}]')")
         for n in ("wandb", "trackio", "mlflow")}



@pytest.fixture(scope="module", autouse=True)
def trackio_dir(tmp_path_factory):
    """trackio reads TRACKIO_DIR once, at its first import: one directory for this module, a project per test."""
    old = os.environ.get("TRACKIO_DIR")
    os.environ["TRACKIO_DIR"] = str(tmp_path_factory.mktemp("trackio"))
    yield
    os.environ.pop("TRACKIO_DIR") if old is None else os.environ.update(TRACKIO_DIR=old)


def trackio_store() -> Path:
    """Where trackio writes in this process (its TRACKIO_DIR as read at import); subprocesses inherit the same."""
    import trackio.utils

    return Path(trackio.utils.TRACKIO_DIR)


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """Every tracker on local storage under tmp_path; nothing reaches a network."""
    if "trackio" in INSTALLED:
        monkeypatch.setenv("TRACKIO_DIR", str(trackio_store()))
    (tmp_path / "wandb").mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    return tmp_path


# ---- reading back what each tracker stored -------------------------------------------------------------------------

def wandb_history(wandb_dir: Path) -> tuple[set[str], list[int], list[str]]:
    """(run ids, history steps in file order, config keys) over every offline run directory."""
    import wandb

    # run.finish() can return before wandb's service process has written the file; its teardown waits for it
    wandb.teardown()
    ids, steps, config = set(), [], []
    for f in sorted(glob.glob(str(wandb_dir / "wandb" / "offline-run-*" / "run-*.wandb"))):
        for rec in wandb_records(Path(f)):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                ids.add(rec.run.run_id)
                config += [u.key for u in rec.run.config.update]
            elif kind == "history":
                steps.append(rec.history.step.num)
    return ids, steps, config


def trackio_history(project: str) -> tuple[set[str], list[int], list[dict]]:
    db = sqlite3.connect(trackio_store() / f"{project}.db")
    try:
        rows = db.execute("select run_id, step from metrics order by id").fetchall()
        configs = db.execute("select config from configs").fetchall()
    finally:
        db.close()
    return {r for r, _ in rows}, [s for _, s in rows], [json.loads(c) for (c,) in configs]


def mlflow_history(uri: str, project: str, key: str) -> tuple[list[str], list[int], dict]:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(project).experiment_id])
    steps = [m.step for r in runs for m in client.get_metric_history(r.info.run_id, key)]
    return [r.info.run_id for r in runs], sorted(steps), runs[0].data.params if runs else {}


def history(name: str, tmp: Path, project: str) -> tuple[set, list[int]]:
    if name == "wandb":
        ids, steps, _ = wandb_history(tmp / "wandb")
        return ids, steps
    if name == "trackio":
        ids, steps, _ = trackio_history(project)
        return ids, steps
    ids, steps, _ = mlflow_history(f"sqlite:///{tmp / 'mlflow.db'}", project, "student/solve_rate")
    return set(ids), steps


# ---- config ---------------------------------------------------------------------------------------------------------

def test_report_to_accepts_lists_none_and_the_deprecated_tensorboard_flag():
    assert load_config(None, []).run.report_to == ["tensorboard"]
    assert load_config(None, ["--run.report_to=none"]).run.report_to == []
    assert load_config(None, ["--run.report_to=[]"]).run.report_to == []
    with pytest.warns(FutureWarning, match="run.report_to"):
        cfg = load_config(None, ["--run.tensorboard=false"])
    assert cfg.run.report_to == [] and cfg.run.tensorboard is None  # the saved config keeps only report_to
    with pytest.raises(ConfigError, match="did you mean 'wandb'"):
        load_config(None, ["--run.report_to=[tensorboard,wandbb]"])
    with pytest.raises(ConfigError, match="'none' cannot be combined"):
        load_config(None, ["--run.report_to=[none,tensorboard]"])


def test_a_tracker_that_is_not_installed_stops_the_run_at_config_load(monkeypatch):
    real = importlib.util.find_spec
    # stands in for an environment without the extra: the check must name the exact install command
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[mlflow\]'"):
        load_config(None, ["--run.report_to=[tensorboard,mlflow]"])


# ---- the logger with real trackers -----------------------------------------------------------------------------------

def _metrics(step: int) -> dict:
    return {"student/solve_rate": step / 10, "n_valid_tasks": step, "flag": True, "undefined": float("nan")}


@pytest.mark.parametrize("name", [pytest.param(n, marks=needs[n]) for n in ("wandb", "trackio", "mlflow")])
def test_a_resumed_logger_continues_one_run_and_sends_each_step_once(name, offline):
    """Steps 1-3 logged, then a resume from checkpoint 1 (metrics.jsonl cut back to step 1, as Trainer._restore
    does) repeats steps 2 and 3 and goes on to 4: the tracker must hold 1, 2, 3, 4 once each, in one run. Then a
    resume after the tracker lost steps it had been sent gets them again from metrics.jsonl."""
    project = f"t-{offline.name}"[:60]
    rd = RunDir(offline / "run")
    rd.create("run: {}\n")
    cfg = {"run": {"steps": 4, "report_to": [name]}}

    def process(steps):  # one training process: its logger, and at its end wandb's service writes its file
        lg = MetricsLogger(rd, [name], config=cfg, project=project)
        for s in steps:
            lg.log_step(s, _metrics(s))
        lg.close()
        if name == "wandb":
            import wandb

            wandb.teardown()

    process((1, 2, 3))
    first = rd.read_trackers()[name]
    assert first["last_step"] == 3 and first["id"]

    rd.truncate_logs(1)
    process((2, 3, 4))
    ids, steps = history(name, offline, project)
    assert sorted(steps) == [1, 2, 3, 4], steps
    assert ids == {first["id"]}
    assert rd.read_trackers()[name] == dict(first, last_step=4)

    # The tracker lost steps it had been sent. mlflow: trackers.json says it took only step 1 (steps 2-4 still
    # queued at a kill). wandb and trackio, whose own record counts: the files of the process that logged step 4
    # are gone (wandb's service died before writing them) / trackio's database lost steps 2-4 (its writer thread
    # died first).
    if name == "wandb":
        __import__("shutil").rmtree(max(glob.glob(str(offline / "wandb" / "wandb" / "offline-run-*"))))
        expect = [1, 2, 3, 4]
    elif name == "trackio":
        db = sqlite3.connect(trackio_store() / f"{project}.db")
        with db:
            db.execute("delete from metrics where step > 1")
        db.close()
        expect = [1, 2, 3, 4]
    else:
        rd.write_trackers({name: dict(first, last_step=1)})
        expect = [1, 2, 2, 3, 3, 4, 4]
    process(())
    ids, steps = history(name, offline, project)
    assert ids == {first["id"]}
    assert sorted(steps) == expect, steps


@needs["mlflow"]
def test_a_tracker_that_fails_mid_run_is_reported_once_and_the_run_goes_on(offline):
    """mlflow's store is destroyed after step 1 (as a full or lost disk would leave it): every later log call would
    fail; the failure is reported once, log_step never raises, metrics.jsonl keeps every step."""
    rd = RunDir(offline / "run")
    rd.create("run: {}\n")
    reports: list[str] = []
    lg = MetricsLogger(rd, [], project="p")
    from lorapop.train.trackers import Trackers

    lg.trackers = Trackers(rd, ["mlflow"], {"run": {"steps": 4}}, "p", "run", report=reports.append)
    lg.log_step(1, _metrics(1))
    lg.trackers.flush(600)  # its start (importing mlflow) can take long on a loaded machine
    assert not reports
    (offline / "mlflow.db").write_bytes(b"\0" * 4096)  # no longer a database
    for s in (2, 3, 4):
        lg.log_step(s, _metrics(s))
    lg.close()
    assert len(reports) == 1 and "mlflow" in reports[0] and "metrics.jsonl keeps every step" in reports[0], reports
    assert [json.loads(line)["step"] for line in (offline / "run" / "metrics.jsonl").read_text().splitlines()] == \
        [1, 2, 3, 4]
    assert rd.read_trackers()["mlflow"]["last_step"] == 1  # what a later --resume sends again from


# ---- a real run, killed and resumed ------------------------------------------------------------------------------

TINY = [
    "--population.n_teachers=1", "--population.n_students=1",
    "--selfplay.task_types=[code_o]", "--selfplay.tasks_per_type=2", "--selfplay.n_solve=1",
    "--selfplay.n_references=1", "--selfplay.seed_files=[]",
    "--selfplay.propose.max_new_tokens=16", "--selfplay.solve.max_new_tokens=8",
    "--engine.device=cpu", "--engine.gen_batch_size=8", "--evolve.burn_in_period=1000",
    "--run.steps=2", "--run.save_interval=1", "--run.progress=plain",
]


@pytest.mark.slow
@pytest.mark.skipif(not INSTALLED, reason="no tracker extra installed (wandb, trackio, mlflow)")
def test_a_run_killed_after_step_1_and_resumed_is_one_tracker_run_with_each_step_once(offline):
    project = f"kill-{offline.name}"[:60]
    args = TINY + [f"--run.output_dir={offline / 'runs'}", "--run.name=k", f"--run.project={project}",
                   f"--run.report_to=[tensorboard,{','.join(INSTALLED)}]"]
    env = dict(os.environ, LORAPOP_TEST_KILL_AT="step2:matchmake")
    cmd = [sys.executable, "-m", "lorapop.cli", "train"]
    p = subprocess.run(cmd + args, cwd=offline, env=env, capture_output=True, text=True, timeout=1800,
                       start_new_session=True)
    assert p.returncode == -signal.SIGKILL, p.stdout + p.stderr
    run = offline / "runs" / "k"
    state = RunDir(run).read_trackers()
    assert set(state) == set(INSTALLED) and all(s["last_step"] <= 1 for s in state.values()), state

    env.pop("LORAPOP_TEST_KILL_AT")
    p = subprocess.run(cmd + ["--resume", str(run)], cwd=offline, env=env, capture_output=True, text=True,
                       timeout=1800)
    assert p.returncode == 0, p.stdout + p.stderr
    assert not any(f"lorapop: {n}:" in p.stderr for n in INSTALLED), p.stderr
    final = RunDir(run).read_trackers()
    for name in INSTALLED:
        ids, steps = history(name, offline, project)
        # trackio's writer thread may die with the killed process before its run reaches the database; the resume
        # then starts that run under the same name (a new id), and it must still be the only one
        want = final[name]["id"] if name == "trackio" else state[name]["id"]
        assert ids == {want}, (name, ids)
        assert sorted(steps) == [1, 2], (name, steps)
    if "mlflow" in INSTALLED:  # the resolved config is the run's config
        _, _, params = mlflow_history(f"sqlite:///{offline / 'mlflow.db'}", project, "valid_rate")
        assert params["run.steps"] == "2" and params["population.n_students"] == "1"
    if "wandb" in INSTALLED:
        assert "selfplay" in wandb_history(offline / "wandb")[2]
    if "trackio" in INSTALLED:
        assert [c["population"]["n_students"] for c in trackio_history(project)[2]] == [1]
