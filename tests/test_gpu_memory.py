"""The GPU path's memory and stop-token checks that a CPU can run."""

from __future__ import annotations

import pytest
import torch

from test_engine_helpers import tiny_engine

GIB = 2**30


def _fake_cuda(monkeypatch, *, free, segments, cache=None, total=80 * GIB):
    """torch.cuda's memory functions as a GPU with ``free`` bytes (or ``free()``) unused by the driver and the
    allocator holding ``segments`` would report them (reserved/allocated derived from the same segments, as the
    allocator does)."""
    reserved = sum(s["total_size"] for s in segments)
    allocated = sum(s["allocated_size"] for s in segments)
    monkeypatch.setattr(torch.cuda, "mem_get_info",
                        lambda device=None: (free() if callable(free) else free, total))
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
        assert eng.kv.budget_bytes() == int(0.5 * (10 + 6) * GIB)
    finally:
        eng.device = eng.kv.device = torch.device("cpu")


def test_kv_budget_counts_the_current_cache_as_free(monkeypatch):
    eng = tiny_engine()
    eng.cfg.kv_cache_memory_fraction = 1.0
    dec = eng.decoder()
    eng.kv_cache()
    held = sum(t.numel() * t.element_size() for t in eng.kv.cache.k + eng.kv.cache.v)
    segments = [{"device": 0, "segment_pool_id": (0, 0), "total_size": 4 * GIB, "allocated_size": 4 * GIB}]
    _fake_cuda(monkeypatch, free=GIB, segments=segments)
    eng.device = eng.kv.device = torch.device("cuda", 0)  # the engine and its cache keeper
    try:
        assert eng.kv.budget_bytes() == GIB + held  # its bytes are freed before the new cache is allocated
    finally:
        eng.device = eng.kv.device = torch.device("cpu")
    assert dec is eng._dec


def test_plan_and_engine_size_the_kv_cache_with_one_function(monkeypatch):
    """`lorapop plan` and the engine decide the cache's size by one function (kvsize.kv_cache_plan) over the memory
    free at the first generate: where the plan says a card leaves F bytes free beside the resident state it
    measured, the engine under torch.cuda reporting F free picks the same slots, capacity, pages and bytes, across
    cards whose budget holds every row at the full length, fewer, and none."""
    import copy

    from lorapop.engine.kvsize import CUDA_RESERVED_BYTES, PAGE, token_bytes
    from lorapop.plan import engine_kv_cache
    from lorapop.plan.measure import Measured, measure_phases

    eng = tiny_engine(gen_batch_size=6, max_model_len=200, kv_cache_memory_fraction=0.5)
    dims, dtype = eng.cache_dims()
    m = measure_phases(eng.model.config, eng.n_adapters, copy.deepcopy(eng.cfg), 64, 64, resident_only=True)
    measured = Measured("tiny", copy.deepcopy(eng.cfg), m, 64, 64, eng.n_adapters)
    row = (256 // PAGE + 1) * PAGE * token_bytes(*dims, dtype)
    full = []
    for rows in (20, 8, 1.5):  # free memory in rows of the capacity; the budget is half of it
        gpu = m["base"] + m["adapters"] + m["copies"] + CUDA_RESERVED_BYTES + int(rows * row)
        free, planned = engine_kv_cache(measured, gpu)
        _fake_cuda(monkeypatch, free=free, segments=[])
        eng.device = eng.kv.device = torch.device("cuda", 0)  # the engine and its cache keeper
        try:
            got = eng.kv.plan_for(dims, dtype)
        except RuntimeError:
            got = None
        finally:
            eng.device = eng.kv.device = torch.device("cpu")
        assert got == planned, rows
        full.append(None if got is None else got.full_rows)
    assert full == [6, 4, None]


def _reachable_bytes(root) -> int:
    """Bytes of every tensor storage reachable from ``root`` through lorapop's, torch's modules' and transformers'
    objects, their containers and tensors' gradients: what a GPU would hold for it."""
    import torch.nn as nn

    seen, storages, todo, total = set(), set(), [root], 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            st = obj.untyped_storage()
            if st._cdata not in storages:
                storages.add(st._cdata)
                total += st.nbytes()
            if obj.grad is not None:
                todo.append(obj.grad)
        elif isinstance(obj, dict):
            todo += list(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            todo += list(obj)
        elif isinstance(obj, nn.Module) or type(obj).__module__.split(".")[0] in ("lorapop", "transformers"):
            todo += list(vars(obj).values())
    return total


@pytest.mark.parametrize("name", ["4T+4S", "8T+8S"])
def test_the_engine_sizes_its_cache_from_the_memory_the_plan_counts(monkeypatch, name):
    """The engine is run on the CUDA stand-in without the plan's figures: the stand-in's free memory is the card
    less every tensor the engine holds at that moment (and the CUDA allowance), as a GPU would report it. At the
    shipped 7B configs (their model at two layers, fake tensors: its shapes without its weights), on 80 and 141 GiB
    cards, the free memory the engine sizes its cache from is the plan's (the gradients and the inference copies
    are resident before the cache is sized, as the plan counts them), and so is the cache."""
    import copy
    import dataclasses

    from torch._subclasses.fake_tensor import FakeTensorMode

    from lorapop.config import load_config
    from lorapop.engine import kvcache
    from lorapop.engine.kvsize import CUDA_RESERVED_BYTES
    from lorapop.engine.phase_probe import PhaseProbe
    from lorapop.plan import engine_kv_cache
    from lorapop.plan.measure import Measured, _at_depth, default_prompt_tokens, measure_phases, model_config

    cfg = load_config(f"lorapop/configs/{name}.yaml")
    ecfg = copy.deepcopy(cfg.engine)
    ecfg.device = "cpu"
    mcfg = _at_depth(model_config(cfg.model.name), 2)
    n = cfg.population.n_members
    prompt = default_prompt_tokens(cfg)
    m = measure_phases(mcfg, n, copy.deepcopy(ecfg), prompt, 8096, resident_only=True)
    measured = Measured(cfg.model.name, copy.deepcopy(ecfg), m, prompt, 8096, n)
    probe = PhaseProbe(mcfg, n, copy.deepcopy(ecfg), FakeTensorMode(allow_non_fake_inputs=True))
    eng = probe.engine
    made = []

    class Recorded:  # the pool is not allocated: the stand-in has no device memory to give it
        def __init__(self, *a):
            made.append(a)
            self.k = self.v = []

    monkeypatch.setattr(kvcache, "PagedKVCache", Recorded)
    for gib in (80, 141):
        total = gib * GIB
        seen = []

        def free():
            seen.append(total - _reachable_bytes(eng) - CUDA_RESERVED_BYTES)
            return seen[-1]

        _fake_cuda(monkeypatch, free=free, segments=[], total=total)
        eng.kv.device = torch.device("cuda", 0)
        eng.kv.release()
        eng.kv_cache()
        planned_free, planned = engine_kv_cache(measured, total)
        assert abs(seen[0] - planned_free) <= 2**20, (gib, seen[0] - planned_free)  # buffers: rotary frequencies
        assert planned is not None and dataclasses.replace(eng.kv.plan, budget=0) == dataclasses.replace(planned, budget=0)
        assert made[-1][1] == planned.n_slots and made[-1][4:6] == (planned.capacity, planned.n_pages)


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
