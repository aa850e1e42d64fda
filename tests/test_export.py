"""`lorapop export`: which member is best, the PEFT directory and model card, complete checkpoints only, and (slow, on
the embedded model) greedy outputs of lorapop's engine, of peft on the export and of transformers on the merged export
agreeing token for token."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lorapop.adapters import best_member, checkpoint_ratings, pick_members
from lorapop.cli import main
from lorapop.config import config_to_yaml, load_config
from lorapop.configlib import to_dict
from lorapop.engine.peft_io import CONFIG_NAME, WEIGHTS_NAME, save_peft_adapter
from lorapop.commands.export import export
from lorapop.records.rundir import ADAPTERS, TRAINER_STATE, RunDir, write_json_atomic
from lorapop.records import RunDirError
from lorapop.records.members import initial_members

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "run_v1"


def tiny_adapter(seed: int, rank: int = 2) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {f"model.layers.{i}.self_attn.v_proj": (torch.randn(rank, 8, generator=g), torch.randn(4, rank, generator=g))
            for i in range(2)}


def write_checkpoint(rd: RunDir, step: int, ratings: dict[str, tuple[float, float]], cfg, complete: bool = True,
                     seed: int = 0) -> Path:
    """A checkpoint as the trainer lays it out (adapters/<id>/ PEFT, trainer_state.json), members with the given
    (mu, sigma). ``complete=False`` leaves it as the temp dir a process killed mid-write leaves behind."""
    members = [m for m in initial_members(cfg.population.mode, cfg.population.n_teachers, cfg.population.n_students)]
    state = {"step": step, "config": to_dict(cfg), "population": {"members": [m.to_json() for m in members]},
             "ratings": {k: [mu, sigma, 3] for k, (mu, sigma) in ratings.items()}}
    if not complete:
        tmp = rd.checkpoints / f".tmp-step_{step:06d}-999"
        for i, m in enumerate(members):
            save_peft_adapter(tiny_adapter(seed + 100 + i), tmp / ADAPTERS / m.id, rank=2, lora_alpha=4,
                              target_modules=["v_proj"])
        write_json_atomic(tmp / TRAINER_STATE, state)
        return tmp
    with rd.new_checkpoint(step) as tmp:
        for i, m in enumerate(members):
            save_peft_adapter(tiny_adapter(seed + i), tmp / ADAPTERS / m.id, rank=2, lora_alpha=4,
                              target_modules=["v_proj"])
        write_json_atomic(tmp / TRAINER_STATE, state)
    return rd.checkpoints / f"step_{step:06d}"


def make_run(tmp_path: Path, overrides: list[str], name: str = "r") -> tuple[RunDir, object]:
    cfg = load_config(None, overrides + ["--engine.rank=2", "--engine.lora_alpha=4", "--engine.target_modules=[v_proj]",
                                         f"--run.output_dir={tmp_path}", f"--run.name={name}"])
    rd = RunDir(tmp_path / name)
    rd.create(config_to_yaml(cfg))
    return rd, cfg


def test_best_is_the_student_with_the_highest_mu_minus_3_sigma(tmp_path):
    rd, cfg = make_run(tmp_path, ["--population.n_teachers=3", "--population.n_students=3"])
    # s1 has the highest mu but is unsure; s2 has the highest mu - 3 sigma; t0 beats every student and is no candidate
    ratings = {"t0": (40.0, 1.0), "t1": (20.0, 5.0), "t2": (20.0, 5.0),
               "s0": (24.0, 6.0), "s1": (30.0, 8.0), "s2": (27.0, 2.0)}
    ckpt = write_checkpoint(rd, 4, ratings, cfg)
    r = checkpoint_ratings(rd, ckpt)
    assert r["s2"].expose == pytest.approx(27.0 - 3 * 2.0) and r["s1"].expose == pytest.approx(30.0 - 24.0)
    (best,) = pick_members(rd.path, "best")
    assert best.member.id == "s2" and best.is_best and best.step == 4
    # a tie on expose goes to the higher mu, then the lower slot
    members = rd.checkpoint_members(ckpt)
    tie = dict(r, s0=type(r["s0"])(27.0, 2.0, 21.0), s2=type(r["s2"])(27.0, 2.0, 21.0))
    assert best_member(members, tie).id == "s0"
    assert [p.member.id for p in pick_members(rd.path, "all")] == ["s0", "s1", "s2", "t0", "t1", "t2"]
    with pytest.raises(RunDirError, match="no member 's7'.*s0, s1, s2"):
        pick_members(rd.path, "s7")


def test_best_of_a_single_run_is_the_agent_and_is_printed(tmp_path, capsys):
    rd, cfg = make_run(tmp_path, ["--population.mode=single"])
    write_checkpoint(rd, 2, {"a0": (26.0, 7.0)}, cfg)
    assert main(["export", str(rd.path), "--member", "best", "--to", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "best: a0 at step 2 (the agent (single mode))" in out and "expose 5.00" in out
    assert (tmp_path / "out" / CONFIG_NAME).is_file()


def test_peft_export_files_and_model_card(tmp_path):
    run = tmp_path / "run_v1"
    shutil.copytree(FIXTURE, run)
    write_json_atomic(run / "eval.json", {"base": {"scores": {"mbpp_plus": 0.25, "aggregate": 0.25}},
                                          "runs": [{"step": 2, "members": [
                                              {"id": "s0", "role": "student",
                                               "scores": {"mbpp_plus": 0.3125, "aggregate": 0.3125}}]}]})
    (out,) = export(run, "best", tmp_path / "best", out=lambda *_: None)
    src = run / "checkpoints" / "step_000002" / ADAPTERS / "s0"
    assert (out / WEIGHTS_NAME).read_bytes() == (src / WEIGHTS_NAME).read_bytes()
    cfg = json.loads((out / CONFIG_NAME).read_text())
    assert cfg["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert (cfg["r"], cfg["lora_alpha"], cfg["target_modules"]) == (1, 2.0, ["v_proj"])
    assert all(k.startswith("base_model.model.") and k.endswith((".lora_A.weight", ".lora_B.weight"))
               for k in load_file(str(out / WEIGHTS_NAME)))
    card = (out / "README.md").read_text()
    for want in ("base_model: HuggingFaceTB/SmolLM2-135M-Instruct", "library_name: peft", "step 2",
                 "role student", "mu 25.000, sigma 8.333, expose 0.000", "| mbpp_plus | 0.312 | 0.250 |",
                 "rank: 1", "--lora-modules s0=", "Q4_1"):
        assert want in card, want
    # an existing target is refused, nothing is overwritten
    with pytest.raises(FileExistsError, match="already exists"):
        export(run, "s0", out, out=lambda *_: None)
    assert main(["export", str(run), "--member", "s9", "--to", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()
    (b,) = export(run, "s0", tmp_path / "named", base_name="/models/smol", out=lambda *_: None)
    assert json.loads((b / CONFIG_NAME).read_text())["base_model_name_or_path"] == "/models/smol"


def test_export_of_a_run_still_training_reads_only_complete_checkpoints(tmp_path):
    rd, cfg = make_run(tmp_path, ["--population.n_teachers=1", "--population.n_students=2",
                                  "--population.require_equal=false"])
    write_checkpoint(rd, 2, {"t0": (25, 8), "s0": (25, 8), "s1": (26, 8)}, cfg, seed=0)
    # step 3 is being written (temp dir), step 4 lost its COMPLETE marker: neither exists for a reader, though
    # either would change the answer (s0 best there, other weights)
    write_checkpoint(rd, 3, {"t0": (25, 8), "s0": (40, 1), "s1": (20, 8)}, cfg, complete=False, seed=50)
    four = write_checkpoint(rd, 4, {"t0": (25, 8), "s0": (40, 1), "s1": (20, 8)}, cfg, seed=70)
    (four / "COMPLETE").unlink()
    lines: list[str] = []
    written = export(rd.path, "best", tmp_path / "out", out=lines.append)
    assert lines[0].startswith("best: s1 at step 2")
    want = rd.checkpoints / "step_000002" / ADAPTERS / "s1" / WEIGHTS_NAME
    assert (written[0] / WEIGHTS_NAME).read_bytes() == want.read_bytes()
    assert [p.name for p in export(rd.path, "all", tmp_path / "all", out=lines.append)] == ["s0", "s1", "t0"]
    with pytest.raises(RunDirError, match=r"no checkpoint for step 3 .*have: \[2\]"):
        export(rd.path, "s0", tmp_path / "three", step=3, out=lines.append)


# ---------------------------------------------------------------- the embedded model

PROMPTS = ["Write a Python function that returns the square of x.", "What is 12 + 30?",
           "Name three colors."]
NEW_TOKENS = 12  # HF generate dominates these tests' time


def hf_greedy(model, prompt_ids: list[int]) -> list[int]:
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, len(prompt_ids):].tolist()


@pytest.mark.slow
def test_engine_peft_export_and_merged_export_agree_token_for_token(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from lorapop.engine import EngineConfig, SamplingParams, TorchEngine
    from lorapop.model import load_base_model

    run = tmp_path / "run_v1"
    shutil.copytree(FIXTURE, run)
    # s0 trained 2 steps at lr 1e-4: too close to the base to tell anything apart. Give it seeded weights large enough
    # to change greedy outputs (checked below), written by the trainer's own PEFT writer.
    src = run / "checkpoints" / "step_000002" / ADAPTERS / "s0"
    g = torch.Generator().manual_seed(5)
    weights = {f"model.layers.{i}.self_attn.v_proj": (torch.randn(1, 576, generator=g) * 0.05,
                                                      torch.randn(192, 1, generator=g) * 0.5) for i in range(30)}
    save_peft_adapter(weights, src, rank=1, lora_alpha=2.0, target_modules=["v_proj"])

    peft_dir, merged_dir = tmp_path / "peft", tmp_path / "merged"
    export(run, "s0", peft_dir, out=lambda *_: None)
    export(run, "s0", merged_dir, merge=True, dtype="float32", out=lambda *_: None)

    model, tok = load_base_model("embedded")  # float32: the three paths then differ only by fp32 rounding order
    eng = TorchEngine(model, tok, 1, EngineConfig(rank=1, lora_alpha=2.0, target_modules=["v_proj"], device="cpu",
                                                  dtype="float32"))
    eng.load_adapter(0, src)
    prompts = [eng.chat_prompt(p) for p in PROMPTS]
    outs = eng.generate(prompts + prompts, [0] * 3 + [-1] * 3, SamplingParams(max_new_tokens=NEW_TOKENS, greedy=True))
    ours, base = [o.token_ids for o in outs[:3]], [o.token_ids for o in outs[3:]]
    eng.close()  # the model is the plain base again
    assert ours != base, "the adapter must change greedy outputs, else the comparison shows nothing"

    pm = PeftModel.from_pretrained(model, str(peft_dir)).eval()
    assert [hf_greedy(pm, p) for p in prompts] == ours
    pm.unload()

    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir)).eval()
    assert merged.dtype == torch.float32
    assert [hf_greedy(merged, p) for p in prompts] == ours
    for f in ("config.json", "generation_config.json", "tokenizer.json", "model.safetensors", "README.md"):
        assert (merged_dir / f).is_file(), f
