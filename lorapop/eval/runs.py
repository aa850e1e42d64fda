"""Run-directory discovery for ``lorapop eval`` (the layout is the trainer's; adjust here only).

Assumed layout (SPEC section 7, lorapop/train/checkpoint.py)::

    RUN_DIR/config.yaml                                model: {name}, population: {mode}, engine: {...}
    RUN_DIR/population.json                            {"members": [{"id", "slot", "role", ...}]}
    RUN_DIR/checkpoints/step_XXXXXX/COMPLETE           written last by the trainer
    RUN_DIR/checkpoints/step_XXXXXX/adapters/<id>/     PEFT dir (adapter_config.json + adapter_model.safetensors)
    RUN_DIR/checkpoints/step_XXXXXX/trainer_state.json {"population": {"members": [...]}, ...} (optional)

The members of a checkpoint are its adapter directories; roles come from the checkpoint's trainer state, else
``population.json``, else the id's first letter (t/s/a).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

_ROLE_BY_PREFIX = {"t": "teacher", "s": "student", "a": "agent"}


class RunDirError(FileNotFoundError):
    """A run directory, checkpoint or adapter that is missing or unusable."""


@dataclass
class Member:
    id: str
    role: str  # "teacher" | "student" | "agent" (single mode) | "unknown"
    adapter_dir: Path
    rank: int
    lora_alpha: float
    target_modules: list[str]


def read_run_config(run_dir: Path) -> dict:
    p = Path(run_dir) / "config.yaml"
    if not p.is_file():
        return {}
    import yaml

    return yaml.safe_load(p.read_text()) or {}


def find_checkpoint(run_dir: str | Path, step: int | None = None) -> Path:
    """``checkpoints/step_XXXXXX`` of ``step``, else the latest complete one (``COMPLETE`` marker present)."""
    from lorapop.train.checkpoint import STEP_RE, list_checkpoints

    root = Path(run_dir) / "checkpoints"
    if not Path(run_dir).is_dir():
        raise RunDirError(f"run directory not found: {run_dir}")
    found = {int(STEP_RE.match(p.name).group(1)): p for p in list_checkpoints(root)}
    if step is not None:
        if step not in found:
            raise RunDirError(f"no checkpoint for step {step} in {root} (have: {sorted(found) or 'none'})")
        return found[step]
    if not found:
        raise RunDirError(f"no complete checkpoint (step_XXXXXX/COMPLETE) in {root}")
    return found[max(found)]


def _roles(run_dir: Path, ckpt: Path) -> dict[str, str]:
    for path, key in ((ckpt / "trainer_state.json", "population"), (run_dir / "population.json", None)):
        try:
            obj = json.loads(path.read_text())
            pop = obj[key] if key else obj
            return {str(m["id"]): str(m["role"]) for m in pop["members"]}
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return {}


def load_members(run_dir: str | Path, checkpoint: Path) -> list[Member]:
    """Members of ``checkpoint`` (sorted by id), each with its PEFT adapter's rank/alpha/targets."""
    run_dir, adir = Path(run_dir), Path(checkpoint) / "adapters"
    dirs = sorted(p for p in adir.iterdir() if p.is_dir()) if adir.is_dir() else []
    if not dirs:
        raise RunDirError(f"checkpoint has no adapters: {adir} (expected adapters/<member_id>/ PEFT directories)")
    roles = _roles(run_dir, Path(checkpoint))
    members = []
    for d in dirs:
        cfg_path = d / "adapter_config.json"
        if not cfg_path.is_file() or not (d / "adapter_model.safetensors").is_file():
            raise RunDirError(f"not a PEFT adapter directory (adapter_config.json + adapter_model.safetensors): {d}")
        cfg = json.loads(cfg_path.read_text())
        tm = cfg.get("target_modules") or []
        role = roles.get(d.name) or _ROLE_BY_PREFIX.get(d.name[:1], "unknown")
        members.append(Member(d.name, role, d, int(cfg["r"]), float(cfg.get("lora_alpha", cfg["r"])),
                              [tm] if isinstance(tm, str) else list(tm)))
    return members


def model_name(run_dir: Path, members: list[Member]) -> str:
    """The base model of a run: config.yaml ``model.name``, else ``embedded``."""
    cfg = read_run_config(run_dir)
    name = (cfg.get("model") or {}).get("name") if isinstance(cfg.get("model"), dict) else None
    return str(name or "embedded")


def is_single(run_dir: Path) -> bool:
    cfg = read_run_config(run_dir)
    pop = cfg.get("population") or {}
    return isinstance(pop, dict) and pop.get("mode") == "single"
