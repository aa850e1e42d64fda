"""`lorapop plan`: phase memory measured under fake tensors on the engine's own code.

A fake-tensor run costs per op, not per byte (a few seconds per probe on a loaded CPU whatever the model's size),
so each config is measured once per module and the assertions read that measurement."""

from __future__ import annotations

import dataclasses

import pytest

from lorapop.plan import gpu as planmod
from lorapop.config import load_config
from lorapop.plan import GIB, PlanError, assemble, check_fits, measure, measure_phases, model_config

PHASES = ["base weights", "adapters + AdamW moments + gradients", "adapters' inference copies", "KV cache",
          "prefill chunk (peak)", "decode step (peak)", "train micro-batch, checkpointing (peak)",
          "train micro-batch, no checkpointing (peak)", "log-prob micro-batch (peak)"]
SHORT = ["--selfplay.propose.max_new_tokens=64", "--selfplay.solve.max_new_tokens=64",
         "--engine.train_micro_batch_size=2"]


def _small(name: str, *extra: str):
    """A shipped config with short rows (the plan's cost is its op count; short rows keep the fake tensors small)."""
    return load_config(f"lorapop/configs/{name}.yaml", [*SHORT, *extra])


@pytest.fixture(scope="module")
def embedded():
    return measure(_small("cpu_demo", "--engine.gradient_checkpointing=false"), prompt_tokens=128)


def test_two_depths_give_the_full_models_figures():
    """Every phase is affine in the number of identical layers, so the plan's 2- and 3-layer probes extrapolate to
    the full depth exactly (a 4-layer model measured directly); bf16 LoRA compute keeps less for backward."""
    from transformers import LlamaConfig

    from lorapop.engine.base import EngineConfig
    from lorapop.plan.measure import PROBE_LAYERS, _at_depth

    mcfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)

    def ecfg(lc="auto"):
        return EngineConfig(dtype="bfloat16", device="cpu", train_micro_batch_size=3, gen_batch_size=4,
                            prefill_chunk_tokens=64, logprob_chunk_size=16, lora_compute_dtype=lc)

    full = measure_phases(mcfg, 2, ecfg(), 40, 24)
    lo, hi = PROBE_LAYERS
    a, b = (measure_phases(_at_depth(mcfg, d), 2, ecfg(), 40, 24) for d in (lo, hi))
    assert {k: a[k] + (b[k] - a[k]) * (4 - lo) // (hi - lo) for k in a} == full
    assert full["train"] > full["train_ckpt"] > 0  # checkpointing keeps less for backward
    fp32 = measure_phases(_at_depth(mcfg, lo), 2, ecfg("float32"), 40, 24)
    assert a["train"] < fp32["train"]  # no float32 copy of each adapted projection's input is saved


def test_embedded_plan_has_every_phase_and_its_fit_follows_the_memory(embedded):
    big, small = assemble(embedded, 80.0), assemble(embedded, 0.25)
    assert list(big.phases) == PHASES and all(v > 0 for v in big.phases.values())
    assert big.fits and not small.fits
    assert "does NOT fit" in small.render() and "fits" in big.render()
    assert big.render().splitlines()[0].endswith("backend torch")
    # a card where the update is over the limit without checkpointing but fits with it: the advice says so
    tight = _tight_update(embedded)
    assert tight and all(not p.fits for p in tight)


def _card_gib(measured, free: int) -> float:
    """The card on which the engine finds ``free`` bytes free at its first generate (kvsize.free_at_first_generate)."""
    from lorapop.engine.kvsize import CUDA_RESERVED_BYTES

    m = measured.phases
    return (m["base"] + m["adapters"] + m["copies"] + CUDA_RESERVED_BYTES + free) / GIB


def _roomy(measured):
    """``measured`` with a cache that takes all the free memory (fraction 1, as many rows as the pages hold), so the
    update's room shrinks as the card grows: the cases where it cannot fit beside the cache."""
    return dataclasses.replace(measured, engine=dataclasses.replace(measured.engine, kv_cache_memory_fraction=1.0,
                                                                    gen_batch_size=1 << 16))


def _tight_update(measured) -> list:
    """Plans, over cards of 0.25 to 16 GiB free, whose advice is to turn activation checkpointing on."""
    roomy = _roomy(measured)
    plans = (assemble(roomy, _card_gib(roomy, q * GIB // 4)) for q in range(1, 65))
    return [p for p in plans if "--engine.gradient_checkpointing=true" in "\n".join(p.advice)]


def test_7b_shape_table_plan():
    cfg = _small("4T+4S")
    assert model_config(cfg.model.name).hidden_size == 3584  # from the shipped table: no network, no weights
    m = measure(cfg, prompt_tokens=128)
    p = assemble(m, 80.0)
    # bf16 weights of Qwen2.5-Coder-7B (7.6e9 parameters): ~14.2 GiB
    assert 13.5 * GIB < p.phases["base weights"] < 15 * GIB
    assert p.fits and not assemble(m, 16.0).fits


def test_7b_headers_state_the_kv_cache_the_engine_allocates():
    """Each 7B YAML sets engine.max_model_len and its header states the KV cache the engine allocates on 80 and 141
    GiB cards: the engine's own function (lorapop/engine/kvsize.py, through plan.engine_kv_cache) over the resident
    state measured on fake tensors. The update's peak is planned beside that cache, which stays all run."""
    import re
    from pathlib import Path

    for name in ("1T+1S", "4T+4S", "8T+8S", "single"):
        path = Path("lorapop/configs") / f"{name}.yaml"
        cfg = load_config(str(path))
        assert cfg.engine.max_model_len == 6144 + 8096 == cfg.selfplay.propose.max_new_tokens + 6144
        stated = dict(re.findall(r"^#\s+(\d+) GiB: (.*)$", path.read_text(), re.M))
        m = measure(cfg, resident_only=True)
        for gib in ("80", "141"):
            assert stated[gib] == planmod.engine_kv_cache(m, int(gib) * GIB)[1].describe(), (name, gib)


def test_refusal_names_the_setting_to_change(embedded, monkeypatch):
    monkeypatch.setattr(planmod, "measure", lambda cfg, prompt_tokens=0: _roomy(embedded))  # measured once above
    with pytest.raises(PlanError, match=r"--engine\.(gradient_checkpointing|train_micro_batch_size)="):
        check_fits(_small("cpu_demo"), _tight_update(embedded)[0].gpu_bytes)
    monkeypatch.setattr(planmod, "measure", lambda cfg, prompt_tokens=0: embedded)
    with pytest.raises(PlanError, match="one row"):
        check_fits(_small("cpu_demo"), GIB // 8)


def test_train_refuses_on_cuda_before_loading_weights(embedded, monkeypatch, tmp_path):
    """The check as `lorapop train` runs it: a CUDA device too small for the update stops prepare_run_dir with the
    plan's message, and no run directory is made."""
    import torch

    from lorapop.configlib import ConfigError
    from lorapop.commands.train import prepare_run_dir

    monkeypatch.setattr(planmod, "measure", lambda cfg, prompt_tokens=0: embedded)
    cfg = _small("cpu_demo", f"--run.output_dir={tmp_path}", "--engine.device=auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: type("P", (), {"total_memory": GIB // 4}))
    with pytest.raises(ConfigError, match="cannot fit this GPU"):
        prepare_run_dir(cfg, resume=False)
    assert not any(tmp_path.iterdir())


def test_cli_plan_exit_status(embedded, monkeypatch, capsys):
    from lorapop.cli import main

    monkeypatch.setattr(planmod, "measure", lambda cfg, prompt_tokens=0: embedded)
    assert main(["plan", "cpu_demo", "--gpu-memory", "0.25", *SHORT]) == 1
    assert "does NOT fit" in capsys.readouterr().out
    assert main(["plan", "cpu_demo", "--gpu-memory", "80"]) == 0
    assert main(["plan", "no-such-config"]) == 2
    assert main(["plan", "cpu_demo", "--engine.no_such_key=1"]) == 2


def test_unknown_model_shape(monkeypatch, tmp_path, capsys):
    """`lorapop plan` says where a config comes from; `lorapop train` on CUDA goes on without a plan (loading will
    fetch the model anyway) instead of refusing."""
    import torch

    from lorapop.plan import UnknownShape, check_on_cuda

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(UnknownShape, match="shape table"):
        model_config("some-org/not-cached-model")
    cfg = _small("cpu_demo", "--model.name=some-org/not-cached-model", "--engine.device=auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: type("P", (), {"total_memory": GIB}))
    assert check_on_cuda(cfg) is None
    assert "no memory plan" in capsys.readouterr().err


# ---------------------------------------------------------------- engine.backend vllm

VLLM_SHARE = "vLLM (vllm_gpu_memory_utilization)"
ADAPTERS = "adapters + AdamW moments + gradients"


@pytest.fixture(scope="module")
def vllm_7b():
    """8T+8S as shipped (AZR's prompt cap, 8096 new tokens), the 7B config with the most adapters, under vllm."""
    cfg = load_config("lorapop/configs/8T+8S.yaml", ["--engine.backend=vllm"])
    return cfg, _measure_in_a_fresh_process(cfg, planmod.default_prompt_tokens(cfg))


def _measure_in_a_fresh_process(cfg, prompt_tokens):
    """``measure`` in a new interpreter, as `lorapop plan` and a run's start measure: in a whole-suite run, after
    other files in the same worker, this fixture's plan once came out with the update's peak below zero (the
    sleep-mode-off test failed); the measurement must not depend on what ran before it in the process."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(measure, cfg, prompt_tokens).result()


def _with(measured, **engine):
    """The same measurement planned with other engine settings (the fraction and sleep mode change no phase)."""
    return dataclasses.replace(measured, engine=dataclasses.replace(measured.engine, **engine))


def test_vllm_7b_fits_80gb_at_its_shipped_fraction(vllm_7b):
    from lorapop.engine.kvsize import kv_capacity

    cfg, m = vllm_7b
    frac = cfg.engine.vllm_gpu_memory_utilization  # as shipped (0.4: about twice the default's KV cache)
    assert cfg.engine.backend == "vllm"
    p = assemble(m, 80.0)
    ph = p.phases
    assert p.backend == "vllm" and "backend vllm" in p.render().splitlines()[0]
    assert ph[VLLM_SHARE] == p.vllm_bytes == int(frac * p.gpu_bytes)
    assert ph["  vLLM base weights"] == ph["base weights"]  # vLLM's own copy of the same parameters
    # its KV cache is what its share leaves after its weights, LoRA slots and activation allowance
    kv = (p.vllm_bytes - ph["  vLLM base weights"] - ph["  vLLM LoRA slots"] - ph["  vLLM activations (allowance)"]
          - ph["  vLLM CUDA-graph pool"])
    assert ph["  vLLM KV cache (the rest of its share)"] == p.vllm_kv_bytes == kv > 0
    row = m.phases["vllm_kv_token"] * kv_capacity(m.prompt_tokens + m.new_tokens, m.engine.max_model_len)
    assert p.kv_slots_fit == kv // row >= 1
    # the TorchEngine never generates under vllm: no inference copies, static KV cache or prefill chunk
    assert not {"adapters' inference copies", "KV cache", "prefill chunk (peak)"} & set(ph)
    torch_state = ph["base weights"] + ph[ADAPTERS]
    assert p.generation_bytes == torch_state + p.vllm_bytes
    # its CUDA-graph pool (two captures with LoRA, at least 1 GiB each) stays on the GPU through sleep
    graph = ph["  vLLM CUDA-graph pool"]
    assert graph == p.vllm_graph_bytes >= 2 * GIB
    assert p.train_bytes == torch_state + ph["train micro-batch, checkpointing (peak)"] + graph
    # level-1 sleep moves vLLM's weights and LoRA slots to host memory and back every step: ~15 GiB each way at 7B
    assert p.vllm_sleep_host_bytes == ph["  vLLM base weights"] + ph["  vLLM LoRA slots"] > 14 * GIB
    assert "sleep (level 1) per step: " in p.render() and "GB/s each way (assumed" in p.render()
    seconds = planmod.vllm_sleep_seconds(p.vllm_sleep_host_bytes)
    assert seconds == 2 * p.vllm_sleep_host_bytes / planmod.HOST_LINK_BYTES_S
    assert p.fits and p.vllm_fraction_min <= frac <= p.vllm_fraction_max


def test_vllm_fraction_out_of_range_is_refused(vllm_7b, monkeypatch):
    """A share too small for vLLM's weights, activations and one row of KV cache is refused naming the fraction that
    is enough; one too large for the TorchEngine beside it is refused naming the largest that fits."""
    import math

    cfg, m = vllm_7b
    p = assemble(m, 80.0)
    lo, hi = math.ceil(p.vllm_fraction_min * 100) / 100, math.floor(p.vllm_fraction_max * 100) / 100
    assert assemble(_with(m, vllm_gpu_memory_utilization=lo), 80.0).fits
    assert assemble(_with(m, vllm_gpu_memory_utilization=hi), 80.0).fits
    for frac, match in ((lo - 0.05, rf"raise it to --engine\.vllm_gpu_memory_utilization={lo:.2f} \(\+0\.05\)"),
                        (hi + 0.05, rf"lower --engine\.vllm_gpu_memory_utilization={hi:.2f} ")):
        bad = _with(m, vllm_gpu_memory_utilization=frac)
        assert not assemble(bad, 80.0).fits
        monkeypatch.setattr(planmod, "measure", lambda cfg, prompt_tokens=0, bad=bad: bad)  # measured once above
        with pytest.raises(PlanError, match=match):
            check_fits(cfg, 80 * GIB)


def test_vllm_sleep_mode_off_keeps_its_share_through_the_update(vllm_7b):
    _, m = vllm_7b
    on, off = assemble(m, 80.0), assemble(_with(m, vllm_enable_sleep_mode=False), 80.0)
    assert off.generation_bytes == on.generation_bytes
    assert off.train_bytes == on.train_bytes - on.vllm_graph_bytes + off.vllm_bytes  # the pool is in its share
    assert off.vllm_sleep_host_bytes == 0 and "sleep (level 1)" not in off.render()
    # 8T+8S's update does not fit beside vLLM's awake share; the advice names the settings that make it fit
    assert off.train_bytes > off.limit and not off.fits
    advice = "\n".join(off.advice)
    assert "--engine.vllm_enable_sleep_mode=true" in advice and "--engine.train_micro_batch_size=" in advice


def test_cli_plan_vllm_backend(capsys):
    from lorapop.cli import main

    assert main(["plan", "cpu_demo", "--engine.backend=vllm", "--prompt-tokens", "128", *SHORT]) == 0
    out = capsys.readouterr().out
    assert "backend vllm" in out and VLLM_SHARE in out and "peak in generation (vLLM)" in out


def test_vllm_graph_pool_follows_vllms_capture_sizes_and_eager_has_none(vllm_7b):
    """vLLM captures up to min(2 x max_num_seqs, 512) tokens (VllmConfig._set_cudagraph_sizes), at most
    max_num_batched_tokens; engine.vllm_enforce_eager captures nothing, and its KV cache gets the pool's bytes."""
    from lorapop.engine.base import EngineConfig

    assert planmod.vllm_graph_capture_tokens(EngineConfig(gen_batch_size=48)) == 96
    assert planmod.vllm_graph_capture_tokens(EngineConfig(gen_batch_size=1024)) == 512
    assert planmod.vllm_graph_capture_tokens(EngineConfig(gen_batch_size=48, prefill_chunk_tokens=64)) == 64
    assert planmod.vllm_graph_capture_tokens(EngineConfig(vllm_enforce_eager=True)) == 0
    _, m = vllm_7b
    graphs, eager = assemble(m, 80.0), assemble(_with(m, vllm_enforce_eager=True), 80.0)
    assert eager.vllm_graph_bytes == 0 < graphs.vllm_graph_bytes
    assert eager.vllm_kv_bytes == graphs.vllm_kv_bytes + graphs.vllm_graph_bytes
    assert eager.train_bytes == graphs.train_bytes - graphs.vllm_graph_bytes




def test_paged_kv_cache_plan_counts_tokens_and_refuses_without_one_full_row(embedded):
    """The pool the engine allocates on a card (kvsize over the memory free at its first generate, rows of
    max_model_len as the engine resolves it: unset, the model's max_position_embeddings): as many pages as the
    budget holds, up to gen_batch_size rows at the full length; the plan gives its positions and its rows at the
    full length and at a shorter one, and refuses a card whose pool cannot hold one row at the full length, however
    short the rows it could hold. The update's figure carries the compiled step's CUDA-graph pool beside the cache."""
    import math

    from lorapop.engine.kvsize import PAGE, kv_capacity

    m, ecfg = embedded.phases, embedded.engine
    assert ecfg.max_model_len == 0 and m["max_model_len"] == 8192  # SmolLM2's max_position_embeddings
    capacity = kv_capacity(0, m["max_model_len"])
    per_page = PAGE * m["kv_token"]
    big = assemble(embedded, 80.0)
    pages = ecfg.gen_batch_size * capacity // PAGE  # the budget holds every row at the full length
    assert big.kv_plan.kind == "paged" and big.kv_plan.n_pages == pages
    assert big.phases["KV cache"] == (pages + 1) * per_page
    assert big.kv_slots_fit == ecfg.gen_batch_size
    assert f"paged, {pages * PAGE} positions ({ecfg.gen_batch_size} rows of {capacity})" in big.notes["KV cache"]
    pool = big.phases.get("CUDA-graph pool (kept through the update)", 0)
    assert pool == (m["decode"] if ecfg.compile else 0)
    train = m["train_ckpt"] if ecfg.gradient_checkpointing else m["train"]
    assert big.train_bytes == m["base"] + m["adapters"] + m["copies"] + big.phases["KV cache"] + pool + train
    compiled = assemble(dataclasses.replace(embedded, engine=dataclasses.replace(ecfg, compile=True)), 80.0)
    assert compiled.phases["CUDA-graph pool (kept through the update)"] == m["decode"] > 0
    one_row = (capacity // PAGE + 1) * per_page
    for budget, rows in ((one_row, 1), (one_row - per_page, 0)):
        gpu = _card_gib(embedded, math.ceil(budget / ecfg.kv_cache_memory_fraction))
        pl = assemble(dataclasses.replace(embedded, reply_tokens=8), gpu)
        assert pl.kv_slots_fit == rows and not (rows == 0 and pl.fits)
        assert ("does not hold one row" in "\n".join(pl.advice)) == (rows == 0)
        if rows:
            short = (capacity // PAGE) * PAGE // (-(-(embedded.prompt_tokens + 8) // PAGE) * PAGE)
            assert f"or {short} rows of {embedded.prompt_tokens} + 8" in pl.notes["KV cache"]


def test_cpu_plan_counts_the_largest_call_and_names_what_lowers_the_peak(embedded, monkeypatch, capsys):
    """`lorapop plan --cpu` and the check `lorapop train` makes on CPU: the KV cache counts the rows of the largest
    generate call (not gen_batch_size slots), the update the configured micro-batch, and a memory too small for
    either gets the setting that lowers it, before step 1."""
    from lorapop.plan import cpu as plan_cpu
    from lorapop.cli import main

    cfg = _small("cpu_demo", "--engine.gradient_checkpointing=false")
    assert plan_cpu.generate_rows(cfg) == {"propose": 2 * 3 * 4, "solve": 2 * 3 * 4 * 2}
    monkeypatch.setattr(plan_cpu, "measured_cached", lambda cfg, prompt_tokens: embedded)
    proc = GIB // 4

    def at(gib_bytes):
        return plan_cpu.plan_cpu(cfg, int(gib_bytes), 128, process_bytes=proc)

    big = at(64 * GIB)
    m = embedded.phases
    assert big.fits and big.phases["KV cache (largest generate call)"] == 48 * (128 + 64) * m["kv_token"]
    resident = proc + m["base"] + m["adapters"] + m["copies"]
    assert big.update_bytes == resident + m["train"] and big.peak_bytes == max(big.update_bytes, big.generation_bytes)
    tight = at(big.update_bytes - 1)
    assert not tight.fits and "--engine.gradient_checkpointing=true" in "\n".join(tight.advice)
    small = at(resident + m["train_ckpt"] * 3 // 4)  # one row of the two per micro-batch, checkpointed
    advice = "\n".join(small.advice)
    assert "--engine.gen_batch_size=" in advice
    assert "--engine.gradient_checkpointing=true and --engine.train_micro_batch_size=1 (now 2)" in advice
    # without a prompt length: the cache's rows at the mean of the prompts built from the seed files, each reply at
    # its budget; the update's rows at the prompt format's budget
    seeded = plan_cpu.seed_prompt_tokens(cfg)
    assert seeded is not None and all(50 < seeded[k] < 1024 for k in ("propose", "solve"))
    own = plan_cpu.plan_cpu(cfg, 64 * GIB, process_bytes=proc)
    assert own.phases["KV cache (largest generate call)"] == max(
        n * (round(seeded[k]) + 64) * m["kv_token"] for k, n in plan_cpu.generate_rows(cfg).items())
    assert own.update_bytes == big.update_bytes and "seed-built mean" in own.notes["KV cache (largest generate call)"]
    said: list[str] = []  # the check plans at the config's own prompt length, with this process's memory
    from lorapop import hostmem

    monkeypatch.setattr(hostmem, "proc_status_kb", lambda field, pid="self": proc // 1024)
    monkeypatch.setattr(plan_cpu, "machine_bytes", lambda: plan_cpu.plan_cpu(cfg, 64 * GIB).update_bytes - 1)
    assert plan_cpu.check_on_cpu(cfg, said.append) is not None
    assert len(said) == 1 and "exceeds" in said[0] and "gradient_checkpointing=true" in said[0]
    assert main(["plan", "cpu_demo", "--cpu", "--memory", "0.01", *SHORT]) == 1
    assert "does NOT fit" in capsys.readouterr().out
    assert main(["plan", "cpu_demo", "--cpu", "--memory", "64", *SHORT]) == 0


@pytest.mark.parametrize("ckpt", [True, False])
def test_cpu_upper_bound_is_above_the_measured_plan_and_skips_it_when_far_below(embedded, ckpt, monkeypatch):
    """The closed-form bound the check before a CPU run tries first is at least the fake-tensor plan's peak (so
    skipping the measurement below it never hides a warning), and where the machine's memory is above the bound
    nothing is measured."""
    from lorapop.plan import cpu as plan_cpu

    cfg = _small("cpu_demo", f"--engine.gradient_checkpointing={str(ckpt).lower()}")
    ecfg = dataclasses.replace(embedded.engine, gradient_checkpointing=ckpt)
    monkeypatch.setattr(plan_cpu, "measured_cached", lambda c, p: dataclasses.replace(embedded, engine=ecfg))
    proc = GIB // 4
    planned = plan_cpu.plan_cpu(cfg, 64 * GIB, embedded.prompt_tokens, process_bytes=proc).peak_bytes
    bound = plan_cpu.upper_bound_bytes(cfg, proc, embedded.prompt_tokens)
    assert planned <= bound < 20 * planned
    monkeypatch.setattr(plan_cpu, "machine_bytes", lambda: 10**15)
    monkeypatch.setattr(plan_cpu, "plan_cpu", lambda *a, **k: pytest.fail("measured below the bound"))
    assert plan_cpu.check_on_cpu(cfg, pytest.fail) is None
