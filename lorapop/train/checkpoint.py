"""Atomic checkpoints (SPEC section 7).

A checkpoint is written into ``checkpoints/.tmp-step_XXXXXX-<pid>`` and renamed to ``checkpoints/step_XXXXXX`` only
when complete (adapters in PEFT format, engine state with optimizer moments, trainer state with RNG states, buffers,
ratings, population, lineage and coverage; ``COMPLETE`` written last). A process killed at any moment therefore leaves
either the previous checkpoint or the new one, never a half-written ``step_`` directory; leftover temp dirs are
deleted on the next start.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

STEP_RE = re.compile(r"^step_(\d{6,})$")
# Fault injection for the kill tests: sleep this long inside a checkpoint write, after the adapters are on disk and
# before the rename, so a test can SIGKILL the run mid-write deterministically.
PAUSE_ENV = "LORAPOP_TEST_CHECKPOINT_PAUSE_S"


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_checkpoint(ckpt_root: Path, step: int, engine: Any, member_slots: dict[str, int],
                    trainer_state: dict[str, Any], keep: int = 0) -> Path:
    import torch

    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / checkpoint_name(step)
    tmp = ckpt_root / f".tmp-{checkpoint_name(step)}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for member_id, slot in member_slots.items():
        engine.save_adapter(slot, tmp / "adapters" / member_id)
    torch.save(engine.state_dict(), tmp / "engine_state.pt")
    write_json_atomic(tmp / "trainer_state.json", trainer_state)
    pause = float(os.environ.get(PAUSE_ENV, "0") or 0)
    if pause > 0:
        time.sleep(pause)
    (tmp / "COMPLETE").write_text(str(step))
    _fsync_dir(tmp)
    if final.exists():  # re-running a step after a resume: the new write replaces the old one whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(ckpt_root)
    if keep > 0:
        for old in list_checkpoints(ckpt_root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not ckpt_root.is_dir():
        return []
    found = []
    for p in ckpt_root.iterdir():
        m = STEP_RE.match(p.name)
        if m and (p / "COMPLETE").is_file():  # written last, after trainer_state.json
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    ckpts = list_checkpoints(ckpt_root)
    return ckpts[-1] if ckpts else None


def clean_temp(ckpt_root: Path) -> list[Path]:
    """Remove temp dirs left by a process killed mid-write; returns what was removed."""
    removed = []
    if ckpt_root.is_dir():
        for p in ckpt_root.iterdir():
            if p.name.startswith(".tmp-"):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed


def read_trainer_state(ckpt: Path) -> dict[str, Any]:
    with open(ckpt / "trainer_state.json") as fh:
        return json.load(fh)


def truncate_jsonl(path: Path, max_step: int) -> int:
    """Keep only complete lines with ``step <= max_step`` (a resumed run rewrites the steps after its checkpoint, so
    nothing is counted twice). A torn last line from a kill is dropped too. Returns the number of lines dropped."""
    if not path.exists():
        return 0
    kept, dropped = [], 0
    with open(path, "rb") as fh:
        for raw in fh:
            try:
                rec = json.loads(raw)
                ok = raw.endswith(b"\n") and int(rec.get("step", 0)) <= max_step
            except (ValueError, TypeError, AttributeError):
                ok = False
            if ok:
                kept.append(raw)
            else:
                dropped += 1
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.writelines(kept)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return dropped
