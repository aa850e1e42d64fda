"""Scratch directories that outlive a SIGKILL: named after their owner's pid, removed by the next process that starts
when that pid no longer runs (a run killed and resumed over a weekend must not pile them up)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def remove_orphans(root: Path, prefix: str) -> list[Path]:
    """Remove ``root/<prefix><pid>-*`` whose pid is not running (nor this process); returns what was removed.
    Directories named without a pid are left alone: they may belong to a version that did not name them."""
    gone = []
    for d in Path(root).glob(prefix + "*"):
        try:
            pid = int(d.name[len(prefix):].split("-", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not pid_alive(pid):
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d)
    return gone


def owned_tempdir(prefix: str, root: str | Path | None = None) -> Path:
    """A new ``<root>/<prefix><pid>-XXXX`` directory, after removing those of processes that died without cleaning
    up. ``root`` defaults to the temp directory."""
    root = Path(root if root is not None else tempfile.gettempdir())
    remove_orphans(root, prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=root))
