"""PEFT interchange: adapters the engine saves load in peft with the same logits, and adapters peft saves load in
the engine with the same logits. Fast on a tiny Llama; once more on the real embedded model (slow)."""

from __future__ import annotations

import json

import pytest
import torch

from lorapop.engine import EngineConfig, TorchEngine
from lorapop.engine.base import DEFAULT_TARGET_MODULES
from lorapop.engine.peft_io import AdapterFormatError, load_peft_adapter
from floattol import sum_tol
from test_engine_helpers import engine_logits, llama_reduction_length, logit_atol, randomize_peft_model, tiny_engine, \
    tiny_llama

IDS = [1, 20, 300, 4000, 5, 6, 7, 8000, 9]


def _peft_logits(peft_model, ids):
    with torch.no_grad():
        return peft_model(input_ids=torch.tensor([ids])).logits[0].float()


def test_engine_adapter_loads_in_peft_with_equal_logits(tmp_path):
    from peft import PeftModel

    eng = tiny_engine()
    path = eng.save_adapter(1, tmp_path / "a1")
    cfg = json.loads((path / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM" and cfg["r"] == 4
    assert cfg["lora_alpha"] == 8 and sorted(cfg["target_modules"]) == sorted(DEFAULT_TARGET_MODULES)
    assert cfg["base_model_name_or_path"] == eng.base_model_name and cfg["lora_dropout"] == 0 and cfg["bias"] == "none"
    weights, _ = load_peft_adapter(path)
    assert "model.layers.0.self_attn.q_proj" in weights
    from safetensors.torch import load_file

    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in load_file(str(path /
                                                                                          "adapter_model.safetensors"))
    plain, _ = tiny_llama(0)
    peft_model = PeftModel.from_pretrained(plain, str(path)).eval()
    want = engine_logits(eng, IDS, 1)
    assert not torch.allclose(want, engine_logits(eng, IDS, -1), atol=1e-3)  # the adapter does something
    torch.testing.assert_close(_peft_logits(peft_model, IDS), want, rtol=0, atol=logit_atol())


@pytest.mark.parametrize("alpha,targets", [(8, DEFAULT_TARGET_MODULES), (16, ["q_proj", "v_proj", "down_proj"])])
def test_peft_adapter_loads_in_engine_with_equal_logits(tmp_path, alpha, targets):
    from peft import LoraConfig, get_peft_model

    plain, _ = tiny_llama(0)
    pm = get_peft_model(plain, LoraConfig(r=4, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0,
                                          task_type="CAUSAL_LM")).eval()
    randomize_peft_model(pm, seed=3)
    pm.save_pretrained(str(tmp_path / "p"))
    eng = tiny_engine()  # slots hold other random adapters; loading must overwrite slot 2 entirely
    eng.load_adapter(2, tmp_path / "p")
    torch.testing.assert_close(engine_logits(eng, IDS, 2), _peft_logits(pm, IDS), rtol=0, atol=logit_atol())


def test_save_load_roundtrip_and_atomic_overwrite(tmp_path):
    eng = tiny_engine()
    eng.save_adapter(0, tmp_path / "x")
    eng.save_adapter(1, tmp_path / "x")  # overwrite in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]  # no temp dirs left behind
    eng.load_adapter(2, tmp_path / "x")
    assert torch.equal(engine_logits(eng, IDS, 2), engine_logits(eng, IDS, 1))


def test_load_errors_are_clear(tmp_path):
    eng = tiny_engine()
    with pytest.raises(FileNotFoundError, match="adapter_config.json is missing"):
        eng.load_adapter(0, tmp_path / "nope")
    other = tiny_engine(rank=2, lora_alpha=4)
    other.save_adapter(0, tmp_path / "r2")
    with pytest.raises(AdapterFormatError, match="rank mismatch: adapter at .* has r=2, the engine uses rank=4"):
        eng.load_adapter(0, tmp_path / "r2")
    eng.save_adapter(0, tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "adapter_config.json").read_text())
    (tmp_path / "d" / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    with pytest.raises(AdapterFormatError, match="use_dora"):
        eng.load_adapter(0, tmp_path / "d")
    with pytest.raises(IndexError, match="out of range"):
        eng.save_adapter(5, tmp_path / "y")


def test_load_rejects_modules_the_engine_does_not_adapt(tmp_path):
    small = TorchEngine(tiny_llama(0)[0], tiny_engine().tokenizer, 1,
                        EngineConfig(rank=4, lora_alpha=8, target_modules=["q_proj"], device="cpu"))
    tiny_engine().save_adapter(0, tmp_path / "full")
    with pytest.raises(AdapterFormatError, match="does not"):
        small.load_adapter(0, tmp_path / "full")


# ---------------------------------------------------------------- the real embedded model


@pytest.fixture(scope="module")
def real_pair():
    """An engine on its own fresh copy of the embedded model, plus a second plain copy for peft."""
    from lorapop.model import load_base_model

    from test_engine_helpers import randomize_adapters

    model, tok = load_base_model("embedded")
    eng = TorchEngine(model, tok, 2, EngineConfig(device="cpu"), seed=0)
    randomize_adapters(eng, seed=1, scale=0.05)
    plain, _ = load_base_model("embedded")
    return eng, plain


@pytest.mark.slow
def test_real_model_engine_to_peft_and_back(real_pair, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    eng, plain = real_pair
    ids = eng.chat_prompt("Write f(x) that returns x + 1.")[:24]
    eng.save_adapter(1, tmp_path / "e1")
    pm = PeftModel.from_pretrained(plain, str(tmp_path / "e1")).eval()
    want = engine_logits(eng, ids, 1)
    assert (want - engine_logits(eng, ids, -1)).abs().max() > 1e-2
    # SmolLM2-135M: 30 layers, hidden 576, intermediate 1536, head_dim 64, LoRA rank 16, 24 tokens
    atol = sum_tol(torch.float32, llama_reduction_length(576, 1536, 30, 64, 16, seq=24), float(want.abs().max()))
    torch.testing.assert_close(_peft_logits(pm, ids), want, rtol=0, atol=atol)
    plain = pm.unload()  # peft -> a fresh adapter made by peft itself

    pm2 = get_peft_model(plain, LoraConfig(r=16, lora_alpha=32, target_modules=list(DEFAULT_TARGET_MODULES),
                                           task_type="CAUSAL_LM")).eval()
    randomize_peft_model(pm2, seed=7, scale=0.05)
    pm2.save_pretrained(str(tmp_path / "p2"))
    eng.load_adapter(0, tmp_path / "p2")
    torch.testing.assert_close(engine_logits(eng, ids, 0), _peft_logits(pm2, ids), rtol=0, atol=atol)
