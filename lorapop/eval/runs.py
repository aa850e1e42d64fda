"""What ``lorapop eval`` needs of a run directory, read through :mod:`lorapop.rundir` (the one owner of the layout).

The members of a checkpoint are its adapter directories; their records come from the checkpoint's trainer state,
else ``population.json``, else the id's prefix (t/s/a).
"""

from __future__ import annotations

from pathlib import Path

from lorapop.rundir import RunDir, RunDirError
from lorapop.train.members import Member

__all__ = ["Member", "RunDirError", "find_checkpoint", "is_single", "load_members", "model_name"]


def find_checkpoint(run_dir: str | Path, step: int | None = None) -> Path:
    """``checkpoints/step_XXXXXX`` of ``step``, else the latest complete one."""
    return RunDir(run_dir).find_checkpoint(step)


def load_members(run_dir: str | Path, checkpoint: Path) -> list[Member]:
    """Members of ``checkpoint`` (sorted by id), each with its PEFT adapter's rank/alpha/targets."""
    return RunDir(run_dir).checkpoint_members(checkpoint)


def model_name(run_dir: str | Path) -> str:
    """The base model of a run: config.yaml ``model.name``, else ``embedded``."""
    return RunDir(run_dir).model_name()


def is_single(run_dir: str | Path) -> bool:
    return RunDir(run_dir).is_single()
