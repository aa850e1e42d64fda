"""A per-row-position forward for the Llama / Qwen2 family over the HF modules' own weights and the paged KV cache
(:mod:`.paged`).

Why not HF's own forward with its ``StaticCache``: that cache shares one ``cache_position`` across the batch, so
rows cannot sit at different positions, and continuous batching (a finished row's slot taking a new prompt) needs
exactly that. Here every row has its own positions: token ``j`` of a row has position id ``j`` and lives in the
row's pages at its logical position ``j``, so no padding ever enters the cache and a slot can be refilled at any
time.

The forward reuses the model's modules (embedding, RMSNorms, rotary embedding, the projections with their LoRA
wrappers, the MLP activation, the head) and only re-implements the attention core around the cache, so a Qwen2
qkv bias or a Llama head_dim come from the modules themselves. The cache has one spare position (``trash``) past
the longest row, on the trash page: padding and finished rows write there, and no real query ever reads it.

Two LoRA paths: eager calls the wrapped layers (``lora.py``'s grouped decode path, the cheapest on CPU); the
compiled step uses a *dense* form, ``((x @ A_cat^T) * row_mask) @ B_cat^T`` with every adapter's factors stacked
into one ``[N * r, d]`` matrix, which has static shapes and no data-dependent indexing (so it fits in one CUDA
graph) at the cost of N times the LoRA FLOPs (~7% of a 7B layer's at N = 8, r = 16).

Sampling is whole-batch and counter-based: each row's Gumbel noise is a hash of (its seed, its step, the token id),
so a row's sample depends only on its seed and how many tokens it has produced, never on the batch around it or
its slot, and costs no per-row kernel launch.

The compiled step is one graph per sampling branch for a whole run, made ready before the first
decode step (:mod:`.compiled`), as in gpt-fast (one compiled decode over a fixed-size cache) and vLLM (symbolic
shapes, then a CUDA graph per batch size): the cache keeps one shape for the run, the batch size and the number of
(row, chunk) pairs a step reads are dimensions dynamo treats as symbolic (so a step reads each row's own length,
not the whole capacity), and the sampling settings are per-row tensors. The K/V write is one ``index_put_`` on the
whole pool (only the new positions are touched); a prefill's attention folds each query group into the query
length so the fused CUDA kernels accept it (see ``attend``).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from lorapop.hostmem import lazy_zeros

from .lora import MultiLoRALinear

M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (lowbias32-style) on int64 tensors holding values in [0, 2^32). Both multipliers are
    below 2^31, so no product overflows int64."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & M32
    x = x ^ (x >> 15)
    x = (x * 0x446CA68B) & M32
    return x ^ (x >> 16)


def _own_buffer(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself (eager: a view of its storage); under ``torch.compile``, a buffer of its own. Inductor inlines a
    pointwise chain into its consumers, and every line of :func:`_mix32` reads its input twice, so nested hashes
    give loop bodies that double with each line: compiled alone with a cold cache, this noise took about 35 s of
    inductor's CPU code generation, against about 3 s with each row key in a buffer (docs/RESULTS.md, "Cold
    inductor caches in the suite"). Inductor's lowering of ``as_strided`` realizes its input
    (torch/_inductor/lowering.py, ``as_strided``). Only per-row ``[b]`` tensors go through it: a ``[b, V]`` one
    would be written to memory every decode step."""
    return t.as_strided(t.shape, t.stride())


def gumbel_noise(seeds: torch.Tensor, steps: torch.Tensor, vocab_key: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise ``[b, V]`` for rows with int64 ``seeds`` at int64 ``steps``; ``vocab_key`` is
    ``_mix32(arange(V))`` (precomputed once)."""
    key = _own_buffer(_mix32(seeds & M32))  # a row's key: its seed's low word, its high word, then its step
    key = _own_buffer(_mix32(key ^ ((seeds >> 32) & M32)))
    key = _own_buffer(_mix32(key ^ (steps & M32)))
    bits = _mix32(key[:, None] ^ vocab_key[None, :])
    u = ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # in (0, 1), never 0 or 1
    return -torch.log(-torch.log(u))


def sample_tokens(logits: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor, vocab_key: torch.Tensor,
                  eos_mask: torch.Tensor | None, min_new: torch.Tensor, temperature: torch.Tensor,
                  top_p: torch.Tensor, branches: tuple[bool, bool] = (True, True)
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token per row from float32 ``logits [b, V]``, and its log-probability under the distribution it was
    drawn from. Per-row settings: ``min_new [b]`` (EOS is masked while a row's ``steps < min_new``),
    ``temperature [b]`` (<= 0: greedy), ``top_p [b]`` (>= 1: no nucleus cut).

    The log-probability is ``log_softmax(logits / T)`` at the token, over the nucleus when one is cut and without
    the EOS ids while they are masked: what the trainer must score to be on-policy (docs/METHOD.md, "On-policy
    updates") and what vLLM returns as processed log-probs. A greedy row, drawn from no distribution, gets its
    temperature-1 log-probability over the whole vocabulary (vLLM's raw log-probs).

    The settings are tensors so a compiled step never specialises on their values (one graph serves every
    temperature). ``branches`` = (some row samples, some row cuts a nucleus): the eager path passes what the host
    knows and skips the noise or the vocabulary sort when no row needs it; the compiled step passes (True, nucleus),
    computing the noise for every row and selecting per row (the same tokens), and compiles the nucleus into a
    second graph only for calls that cut one.

    Gumbel-max rather than inverse-CDF: the pick only flips if the top two perturbed scores are within float
    noise, so batch composition (which perturbs logits by ~1e-6) does not change a row's sample."""
    if eos_mask is not None:
        logits = logits.masked_fill(eos_mask[None, :] & (steps < min_new)[:, None], float("-inf"))
    greedy = logits.argmax(-1)
    sample, nucleus = branches
    if not sample:
        return greedy, logits.gather(-1, greedy[:, None]).squeeze(-1) - logits.logsumexp(-1)
    hot = temperature > 0
    scaled = logits / torch.where(hot, temperature, torch.ones_like(temperature))[:, None]
    if nucleus:
        sp, si = torch.softmax(scaled, dim=-1).sort(dim=-1, descending=True)
        # the crossing token stays; a greedy row keeps its whole distribution, so its log-prob is the raw one
        drop_sorted = ((sp.cumsum(-1) - sp) >= top_p[:, None]) & ((top_p < 1.0) & hot)[:, None]
        scaled = scaled.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, si, drop_sorted), float("-inf"))
    picked = torch.where(hot, (scaled + gumbel_noise(seeds, steps, vocab_key)).argmax(-1), greedy)
    return picked, scaled.gather(-1, picked[:, None]).squeeze(-1) - scaled.logsumexp(-1)


def attend(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, allowed: torch.Tensor,
           scale: float | None) -> torch.Tensor:
    """Grouped-query attention ``q [b, H, t, d]`` over ``keys, vals [b, n_kv, L, d]`` where ``allowed [b, 1, t, L]``
    (bool), returning ``[b, H, t, d]``.

    Each group's ``H / n_kv`` query heads are folded into the query length, so K/V keep ``n_kv`` heads and the
    call needs no ``enable_gqa``: on CUDA the memory-efficient kernel takes an explicit mask but not
    ``enable_gqa``, and without it SDPA falls back to the math path, which repeats K/V to ``H`` heads and
    materialises the float32 score matrix. Decoding (``t == 1``) folds by views only; the mask broadcasts over
    the group (stride 0). In a prefill chunk the folded mask is materialised, ``b * H / n_kv * t * L`` bools."""
    b, h, t, d = q.shape
    n_kv, length = keys.shape[1], keys.shape[2]
    g = h // n_kv
    if g > 1:
        q = q.reshape(b, n_kv, g * t, d)
        allowed = allowed[:, :, None].expand(b, 1, g, t, length).reshape(b, 1, g * t, length)
    o = F.scaled_dot_product_attention(q, keys, vals, attn_mask=allowed, scale=scale)
    return o.reshape(b, h, t, d)


def cache_zeros(shape: tuple[int, ...], dtype, device) -> torch.Tensor:
    """One layer's K or V cache, zero-filled. On CPU its pages become resident only where rows write (or attention
    reads) them (:func:`lorapop.hostmem.lazy_zeros`): a cache sized for ``gen_batch_size`` rows of the longest
    length holds in memory about what the call's rows really reach, not its capacity. Elsewhere, and under a
    dispatch mode (lorapop plan's fake tensors count what an op allocates), ``torch.zeros``."""
    if torch.device(device).type == "cpu" and not is_in_torch_dispatch_mode():
        return lazy_zeros(shape, dtype)
    return torch.zeros(shape, dtype=dtype, device=device)


class LlamaFamilyDecoder:
    """The per-row-position forward (see the module docstring) over ``model``'s modules."""

    def __init__(self, model: Any, n_adapters: int, rank: int, scaling: float) -> None:
        inner = model.get_decoder()
        need = ("embed_tokens", "layers", "norm", "rotary_emb")
        layer0 = inner.layers[0] if hasattr(inner, "layers") and len(inner.layers) else None
        parts = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")
        if any(not hasattr(inner, a) for a in need) or layer0 is None or any(not hasattr(layer0, a) for a in parts) \
                or not all(hasattr(layer0.mlp, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            raise NotImplementedError(
                f"TorchEngine generation supports the Llama / Qwen2 decoder family (embed_tokens, layers with "
                f"self_attn q/k/v/o_proj and a gated MLP, rotary_emb); {type(model).__name__} is not of it")
        self.model, self.inner = model, inner
        self.head = model.get_output_embeddings()
        cfg = model.config
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.n_layers = len(inner.layers)
        self.apply_rope = sys.modules[type(layer0.self_attn).__module__].apply_rotary_pos_emb
        self.n_adapters, self.rank, self.scaling = n_adapters, rank, scaling
        self.dense: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(layer) -> (A_cat, B_cat), base dtype

    # ---------------------------------------------------------------- dense LoRA (compiled path)
    @torch.no_grad()
    def refresh_dense(self) -> None:
        """(Re)fill every wrapped layer's stacked factors in the base dtype from the float32 master weights, in
        place once allocated (fixed addresses for CUDA graphs)."""
        for m in self.model.modules():
            if not isinstance(m, MultiLoRALinear):
                continue
            n, d_out, r = m.lora_B.shape
            a_src = m.lora_A.reshape(n * r, -1)
            b_src = m.lora_B.permute(1, 0, 2).reshape(d_out, n * r)
            if id(m) not in self.dense:
                dt = m.base.weight.dtype
                self.dense[id(m)] = (a_src.to(dt).clone(), b_src.to(dt).contiguous())
                if a_src.is_cuda:
                    for t in self.dense[id(m)]:
                        torch._dynamo.mark_static_address(t)
            else:
                a, b = self.dense[id(m)]
                a.copy_(a_src)
                b.copy_(b_src)

    def row_mask(self, ids: torch.Tensor, dtype) -> torch.Tensor:
        """``[b, N * r]``: ``scaling`` on the r columns of each row's adapter, 0 elsewhere (all 0 for id -1)."""
        cols = torch.arange(self.n_adapters * self.rank, device=ids.device) // self.rank
        return (ids[:, None] == cols[None, :]).to(dtype) * self.scaling

    def _proj(self, m, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is None or not isinstance(m, MultiLoRALinear):
            return m(x)
        a, b = self.dense[id(m)]
        return m.base(x) + ((x @ a.T) * mask[:, None, :]) @ b.T

    # ---------------------------------------------------------------- the forward
    def forward(self, cache: Any, tokens: torch.Tensor, pos: torch.Tensor, write: torch.Tensor,
                kv: int | torch.Tensor, slots: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Run ``tokens [b, T]`` at positions ``pos [b, T]``, writing their K/V at cache index ``write [b, T]``
        (= pos, or ``cache.trash`` for padding), and return the final hidden states ``[b, T, d]``.

        ``kv``: what attention reads. A prefill chunk: the positions ``0..kv-1``, as a length or as
        ``cache.span(length)``, queries attending to positions ``<= pos``. A decode step: ``[N, 2]`` (row, chunk)
        pairs, each row reading only its own chunks (:mod:`.splitkv`). ``slots``: the cache slot of each row
        (prefill), or None when the rows are slots ``0..b-1`` (decode). ``mask``: the dense LoRA row mask (compiled
        path), else the layers' own LoRA path (LoRAContext).

        The new K/V are written with one ``index_put_`` on the whole pool, touching ``b x T`` positions: a write
        into a slice of it is functionalised under inductor into a copy of the whole slice and a copy back, every
        step."""
        b, t = tokens.shape
        span = cache.span(kv) if isinstance(kv, int) else kv
        split = span.dim() == 2  # a decode step's (row, chunk) pairs: each row reads its own length (splitkv)
        kv_len = span.shape[0]
        w_at, r_at = cache.locate(slots, b, write, span)
        x = self.inner.embed_tokens(tokens)
        cos, sin = self.inner.rotary_emb(x, pos)
        allowed = None if split else span[None, None, None, :] <= pos[:, None, :, None]
        for li, layer in enumerate(self.inner.layers):
            attn, mlp = layer.self_attn, layer.mlp
            h = layer.input_layernorm(x)
            q = self._proj(attn.q_proj, h, mask).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
            k = self._proj(attn.k_proj, h, mask).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
            v = self._proj(attn.v_proj, h, mask).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
            q, k = self.apply_rope(q, k, cos, sin)
            cache.store(li, w_at, k, v)
            if split:
                o = cache.attend_pairs(li, q, r_at, attn.scaling)
            else:
                keys, vals = cache.load(li, r_at, b, kv_len)
                o = attend(q, keys, vals, allowed, attn.scaling)
            x = x + self._proj(attn.o_proj, o.transpose(1, 2).reshape(b, t, -1), mask)
            h = layer.post_attention_layernorm(x)
            gate = mlp.act_fn(self._proj(mlp.gate_proj, h, mask)) * self._proj(mlp.up_proj, h, mask)
            x = x + self._proj(mlp.down_proj, gate, mask)
        return self.inner.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden)
        return logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 up to float32; float64 kept

    def decode_step(self, cache: Any, tokens: torch.Tensor, pos: torch.Tensor, ids: torch.Tensor,
                    seeds: torch.Tensor, steps: torch.Tensor, span: torch.Tensor, vocab_key: torch.Tensor,
                    eos_mask: torch.Tensor | None, min_new: torch.Tensor, temperature: torch.Tensor,
                    top_p: torch.Tensor, dense: bool, branches: tuple[bool, bool]
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token and its sampler log-probability for rows = slots ``0..b-1``: forward their input
        ``tokens [b]`` at ``pos [b]`` (writing K/V there; pos == trash for free slots), each row attending to its own
        chunks through ``span``, the step's (row, chunk) pairs (``cache.reads``), and sample with the per-row
        settings (see sample_tokens). This is the function ``torch.compile`` wraps: ``b`` and the pair count are
        symbolic, the settings tensors, so only ``branches`` makes another graph."""
        mask = self.row_mask(ids, cache.k[0].dtype) if dense else None
        hidden = self.forward(cache, tokens[:, None], pos[:, None], pos[:, None], span, None, mask)
        return sample_tokens(self.logits(hidden[:, -1]), seeds, steps, vocab_key, eos_mask, min_new, temperature,
                             top_p, branches)
