"""Shared builders for engine tests: a tiny random Llama (real HF model, real tokenizer) so engine logic runs in
milliseconds; the real embedded model is exercised by the slow integration tests."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile

import torch

from floattol import sum_tol


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


def llama_reduction_length(hidden: int, intermediate: int, layers: int, head_dim: int, rank: int, seq: int) -> int:
    """The longest chain of summed terms to one logit of a Llama with LoRA on every projection (the k of
    tests/floattol.py): per layer RMSNorm (hidden), q/k/v with their LoRA (hidden + hidden + rank), the attention
    scores (head_dim) and their weighted sum (seq), o_proj with LoRA, RMSNorm, gate/up with LoRA, down with LoRA
    (intermediate + intermediate + rank); then the final RMSNorm and lm_head (hidden each)."""
    def lora(k):
        return k + k + rank

    return layers * (hidden + lora(hidden) + head_dim + seq + lora(hidden) + hidden + lora(hidden)
                     + lora(intermediate)) + 2 * hidden


VOCAB = 49152  # SmolLM2's tokenizer, which the tiny Llama shares
K_TINY = llama_reduction_length(32, 48, 2, 8, 4, seq=128)  # tiny_llama below, prompts under 128 tokens
# A LoRA gradient: the forward path, back through it, the softmax over the vocabulary and the sum over tokens.
K_TINY_GRAD = 2 * K_TINY + VOCAB + 128
# The embedded SmolLM2-135M: 30 layers, hidden 576, intermediate 1536, head_dim 64, LoRA rank 16, prompts under 128
# tokens, batches under 8 x 128 tokens; its logits stay under 30.
K_REAL = llama_reduction_length(576, 1536, 30, 64, 16, seq=128)
K_REAL_GRAD = 2 * K_REAL + VOCAB + 8 * 128
REAL_LOGIT_SCALE = 30.0


def logit_atol(k: int = K_TINY, scale: float = 1.0) -> float:
    """Two computations of one float32 logit (the tiny Llama's logits are under 1: scale 1)."""
    return sum_tol(torch.float32, k, scale)


def logprob_atol(k: int = K_TINY, scale: float = 1.0) -> float:
    """Two computations of one log-probability: the logit's, plus log-sum-exp over the vocabulary (the sum's
    relative error is the log's absolute error)."""
    return logit_atol(k, scale) + sum_tol(torch.float32, VOCAB)


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


def assert_greedy_agrees(got: list[int], ref: list[int], engine, prompt: list[int], adapter: int,
                         atol: float | None = None) -> None:
    """Greedy tokens of two computations (batched vs alone, engine vs Hugging Face) agree up to the first step whose
    two best logits are within rounding of each other (2 x ``atol``, default the tiny Llama's logit_atol: either may
    come out on top depending on the processor's summation order); after such a near-tie the continuations may
    differ legitimately."""
    atol = logit_atol() if atol is None else atol
    logits = engine_logits(engine, prompt + ref, adapter)[len(prompt) - 1:-1]  # the logits each ref token won
    top2 = logits.topk(2, dim=-1).values
    ties = [i for i, (a, b) in enumerate(top2.tolist()) if a - b <= 2 * atol]
    if ties:  # the tied step itself may go either way: compare what precedes it
        assert got[:ties[0]] == ref[:ties[0]], (got, ref, ties)
    else:
        assert got == ref


def randomize_peft_model(peft_model, seed: int = 0, scale: float = 0.3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
