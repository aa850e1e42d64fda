"""`lorapop retention` end to end at a tiny size: real embedded model, real PEFT checkpoint, real operators and sandbox;
then `lorapop report` renders the retention section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A population run's checkpoint with two trained-looking students (non-zero B) and ratings that make s1 the
    best by expose, written through lorapop.rundir as the trainer writes it."""
    import torch

    from lorapop.config import config_to_yaml, load_config
    from lorapop.engine import EngineConfig, TorchEngine
    from lorapop.model import load_base_model
    from lorapop.rundir import ADAPTERS, TRAINER_STATE, Member, RunDir, write_json_atomic

    model, tok = load_base_model("embedded")
    eng = TorchEngine(model, tok, 3, EngineConfig(rank=4, lora_alpha=8, device="cpu"))
    g = torch.Generator().manual_seed(0)
    for i in range(3):
        w = eng.get_adapter(i)
        eng.set_adapter(i, {n: (a, torch.randn(b.shape, generator=g) * 0.002) for n, (a, b) in w.items()})
    root = tmp_path_factory.mktemp("ret") / "run"
    rd = RunDir(root)
    rd.create(config_to_yaml(load_config(None, ["--engine.rank=4", "--engine.lora_alpha=8"])))
    members = [Member("t0", 0, "teacher"), Member("s0", 1, "student"), Member("s1", 2, "student")]
    with rd.new_checkpoint(2) as tmp:
        for m in members:
            eng.save_adapter(m.slot, tmp / ADAPTERS / m.id)
        write_json_atomic(tmp / TRAINER_STATE, {"step": 2, "population": {"members": [m.to_json() for m in members]},
                                                "ratings": {"t0": [30.0, 2.0], "s0": [24.0, 3.0],
                                                            "s1": [27.0, 2.0]}})
    rd.write_population(2, [m.to_json() for m in members], [])
    eng.close()
    return root


def test_retention_cli_writes_json_and_report_section(run_dir, capsys):
    from lorapop.cli import main
    from lorapop.evolve.retention import rank_members
    from lorapop.rundir import RunDir

    ranked = rank_members(run_dir, RunDir(run_dir).find_checkpoint(), "student")
    assert [m.id for m, _ in ranked] == ["s1", "s0"]  # expose 21 > 15
    rc = main(["retention", str(run_dir), "--operators", "full_gaussian", "average", "--steps", "1",
               "--tasks-per-step", "2", "--n-samples", "2", "--heldout", "3", "--max-new-tokens", "12",
               "--group-size", "3"])
    assert rc == 0
    out = json.loads((run_dir / "retention.json").read_text())
    assert out["parent"] == "s1" and out["second_parent"] == "s0"
    assert list(out["arms"]) == ["continuation", "full_gaussian", "average"]
    for name, arm in out["arms"].items():
        assert len(arm["heldout"]) == 2 and len(arm["train_reward"]) == 1, name  # after operator + each step
        assert all(0.0 <= v <= 1.0 for v in arm["heldout"])
        rec = arm["recovered_step"]
        assert rec is None or 0 <= rec <= 1
    assert out["arms"]["average"]["record"]["n_parents"] == 2
    assert out["arms"]["full_gaussian"]["record"]["id"] == "M4"
    assert "not recovered" in capsys.readouterr().out or all(
        a["recovered_step"] is not None for a in out["arms"].values())

    assert main(["report", str(run_dir)]) == 0
    html = (run_dir / "report.html").read_text()
    section = html.split('<section id="retention">')[1].split("</section>")[0]
    assert "Held-out solve rate after the operator" in section
    for name in out["arms"]:
        assert f"<title>{name}</title>" in section or name in section
    assert section.count('<g class="series"') >= 3


def test_retention_rejects_bad_input_clearly(run_dir, capsys):
    from lorapop.cli import main

    assert main(["retention", str(run_dir), "--operators", "nope", "--steps", "1"]) == 2
    assert "unknown operator" in capsys.readouterr().err
    assert main(["retention", str(run_dir), "--member", "t0", "--steps", "1"]) == 2
    assert "not a student" in capsys.readouterr().err
    assert main(["retention", str(run_dir.parent / "missing"), "--steps", "1"]) == 2
