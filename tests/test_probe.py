"""run.probe_interval on the embedded model: the capability probe writes probe.jsonl rows before step 1 (with the
noise floor) and after every probe step, changes nothing of what a run trains, and a resume drops the rows a killed
run wrote after its last checkpoint. The population side (the probe of a PBT step scores the members before their
replacement, a too-young child is marked, kills between probe rows and checkpoints) is checked on the killed run of
tests/test_resume.py, which already trains a population with PBT."""

from __future__ import annotations

import json

import pytest
import torch

from lorapop.config import load_config
from lorapop.train.loop import Trainer

pytestmark = pytest.mark.slow

TINY = ["--population.mode=single", "--selfplay.task_types=[code_o]", "--selfplay.tasks_per_type=2",
        "--selfplay.n_solve=2", "--selfplay.n_references=1", "--selfplay.propose.max_new_tokens=24",
        "--selfplay.solve.max_new_tokens=8", "--selfplay.seed_files=[seeds/expr_seed_io.jsonl]",
        "--engine.device=cpu", "--engine.dtype=float32",  # not auto: both runs must compute in the same dtype
        "--run.progress=none", "--run.report_to=none", "--run.steps=2", "--run.save_interval=1"]
PROBE = ["--run.probe_interval=1", "--run.probe_per_level=2", "--run.probe_samples=1"]


def _train(tmp_path, name, extra):
    cfg = load_config(None, TINY + extra + [f"--run.output_dir={tmp_path}", f"--run.name={name}"])
    with Trainer(cfg, tmp_path / name) as t:
        t.run()
        return cfg, {k: v[0].clone() for k, v in t.engine.get_adapter(0).items()}


def test_probe_rows_change_no_training_and_resume_truncates(tmp_path):
    cfg, probed = _train(tmp_path, "probed", PROBE)
    _, plain = _train(tmp_path, "plain", [])
    assert probed.keys() == plain.keys() and all(torch.equal(probed[k], plain[k]) for k in probed)
    assert not (tmp_path / "plain" / "probe.jsonl").exists()

    path = tmp_path / "probed" / "probe.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    scores = [r for r in rows if "noise_floor" not in r]
    assert sorted({r["step"] for r in scores}) == [0, 1, 2]  # before step 1, then after every step
    assert len(scores) == 3 * 6  # 3 probes x 2 tasks x 3 levels x the one agent
    assert {r["level"] for r in scores} == {1, 2, 3} and {r["role"] for r in scores} == {"agent"}
    assert all(0.0 <= r["score"] <= 1.0 for r in scores)
    assert len({r["task"] for r in scores}) == 6
    assert [(r["step"], r["age"], r["counted"]) for r in scores[::6]] == [(0, 0, True), (1, 1, True), (2, 2, True)]

    # the noise floor, once, on step 0: the one agent scored a second time with the next seeds (two replicates)
    floors = [r for r in rows if "noise_floor" in r]
    assert len(floors) == 1 and floors[0]["step"] == 0
    nf = floors[0]["noise_floor"]
    assert [r["member"] for r in nf["replicates"]] == ["a0", "a0"] and nf["identical"] and nf["tasks"] == 6
    first = sum(r["score"] for r in scores[:6]) / 6  # the first replicate is the step-0 rows themselves
    assert abs(nf["replicates"][0]["score"] - first) < 1e-12
    assert abs(nf["spread"] - abs(nf["replicates"][0]["score"] - nf["replicates"][1]["score"])) < 1e-12

    # a killed run may have probed past its last checkpoint (step 2): a resume drops those rows
    with open(path, "a") as fh:
        fh.write(json.dumps(dict(rows[0], step=3)) + "\n" + '{"step": 3, "torn')
    cfg.run.steps = 2
    with Trainer(cfg, tmp_path / "probed", resume=True) as t:
        assert t.step == 2
    assert [json.loads(x) for x in path.read_text().splitlines()] == rows
