"""`lorapop plan CONFIG --cpu`: the peak resident memory of a run on CPU, measured as `lorapop plan` measures a GPU's
(the engine's own code on fake tensors, :mod:`lorapop.plan.measure`), and the check `lorapop train` makes before
step 1 on CPU.

What a CPU run holds differs from a GPU's in three ways, each taken from the engine's own behaviour:

- the process itself: Python, torch, transformers and the run's bookkeeping, measured as this process's resident
  memory once they are imported (``process``); the trainer's is that plus what is planned here;
- the KV cache is resident only where rows write (:func:`lorapop.engine.decode.cache_zeros`) and lives for one
  generate call, so it counts the rows of the largest call (``gen_batch_size`` at most), each at its own length, not
  ``gen_batch_size`` slots of the capacity, and is gone during the update. The model of that residency: every row
  at its call's mean prompt as the config builds prompts from its seed files (:func:`seed_prompt_tokens`), plus its
  full ``max_new_tokens`` (replies that stop early hold less);
- the update holds the base, the adapters with their optimizer state, and one micro-batch's peak, its rows padded
  to the longest: planned at the prompt budget (``--prompt-tokens``; the prompt format's by default) plus the
  longest reply.

The peak is the process plus the larger of generation and the update. ``--prompt-tokens`` puts every row, the
cache's included, at that length.
"""

from __future__ import annotations

import copy
import functools
import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

GIB = 2**30


def generate_rows(cfg: Any) -> dict[str, int]:
    """Rows of each generate call of a step (lorapop/train/stages.py): every teacher's proposals in one call, every
    student's answers (``n_solve`` per task) in another; the single agent makes both."""
    sp, pop = cfg.selfplay, cfg.population
    teachers, students = (1, 1) if pop.mode == "single" else (pop.n_teachers, pop.n_students)
    per_member = len(sp.task_types) * sp.tasks_per_type
    return {"propose": teachers * per_member, "solve": students * per_member * sp.n_solve}


@functools.lru_cache(maxsize=2)
def _tokenizer(name: str) -> Any:
    """The model's tokenizer from local files (seconds to load: kept for the process), None where not at hand."""
    from lorapop.model import import_transformers, prepare_model

    try:
        return import_transformers().AutoTokenizer.from_pretrained(str(prepare_model(name)), local_files_only=True)
    except (OSError, ValueError):  # ModelNotFoundError included
        return None


def seed_prompt_tokens(cfg: Any) -> dict[str, float] | None:
    """The mean prompt, in the model's tokens, of each generate call of a step as the config builds them from its
    seed files (lorapop/train/stages.py): ``propose``, teacher prompts, each with ``n_references`` references drawn
    as the run draws them (code_f's from the code_o and code_i tasks); ``solve``, the student prompt of every seed
    task. What the lazily resident KV cache holds per row early in a run, when the buffers are the seeds and the
    tasks teachers add are no longer than their replies. None where the config has no seed files or the tokenizer
    is not at hand without the network."""
    import random

    from lorapop.data import resolve_data_file
    from lorapop.engine.base import chat_prompt_ids
    from lorapop.tasks import TASK_TYPES
    from lorapop.tasks.buffer import read_seed_file
    from lorapop.tasks.formats import prompt_format
    from lorapop.tasks.styles import proposal_style

    sp = cfg.selfplay
    pools: dict[str, list] = {tt: [] for tt in sp.task_types}
    for name in sp.seed_files:
        path = resolve_data_file(name)
        if path is None:
            return None
        with open(path) as fh:
            first = fh.readline()
        for tt in ("code_f",) if '"inputs"' in first else ("code_o", "code_i"):
            if tt in pools:
                pools[tt] += read_seed_file(path, tt)
    if not any(pools.values()):
        return None
    tok = _tokenizer(cfg.model.name)
    if tok is None:
        return None
    style, fmt = proposal_style(sp.proposal_style), prompt_format(sp.prompt_format)
    engine = SimpleNamespace(tokenizer=tok, chat_prompt=lambda text: chat_prompt_ids(tok, text))
    rng = random.Random(0)
    lens: dict[str, list[float]] = {"propose": [], "solve": []}
    for tt, pool in pools.items():
        ty = TASK_TYPES[tt]
        refs_from = [t for k in ("code_o", "code_i") for t in pools.get(k, [])] if tt == "code_f" else pool
        k = 1 if tt == "code_f" else max(1, sp.n_references)
        pre_t = fmt.proposal_start(style, ty, sp.response_prefill)
        pre_s = fmt.answer_start(style, ty, sp.response_prefill)
        teacher = [len(fmt.prompt_ids(engine, fmt.teacher_prompt(style, ty, rng.sample(refs_from, min(k, len(
            refs_from))), rng), pre_t)) for _ in range(64)] if refs_from else []
        student = [len(fmt.prompt_ids(engine, fmt.student_prompt(style, ty, t), pre_s)) for t in pool]
        for call, xs in (("propose", teacher), ("solve", student)):
            if xs:  # every type has as many rows in a call: the call's mean is the mean of the types' means
                lens[call].append(sum(xs) / len(xs))
    if not lens["propose"] or not lens["solve"]:
        return None
    return {call: sum(xs) / len(xs) for call, xs in lens.items()}


def machine_bytes() -> int | None:
    """Memory a new run may take on this machine: ``MemAvailable`` (Linux), else the physical memory; None when
    neither can be read."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


@dataclass
class CpuPlan:
    model: str
    memory_bytes: int
    dtype: str
    phases: dict[str, int] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    generation_bytes: int = 0
    update_bytes: int = 0
    advice: list[str] = field(default_factory=list)

    @property
    def peak_bytes(self) -> int:
        return max(self.generation_bytes, self.update_bytes)

    @property
    def peak_stage(self) -> str:
        return "generation" if self.generation_bytes >= self.update_bytes else "update"

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.memory_bytes

    def render(self) -> str:
        lines = [f"CPU memory plan for {self.model} ({self.dtype}) on {self.memory_bytes / GIB:.1f} GiB"]
        for name, b in self.phases.items():
            note = self.notes.get(name, "")
            lines.append(f"  {name:<44} {b / GIB:8.2f} GiB" + (f"  ({note})" if note else ""))
        lines.append(f"  {'peak resident memory in generation':<44} {self.generation_bytes / GIB:8.2f} GiB")
        lines.append(f"  {'peak resident memory in the update':<44} {self.update_bytes / GIB:8.2f} GiB")
        lines.append(f"peak {self.peak_bytes / GIB:.2f} GiB in the {self.peak_stage}: "
                     + ("fits" if self.fits else "does NOT fit"))
        lines += [f"  - {a}" for a in self.advice]
        return "\n".join(lines)


def measured_cached(cfg: Any, prompt_tokens: int) -> Any:
    """:func:`lorapop.plan.measure.measure` of ``cfg``, kept on disk (``$LORAPOP_CACHE/plans``) under a hash of all
    it depends on: the config's model and engine sections, its members, its lengths, the torch and
    transformers versions and the source of the engine and of the measurement. `lorapop train` plans every CPU run
    before step 1, and measuring takes seconds of CPU; an unchanged config is measured once."""
    import dataclasses
    import hashlib
    import json
    from pathlib import Path

    import torch
    import transformers

    from lorapop.configlib import to_dict
    from lorapop.model import cache_dir
    from lorapop.plan.measure import Measured, measure

    src = Path(__file__).parents[1]  # lorapop/
    code = b"".join(f.read_bytes() for f in sorted([*(src / "engine").glob("*.py"), src / "plan" / "measure.py"]))
    d, sp = to_dict(cfg), cfg.selfplay  # what measure() reads: the model, the engine, the lengths, the adapters
    key = json.dumps([d["model"], d["engine"], cfg.population.n_members, sp.propose.max_new_tokens,
                      sp.solve.max_new_tokens, prompt_tokens, torch.__version__, transformers.__version__],
                     sort_keys=True, default=str).encode()
    path = cache_dir() / "plans" / f"{hashlib.sha256(key + code).hexdigest()[:32]}.json"
    try:
        data = json.loads(path.read_text())
        return Measured(**{**data, "engine": copy.deepcopy(cfg.engine)})
    except (OSError, ValueError, TypeError):
        pass
    measured = measure(cfg, prompt_tokens)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({k: v for k, v in dataclasses.asdict(measured).items() if k != "engine"}))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs the next run the measurement again
    return measured


def plan_cpu(cfg: Any, memory_bytes: int, prompt_tokens: int | None = None,
             process_bytes: int | None = None) -> CpuPlan:
    """The peak resident memory of ``cfg``'s run on CPU, against ``memory_bytes``, with advice when it does not fit.
    ``process_bytes``: the process's own memory (default: this process's, measured)."""
    from lorapop.engine.dtype import resolve_dtype
    from lorapop.hostmem import proc_status_kb
    from lorapop.plan.measure import default_prompt_tokens

    cfg = copy.deepcopy(cfg)
    cfg.engine.device = "cpu"
    cfg.engine.dtype = resolve_dtype(cfg.engine.dtype, "cpu")  # what this machine's run will use
    prompt = prompt_tokens or default_prompt_tokens(cfg)
    import lorapop.engine.torch_engine  # noqa: F401 - torch and transformers, as the trainer imports them

    if process_bytes is None:  # before measuring: the fake tensors' bookkeeping is not the run's
        process_bytes = (proc_status_kb("VmRSS") or 0) * 1024
    process = process_bytes
    measured = measured_cached(cfg, prompt)
    m, ecfg, sp = measured.phases, measured.engine, cfg.selfplay
    p = CpuPlan(cfg.model.name, int(memory_bytes), ecfg.dtype)
    rows = {k: min(n, max(1, ecfg.gen_batch_size)) for k, n in generate_rows(cfg).items()}
    new = {"propose": sp.propose.max_new_tokens, "solve": sp.solve.max_new_tokens}
    # The lazily resident cache holds each row's own tokens: a call's rows at their mean prompt (the seed-built
    # prompts', unless told a length) and every reply at its full budget. The update pads a micro-batch to its
    # longest row, so it is planned at the prompt budget.
    seeded = None if prompt_tokens else seed_prompt_tokens(cfg)
    kv_prompt = {k: round(seeded[k]) if seeded else prompt for k in rows}
    kv = {k: rows[k] * (kv_prompt[k] + new[k]) * m["kv_token"] for k in rows}
    call = max(kv, key=kv.__getitem__)
    ckpt = ecfg.gradient_checkpointing
    mb = max(1, ecfg.train_micro_batch_size)
    table = [
        ("process (Python, torch, transformers)", process, "this process's resident memory, measured"),
        ("base weights", m["base"], ecfg.dtype),
        ("adapters + AdamW moments + gradients", m["adapters"], f"{measured.n_adapters} adapters, float32"),
        ("adapters' inference copies", m["copies"], "base dtype"),
        ("KV cache (largest generate call)", kv[call],
         f"{call}: {rows[call]} rows x ({kv_prompt[call]} prompt{', the seed-built mean,' if seeded else ''} + "
         f"{new[call]} new), resident where written"),
        ("prefill chunk / decode step (peak)", max(m["prefill"], m["decode"]), ""),
        ("train micro-batch (peak)", m["train_ckpt"] if ckpt else m["train"],
         f"{mb} rows x ({prompt} + {measured.new_tokens}), "
         + ("gradient_checkpointing" if ckpt else "no gradient_checkpointing")),
    ]
    for name, b, note in table:
        p.phases[name], p.notes[name] = int(b), note
    resident = process + m["base"] + m["adapters"] + m["copies"]
    p.generation_bytes = resident + kv[call] + max(m["prefill"], m["decode"])
    p.update_bytes = resident + (m["train_ckpt"] if ckpt else m["train"])
    if not p.fits:
        _advise(p, resident, m, kv[call] // rows[call], rows[call], max(m["prefill"], m["decode"]), ecfg)
    return p


def _advise(p: CpuPlan, resident: int, m: dict[str, int], per_row: int, rows: int, transient: int, ecfg: Any) -> None:
    room = p.memory_bytes - resident
    if p.generation_bytes > p.memory_bytes:
        fit = (room - transient) // per_row if per_row else 0
        p.advice.append(f"generation: set --engine.gen_batch_size={fit} (now {ecfg.gen_batch_size}; {rows} rows "
                        "decode at once)" if fit >= 1 else
                        "generation: not one row fits: shorten the prompts or max_new_tokens, or fewer adapters")
    if p.update_bytes > p.memory_bytes:
        if not ecfg.gradient_checkpointing and resident + m["train_ckpt"] <= p.memory_bytes:
            p.advice.append("update: set --engine.gradient_checkpointing=true (update peak "
                            f"{(resident + m['train_ckpt']) / GIB:.1f} GiB)")
        else:  # checkpointing (on, or to turn on) and fewer rows per micro-batch: activations grow with the rows
            mb = max(1, ecfg.train_micro_batch_size)
            fit = int(room // (m["train_ckpt"] / mb)) if m["train_ckpt"] else 0
            also = "" if ecfg.gradient_checkpointing else "--engine.gradient_checkpointing=true and "
            p.advice.append(f"update: set {also}--engine.train_micro_batch_size={min(fit, mb - 1)} (now {mb})"
                            if fit >= 1 else "update: one row does not fit: shorten max_new_tokens or the prompts")


# Floats per token and decoder layer, per unit of (hidden + intermediate) size, that the upper bound below allows
# for one layer's activations kept for backward (and for a forward's transients): the fake-tensor measurement finds
# 4.6 on the embedded model (float32, 8 rows x 1184 tokens, no checkpointing: 11.1 GB), so 16 leaves 3.5x.
ACT_FLOATS = 16


def upper_bound_bytes(cfg: Any, process_bytes: int, prompt_tokens: int | None = None) -> int:
    """A closed-form upper bound on :func:`plan_cpu`'s peak for ``cfg`` (the same rows and prompt length), from the
    model's config alone (no fake tensors): every parameter in the base's dtype (float32 counted for auto); every
    Linear inside the decoder adapted, each adapter with float32 weights, gradients, two AdamW moments and a
    base-dtype copy; the KV cache of the largest generate call at the full length; activations at
    :data:`ACT_FLOATS` float32 per token, layer and unit of hidden + intermediate size, for every layer without
    checkpointing (one layer's plus every layer's input with it), and attention scores of every head over the whole
    row (eager attention's, which memory-efficient attention does not keep); the log-prob chunk's logits eight times
    over (softmax, entropy and their gradients). Milliseconds, where the measurement takes seconds: the check before a
    run measures only when this bound reaches the memory available."""
    import torch

    from lorapop.model import import_transformers
    from lorapop.plan.measure import default_prompt_tokens, model_config

    mcfg, e, sp = model_config(cfg.model.name), cfg.engine, cfg.selfplay
    elt = 8 if e.dtype == "float64" else 4
    with torch.device("meta"):
        model = import_transformers().AutoModelForCausalLM.from_config(mcfg)
    params = sum(t.numel() for t in model.parameters())
    lin = [m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in f".{n}"]
    lora = sum(e.rank * (m.in_features + m.out_features) for m in lin) * cfg.population.n_members * (4 * 4 + elt)
    layers, hidden = mcfg.num_hidden_layers, mcfg.hidden_size
    heads = mcfg.num_attention_heads
    head_dim = getattr(mcfg, "head_dim", None) or hidden // heads
    kv_token = 2 * layers * getattr(mcfg, "num_key_value_heads", heads) * head_dim * elt
    prompt = prompt_tokens or default_prompt_tokens(cfg)
    new = max(sp.propose.max_new_tokens, sp.solve.max_new_tokens)
    rows = max(min(n, max(1, e.gen_batch_size)) for n in generate_rows(cfg).values())
    unit = ACT_FLOATS * (hidden + getattr(mcfg, "intermediate_size", 4 * hidden)) * 4
    vocab = mcfg.vocab_size * 4
    gen_tokens = max(rows, min(prompt * rows, max(1, e.prefill_chunk_tokens)))  # a decode step, a prefill chunk
    generation = rows * (prompt + new) * kv_token + gen_tokens * (unit + 4 * vocab)
    mb, row = max(1, e.train_micro_batch_size), prompt + new
    kept = (hidden * 4 * layers + unit) if e.gradient_checkpointing else unit * layers
    scores = heads * row * 4 * (1 if e.gradient_checkpointing else layers)
    update = mb * row * (kept + scores) + 8 * mb * max(1, e.logprob_chunk_size) * vocab
    return process_bytes + params * elt + lora + max(generation, update)


def check_on_cpu(cfg: Any, note: Any = print) -> CpuPlan | None:
    """Before a CPU run loads its weights: plan its peak and, when it exceeds the memory available now, ``note``
    what to lower. A warning, not a refusal: with swap a run that does not fit is slow, not impossible. The plan is
    measured (seconds, on fake tensors) only where :func:`upper_bound_bytes` reaches the available memory; below it
    the run fits whatever the measurement would say, and None is returned. Nothing happens off CPU or where the
    available memory cannot be read."""
    import torch

    dev = cfg.engine.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    avail = machine_bytes()
    if torch.device(dev).type != "cpu" or avail is None or cfg.engine.backend != "torch":
        return None
    from lorapop.plan.measure import UnknownShape

    import lorapop.engine.torch_engine  # noqa: F401 - the process as plan_cpu measures it
    from lorapop.hostmem import proc_status_kb

    try:
        if upper_bound_bytes(cfg, (proc_status_kb("VmRSS") or 0) * 1024) < avail:
            return None
        p = plan_cpu(cfg, avail)
    except UnknownShape:
        return None
    if not p.fits:
        note(f"warning: this run's planned peak resident memory ({p.peak_bytes / GIB:.1f} GiB, in the "
             f"{p.peak_stage}) exceeds the {avail / GIB:.1f} GiB available: "
             + "; ".join(p.advice) + " (lorapop plan CONFIG --cpu shows the plan)")
    return p
