"""Scratch directories of processes killed with -9 are removed by the next process that makes one."""

from __future__ import annotations

import os
import subprocess
import sys

from lorapop.tmpdirs import owned_tempdir, remove_orphans


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_only_the_directories_of_dead_processes_are_removed(tmp_path):
    prefix = "lorapop-x-"
    mine, gone, live = (tmp_path / f"{prefix}{pid}-x" for pid in (os.getpid(), _dead_pid(), os.getppid()))
    for d in (mine, gone, live):
        (d / "slot0-v1").mkdir(parents=True)
    (tmp_path / f"{prefix}notapid").mkdir()
    assert remove_orphans(tmp_path, prefix) == [gone]
    assert mine.exists() and live.exists() and not gone.exists() and (tmp_path / f"{prefix}notapid").exists()


def test_owned_tempdir_names_its_owner_and_clears_the_dead_ones(tmp_path):
    prefix = "lorapop-x-"
    gone = tmp_path / f"{prefix}{_dead_pid()}-abc"
    gone.mkdir()
    d = owned_tempdir(prefix, tmp_path)
    assert d.parent == tmp_path and d.name.startswith(f"{prefix}{os.getpid()}-") and d.is_dir()
    assert not gone.exists()


def test_the_sandbox_worker_roots_use_it(tmp_path, monkeypatch):
    """The sandbox's worker roots carry the pid too, and a dead run's roots go when the next sandbox starts."""
    from lorapop.executor.sandbox import SandboxExecutor
    from lorapop.executor.handle import SANDBOX_PREFIX
    from lorapop.executor.base import ExecutorConfig

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    gone = tmp_path / f"{SANDBOX_PREFIX}{_dead_pid()}-old"
    gone.mkdir()
    with SandboxExecutor(ExecutorConfig(n_workers=1)) as ex:
        assert ex.run("_result = 1 + 1").value == "2"
        roots = sorted(p.name for p in tmp_path.glob(SANDBOX_PREFIX + "*"))
    assert not gone.exists()
    assert roots and all(r.startswith(f"{SANDBOX_PREFIX}{os.getpid()}-") for r in roots), roots
