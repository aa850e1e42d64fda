"""The memory plan (what `lorapop plan` prints, lorapop/commands/plan.py): the GPU memory each phase of a run needs,
measured without a GPU and without the weights.

The base model is built from its config alone with fake tensors (``torch._subclasses.FakeTensorMode``: shapes,
dtypes and storages, no data), wrapped by the project's own :class:`~lorapop.engine.torch_engine.TorchEngine`, and
the engine's own code runs on it: a prefill chunk and a decode step through the decoder and the paged KV cache (each
row reading its own chunks, split-KV), a train micro-batch's forward and backward (with and without activation checkpointing), a log-prob micro-batch. A
``TorchDispatchMode`` counts the bytes of every storage an op creates until it is freed, which is what CUDA's
``max_memory_allocated`` reports on a GPU (allocator rounding and fragmentation aside). No hand formula: change the
engine, and the plan follows it.

Where the model's config comes from, without downloading weights: a local checkpoint directory, the Hugging Face hub
cache (``local_files_only``), or :data:`SHAPES`, a table of the shipped configs' models (the embedded
SmolLM2-135M-Instruct and Qwen2.5-Coder-7B). The name follows ``accelerate estimate-memory`` (which sizes a model
from its config on the meta device), but plans a whole run's phases, so it takes a run config like ``lorapop train``.

Fit rule, ``engine.backend`` torch: the KV cache is the one the engine allocates, decided by the engine's own
function (:func:`lorapop.engine.kvsize.kv_cache_plan`) over the memory the engine finds free when it first
generates (the resident state in place: the engine makes its gradients at its start and its inference copies before
it sizes the cache), and it must hold one row at the full length. Generation needs the resident state (base,
adapters with their AdamW moments and gradients, the inference copies of the adapters) plus that cache and the
larger of the prefill chunk's and the decode step's peaks; training needs the resident state plus the cache (kept
for the whole run, at one address, so the compiled step's CUDA graphs stay valid) plus, with engine.compile on
CUDA, the CUDA graphs' memory pool (kept through the update; estimated as the decode step's peak at the declared
set's largest shape, split-KV buffers included, the pool's largest graph) plus one micro-batch's peak. Backend vllm:
the
TorchEngine never generates, so its resident state is the base and the adapters with their moments and gradients;
generation needs that plus vLLM's share, ``vllm_gpu_memory_utilization`` of the GPU's total memory; training needs
it plus one micro-batch's peak plus what vLLM keeps during the update (its CUDA-graph pool under
``vllm_enable_sleep_mode``; its whole share without). vLLM's share must hold its own copy of the base weights, its
LoRA slots, an activation allowance, its CUDA-graph pool and at least one row of KV cache (see
:func:`_assemble_vllm`); the plan also prints what level-1 sleep moves to and from host memory per step. Both phases
must stay under ``HEADROOM`` of the GPU's memory: the CUDA context, cuBLAS workspaces and allocator fragmentation
take the rest.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field
from typing import Any

from lorapop.plan.measure import (DEFAULT_PROMPT_TOKENS, REPLY_TOKENS, Measured, PlanError, UnknownShape,
                                  default_prompt_tokens, measure, vllm_graph_capture_tokens)

GIB = 2**30
HEADROOM = 0.92  # of the GPU's memory the plan lets tensors take (context, workspaces, fragmentation: the rest)


@dataclass
class MemoryPlan:
    model: str
    gpu_bytes: int
    backend: str = "torch"  # engine.backend planned for: what generates (see EngineConfig.backend)
    phases: dict[str, int] = field(default_factory=dict)  # name -> bytes
    notes: dict[str, str] = field(default_factory=dict)
    advice: list[str] = field(default_factory=list)
    generation_bytes: int = 0
    train_bytes: int = 0
    kv_plan: Any = None  # the KV cache the engine allocates (lorapop/engine/kvsize.py), None when none fits
    kv_slots_fit: int = 0  # rows of prompt + max_new_tokens the KV cache can hold (torch: slots, or rows of the paged
    # pool at the full length; vllm: in its share)
    # backend vllm only: vLLM's share (vllm_gpu_memory_utilization of the memory), the KV cache left in it after its
    # weights, LoRA slots and activations (negative when they do not fit), and the range of the fraction that fits
    vllm_bytes: int = 0
    vllm_kv_bytes: int = 0
    vllm_fraction_min: float = 0.0
    vllm_fraction_max: float = 0.0
    vllm_graph_bytes: int = 0  # its CUDA-graph pool: inside its share, kept on the GPU through sleep
    vllm_sleep_host_bytes: int = 0  # level-1 sleep: bytes copied to host memory per step, and as many back on wake

    @property
    def limit(self) -> int:
        return int(HEADROOM * self.gpu_bytes)

    @property
    def fits(self) -> bool:
        return self.generation_bytes <= self.limit and self.train_bytes <= self.limit and self.kv_slots_fit >= 1

    def render(self) -> str:
        lines = [f"memory plan for {self.model} on {self.gpu_bytes / GIB:.1f} GiB "
                 f"(tensors may take {HEADROOM:.0%}: {self.limit / GIB:.1f} GiB), backend {self.backend}"]
        gen = "peak in generation"
        if self.backend == "vllm":
            lines.append("  vLLM generates in its share of the GPU; the TorchEngine beside it holds the base, the "
                         "adapters and their optimizer, and runs the update")
            gen = "peak in generation (vLLM)"
        for name, b in self.phases.items():
            note = self.notes.get(name, "")
            lines.append(f"  {name:<44} {b / GIB:8.2f} GiB" + (f"  ({note})" if note else ""))
        lines.append(f"  {gen:<44} {self.generation_bytes / GIB:8.2f} GiB")
        lines.append(f"  {'peak in the update':<44} {self.train_bytes / GIB:8.2f} GiB")
        if self.backend == "vllm":
            lo, hi = _ceil2(self.vllm_fraction_min), _floor2(self.vllm_fraction_max)
            lines.append(f"  engine.vllm_gpu_memory_utilization that fits: "
                         + (f"{lo:.2f} to {hi:.2f}" if lo <= hi else f"none (vLLM needs {lo:.2f}, the rest leaves "
                                                                     f"it {max(0.0, hi):.2f})"))
            if self.vllm_sleep_host_bytes:
                moved = self.vllm_sleep_host_bytes
                lines.append(f"  sleep (level 1) per step: {moved / GIB:.2f} GiB to host memory and {moved / GIB:.2f} "
                             f"GiB back (its weights and LoRA slots), about {vllm_sleep_seconds(moved):.1f} s at "
                             f"{HOST_LINK_BYTES_S / 1e9:g} GB/s each way (assumed: see lorapop/plan/gpu.py)")
        lines.append("fits" if self.fits else "does NOT fit")
        lines += [f"  - {a}" for a in self.advice]
        return "\n".join(lines)


def _ceil2(x: float) -> float:
    """``x`` rounded up to 2 decimals (a fraction to raise a setting to), immune to float noise like 0.30000001."""
    return math.ceil(round(x * 100, 6)) / 100


def _floor2(x: float) -> float:
    return math.floor(round(x * 100, 6)) / 100


def plan(cfg: Any, gpu_gib: float, prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
         reply_tokens: int = REPLY_TOKENS) -> MemoryPlan:
    """The memory plan of ``cfg``'s run on a GPU of ``gpu_gib`` GiB."""
    return assemble(dataclasses.replace(measure(cfg, prompt_tokens), reply_tokens=reply_tokens), gpu_gib)


def assemble(measured: Measured, gpu_gib: float) -> MemoryPlan:
    """The plan for a GPU of ``gpu_gib`` GiB from measured phases: totals, fit and advice."""
    from lorapop.engine.kvsize import kv_capacity

    ecfg, m, n = measured.engine, measured.phases, measured.n_adapters
    prompt_tokens, new_tokens = measured.prompt_tokens, measured.new_tokens
    p = MemoryPlan(model=measured.model, gpu_bytes=int(gpu_gib * GIB), backend=ecfg.backend)
    rows = max(1, ecfg.train_micro_batch_size)
    chunk_rows = max(1, min(ecfg.gen_batch_size, ecfg.prefill_chunk_tokens // max(1, prompt_tokens)))
    capacity = kv_capacity(prompt_tokens + new_tokens, ecfg.max_model_len)
    lc = ecfg.lora_compute_dtype
    ckpt = ecfg.gradient_checkpointing
    torch_state = [
        ("base weights", m["base"], ecfg.dtype),
        ("adapters + AdamW moments + gradients", m["adapters"],
         f"{n} adapter{'s' if n != 1 else ''}, rank {ecfg.rank}, float32"),
    ]
    update = [
        ("train micro-batch, checkpointing (peak)", m["train_ckpt"],
         f"{rows} rows x ({prompt_tokens} + {new_tokens}), LoRA in {lc}" + (", as configured" if ckpt else "")),
        ("train micro-batch, no checkpointing (peak)", m["train"], "" if ckpt else "as configured"),
        ("log-prob micro-batch (peak)", m["logprobs"], f"{rows} rows, vocabulary in chunks of "
                                                       f"{ecfg.logprob_chunk_size}"),
    ]
    if ecfg.backend == "vllm":
        _assemble_vllm(p, measured, capacity, torch_state, update)
        return p
    resident = m["base"] + m["adapters"] + m["copies"]
    # The engine's own rule over the memory it finds free when it first generates; the cache then stays for the
    # whole run, so the update's peak sits beside it, and with it the compiled step's CUDA-graph pool.
    free, kvp = engine_kv_cache(measured, p.gpu_bytes)
    p.kv_plan = kvp
    transient = max(m["prefill"], m["decode"])
    pool = m["decode"] if ecfg.compile else 0
    kv = kvp.nbytes if kvp is not None else 0
    p.kv_slots_fit = kvp.full_rows if kvp is not None else 0
    kv_note = (f"{kvp.describe() if kvp is not None else 'none'}: engine.kv_cache_memory_fraction "
               f"{ecfg.kv_cache_memory_fraction:g} of the {free / GIB:.1f} GiB free at the first generate")
    if kvp is not None:
        kv_note += _advise_paged(p, measured, kvp)
    table = [
        *torch_state,
        ("adapters' inference copies", m["copies"], "base dtype" + (", and the compiled step's dense copy"
                                                                    if ecfg.compile else "")),
        ("KV cache", kv, kv_note),
        ("prefill chunk (peak)", m["prefill"], f"{chunk_rows} rows x {min(prompt_tokens, ecfg.prefill_chunk_tokens)}"
                                               " tokens (prefill_chunk_tokens)"),
        ("decode step (peak)", m["decode"], f"{ecfg.gen_batch_size} rows attending {capacity} positions, each row's "
                                            "own chunks read (split-KV)"),
        *([("CUDA-graph pool (kept through the update)", pool, "engine.compile: the decode step's peak at the "
                                                               "declared set's largest shape, its largest graph")]
          if pool else []),
        *update,
    ]
    for name, b, note in table:
        p.phases[name], p.notes[name] = int(b), note
    p.generation_bytes = resident + kv + transient
    p.train_bytes = resident + kv + pool + (m["train_ckpt"] if ckpt else m["train"])
    if p.kv_slots_fit < 1:  # the cache must hold one row at the full length
        p.advice.append(f"generation: engine.kv_cache_memory_fraction={ecfg.kv_cache_memory_fraction:g} of the "
                        f"{free / GIB:.1f} GiB free does not hold one row of {kv_capacity(0, m['max_model_len'])} "
                        "positions: raise it, or shorten engine.max_model_len")
    else:
        peak = max(transient, pool + (m["train_ckpt"] if ckpt else m["train"]))
        if resident + kv + peak > p.limit and free:
            fit = _floor2((p.limit - resident - peak) / free)
            p.advice.append(f"lower --engine.kv_cache_memory_fraction={max(0.0, fit):.2f} (now "
                            f"{ecfg.kv_cache_memory_fraction:g}): the KV cache stays through the update")
    _advise_update(p, ecfg, resident + kv + pool, m["train_ckpt"], m["train"], rows)
    return p


def engine_kv_cache(measured: Measured, gpu_bytes: int) -> tuple[int, Any]:
    """(free bytes, cache) the engine allocates on a CUDA card of ``gpu_bytes`` for the measured run: the engine's
    own functions (lorapop/engine/kvsize.py) over what it finds free when it first generates (the resident state in
    place), for rows of ``engine.max_model_len`` as the engine resolves it. The cache is None when the budget holds
    no row. The 7B configs' headers quote it for 80 and 141 GiB cards (tests/test_plan.py checks them)."""
    import torch

    from lorapop.engine.kvsize import free_at_first_generate, kv_budget, kv_cache_plan

    m = measured.phases
    ecfg = dataclasses.replace(measured.engine, max_model_len=m["max_model_len"])
    free = free_at_first_generate(gpu_bytes, m["base"] + m["adapters"] + m["copies"])
    try:
        return free, kv_cache_plan(ecfg, (m["kv_layers"], m["kv_heads"], m["kv_head_dim"]),
                                   getattr(torch, ecfg.dtype), kv_budget(ecfg, "cuda", free))
    except RuntimeError:
        return free, None


def _advise_paged(p: MemoryPlan, measured: Measured, kvp: Any) -> str:
    """The rows of ``prompt + reply_tokens`` a paged cache holds (the note's tail), and advice when that is more than
    gen_batch_size lets decode at once."""
    from lorapop.engine.kvsize import PAGE

    ecfg = measured.engine
    reply = min(measured.reply_tokens, measured.new_tokens)
    short = kvp.n_pages * PAGE // (-(-(measured.prompt_tokens + reply) // PAGE) * PAGE)
    if short > ecfg.gen_batch_size:
        p.advice.append(f"generation: the paged KV cache holds {short} rows of {measured.prompt_tokens} + {reply} "
                        f"tokens: raise --engine.gen_batch_size (now {ecfg.gen_batch_size}) to decode more at once "
                        "when replies are that short")
    return f"; or {short} rows of {measured.prompt_tokens} + {reply}"


# vLLM's CUDA-graph pool. VllmConfig._set_cudagraph_sizes (vllm/config/vllm.py) captures batch sizes 1, 2, 4, 8, 16,
# ... up to min(2 x max_num_seqs, 512) tokens (1024 on data-center Blackwell), no more than max_num_batched_tokens;
# GPUModelRunner.capture_model (vllm/v1/worker/gpu_model_runner.py) captures them largest first into one shared pool,
# so the pool is about the largest graph's activations; with LoRA it captures every size twice, with and without
# active adapters (CompilationConfig.cudagraph_specialize_lora, on by default; vLLM PR #25914 measured 1.62 -> 2.38
# GiB of graph memory from it). Since v0.21 Worker.determine_available_memory subtracts the pool's estimate
# (profile_cudagraph_memory) from the KV cache's budget inside the fraction, and sleep keeps it on the GPU
# (ModelConfig.sleep_mode_offload_cudagraph is off by default: CuMemBackend.suspend offloads only cuMem-pool tags).
# The decode forward's activations, which the plan measures, are only part of a pool: it also holds each captured
# size's static outputs and the compiled pieces' buffers. vLLM's own figures are larger ("CUDA graphs can take
# additional 1~3 GiB memory per GPU", its model runner's capture message; 1.62 GiB before LoRA specialisation in PR
# #25914), so each capture set counts at least VLLM_GRAPH_SET_MIN_BYTES until bench/engines.py measures the pool on a
# GPU (its vllm_asleep_gib).
VLLM_GRAPH_CAPTURES_WITH_LORA = 2
VLLM_GRAPH_SET_MIN_BYTES = GIB
# Host <-> GPU copy speed assumed for level-1 sleep (CuMemAllocator.sleep / wake_up: one cudaMemcpy per allocation
# to and from pinned host memory): 25 GB/s each way, about 80% of a PCIe 4.0 x16 link's 31.5 GB/s per direction
# (PCI-SIG's 16 GT/s x 16 lanes, 128b/130b), which pinned cudaMemcpy reaches. A PCIe 5.0 host (H100/H200) doubles the
# link, so the estimate errs slow; it leaves out pinning the host buffers, which vLLM allocates at each sleep.
HOST_LINK_BYTES_S = 25e9


def vllm_sleep_seconds(host_bytes: int) -> float:
    """Seconds per step level-1 sleep spends copying ``host_bytes`` to host memory and back (HOST_LINK_BYTES_S)."""
    return 2 * host_bytes / HOST_LINK_BYTES_S


def _assemble_vllm(p: MemoryPlan, measured: Measured, capacity: int, torch_state: list, update: list) -> None:
    """backend vllm: an in-process vLLM engine takes ``vllm_gpu_memory_utilization`` of the GPU's total memory for
    its own copy of the base weights, its LoRA slots, its activations and, in the rest, its KV cache; the TorchEngine
    beside it holds the base weights and the adapters with their optimizer state and runs the update, but never
    generates (no inference copies, no KV cache of its own, no prefill). vLLM itself refuses to start when its KV cache
    cannot hold one row of ``max_model_len`` tokens, so the plan refuses the same.

    vLLM's figures, as vLLM sizes them when it starts (its profile run), without importing vLLM:

    - its weights: the base's parameters in engine.dtype, the TorchEngine's base weights' bytes;
    - its LoRA slots: vLLM preallocates ``max_loras`` stacked adapters of ``max_lora_rank`` in the base dtype for
      every adapted module; planned with one slot per member (every member's rows in one batch) at engine.rank;
    - its activations: vLLM profiles one forward of ``max_num_batched_tokens`` tokens and keeps that peak free;
      bounded by the TorchEngine's own prefill forward of one engine.prefill_chunk_tokens-token row (measured like
      the prefill chunk; it also materialises an attention mask and gathers K/V, which vLLM's attention kernels do
      not, so it overstates vLLM's peak), assuming vLLM's max_num_batched_tokens is engine.prefill_chunk_tokens;
    - its CUDA-graph pool (not under engine.vllm_enforce_eager): :data:`VLLM_GRAPH_CAPTURES_WITH_LORA` times the
      TorchEngine's decode forward of :func:`vllm_graph_capture_tokens` rows, measured like the prefill chunk, or
      :data:`VLLM_GRAPH_SET_MIN_BYTES` when that is more; it stays on the GPU while vLLM sleeps;
    - its KV cache: the rest of the fraction, the same bytes per token as the TorchEngine's cache
      (2 x layers x KV heads x head_dim in the base dtype); rows of ``capacity`` positions (prompt + max_new_tokens
      rounded up, or engine.max_model_len, vLLM's max_model_len).
    """
    ecfg, m = measured.engine, measured.phases
    asleep_ok = ecfg.vllm_enable_sleep_mode
    graph = 0 if ecfg.vllm_enforce_eager else VLLM_GRAPH_CAPTURES_WITH_LORA * max(m.get("vllm_graph", 0),
                                                                                VLLM_GRAPH_SET_MIN_BYTES)
    share = int(ecfg.vllm_gpu_memory_utilization * p.gpu_bytes)
    torch_resident = sum(b for _, b, _ in torch_state)
    train_peak = m["train_ckpt"] if ecfg.gradient_checkpointing else m["train"]
    in_update = graph if asleep_ok else share  # what vLLM keeps on the GPU while the update runs
    p.vllm_bytes, p.vllm_graph_bytes = share, graph
    p.vllm_sleep_host_bytes = m["base"] + m["vllm_lora"] if asleep_ok else 0  # the "weights" tag sleep offloads
    p.vllm_kv_bytes = share - m["base"] - m["vllm_lora"] - m["vllm_forward"] - graph
    p.kv_slots_fit = max(0, p.vllm_kv_bytes // (m["vllm_kv_token"] * capacity))
    p.generation_bytes = torch_resident + share
    p.train_bytes = torch_resident + train_peak + in_update
    need = m["base"] + m["vllm_lora"] + m["vllm_forward"] + graph + m["vllm_kv_token"] * capacity
    p.vllm_fraction_min = need / p.gpu_bytes
    p.vllm_fraction_max = (p.limit - torch_resident - (0 if asleep_ok else train_peak)) / p.gpu_bytes
    table = [*torch_state, *_vllm_rows(p, measured, capacity, share, graph), *update]
    for name, b, note in table:
        p.phases[name], p.notes[name] = int(b), note
    _advise_vllm(p, measured, capacity, need, torch_resident, train_peak)
    _advise_update(p, ecfg, torch_resident + in_update, m["train_ckpt"], m["train"],
                   max(1, ecfg.train_micro_batch_size))


def _vllm_rows(p: MemoryPlan, measured: Measured, capacity: int, share: int, graph: int) -> list:
    """The plan's rows for vLLM's share and what it holds, as :func:`_assemble_vllm` sized them."""
    ecfg, m = measured.engine, measured.phases
    frac, asleep_ok = ecfg.vllm_gpu_memory_utilization, ecfg.vllm_enable_sleep_mode
    kv_tokens = max(0, p.vllm_kv_bytes) // m["vllm_kv_token"]
    return [
        ("vLLM (vllm_gpu_memory_utilization)", share,
         f"{frac:g} x {p.gpu_bytes / GIB:.1f} GiB; " + ("asleep in the update" if asleep_ok
                                                        else "resident in the update: sleep mode off")),
        ("  vLLM base weights", m["base"], f"its own copy, {ecfg.dtype}"),
        ("  vLLM LoRA slots", m["vllm_lora"], f"max_loras {measured.n_adapters}, rank {ecfg.rank}, {ecfg.dtype}"),
        ("  vLLM activations (allowance)", m["vllm_forward"], f"one {ecfg.prefill_chunk_tokens}-token forward: "
                                                              "max_num_batched_tokens = prefill_chunk_tokens"),
        ("  vLLM CUDA-graph pool", graph,
         f"{VLLM_GRAPH_CAPTURES_WITH_LORA} captures (with and without LoRA) of up to "
         f"{vllm_graph_capture_tokens(ecfg)} rows, at least {VLLM_GRAPH_SET_MIN_BYTES / GIB:g} GiB each; kept "
         "through sleep" if graph else "engine.vllm_enforce_eager"),
        ("  vLLM KV cache (the rest of its share)", max(0, p.vllm_kv_bytes),
         f"{kv_tokens} tokens: {p.kv_slots_fit} rows of {capacity}"),
    ]


def _advise_vllm(p: MemoryPlan, measured: Measured, capacity: int, need: int, torch_resident: int,
                 train_peak: int) -> None:
    """What to change when vLLM's share holds no row, does not fit beside the TorchEngine, or crowds the update."""
    ecfg, m = measured.engine, measured.phases
    frac, asleep_ok = ecfg.vllm_gpu_memory_utilization, ecfg.vllm_enable_sleep_mode
    share, graph, total = p.vllm_bytes, p.vllm_graph_bytes, p.gpu_bytes / GIB
    weights, lora, act, row = m["base"], m["vllm_lora"], m["vllm_forward"], m["vllm_kv_token"] * capacity
    if p.kv_slots_fit < 1:
        lo = _ceil2(p.vllm_fraction_min)
        p.advice.append(
            f"vLLM: engine.vllm_gpu_memory_utilization={frac:g} gives vLLM {share / GIB:.1f} GiB, less than its "
            f"weights ({weights / GIB:.1f} GiB), LoRA slots ({lora / GIB:.2f}), activations ({act / GIB:.2f}), "
            f"CUDA graphs ({graph / GIB:.2f}) and one {capacity}-token row of KV cache ({row / GIB:.2f}) take "
            f"({need / GIB:.1f} GiB): raise it to --engine.vllm_gpu_memory_utilization={lo:.2f} (+{lo - frac:.2f})")
    if p.generation_bytes > p.limit:
        hi = _floor2((p.limit - torch_resident) / p.gpu_bytes)
        if hi >= _ceil2(p.vllm_fraction_min) and hi > 0:
            p.advice.append(f"generation: vLLM's {share / GIB:.1f} GiB do not fit beside the TorchEngine's "
                            f"{torch_resident / GIB:.1f} GiB: lower --engine.vllm_gpu_memory_utilization={hi:.2f} "
                            f"(now {frac:g}; {hi * total:.1f} GiB)")
        else:
            p.advice.append(f"generation: the smallest share vLLM starts with "
                            f"({_ceil2(p.vllm_fraction_min):.2f} of the memory) does not fit beside the "
                            f"TorchEngine's base and adapters ({torch_resident / GIB:.1f} GiB): fewer adapters, "
                            "shorter rows (max_new_tokens, engine.max_model_len) or a larger GPU")
    if p.train_bytes > p.limit and not asleep_ok:
        alone = torch_resident + train_peak + graph
        if alone <= p.limit:
            p.advice.append(f"update: set --engine.vllm_enable_sleep_mode=true (vLLM's {share / GIB:.1f} GiB go "
                            f"while the update runs; peak {alone / GIB:.1f} GiB)")
        hi = _floor2(p.vllm_fraction_max)
        if _ceil2(p.vllm_fraction_min) <= hi < frac:
            p.advice.append(f"update: {'or ' if alone <= p.limit else ''}lower --engine.vllm_gpu_memory_utilization="
                            f"{hi:.2f} (now {frac:g}) to keep vLLM awake beside the update")


def _advise_update(p: MemoryPlan, ecfg: Any, resident: int, with_ckpt: int, without: int, rows: int) -> None:
    """Advice when the update does not fit; ``resident``: what stays on the GPU beside the micro-batch."""
    if p.train_bytes > p.limit:
        if not ecfg.gradient_checkpointing and resident + with_ckpt <= p.limit:
            p.advice.append("update: set --engine.gradient_checkpointing=true "
                            f"(peak {(resident + with_ckpt) / GIB:.1f} GiB)")
        else:
            peak = with_ckpt if ecfg.gradient_checkpointing else without
            per_row = peak / rows  # a micro-batch's activations grow with its rows
            fit = int((p.limit - resident) // per_row) if per_row > 0 else 0
            if fit >= 1:
                p.advice.append(f"update: set --engine.train_micro_batch_size={min(fit, rows - 1)} (now {rows})")
            else:
                p.advice.append("update: one row of prompt + max_new_tokens does not fit: shorten "
                                "selfplay.propose/solve.max_new_tokens or use a GPU with more memory")
    if p.phases["base weights"] + p.phases["adapters + AdamW moments + gradients"] > p.limit:
        p.advice.append("the base weights and the adapters alone exceed the memory: fewer adapters or a larger GPU")


def check_fits(cfg: Any, gpu_bytes: int, prompt_tokens: int = DEFAULT_PROMPT_TOKENS) -> MemoryPlan:
    """The plan at ``gpu_bytes``; raises :class:`PlanError` with the plan's advice when the update cannot fit.

    Under backend torch only the update refuses a run: generation with too small a memory decodes fewer rows at once
    (the KV budget caps the slots), which is slower but works, so it is a warning in the plan's text. Under backend
    vllm generation refuses too: vLLM will not start without its whole fraction free, nor when that fraction cannot
    hold its weights, activations and one row of KV cache."""
    p = plan(cfg, gpu_bytes / GIB, prompt_tokens)
    if p.train_bytes > p.limit or p.kv_slots_fit < 1 or (p.backend == "vllm" and p.generation_bytes > p.limit):
        raise PlanError("the config cannot fit this GPU:\n" + p.render())
    return p


def check_on_cuda(cfg: Any, prompt_tokens: int | None = None) -> MemoryPlan | None:
    """Before a run loads its weights on CUDA: plan it at the GPU's memory and refuse (:class:`PlanError`, a
    ConfigError) a config whose update cannot fit. Nothing happens off CUDA."""
    import torch

    dev = cfg.engine.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(dev)
    if dev.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(dev).total_memory
    try:
        return check_fits(cfg, total, prompt_tokens or default_prompt_tokens(cfg))
    except UnknownShape as e:  # the weights are not here yet either: loading fetches them, so do not refuse
        print(f"note: no memory plan before loading ({e})", file=sys.stderr)
        return None
