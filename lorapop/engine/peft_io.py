"""Save/load one adapter as a standard PEFT LoRA directory (adapter_config.json + adapter_model.safetensors).

Keys follow peft's on-disk layout, ``base_model.model.<module path>.lora_A.weight`` ([r, d_in]) and ``...lora_B.weight``
([d_out, r]), so ``peft.PeftModel.from_pretrained`` reads what we write and we read what peft writes. Writes go to a
temp dir beside the target and are renamed into place, so a crash never leaves a half-written adapter.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
PREFIX = "base_model.model."


class AdapterFormatError(ValueError):
    """An adapter directory that cannot be used with this engine (wrong rank, unknown modules, unsupported options)."""


def peft_config(*, rank: int, lora_alpha: float, target_modules: list[str], base_model_name_or_path: str | None) -> dict:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": lora_alpha,
        "target_modules": sorted(target_modules),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "base_model_name_or_path": base_model_name_or_path,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "revision": None,
    }


def save_peft_adapter(weights: dict[str, tuple[torch.Tensor, torch.Tensor]], path: str | os.PathLike, *,
                      rank: int, lora_alpha: float, target_modules: list[str],
                      base_model_name_or_path: str | None = None, dtype: torch.dtype = torch.float32) -> Path:
    """``dtype``: the tensors' dtype in the file (float32, the master weights', unless a reader computes in less)."""
    from safetensors.torch import save_file

    path = Path(path)
    tensors = {}
    for name, (a, b) in weights.items():
        tensors[f"{PREFIX}{name}.lora_A.weight"] = a.detach().to("cpu", dtype).contiguous()
        tensors[f"{PREFIX}{name}.lora_B.weight"] = b.detach().to("cpu", dtype).contiguous()
    cfg = peft_config(rank=rank, lora_alpha=lora_alpha, target_modules=target_modules,
                      base_model_name_or_path=base_model_name_or_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        (tmp / CONFIG_NAME).write_text(json.dumps(cfg, indent=2) + "\n")
        save_file(tensors, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        old = None
        if path.exists():
            # os.replace cannot overwrite a non-empty directory: move the old one aside first.
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            os.replace(path, old / "x")
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _scaling(cfg: dict) -> float:
    r, alpha = cfg["r"], cfg.get("lora_alpha", cfg["r"])
    return alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r


def load_peft_adapter(path: str | os.PathLike) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], dict]:
    """Read a PEFT LoRA directory: ``({module path: (A, B)}, config dict)``. Tensors come back float32 on CPU."""
    from safetensors.torch import load_file

    path = Path(path)
    cfg_file, w_file = path / CONFIG_NAME, path / WEIGHTS_NAME
    if not cfg_file.is_file():
        raise FileNotFoundError(f"not a PEFT adapter directory: {cfg_file} is missing")
    if not w_file.is_file():
        if (path / "adapter_model.bin").is_file():
            raise AdapterFormatError(f"{path}: only adapter_model.safetensors is supported (found adapter_model.bin)")
        raise FileNotFoundError(f"not a PEFT adapter directory: {w_file} is missing")
    cfg = json.loads(cfg_file.read_text())
    if cfg.get("peft_type", "LORA") != "LORA":
        raise AdapterFormatError(f"{path}: peft_type is {cfg.get('peft_type')!r}, only LORA adapters are supported")
    for key in ("use_dora",):
        if cfg.get(key):
            raise AdapterFormatError(f"{path}: {key}=true is not supported by the multi-LoRA engine")
    if cfg.get("bias", "none") != "none":
        raise AdapterFormatError(f"{path}: bias={cfg['bias']!r} is not supported (only 'none')")
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        raise AdapterFormatError(f"{path}: per-module rank_pattern/alpha_pattern is not supported (one rank for all)")
    raw = load_file(str(w_file))
    weights: dict[str, list] = {}
    for key, t in raw.items():
        if not key.startswith(PREFIX) or not key.endswith((".lora_A.weight", ".lora_B.weight")):
            raise AdapterFormatError(f"{path}: unexpected tensor {key!r} (only LoRA A/B weights are supported)")
        body = key[len(PREFIX):]
        name, part = body.rsplit(".", 2)[0], body.rsplit(".", 2)[1]
        slot = weights.setdefault(name, [None, None])
        slot[0 if part == "lora_A" else 1] = t.to(torch.float32)
    out = {}
    for name, (a, b) in weights.items():
        if a is None or b is None:
            raise AdapterFormatError(f"{path}: module {name} has only one of lora_A / lora_B")
        out[name] = (a, b)
    cfg["scaling"] = _scaling(cfg)
    return out, cfg
