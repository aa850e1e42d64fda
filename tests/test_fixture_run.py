"""A run directory written by the trainer before the run-directory refactor (``tests/fixtures/run_v1``: a real
``lorapop train cpu_demo`` shrunk to 1T+1S, rank 1 on v_proj, 2 steps, one checkpoint) still resumes, reports and
evaluates with today's code. If this fails, the run-directory format changed in a way old runs cannot follow.
Its config.yaml's ``tasks_per_type`` was raised from 1 to 2 when configs with one-sample TRR++ groups became refused
at load (such a run learns nothing), and its sampling top_p from 0.95 to 1.0 when trained rollouts sampled
in a nucleus became refused (the update scores the whole vocabulary, so they trained off-policy); the
checkpoint and logs are as written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lorapop.cli import main

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).parent / "fixtures" / "run_v1"


@pytest.fixture
def run(tmp_path) -> Path:
    dst = tmp_path / "run_v1"
    shutil.copytree(FIXTURE, dst)
    return dst


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def test_fixture_is_a_complete_run_of_two_steps():
    assert _steps(FIXTURE / "metrics.jsonl") == [1, 2]
    ck = FIXTURE / "checkpoints" / "step_000002"
    assert (ck / "COMPLETE").is_file() and (ck / "engine_state.pt").is_file()
    assert sorted(p.name for p in (ck / "adapters").iterdir()) == ["s0", "t0"]
    # small enough to live in git
    assert sum(p.stat().st_size for p in FIXTURE.rglob("*") if p.is_file()) < 1_200_000


def test_old_run_reports(run, capsys):
    assert main(["report", str(run)]) == 0
    html = (run / "report.html").read_text()
    for section in ("Rewards", "TrueSkill", "Lineage"):
        assert f">{section}<" in html
    for mid in ("t0", "s0"):
        assert f"<title>{mid}</title>" in html


def test_old_run_evaluates(run, data_dir, capsys):
    rc = main(["eval", str(run), "--benchmarks", "gsm8k", "--limit", "1", "--max-new-tokens", "4", "--device",
               "cpu", "--threads", "1", "--data-dir", str(data_dir)])
    assert rc == 0, capsys.readouterr()
    res = json.loads((run / "eval.json").read_text())
    (only,) = res["runs"]
    assert only["step"] == 2 and sorted(m["id"] for m in only["members"]) == ["s0", "t0"]
    assert {m["role"] for m in only["members"]} == {"teacher", "student"}
    assert all(m["benchmarks"]["gsm8k"]["n"] == 1 for m in only["members"])


def test_old_run_resumes_to_a_third_step(run):
    rc = main(["train", "--resume", str(run), "--run.steps=3", "--run.progress=none"])
    assert rc == 0
    assert _steps(run / "metrics.jsonl") == [1, 2, 3]
    assert (run / "checkpoints" / "step_000003" / "COMPLETE").is_file()
    pop = json.loads((run / "population.json").read_text())
    assert pop["step"] == 3 and [m["id"] for m in pop["members"]] == ["t0", "s0"]
