"""The GPU path's memory and stop-token checks that a CPU can run."""

from __future__ import annotations

import torch

from test_engine_helpers import tiny_engine

GIB = 2**30


def _fake_cuda(monkeypatch, *, free, segments, cache=None):
    """torch.cuda's memory functions as a GPU with ``free`` bytes unused by the driver and the allocator holding
    ``segments`` would report them (reserved/allocated derived from the same segments, as the allocator does)."""
    reserved = sum(s["total_size"] for s in segments)
    allocated = sum(s["allocated_size"] for s in segments)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated)
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda *a, **k: segments)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_kv_budget_leaves_out_cuda_graph_pool_memory(monkeypatch):
    """A reduce-overhead graph's private pool is reserved but unallocated between replays; it cannot back a new
    cache, so it must not enter the budget (the old reserved - allocated figure counted its 20 GiB)."""
    eng = tiny_engine()
    eng.cfg.kv_cache_memory_fraction = 0.5
    segments = [
        # default pool: 8 GiB cached, 2 GiB of it in use -> 6 GiB a new tensor can reuse
        {"device": 0, "segment_pool_id": (0, 0), "total_size": 8 * GIB, "allocated_size": 2 * GIB},
        # a CUDA graph's private pool: 20 GiB reserved, 1 GiB live between replays
        {"device": 0, "segment_pool_id": (1, 0), "total_size": 20 * GIB, "allocated_size": 1 * GIB},
        # another device's segment never counts
        {"device": 1, "segment_pool_id": (0, 0), "total_size": 30 * GIB, "allocated_size": 0},
    ]
    _fake_cuda(monkeypatch, free=10 * GIB, segments=segments)
    eng.device = eng.kv.device = torch.device("cuda", 0)  # the engine and its cache keeper
    try:
        assert eng.kv_budget_bytes() == int(0.5 * (10 + 6) * GIB)
    finally:
        eng.device = eng.kv.device = torch.device("cpu")


def test_kv_budget_counts_the_current_cache_as_free(monkeypatch):
    eng = tiny_engine()
    eng.cfg.kv_cache_memory_fraction = 1.0
    dec = eng.decoder()
    eng._kv_cache(40)
    held = sum(t.numel() * t.element_size() for t in eng._cache.k + eng._cache.v)
    segments = [{"device": 0, "segment_pool_id": (0, 0), "total_size": 4 * GIB, "allocated_size": 4 * GIB}]
    _fake_cuda(monkeypatch, free=GIB, segments=segments)
    eng.device = eng.kv.device = torch.device("cuda", 0)  # the engine and its cache keeper
    try:
        assert eng.kv_budget_bytes() == GIB + held  # its bytes are freed before the new cache is allocated
    finally:
        eng.device = eng.kv.device = torch.device("cpu")
    assert dec is eng._dec


def test_plan_and_engine_size_the_kv_cache_with_one_function(monkeypatch):
    """`lorapop plan` and the engine decide the cache's kind and size by one function (kvsize.kv_cache_plan) over
    the memory free at the first generate: where the plan says a card leaves F bytes free beside the resident state
    it measured, the engine under torch.cuda reporting F free picks the same kind,
    slots, capacity, pages and bytes, across cards that give a static cache, a paged one and none."""
    import copy

    from lorapop.engine.decode import StaticKVCache
    from lorapop.engine.kvsize import CUDA_RESERVED_BYTES
    from lorapop.plan import engine_kv_cache
    from lorapop.plan.measure import Measured, measure_phases

    eng = tiny_engine(gen_batch_size=6, max_model_len=200, kv_cache_memory_fraction=0.5)
    dec = eng.decoder()
    m = measure_phases(eng.model.config, eng.n_adapters, copy.deepcopy(eng.cfg), 64, 64, resident_only=True)
    measured = Measured("tiny", copy.deepcopy(eng.cfg), m, 64, 64, eng.n_adapters)
    row = StaticKVCache.slot_bytes(dec.n_layers, dec.n_kv, dec.head_dim, 256, getattr(torch, eng.cfg.dtype))
    kinds = []
    for rows in (20, 8, 1.5):  # free memory in rows of the capacity; the budget is half of it
        gpu = m["base"] + m["adapters"] + m["copies"] + CUDA_RESERVED_BYTES + int(rows * row)
        free, planned = engine_kv_cache(measured, gpu)
        _fake_cuda(monkeypatch, free=free, segments=[])
        eng.device = eng.kv.device = torch.device("cuda", 0)  # the engine and its cache keeper
        try:
            got = eng.plan_kv_cache(200)
        except RuntimeError:
            got = None
        finally:
            eng.device = eng.kv.device = torch.device("cpu")
        assert got == planned, rows
        kinds.append(None if got is None else got.kind)
    assert kinds == ["static", "paged", None]


def _base_model_tokenizer():
    """The embedded tokenizer as a base model's would be: EOS ``<|endoftext|>`` while its ChatML template still ends
    each turn with ``<|im_end|>`` (Qwen2.5 base's layout), built locally from the embedded files."""
    import copy

    from test_engine_helpers import tokenizer

    tok = copy.deepcopy(tokenizer())
    tok.eos_token = "<|endoftext|>"
    return tok


def test_end_of_turn_token_is_read_from_the_chat_template():
    from lorapop.engine.base import end_of_turn_ids

    tok = _base_model_tokenizer()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token_id != im_end
    assert end_of_turn_ids(tok) == [im_end]
    tok.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}<|endoftext|>{% endfor %}"
    assert end_of_turn_ids(tok) == [tok.convert_tokens_to_ids("<|endoftext|>")]
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"  # plain text closes no turn
    assert end_of_turn_ids(tok) == []
    tok.chat_template = None
    assert end_of_turn_ids(tok) == []


def test_a_reply_that_closes_its_turn_stops_there():
    """A base model (EOS <|endoftext|>) under a ChatML template: greedy decoding whose every step prefers
    <|im_end|> ends after that one token with finish_reason 'eos', instead of running to max_new_tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lorapop.engine import EngineConfig, SamplingParams, TorchEngine

    tok = _base_model_tokenizer()
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    head = torch.nn.Linear(32, len(tok), bias=True)  # constant logits: the end-of-turn token wins every step
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[eot] = 10.0
    model.lm_head = head
    eng = TorchEngine(model, tok, 1, EngineConfig(rank=4, lora_alpha=8, device="cpu"))
    assert eot in eng.eos_ids and tok.eos_token_id in eng.eos_ids
    out = eng.generate([eng.chat_prompt("hi")], [0], SamplingParams(max_new_tokens=6, greedy=True))[0]
    assert out.token_ids == [eot] and out.finish_reason == "eos"
