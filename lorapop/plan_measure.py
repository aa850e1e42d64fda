"""What `lorapop plan` measures: each phase's bytes under fake tensors, through the engine's own code (see
:mod:`lorapop.plan`, whose docstring describes the method); the model shapes it knows without the network; the plan's
errors. :mod:`lorapop.plan` turns a :class:`Measured` into a plan for a GPU of any size."""

from __future__ import annotations

import copy
import gc
import weakref
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lorapop.configlib import ConfigError
from lorapop.tasks.formats import AZR, SHORT, prompt_format


# The prompt budgets the plan assumes live on the prompt formats (lorapop/tasks/formats.py); named here for the CLI.
DEFAULT_PROMPT_TOKENS = SHORT.plan_prompt_tokens
AZR_PROMPT_TOKENS = AZR.plan_prompt_tokens
# The reply length the paged KV cache's rows are also counted at (besides the full max_new_tokens): an assumption,
# not a measurement (an example of AZR's typical reply, far below its 8096-token budget); --reply-tokens.
REPLY_TOKENS = 600

# vLLM captures CUDA graphs up to min(2 x max_num_seqs, 512) tokens (lorapop/plan.py says where that comes from);
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



def _fake_engine(mcfg: Any, n_adapters: int, fake_mode: Any, ecfg: Any):
    """The project's TorchEngine on a fake-tensor base model of config ``mcfg`` (no weights read)."""
    import torch

    from lorapop.engine.torch_engine import TorchEngine
    from lorapop.model import import_transformers

    with torch.device("meta"):
        model = import_transformers().AutoModelForCausalLM.from_config(mcfg, dtype=getattr(torch, ecfg.dtype))
    with fake_mode:
        model = model.to_empty(device="cpu")
    # Already on the plan's device and dtype; the engine's model.to() would try to swap the fake parameters, which
    # the fake-tensor mode forbids (it holds weak references to them).
    model.to = lambda *a, **k: model
    # The engine needs only the stop and pad ids from a tokenizer; memory does not depend on them.
    tok = SimpleNamespace(eos_token_id=0, pad_token_id=0, chat_template=None)
    return TorchEngine(model, tok, n_adapters, ecfg, seed=0)


def _measure(fn) -> int:
    """Peak bytes allocated while ``fn`` runs, beyond what was live before it."""
    with LiveBytes() as t:
        fn()
    return t.peak


def _train_peak(eng, rows: int, prompt: int, completion: int, checkpointing: bool) -> int:
    """One train micro-batch (forward, backward into the LoRA gradients) as accumulate_gradients runs it: rows in
    equal runs per adapter, as engine/scoring.py's train_micro_batches makes them."""
    import torch

    ids = sorted(k % eng.n_adapters for k in range(rows))

    def step():
        eng.cfg.gradient_checkpointing = checkpointing
        with eng._checkpointing():
            bonus = eng.cfg.entropy_coeff > 0  # the entropy term's [chunk, vocab] softmax is backpropagated too
            (logp, ent), _ = eng._response_logprobs([[1] * prompt] * rows, [[2] * completion] * rows, ids,
                                                    entropy=True, entropy_grad=bonus)
            (logp.sum() + ent.sum() if bonus else logp.sum()).backward()

    eng.optimizer.zero_grad()
    with torch.enable_grad():
        return _measure(step)


# Layers measured; every figure is affine in the number of identical decoder layers (weights, KV cache and saved
# activations grow by one layer's worth, the transients at the ends do not), so two depths give the full model's.
PROBE_LAYERS = (2, 3)


def measure_phases(mcfg: Any, n_adapters: int, ecfg: Any, prompt_tokens: int, new_tokens: int,
                   resident_only: bool = False) -> dict[str, int]:
    """Bytes of each phase for the model of config ``mcfg`` at its depth, measured on the engine's own code;
    ``resident_only``: only what the KV cache's size depends on (the resident state and the cache's dimensions)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from lorapop.engine.decode import StaticKVCache, kv_capacity
    from lorapop.engine.paged import PAGE, PagedKVCache, token_bytes

    dtype = getattr(torch, ecfg.dtype)
    # Earlier garbage is destroyed now, not inside the counting modes below: in a whole test-suite run an earlier
    # in-process vLLM engine's objects were collected in the middle of this measurement (their destructors' ops ran
    # under the fake mode and failed), and that run's plan came out wrong; not reproduced in isolation.
    gc.collect()
    eng = _fake_engine(mcfg, n_adapters, FakeTensorMode(allow_non_fake_inputs=True), ecfg)
    n = eng.n_adapters
    out: dict[str, int] = {"base": eng.base_bytes()}
    lora = sum(t.numel() * t.element_size() for t in eng._params)
    moments = sum(t.numel() * t.element_size() for t in eng.optimizer.exp_avg + eng.optimizer.exp_avg_sq)
    out["adapters"] = 2 * lora + moments  # float32 gradients are the size of the master weights

    def inference_copies():
        for layer in eng.layers.values():
            layer.refresh_low_precision()
        if ecfg.compile:
            eng._decoder().refresh_dense()

    out["copies"] = _measure(inference_copies)
    dec = eng._decoder()
    # the cache's dimensions, for kvsize.kv_cache_plan (the layer count extrapolates with the depth like the bytes)
    out["kv_layers"], out["kv_heads"], out["kv_head_dim"] = dec.n_layers, dec.n_kv, dec.head_dim
    if resident_only:
        return out
    capacity = kv_capacity(prompt_tokens + new_tokens, ecfg.max_model_len)
    out["per_slot"] = StaticKVCache.slot_bytes(dec.n_layers, dec.n_kv, dec.head_dim, capacity, dtype)
    out["kv_token"] = token_bytes(dec.n_layers, dec.n_kv, dec.head_dim, dtype)
    n_rows = max(1, ecfg.gen_batch_size)
    chunk_rows = max(1, min(ecfg.gen_batch_size, ecfg.prefill_chunk_tokens // max(1, prompt_tokens)))
    width = min(prompt_tokens, ecfg.prefill_chunk_tokens)

    def prefill(cache, rows: int, width: int):
        """One chunk as ContinuousBatcher._prefill runs it: rows into their slots, positions 0..width-1."""
        pos = torch.arange(width)[None].expand(rows, width)
        eng._ctx.set(torch.tensor(sorted(k % n for k in range(rows))))
        eng._ctx.low_precision = True  # as generate() runs it: the adapters' base-dtype copies
        try:
            with torch.no_grad():
                dec.forward(cache, torch.ones(rows, width, dtype=torch.long), pos, pos, width, torch.arange(rows),
                            None)
        finally:
            eng._ctx.low_precision = False
            eng._ctx.set(None)

    def decode(cache, rows: int, kv: int):
        """One decode step's forward with every row attending ``kv`` positions (the paged cache gathers them)."""
        pos = torch.full((rows, 1), kv - 1)
        eng._ctx.set(torch.tensor(sorted(k % n for k in range(rows))))
        eng._ctx.low_precision = True
        try:
            with torch.no_grad():
                dec.forward(cache, torch.ones(rows, 1, dtype=torch.long), pos, pos, kv, None, None)
        finally:
            eng._ctx.low_precision = False
            eng._ctx.set(None)

    # One kind at a time: the caches are real tensors (their bytes counted as allocated); the paged block table is
    # made fake, so the gather a decode step makes is counted without being computed.
    fake = next(eng.model.parameters()).fake_mode
    holder: list = []
    kinds = ("static", "paged") if ecfg.kv_cache == "auto" else (ecfg.kv_cache,)
    for i, kind in enumerate(kinds if ecfg.backend == "torch" else ("static",)):  # vllm: its own cache
        if kind == "paged":  # the pool at its largest: every row at the full length
            out[f"kv_{kind}"] = _measure(lambda: holder.append(PagedKVCache(
                dec.n_layers, n_rows, dec.n_kv, dec.head_dim, capacity, n_rows * capacity // PAGE, dtype,
                torch.device("cpu"))))
            holder[0].table = fake.from_tensor(holder[0].table)
        else:
            out[f"kv_{kind}"] = _measure(lambda: holder.append(StaticKVCache(
                dec.n_layers, n_rows, dec.n_kv, dec.head_dim, capacity, dtype, torch.device("cpu"))))
        cache = holder.pop()
        if i == 0:
            out["prefill"] = _measure(lambda: prefill(cache, chunk_rows, width))
        out[f"decode_{kind}"] = _measure(lambda: decode(cache, n_rows, capacity))
        del cache
    if ecfg.backend == "vllm":  # the figures the plan sizes vLLM's share with (see _assemble_vllm)
        cap = vllm_graph_capture_tokens(ecfg)
        if cap:  # the largest graph vLLM captures: one decode token for each of `cap` rows
            graphs = StaticKVCache(dec.n_layers, cap, dec.n_kv, dec.head_dim, kv_capacity(1), dtype,
                                   torch.device("cpu"))
            out["vllm_graph"] = _measure(lambda: prefill(graphs, cap, 1))
            del graphs
        else:
            out["vllm_graph"] = 0
        out["vllm_lora"] = sum(t.numel() for t in eng._params) * torch.empty((), dtype=dtype).element_size()
        out["vllm_kv_token"] = (StaticKVCache.slot_bytes(dec.n_layers, dec.n_kv, dec.head_dim, 1, dtype)
                                - StaticKVCache.slot_bytes(dec.n_layers, dec.n_kv, dec.head_dim, 0, dtype))
        tokens = max(1, ecfg.prefill_chunk_tokens)
        one = StaticKVCache(dec.n_layers, 1, dec.n_kv, dec.head_dim, kv_capacity(tokens), dtype, torch.device("cpu"))
        out["vllm_forward"] = _measure(lambda: prefill(one, 1, tokens))
        del one
    rows = max(1, ecfg.train_micro_batch_size)
    out["train_ckpt"] = _train_peak(eng, rows, prompt_tokens, new_tokens, True)
    out["train"] = _train_peak(eng, rows, prompt_tokens, new_tokens, False)
    eng.optimizer.zero_grad()

    def logprobs():
        with torch.no_grad():
            eng._response_logprobs([[1] * prompt_tokens] * rows, [[2] * new_tokens] * rows,
                                   sorted(k % n for k in range(rows)))

    out["logprobs"] = _measure(logprobs)
    eng._ctx.set(None)
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
