"""Shared builders for engine tests: a tiny random Llama (real HF model, real tokenizer) so engine logic runs in
milliseconds; the real embedded model is exercised by the slow integration tests."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile

import torch


@functools.lru_cache(maxsize=1)
def tokenizer():
    from transformers import AutoTokenizer

    from lorapop.model import prepare_model

    tok = AutoTokenizer.from_pretrained(str(prepare_model("embedded")))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


@functools.lru_cache(maxsize=None)
def _config_dir(cfg_json: str) -> str:
    """A local directory holding the tiny model's config.json, as its ``name_or_path``: peft's save_pretrained looks
    up the base model's config there (to see whether the vocabulary changed) and, given a bare name instead, asks
    the hub for it."""
    path = tempfile.mkdtemp(prefix="tiny-llama-test-")
    atexit.register(shutil.rmtree, path, True)
    with open(f"{path}/config.json", "w") as f:
        f.write(cfg_json)
    return path


def tiny_llama(seed: int = 0, tie: bool = True):
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    model.name_or_path = _config_dir(cfg.to_json_string())
    return model, tok


def randomize_adapters(engine, seed: int = 0, scale: float = 0.5, slots=None) -> None:
    """Non-zero B (and random A) so the LoRA path changes outputs."""
    g = torch.Generator().manual_seed(seed)
    slots = range(engine.n_adapters) if slots is None else slots
    for i in slots:
        w = {n: (torch.randn(a.shape, generator=g) * scale, torch.randn(b.shape, generator=g) * scale)
             for n, (a, b) in engine.get_adapter(i).items()}
        engine.set_adapter(i, w)


def tiny_engine(n_adapters: int = 3, seed: int = 0, randomize: bool = True, **cfg_kw):
    from lorapop.engine import EngineConfig, TorchEngine

    model, tok = tiny_llama(seed)
    cfg = EngineConfig(rank=cfg_kw.pop("rank", 4), lora_alpha=cfg_kw.pop("lora_alpha", 8), device="cpu", **cfg_kw)
    eng = TorchEngine(model, tok, n_adapters, cfg, seed=seed)
    if randomize:
        randomize_adapters(eng, seed)
    return eng


def engine_logits(engine, input_ids: list[int], adapter: int) -> torch.Tensor:
    """Full logits of one sequence through the engine's model under one adapter (-1 = base)."""
    engine._ctx.set(torch.tensor([adapter], device=engine.device))
    try:
        with torch.no_grad():
            return engine.model(input_ids=torch.tensor([input_ids], device=engine.device)).logits[0].float().cpu()
    finally:
        engine._ctx.set(None)


def randomize_peft_model(peft_model, seed: int = 0, scale: float = 0.3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
