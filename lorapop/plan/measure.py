"""What `lorapop plan` measures: each phase's bytes under fake tensors, through the engine's own code (see
:mod:`lorapop.plan`, whose docstring describes the method); the model shapes it knows without the network; the plan's
errors. :mod:`lorapop.plan` turns a :class:`Measured` into a plan for a GPU of any size."""

from __future__ import annotations

import copy
import gc
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lorapop.configlib import ConfigError
from lorapop.tasks.formats import AZR, SHORT, prompt_format


# The prompt budgets the plan assumes live on the prompt formats (lorapop/tasks/formats.py); named here for the CLI.
DEFAULT_PROMPT_TOKENS = SHORT.plan_prompt_tokens
AZR_PROMPT_TOKENS = AZR.plan_prompt_tokens
# The reply length the paged KV cache's rows are also counted at (besides the full max_new_tokens): an assumption,
# not a measurement (an example of AZR's typical reply, far below its 8096-token budget); --reply-tokens.
REPLY_TOKENS = 600

# vLLM captures CUDA graphs up to min(2 x max_num_seqs, 512) tokens (lorapop/plan/gpu.py says where that comes from);
# the plan measures a decode step of the largest capture as part of vLLM's graph pool.
VLLM_MAX_CAPTURE_TOKENS = 512

def default_prompt_tokens(cfg: Any) -> int:
    """The longest prompt a config's plan assumes unless told: its prompt format's (AZR's cap under azr, else 1024)."""
    return prompt_format(getattr(cfg.selfplay, "prompt_format", "short")).plan_prompt_tokens


# Model shapes for the shipped configs, so `lorapop plan` needs neither the network nor a download.
_QWEN25_CODER_7B = dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                        num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                        max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False)
SHAPES: dict[str, dict[str, Any]] = {
    "embedded": dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                     num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                     max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "Qwen/Qwen2.5-Coder-7B": _QWEN25_CODER_7B,
    "Qwen/Qwen2.5-Coder-7B-Instruct": _QWEN25_CODER_7B,
}


class PlanError(ConfigError):
    """The config cannot fit the GPU memory; the message says which setting to change."""


class UnknownShape(PlanError):
    """No config.json for the model is at hand without the network (and it is not in :data:`SHAPES`)."""


def model_config(name: str) -> Any:
    """The transformers config of ``name`` without weights or network: a local directory, the hub cache, or
    :data:`SHAPES`."""
    from lorapop.model import import_transformers

    AutoConfig = import_transformers().AutoConfig

    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return AutoConfig.from_pretrained(str(path))
    if name != "embedded" and not path.exists():
        try:
            return AutoConfig.from_pretrained(name, local_files_only=True)
        except (OSError, ValueError):
            pass
    if name in SHAPES:
        shape = dict(SHAPES[name])
        return AutoConfig.for_model(shape.pop("model_type"), **shape)
    raise UnknownShape(f"model {name!r}: no config.json in a local directory or the Hugging Face cache, and not in the "
                    f"shape table ({', '.join(SHAPES)}); point model.name at a checkpoint directory")


class LiveBytes:
    """A TorchDispatchMode counting the bytes of storages created while it is on, live and at their peak.

    An op's output that shares storage with one of its inputs (a view, an in-place op) allocates nothing; any other
    output storage is counted once, until its last reference dies (a weakref finalizer)."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                tracker._count(args, kwargs, out)
                return out

        self.mode = _Mode()
        self.live = self.peak = 0
        self._seen: set[int] = set()

    def _count(self, args, kwargs, out) -> None:
        import torch
        from torch.utils._pytree import tree_leaves

        inputs = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs or {})) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key = st._cdata
            if key in inputs or key in self._seen:
                continue
            n = st.nbytes()
            self._seen.add(key)
            self.live += n
            self.peak = max(self.peak, self.live)
            weakref.finalize(st, self._free, key, n)

    def _free(self, key: int, n: int) -> None:
        self._seen.discard(key)
        self.live -= n

    def __enter__(self) -> "LiveBytes":
        self.mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.mode.__exit__(*exc)



def _measure(fn) -> int:
    """Peak bytes allocated while ``fn`` runs, beyond what was live before it."""
    with LiveBytes() as t:
        fn()
    return t.peak


# Layers measured; every figure is affine in the number of identical decoder layers (weights, KV cache and saved
# activations grow by one layer's worth, the transients at the ends do not), so two depths give the full model's.
PROBE_LAYERS = (2, 3)


def measure_phases(mcfg: Any, n_adapters: int, ecfg: Any, prompt_tokens: int, new_tokens: int,
                   resident_only: bool = False) -> dict[str, int]:
    """Bytes of each phase for the model of config ``mcfg`` at its depth, measured on the engine's own code
    (:class:`lorapop.engine.phase_probe.PhaseProbe`); ``resident_only``: only what the KV cache's size depends on (the
    resident state and the cache's dimensions)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from lorapop.engine.phase_probe import PhaseProbe

    # Earlier garbage is destroyed now, not inside the counting modes below: in a whole test-suite run an earlier
    # in-process vLLM engine's objects were collected in the middle of this measurement (their destructors' ops ran
    # under the fake mode and failed), and that run's plan came out wrong; not reproduced in isolation.
    gc.collect()
    configured = copy.deepcopy(ecfg)  # the engine resolves max_model_len in place (kvsize.model_len)
    probe = PhaseProbe(mcfg, n_adapters, ecfg, FakeTensorMode(allow_non_fake_inputs=True))
    out = _resident(probe)
    if resident_only:
        return out
    out.update(_generation(probe, configured, prompt_tokens, new_tokens))
    if ecfg.backend == "vllm":
        out.update(_vllm_share(probe, ecfg))
    out.update(_update(probe, ecfg, prompt_tokens, new_tokens))
    return out


def _resident(probe: Any) -> dict[str, int]:
    """The resident state (base weights, the adapters' training state, their inference copies) and the KV cache's
    dimensions, for kvsize.kv_cache_plan (the layer count extrapolates with the depth like the bytes)."""
    out = {"base": probe.base_bytes(), "adapters": probe.adapter_state_bytes(),
           "copies": _measure(probe.inference_copies)}
    out["kv_layers"], out["kv_heads"], out["kv_head_dim"] = probe.cache_dims()
    out["max_model_len"] = probe.cfg.max_model_len  # as the engine resolved it: the cache's capacity
    return out


def _generation(probe: Any, ecfg: Any, prompt_tokens: int, new_tokens: int) -> dict[str, int]:
    """A page pool holding every row at ``prompt + new_tokens`` positions (``engine.max_model_len`` when set: the
    longest rows the run allows), a decode step over it with every row at that length, and one prefill chunk. The
    pool is a real tensor (its bytes counted as allocated); the block table is made fake, so the gather a step makes
    is counted without being computed."""
    import torch

    from lorapop.engine.kvsize import kv_capacity, token_bytes

    dims, dtype = probe.cache_dims(), getattr(torch, ecfg.dtype)
    capacity = kv_capacity(prompt_tokens + new_tokens, ecfg.max_model_len)
    out = {"kv_token": token_bytes(*dims, dtype)}
    n_rows = max(1, ecfg.gen_batch_size)
    chunk_rows = max(1, min(ecfg.gen_batch_size, ecfg.prefill_chunk_tokens // max(1, prompt_tokens)))
    width = min(prompt_tokens, ecfg.prefill_chunk_tokens)
    holder: list = []
    out["kv_pool"] = _measure(lambda: holder.append(probe.paged_cache(n_rows, capacity)))
    probe.fake_table(holder[0])
    cache = holder.pop()
    out["prefill"] = _measure(lambda: probe.prefill(cache, chunk_rows, width))
    if ecfg.backend == "torch":  # vllm decodes in its own engine
        out["decode"] = _measure(lambda: probe.decode(cache, n_rows, capacity))
    del cache
    return out


def _vllm_share(probe: Any, ecfg: Any) -> dict[str, int]:
    """The figures the plan sizes vLLM's share with (see plan._assemble_vllm): its largest CUDA graph, its LoRA
    weights in the model dtype, a KV token, one prefill forward."""
    import torch

    from lorapop.engine.kvsize import kv_capacity, token_bytes

    dims, dtype = probe.cache_dims(), getattr(torch, ecfg.dtype)
    out = {"vllm_graph": 0}
    cap = vllm_graph_capture_tokens(ecfg)
    if cap:  # the largest graph vLLM captures: one decode token for each of `cap` rows
        graphs = probe.paged_cache(cap, kv_capacity(1))
        out["vllm_graph"] = _measure(lambda: probe.prefill(graphs, cap, 1))
        del graphs
    out["vllm_lora"] = probe.lora_elements() * torch.empty((), dtype=dtype).element_size()
    out["vllm_kv_token"] = token_bytes(*dims, dtype)
    tokens = max(1, ecfg.prefill_chunk_tokens)
    one = probe.paged_cache(1, kv_capacity(tokens))
    out["vllm_forward"] = _measure(lambda: probe.prefill(one, 1, tokens))
    del one
    return out


def _update(probe: Any, ecfg: Any, prompt_tokens: int, new_tokens: int) -> dict[str, int]:
    """One train micro-batch with and without activation checkpointing, and one scoring batch."""
    rows = max(1, ecfg.train_micro_batch_size)
    out = {}
    for key, ckpt in (("train_ckpt", True), ("train", False)):
        probe.zero_grad()
        out[key] = _measure(lambda: probe.train_micro_batch(rows, prompt_tokens, new_tokens, ckpt))
    probe.zero_grad()
    out["logprobs"] = _measure(lambda: probe.logprobs(rows, prompt_tokens, new_tokens))
    return out


def _at_depth(mcfg: Any, layers: int) -> Any:
    c = copy.deepcopy(mcfg)
    c.num_hidden_layers = layers
    if getattr(c, "layer_types", None):  # transformers 5 keeps a per-layer attention type list
        c.layer_types = list(c.layer_types)[:layers]
    return c


@dataclass
class Measured:
    """What :func:`measure` found for a config; :func:`assemble` turns it into a plan for any memory size."""
    model: str
    engine: Any  # the EngineConfig planned (dtypes resolved)
    phases: dict[str, int]
    prompt_tokens: int
    new_tokens: int
    n_adapters: int
    reply_tokens: int = REPLY_TOKENS  # the reply the paged cache's rows are also counted at (plan --reply-tokens)


def measure(cfg: Any, prompt_tokens: int = DEFAULT_PROMPT_TOKENS, resident_only: bool = False) -> Measured:
    """Measure each phase of ``cfg``'s run under fake tensors; see the module docstring. ``resident_only``: the
    resident state and the cache's dimensions only (what :func:`lorapop.plan.engine_kv_cache` needs)."""
    from lorapop.engine.dtype import resolve_lora_compute_dtype

    ecfg = copy.deepcopy(cfg.engine)
    ecfg.device = "cpu"
    ecfg.dtype = "bfloat16" if ecfg.dtype == "auto" else ecfg.dtype  # the plan is for a GPU: auto is bf16 there
    ecfg.lora_compute_dtype = resolve_lora_compute_dtype(ecfg.lora_compute_dtype, ecfg.dtype)
    mcfg = model_config(cfg.model.name)
    sp = cfg.selfplay
    new_tokens = max(sp.propose.max_new_tokens, sp.solve.max_new_tokens)
    n = cfg.population.n_members
    depth = mcfg.num_hidden_layers
    lo, hi = PROBE_LAYERS
    if depth <= hi:
        m = measure_phases(mcfg, n, copy.deepcopy(ecfg), prompt_tokens, new_tokens, resident_only)
    else:
        a = measure_phases(_at_depth(mcfg, lo), n, copy.deepcopy(ecfg), prompt_tokens, new_tokens, resident_only)
        b = measure_phases(_at_depth(mcfg, hi), n, copy.deepcopy(ecfg), prompt_tokens, new_tokens, resident_only)
        m = {k: a[k] + (b[k] - a[k]) * (depth - lo) // (hi - lo) for k in a}
    return Measured(cfg.model.name, ecfg, m, prompt_tokens, new_tokens, n)


def vllm_graph_capture_tokens(ecfg: Any) -> int:
    """vLLM's largest CUDA-graph capture size for ``ecfg`` (tokens = rows of one decode step); 0 when eager."""
    if ecfg.vllm_enforce_eager:
        return 0
    return min(2 * max(1, ecfg.gen_batch_size), VLLM_MAX_CAPTURE_TOKENS, max(1, ecfg.prefill_chunk_tokens))
