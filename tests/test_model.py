"""Base model resolution and loading (lorapop/model.py)."""

from __future__ import annotations

import time

import pytest
import torch

from lorapop.model import ModelNotFoundError, embedded_gguf_path, load_base_model, prepare_model

IDS = torch.tensor([[1, 504, 3458, 28, 601, 1010, 45, 11, 7, 2]])


@pytest.mark.slow
def test_cached_safetensors_copy_has_the_gguf_logits(embedded_model):
    from transformers import AutoModelForCausalLM

    gguf = embedded_gguf_path()
    direct = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    model, _ = embedded_model
    with torch.no_grad():
        assert torch.equal(model(input_ids=IDS).logits, direct(input_ids=IDS).logits)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)


@pytest.mark.slow
def test_local_checkpoint_dir_loads_frozen(embedded_model):
    path = prepare_model("embedded")
    assert (path / "config.json").is_file() and any(path.glob("*.safetensors"))
    model, tok = load_base_model(str(path))
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert tok.pad_token_id is not None and tok.eos_token == "<|im_end|>"
    assert model.config.tie_word_embeddings and model.config.num_hidden_layers == 30
    with torch.no_grad():
        assert torch.equal(model(input_ids=IDS).logits, embedded_model[0](input_ids=IDS).logits)


def test_missing_gguf_file_is_named():
    with pytest.raises(ModelNotFoundError, match=r"model file not found: /nonexistent/x\.gguf"):
        load_base_model("/nonexistent/x.gguf")


def test_missing_directory_is_named():
    with pytest.raises(ModelNotFoundError, match="model path not found: /nonexistent/model_dir"):
        load_base_model("/nonexistent/model_dir")


def test_directory_without_config_is_rejected(tmp_path):
    with pytest.raises(ModelNotFoundError, match="not a model checkpoint directory"):
        load_base_model(str(tmp_path))


def test_unreachable_hub_id_fails_fast_and_says_to_use_a_local_path(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.time()
    with pytest.raises(ModelNotFoundError, match="local checkpoint directory"):
        load_base_model("someorg/somemodel")
    assert time.time() - t0 < 30


def test_loading_a_model_leaves_scikit_learn_unimported():
    """transformers imports sklearn.metrics at import when scikit-learn is installed (pyribs installs it),
    1 to 2 s of every lorapop command's start; lorapop.model.import_transformers keeps it out and puts
    transformers' own check back. In a fresh interpreter, since this one may have imported either already."""
    import importlib.util
    import subprocess
    import sys

    assert importlib.util.find_spec("sklearn") is not None  # else this test proves nothing (pyribs requires it)
    code = ("import sys\nfrom lorapop.model import load_base_model\n"
            "model, _ = load_base_model('embedded')\nimport transformers.utils as tu\n"
            "print('sklearn' in sys.modules, tu.is_sklearn_available())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "False True", out.stdout
