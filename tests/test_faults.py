"""Faults a long run meets: a full disk at checkpoint time, a sandbox worker killed mid-run. (A
tracker whose store fails mid-run: tests/test_trackers.py, "reported once and the run goes on".)"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from lorapop.executor.sandbox import SandboxExecutor
from lorapop.executor.base import ExecutorConfig
from lorapop.records.rundir import COMPLETE, RunDir
from lorapop.records import RunDirError


@pytest.fixture
def small_fs(tmp_path):
    """A real 1 MiB filesystem (tmpfs), so ENOSPC comes from the kernel, not from a stand-in."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {res.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(path: Path, leave: int) -> Path:
    """Write a filler file until the filesystem has about ``leave`` bytes free."""
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    filler = path / "filler"
    filler.write_bytes(b"\0" * max(0, free - leave))
    return filler


def test_a_full_disk_at_checkpoint_time_fails_clearly_and_keeps_the_last_checkpoint(small_fs):
    rd = RunDir(small_fs / "run")
    rd.create("run: {}\n")
    with rd.new_checkpoint(1) as tmp:
        (tmp / "engine_state.pt").write_bytes(os.urandom(64 * 1024))
    first = (rd.checkpoints / "step_000001" / "engine_state.pt").read_bytes()
    filler = _fill(small_fs, leave=32 * 1024)

    with pytest.raises(RunDirError) as e:
        with rd.new_checkpoint(2) as tmp:
            (tmp / "engine_state.pt").write_bytes(os.urandom(256 * 1024))  # more than is left
    msg = str(e.value)
    assert "No space left on device" in msg and "step_000001, is intact" in msg and "--resume" in msg
    # the last complete checkpoint is untouched, the partial one is gone (its space is free again)
    assert rd.latest_checkpoint().name == "step_000001"
    assert (rd.checkpoints / "step_000001" / COMPLETE).is_file()
    assert (rd.checkpoints / "step_000001" / "engine_state.pt").read_bytes() == first
    assert not [p for p in rd.checkpoints.iterdir() if p.name.startswith(".tmp-")]

    filler.unlink()  # room again: the same step checkpoints, as a resumed run would
    with rd.new_checkpoint(2) as tmp:
        (tmp / "engine_state.pt").write_bytes(os.urandom(256 * 1024))
    assert rd.latest_checkpoint().name == "step_000002"


def test_an_error_that_is_not_a_full_disk_still_surfaces_as_itself(tmp_path):
    rd = RunDir(tmp_path / "run")
    rd.create("run: {}\n")
    with pytest.raises(PermissionError):
        with rd.new_checkpoint(1):
            raise PermissionError(13, "Permission denied")
    assert rd.latest_checkpoint() is None
    assert not [p for p in rd.checkpoints.iterdir() if p.name.startswith(".tmp-")]


def test_a_sandbox_worker_killed_mid_run_is_replaced_and_the_run_answered():
    """The OOM killer or an operator kills a worker while it runs a program: the program runs again on a fresh
    worker (a run cannot signal its own worker, so the kill is not the program's doing) and later runs go on."""
    with SandboxExecutor(ExecutorConfig(n_workers=1)) as ex:
        assert ex.run("_result = 1").value == "1"  # the worker is up
        worker = ex._all[0]
        pid = worker.proc.pid
        started = threading.Event()

        def kill_when_running():
            started.wait(30)
            os.killpg(pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_when_running)
        killer.start()
        # the run's own clock: the kill lands while it sleeps
        threading.Timer(0.5, started.set).start()
        res = ex.run("import time\ntime.sleep(3)\n_result = 7", timeout_s=20)
        killer.join()
        assert res.status == "ok" and res.value == "7", res
        assert worker.proc is not None and worker.proc.pid != pid
        assert [r.value for r in ex.run_many([f"_result = {i}" for i in range(4)])] == ["0", "1", "2", "3"]
