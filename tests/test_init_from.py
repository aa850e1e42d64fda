"""population.init_from: which member starts from which adapter, the startup checks (rank, target modules, base
model) before anything loads, rank padding that keeps the weight delta, and (slow, on the embedded model) a run
initialised from a peft-saved adapter generating exactly what peft.PeftModel generates, with resume untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lorapop.adapters import InitPlan, Source, assign, fit_weights, plan_init, resolve_source
from lorapop.config import load_config
from lorapop.configlib import ConfigError
from lorapop.engine.peft_io import CONFIG_NAME, save_peft_adapter
from lorapop.records.members import Member, initial_members
from lorapop.commands.train import prepare_run_dir

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "run_v1"
POP = initial_members("population", 2, 2)


def adapter_dir(path: Path, *, rank: int = 2, alpha: float = 4, targets=("v_proj",), base: str | None = "embedded",
                d_in: int = 8, d_out: int = 4, seed: int = 0) -> Path:
    g = torch.Generator().manual_seed(seed)
    w = {f"model.layers.{i}.self_attn.{t}": (torch.randn(rank, d_in, generator=g), torch.randn(d_out, rank, generator=g))
         for i in range(2) for t in targets}
    return save_peft_adapter(w, path, rank=rank, lora_alpha=alpha, target_modules=list(targets),
                             base_model_name_or_path=base)


def test_assign_one_for_all_one_per_member_and_by_role_or_id():
    assert assign([], POP) == {}
    assert assign(["A"], POP) == {"t0": "A", "t1": "A", "s0": "A", "s1": "A"}
    assert assign(["A", "B", "C", "D"], POP) == {"t0": "A", "t1": "B", "s0": "C", "s1": "D"}
    # an id's entry wins over its role's; members named by neither start fresh
    assert assign(["student=runs/x:best", "s1=p/q"], POP) == {"s0": "runs/x:best", "s1": "p/q"}
    assert assign(["a0=runs/x:s2"], initial_members("single", 1, 1)) == {"a0": "runs/x:s2"}
    for bad, msg in ((["A", "B"], "2 sources for 4 members"), (["teacher=A", "B"], "not both"),
                     (["s5=A"], "s5 names no member"), (["student=A", "student=B"], "given twice"),
                     (["teacher="], "no source")):
        with pytest.raises(ConfigError, match=msg):
            assign(bad, POP)
    with pytest.raises(ConfigError, match="student names no member of this run .members: a0 .agent"):
        load_config(None, ["--population.mode=single", "--population.init_from=[student=x]"])
    assert load_config(None, ["--population.init_from=a/b"]).population.init_from == ["a/b"]


def test_sources_peft_dir_and_run_members(tmp_path):
    d = adapter_dir(tmp_path / "a")
    assert resolve_source(str(d)).dir == d and resolve_source(str(d)).picked is None
    best = resolve_source(f"{FIXTURE}:best")
    assert best.picked.member.id == "s0" and best.dir == FIXTURE / "checkpoints/step_000002/adapters/s0"
    assert resolve_source(f"{FIXTURE}:t0").picked.member.role == "teacher"
    with pytest.raises(ConfigError, match="is a run directory: name one of its members"):
        resolve_source(str(FIXTURE))
    with pytest.raises(ConfigError, match="no member 's4'"):
        resolve_source(f"{FIXTURE}:s4")
    with pytest.raises(ConfigError, match="neither a PEFT adapter directory"):
        resolve_source(str(tmp_path / "nothing"))


def _plan(entries, **kw):
    args = dict(rank=4, target_modules=["v_proj"], model_name="embedded")
    return plan_init(entries, POP, **{**args, **kw})


def test_mismatches_stop_at_startup_with_expected_and_found(tmp_path, capsys):
    big = adapter_dir(tmp_path / "r8", rank=8)
    with pytest.raises(ConfigError, match=r"rank mismatch: expected r <= 4 \(engine.rank\), found r=8"):
        _plan([str(big)])
    qv = adapter_dir(tmp_path / "qv", targets=("q_proj", "v_proj"))
    with pytest.raises(ConfigError, match=r"target-module mismatch: expected \['v_proj'\].*found \['q_proj', 'v_proj'\]"):
        _plan([str(qv)])
    other = adapter_dir(tmp_path / "other", base="Qwen/Qwen2.5-0.5B")
    with pytest.raises(ConfigError, match=r"base-model mismatch: expected 'embedded' .*found .*'Qwen/Qwen2.5-0.5B'"):
        _plan([f"s0={other}"])
    assert [p.member.id for p in _plan([f"s0={other}"], check_base=False)] == ["s0"]
    # the embedded model under its other names: the cache dir peft records, the hub id it quantises
    for name in ("/home/u/.cache/lorapop/models/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"):
        assert _plan([str(adapter_dir(tmp_path / name.replace("/", "_"), base=name))])
    small = _plan([str(adapter_dir(tmp_path / "r2", rank=2))])
    assert len(small) == 4 and "padded to 4" in small[0].notes[0]

    # through the CLI's path: refused before the run directory is made or any model loads
    cfg = load_config(None, [f"--population.init_from={big}", "--engine.rank=4", "--engine.target_modules=[v_proj]",
                             f"--run.output_dir={tmp_path / 'runs'}", "--run.name=x"])
    with pytest.raises(ConfigError, match="rank mismatch"):
        prepare_run_dir(cfg, resume=False)
    assert not (tmp_path / "runs" / "x").exists()

    # and by `lorapop train` itself: exit 2 with the reason, nothing written
    from lorapop.cli import main

    assert main(["train", f"--population.init_from=[s1={tmp_path / 'missing'}]", "--engine.target_modules=[v_proj]",
                 f"--run.output_dir={tmp_path / 'runs'}", "--run.name=y"]) == 2
    assert "neither a PEFT adapter directory" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "y").exists()


def test_fit_weights_pads_the_rank_and_rescales_so_the_delta_is_unchanged(tmp_path):
    src = adapter_dir(tmp_path / "a", rank=2, alpha=3.0, seed=4)  # scaling 1.5
    plan = InitPlan(Member("s0", 2, "student"), Source(str(src), src), json.loads((src / CONFIG_NAME).read_text()))
    like = {f"model.layers.{i}.self_attn.v_proj": (torch.zeros(6, 8), torch.zeros(4, 6)) for i in range(2)}
    fitted = fit_weights(plan, like, lora_alpha=12.0, generator=torch.Generator().manual_seed(0))  # scaling 2
    from lorapop.engine.peft_io import load_peft_adapter

    orig, _ = load_peft_adapter(src)
    for name, (a, b) in fitted.items():
        assert a.shape == (6, 8) and b.shape == (4, 6)
        assert torch.count_nonzero(a[2:]) == a[2:].numel()  # the new rank is PEFT-initialised: it can learn
        assert torch.count_nonzero(b[:, 2:]) == 0  # and adds nothing yet
        # float32 products of 8-term sums: equal to a few ulps of their magnitude
        torch.testing.assert_close(2.0 * b @ a, 1.5 * orig[name][1] @ orig[name][0], rtol=1e-5, atol=1e-5)
    with pytest.raises(ConfigError, match="target-module mismatch"):
        fit_weights(plan, {**like, "model.layers.2.self_attn.v_proj": like["model.layers.0.self_attn.v_proj"]},
                    lora_alpha=12.0, generator=torch.Generator())
    wide = {k: (torch.zeros(6, 16), b) for k, (_, b) in like.items()}
    with pytest.raises(ConfigError, match=r"base-model mismatch at .*expected A \[r, 16\].*found A \[2, 8\]"):
        fit_weights(plan, wide, lora_alpha=12.0, generator=torch.Generator())


# ---------------------------------------------------------------- the embedded model

@pytest.mark.slow
def test_run_from_a_peft_adapter_generates_what_peft_does_and_resume_keeps_its_checkpoint(tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    from lorapop.engine import SamplingParams, TorchEngine
    from lorapop.engine.base import chat_prompt_ids
    from lorapop.model import load_base_model
    from lorapop.train.loop import Trainer
    from test_engine_helpers import randomize_peft_model
    from test_export import NEW_TOKENS, PROMPTS, hf_greedy

    plain, tok = load_base_model("embedded")
    pm = get_peft_model(plain, LoraConfig(r=4, lora_alpha=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                                          task_type="CAUSAL_LM"))
    randomize_peft_model(pm, seed=11, scale=0.1)  # random nonzero A and B
    src = tmp_path / "sft"
    pm.save_pretrained(str(src))
    base = pm.unload()
    peft_model = PeftModel.from_pretrained(base, str(src)).eval()
    prompts = [chat_prompt_ids(tok, p) for p in PROMPTS]
    want = [hf_greedy(peft_model, p) for p in prompts]
    del peft_model, base, pm, plain

    # rank 8 > 4 (padded) and alpha 16 (scaling 2 where peft's is 1: B rescaled); only s0 starts from the adapter
    cfg = load_config(None, ["--population.n_teachers=1", "--population.n_students=1", "--engine.rank=8",
                             "--engine.lora_alpha=16", "--engine.target_modules=[q_proj, v_proj]",
                             "--engine.device=cpu", "--engine.dtype=float32", f"--population.init_from=[s0={src}]",
                             "--selfplay.task_types=[code_o]", "--coverage.n_cells=64",
                             "--coverage.kmeans_samples=2000", "--run.progress=none", "--run.tensorboard=false",
                             f"--run.output_dir={tmp_path / 'runs'}", "--run.name=init"])
    run_dir, resume = prepare_run_dir(cfg, resume=False)
    model, tok = load_base_model("embedded")
    eng = TorchEngine(model, tok, 2, cfg.engine, seed=0)
    with Trainer(cfg, run_dir, engine=eng) as trainer:
        assert trainer.init_from["s0"]["source"] == str(src) and "t0" not in trainer.init_from
        outs = eng.generate(prompts * 3, [1] * 3 + [0] * 3 + [-1] * 3,
                            SamplingParams(max_new_tokens=NEW_TOKENS, greedy=True))
        s0, t0, base = ([o.token_ids for o in outs[i:i + 3]] for i in (0, 3, 6))
        assert s0 != base, "the adapter must change greedy outputs, else the comparison shows nothing"
        assert s0 == want  # s0 = peft.PeftModel with the adapter, token for token
        assert t0 == base  # t0 is fresh LoRA: exactly the base
        started = eng.get_adapter(1)
        trainer.save_checkpoint()
    state = json.loads((run_dir / "checkpoints" / "step_000000" / "trainer_state.json").read_text())
    assert state["init_from"]["s0"]["r"] == 4

    # a resume reads its checkpoint, never the source again (gone here), and keeps the record
    import shutil

    shutil.rmtree(src)
    eng.set_adapter(1, {k: (torch.zeros_like(a), torch.zeros_like(b)) for k, (a, b) in started.items()})
    with Trainer(cfg, run_dir, resume=True, engine=eng) as trainer:
        assert trainer.init_from["s0"]["source"] == str(src)
        for k, (a, b) in eng.get_adapter(1).items():
            assert torch.equal(a, started[k][0]) and torch.equal(b, started[k][1])
    eng.close()
