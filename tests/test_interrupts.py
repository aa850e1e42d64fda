"""The trainer's own exceptions (Ctrl-C, a signal handler's SystemExit, a cancelled task) leave the executor whole:
every later verdict right, every worker back in its pool, the compile helper's lock free, no descriptor left open,
and ``close`` prompt. Python raises a handler's exception on the main thread only, between any two steps, so the
executor's own steps never run there (sandbox.py, ``_off_main``)."""

from __future__ import annotations

import os
import random
import signal
import socket
import threading
import time
import warnings

import pytest

from lorapop.executor import ExecutorConfig, SandboxExecutor
from lorapop.executor.compiler import Compiler
from lorapop.executor.handle import WorkerHandle

ROOT = os.geteuid() == 0


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _whole(ex: SandboxExecutor) -> None:
    """Every pool holds all its workers, and the compile helper's lock is free."""
    for pool in ex._pools.values():
        assert pool.qsize() == ex.config.n_workers
    assert ex.compiler._helper.acquire(timeout=2.0)
    ex.compiler._helper.release()


def test_the_executors_steps_never_run_on_the_main_thread(monkeypatch):
    seen = []
    call, compile_ = WorkerHandle.call, Compiler.compile

    def watched(fn):
        def wrapper(*args, **kwargs):
            seen.append((fn.__name__, threading.current_thread() is threading.main_thread()))
            return fn(*args, **kwargs)
        return wrapper
    monkeypatch.setattr(WorkerHandle, "call", watched(call))
    monkeypatch.setattr(Compiler, "compile", watched(compile_))
    with SandboxExecutor(ExecutorConfig(n_workers=2, timeout_s=2.0, require_isolation=ROOT)) as ex:
        assert ex.run("_result = 1").value == "1"
        assert [r.value for r in ex.run_many([f"_result = {i}" for i in range(6)])] == [str(i) for i in range(6)]
        assert ex.protections["fork_per_run"] and ex.importable is not None
    assert {name for name, _ in seen} == {"call", "compile"} and not any(main for _, main in seen), seen


def test_interrupts_from_a_signal_handler_leave_every_later_verdict_right():
    """A KeyboardInterrupt from a SIGALRM handler at random moments of runs and batches on the main thread: each
    interrupted call raises it, and the next run on every worker is right, at once."""
    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    rng = random.Random(7)
    ex = SandboxExecutor(ExecutorConfig(n_workers=2, timeout_s=2.0, require_isolation=ROOT))
    interrupted = 0
    try:
        ex.run_many(["import decimal\n_result = 0"] * 2)  # both kinds of worker started
        fds = _fds()
        for i in range(60):
            try:
                signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.0, 0.006))
                if i % 3:
                    ex.run(f"_result = {i}")
                else:
                    ex.run_many([f"import decimal\n_result = {i}"] * 4)
                signal.setitimer(signal.ITIMER_REAL, 0)
            except KeyboardInterrupt:
                interrupted += 1
            signal.setitimer(signal.ITIMER_REAL, 0)
            got = ex.run_many([f"_result = {i} * 3", f"import decimal\n_result = {i} * 5"] * 2)
            assert [r.value for r in got] == [str(i * 3), str(i * 5)] * 2, (i, got)
        assert interrupted >= 10, interrupted
        time.sleep(0.2)  # a batch's last runs, finishing on their threads after the interrupt
        _whole(ex)
        assert _fds() <= fds + 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        t0 = time.monotonic()
        ex.close()
        assert time.monotonic() - t0 < 15


def test_an_exception_after_the_request_went_ends_that_worker(monkeypatch):
    """Raised in the trainer's step right after the request reached the worker (any exception, on any thread): the
    worker goes, so its report cannot be read as the next run's, and no pipe end stays open."""
    with SandboxExecutor(ExecutorConfig(n_workers=1, timeout_s=2.0, lean_preload=(), require_isolation=ROOT)) as ex:
        assert ex.run("_result = 0").value == "0"
        fds = _fds()
        send = socket.send_fds

        def send_then_fail(*args, **kwargs):
            send(*args, **kwargs)
            raise RuntimeError("after the request went")
        monkeypatch.setattr(socket, "send_fds", send_then_fail)
        bad = ex.run("_result = 1")
        monkeypatch.setattr(socket, "send_fds", send)
        assert bad.status == "crashed" and "RuntimeError" in bad.error, bad
        t0 = time.monotonic()
        assert [ex.run(f"_result = {i}").value for i in (2, 3, 4)] == ["2", "3", "4"]
        assert time.monotonic() - t0 < 3.0  # no run waited out the clock of the one before it
        assert _fds() <= fds + 1  # the restarted worker's socket at most
        _whole(ex)


def test_a_worker_left_without_its_socket_is_replaced():
    """A start stopped between the worker's process and its socket (an exception there): the next run starts a
    fresh worker, and close stops every process."""
    with SandboxExecutor(ExecutorConfig(n_workers=1, timeout_s=2.0, lean_preload=(), require_isolation=ROOT)) as ex:
        assert ex.run("_result = 0").value == "0"
        w = ex._all[0]
        proc, w.ctl = w.proc, None
        assert ex.run("_result = 1").value == "1"
        assert proc.poll() is not None and w.proc is not proc
        w.ctl.close()
        w.ctl = None
    assert w.proc is None


def _interrupted(ex: SandboxExecutor, call) -> None:
    """``call(ex)`` on the main thread, interrupted 0.3 s in by a SIGALRM handler's KeyboardInterrupt (its run goes
    on), then ``ex`` closed."""
    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        ex.run("_result = 0")
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            call(ex)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        ex.close()


@pytest.mark.parametrize("where", ["run", "batch"])
def test_close_after_an_interrupted_call_is_prompt(where):
    """A call interrupted while its run goes on (a clock of seconds): close ends within a few seconds."""
    ex = SandboxExecutor(ExecutorConfig(n_workers=1, timeout_s=5.0, require_isolation=ROOT))
    t0 = time.monotonic()
    _interrupted(ex, (lambda e: e.run("while True:\n    pass")) if where == "run"
                 else (lambda e: e.run_many(["while True:\n    pass"] * 3)))
    assert time.monotonic() - t0 < 12


def _children() -> set[int]:
    out = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            out.update(int(p) for p in open(f"/proc/self/task/{tid}/children").read().split())
        except OSError:
            pass
    return out


def test_a_run_finishing_after_close_starts_no_worker():
    """close while an interrupted call's run goes on: that run meets its worker gone, and its retry may start no
    worker that close could no longer reach."""
    before = _children()
    # with the opt-out, a start refused because of the close had been taken for refused namespaces: a warning that
    # the sandbox is not isolated, and the executor's mode set to none
    ex = SandboxExecutor(ExecutorConfig(n_workers=1, timeout_s=3.0, allow_unisolated=True))
    mechanism = ex.mode["mechanism"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _interrupted(ex, lambda e: e.run("while True:\n    pass"))
        ex._runner.join(10)
    assert ex.mode["mechanism"] == mechanism and not [w for w in caught if "NOT ISOLATED" in str(w.message)]
    ex._runner.join(10)  # the interrupted call's steps, finished
    assert not ex._runner.is_alive()
    time.sleep(0.5)
    assert _children() - before <= set(), _children() - before
    assert all(w.proc is None for w in ex._all)


def test_a_call_waiting_when_another_thread_closes_is_told(monkeypatch):
    """close from another thread between a main-thread call's check and its hand-off: the call says the executor
    is closed, within seconds, rather than waiting for good."""
    ex = SandboxExecutor(ExecutorConfig(n_workers=1, timeout_s=2.0, require_isolation=ROOT))
    ex.run("_result = 0")
    jobs = ex._jobs

    class ClosedMeanwhile:
        def put(self, job):
            if job is not None:  # the call's hand-off: another thread closes first (close's own put goes on)
                ex._jobs = jobs
                closer = threading.Thread(target=ex.close)
                closer.start()
                closer.join(10)
                ex._runner.join(10)
            jobs.put(job)

        def get(self):
            return jobs.get()
    ex._jobs = ClosedMeanwhile()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="closed"):
        ex.run("_result = 1")
    assert time.monotonic() - t0 < 10


def test_a_run_that_meets_the_close_raises_rather_than_judges():
    """A run on another thread when close lands: it raises, so no check scores the close as the program's crash."""
    ex = SandboxExecutor(ExecutorConfig(n_workers=1, timeout_s=3.0, require_isolation=ROOT))
    ex.run("_result = 0")
    got = []

    def runner():
        try:
            got.append(ex.run("while True:\n    pass"))
        except RuntimeError as exc:
            got.append(exc)
    th = threading.Thread(target=runner)
    th.start()
    time.sleep(0.3)
    ex.close()
    th.join(10)
    assert len(got) == 1 and isinstance(got[0], RuntimeError) and "closed" in str(got[0]), got
