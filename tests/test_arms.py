"""bench/arms.py end to end on the embedded model at a tiny shape: two arms (the single agent and the no-update
arm) of one seed, their run directories and the report; the null arm's adapters never leave the base; and a second
invocation finds both runs finished and trains nothing."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
# one task type: what this test checks (runs, report, criteria, null arm, resume) is the same for each of the three
TINY = ["--selfplay.task_types=[code_o]", "--selfplay.tasks_per_type=2", "--selfplay.n_solve=2",
        "--selfplay.propose.max_new_tokens=32", "--selfplay.solve.max_new_tokens=16", "--run.probe_interval=0",
        "--run.progress=none", "--engine.device=cpu", "--run.save_interval=1"]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_arms", ROOT / "bench" / "arms.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _lora(run_dir: Path) -> dict[str, dict]:
    from lorapop.records.rundir import RunDir

    ckpt = RunDir(run_dir).latest_checkpoint()
    return {d.name: load_file(str(d / "adapter_model.safetensors")) for d in sorted((ckpt / "adapters").iterdir())}


def test_two_arms_run_report_and_resume(tmp_path, capsys):
    arms = _bench()
    argv = ["--seeds", "0", "--arms", "single,null", "--out", str(tmp_path), "--steps", "2"] + TINY
    out = arms.main(argv)

    seed = tmp_path / "seed0"
    for arm in ("single", "null"):
        assert (seed / arm / "config.yaml").is_file() and arms.done_steps(seed / arm) == 2
    for arm in ("single", "null"):
        wall = json.loads((seed / arm / "wall.json").read_text())
        assert wall["wall_s"] > 0 and [(r["from_step"], r["to_step"]) for r in wall["sessions"]] == [(0, 2)]
    # the report: per seed, per arm, the raw curves and the last probe (none: the probe is off here)
    figs = out["per_seed"]["seed0"]["arms"]
    assert set(figs) == {"single", "null"}
    for f in figs.values():
        assert f["steps"] == 2 and [s for s, _ in f["valid_rate"]] == [1, 2]
        assert {"matched_solve_rate", "mixed_share", "n_valid_tasks", "ast_depth", "probe"} <= set(f)
        assert f["last_probe"] is None
        assert all(0.0 <= v <= 1.0 for _, v in f["mixed_share"])
    assert json.loads((tmp_path / "arms.json").read_text())["per_seed"]["seed0"]["arms"].keys() == figs.keys()
    assert out["per_seed"]["seed0"]["wall"].keys() == figs.keys()
    assert all(out["per_seed"]["seed0"]["compute_s"][a] > 0 for a in figs)
    assert (tmp_path / "arms.svg").read_text().startswith("<svg")
    # criteria.json: two steps are too few to judge, and the arms that did not run are named
    crit = json.loads((tmp_path / "criteria.json").read_text())
    assert crit["per_seed"]["seed0"]["learning.single"]["held"] is None
    assert "2T+2S" in crit["per_seed"]["seed0"]["population.vs_single"]["why"]
    assert crit["across_seeds"]["null.flat"]["unjudged"] == 1

    # the null arm: lr 0 and no PBT round, so every adapter is still the base (LoRA B = 0) and nobody was replaced
    null_cfg = (seed / "null" / "config.yaml").read_text()
    assert "lr: 0" in null_cfg and "burn_in_period: 3" in null_cfg
    null = _lora(seed / "null")
    assert sorted(null) == ["s0", "s1", "t0", "t1"]
    for tensors in null.values():
        bs = [v for k, v in tensors.items() if "lora_B" in k]
        assert bs and all(not b.any() for b in bs)
    # lr 0 skips the update stage itself (no train/ metric), while the single agent trained
    null_metrics = [json.loads(x) for x in (seed / "null" / "metrics.jsonl").read_text().splitlines()]
    single_metrics = [json.loads(x) for x in (seed / "single" / "metrics.jsonl").read_text().splitlines()]
    assert not any(k.startswith("train/") for r in null_metrics for k in r)
    assert any(k.startswith("train/") for r in single_metrics for k in r)
    # while the same two steps at the config's lr moved the single agent
    single = _lora(seed / "single")
    assert any(v.any() for t in single.values() for k, v in t.items() if "lora_B" in k)

    # a second invocation trains nothing: both runs are finished
    before = {arm: (seed / arm / "metrics.jsonl").stat().st_mtime_ns for arm in ("single", "null")}
    capsys.readouterr()
    arms.main(argv)
    said = capsys.readouterr().out
    assert "seed 0 single: done (2 steps), skipped" in said and "seed 0 null: done (2 steps), skipped" in said
    assert {arm: (seed / arm / "metrics.jsonl").stat().st_mtime_ns for arm in before} == before
    assert len(json.loads((seed / "single" / "wall.json").read_text())["sessions"]) == 1
