"""Sandboxed execution of untrusted Python: long-lived isolated workers that fork once per program.

The same walls for root and for an ordinary user (docs/METHOD.md, "The sandbox", lists each layer and what it
stops). Each worker is started by util-linux ``unshare`` in its own network, mount, pid and IPC namespaces: as root
directly (mechanism "root"), as anyone else inside a user namespace whose only uid is the caller's, mapped to root
(``unshare --user --map-root-user``, mechanism "userns"). Then:

* **Separate processes, fresh every run.** Code never runs in the trainer. A worker forks a fresh child per program
  and never holds a program or a result itself: the program comes to the child, and its result goes to the trainer,
  on two new pipes per run that the worker only passes on (worker.py). So nothing a program does (patched builtins,
  monkey-patched modules, leftover processes) reaches the next one, and no run starts from memory that held
  another's program or result. A run can leave nothing in the kernel either (below, and docs/METHOD.md lists each
  channel); a worker that finds anything a run could reach changed after a run (its filesystem whole, its limits,
  priority, scheduler, CPU set, host name, the pid counter) retires: the trainer replaces it, and its tmpfs and
  namespaces die whole.
* **Data, not verdicts.** A run returns the text of ``repr(_result)``; the program can choose that text, as it can
  choose what it returns, and nothing else. Every comparison happens in the trainer (lorapop/tasks/values.py).
* **No network.** A fresh network namespace has only a downed loopback: no socket reaches the host, 127.0.0.1
  included; and the seccomp filter refuses every ``socket`` call anyway.
* **No host files, and no file at all.** The worker mounts a tmpfs holding one empty directory, ``/w``, remounts it
  read-only (superblock and mount; nosuid/nodev/noexec), pre-imports the allowed stdlib modules and chroots there.
  Programs see no host file (no /proc, /tmp, /etc, /bin/sh), cannot import anything that was not pre-imported, and
  can write no file, extended attribute or timestamp: every run finds the same filesystem. Runs work in /w.
* **No privileges.** As root the child drops to an unprivileged uid (distinct per worker); in a user namespace the
  worker gives up every capability for good (securebits locked, bounding and ambient sets cleared) once its chroot
  is done, so runs can neither undo the chroot nor mount, and the worker is PID 1 of its namespace (it ignores the
  one signal a same-uid run could deliver to it, SIGINT).
* **Syscall filter** (lorapop/executor/lockdown.py), on every run, root or not: new namespaces, mount, pivot_root,
  chroot, ptrace, process_vm_*, keyctl, bpf, perf_event_open, module loading, reboot, kexec, io_uring, sockets,
  execve/execveat and a few more fail with EPERM inside the program.
* **Limits.** Wall clock (the worker kills the run's process group and every other process in the namespace),
  RLIMIT_CPU, RLIMIT_AS (``memory_mb``), RLIMIT_FSIZE, RLIMIT_NPROC (``max_procs``, 1 by default: no fork, no thread,
  so RLIMIT_AS bounds all the memory a run holds), RLIMIT_NOFILE, no core dumps; stdout and stderr are counted and
  discarded (``max_output_chars``); ``repr(_result)`` is capped (``max_repr_chars``). The filter refuses what would
  hold memory past a run or outside RLIMIT_AS, or leave a value for the next run (System V and POSIX IPC, memfd,
  extended attributes, new pipes and pidfds, whose inode numbers come from counters shared beyond the run). The trainer side has its own deadline
  and replaces a worker that stops answering.
* **Own host name** (UTS namespace): every worker is ``sandbox``.
* **Scrubbed environment**: the worker starts with only PATH, LC_ALL and PYTHONHASHSEED; runs see PATH and LC_ALL.
* **Hash seeds.** Workers are pooled per PYTHONHASHSEED (fixed at interpreter start), started lazily; the executor's
  three seeds (``hashseeds``) are drawn at random unless the config names them.
* **Lean workers first.** Per seed, a pool of lean workers (``lean_preload`` only) takes every run first, and a pool
  of full ones the runs that import what a lean worker lacks, again from their start (docs/METHOD.md).
* **Never on the main thread.** Python raises a signal handler's exception (Ctrl-C) on the main thread only, between
  any two steps; the executor's steps run on other threads, so an interrupt ends a caller's wait, not a step.

Not pre-imported on purpose: modules that pull in `random` or `threading` (statistics, queue, secrets...): their
at-fork hooks cost about a millisecond per run, and both are on the banned list anyway.

What is not covered: the kernel itself (every call the filter lets through reaches it, as a process of the caller's
uid in a user namespace); CPU time of a run is not weighted against other tenants.

No silent fallback: where a protection cannot be set up (neither root nor user namespaces, no ``unshare``, no
seccomp on this architecture, or one turned off in the config), :class:`SandboxExecutor` raises
:class:`IsolationError` saying what is missing, unless ``executor.allow_unisolated`` is set; then it warns, and
``protections`` (with :func:`isolated`) says what holds, which the trainer records. ``require_isolation`` refuses
even with the opt-out.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import random
import re
import shutil
import sys
import threading
import warnings

from lorapop.progress import progress

from .base import ESCALATED, WORKER_DIED, ExecResult, ExecutorConfig, IsolationError, resolve_hashseeds
from .compiler import Compiler
from .handle import WorkerHandle

# Run uids as root: above the ranges hosts hand out (logins, systemd's dynamic and container ranges, /etc/subuid
# blocks, SSSD's id mapping up to 2,000,200,000), below 2**32 - 1, which is no uid.
UID_LO, UID_HI = 3_000_000_000, 3_000_000_000 + (1 << 22)
_UIDS = random.SystemRandom()
_UIDS_TAKEN: set[int] = set()  # by the workers of every executor of this process
_UIDS_LOCK = threading.Lock()
# the modules a program's text imports (an approximation: a name it misses is caught when the run imports it)
_IMPORTS = re.compile(r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import\b|import[ \t]+([\w.]+(?:[ \t]*,[ \t]*[\w.]+)*))", re.M)
ROOT_CAPS = {"chown": 0, "kill": 5, "setgid": 6, "setuid": 7, "sys_chroot": 18, "sys_admin": 21}

USERNS_FIX = ("Run as root, or let ordinary users create user namespaces (sysctl user.max_user_namespaces > 0; "
              "kernel.unprivileged_userns_clone=1 on Debian; kernel.apparmor_restrict_unprivileged_userns=0 on "
              "Ubuntu 24.04+; in a container, one allowed to create namespaces)")


def effective_caps() -> int:
    """This process's effective capability mask (0 where /proc cannot say)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


class SandboxExecutor:
    """The Executor. Thread-safe; workers start on first use per hash seed."""

    def __init__(self, config: ExecutorConfig | None = None, **overrides):
        self.config = config or ExecutorConfig()
        for k, v in overrides.items():
            setattr(self.config, k, v)
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()  # the main thread's calls, for the runner (_off_main)
        self._runner: threading.Thread | None = None
        self._full_vm: int | None = None  # a full worker's address space as it begins serving (full_vm)
        self._lean_modules: frozenset[str] | None = None  # what a lean worker can import (its hello)
        self._pools: dict[tuple[int, bool], queue.Queue] = {}  # (hash seed, lean)
        self._all: list[WorkerHandle] = []
        self._closed = False
        self._hello_checked = False
        self.hashseeds = resolve_hashseeds(self.config)
        self.mode = self._probe_mode()
        c = self.config  # programs compiled for their runs in a helper, under the runs' memory limit (compiler.py)
        self.compiler = Compiler(c.python or sys.executable, int(c.memory_mb) << 20, min(0.2, float(c.timeout_s)))

    def _probe_mode(self) -> dict:
        """How workers are isolated: "root" (namespaces made with real privileges, runs under their own uid),
        "userns" (an ordinary user: the same namespaces inside a user namespace, runs without capabilities) or
        "none". Whether a user namespace really works is known when the first worker starts (_started)."""
        c = self.config
        wants_ns = c.isolate_network or c.isolate_filesystem or c.isolate_pids
        caps = effective_caps()
        root = all(caps >> bit & 1 for bit in ROOT_CAPS.values())
        tools = shutil.which("unshare") is not None and shutil.which("mount") is not None
        mechanism = "none" if not (wants_ns and tools) else "root" if root else "userns"
        mode = {"root": root, "mechanism": mechanism}
        off = [f"executor.{k}" for k in ("isolate_network", "isolate_filesystem", "isolate_pids", "seccomp",
                                           "drop_privileges") if not getattr(c, k)]
        if off:
            self._degrade(f"turned off by the config ({', '.join(off)})", "Set them back to true")
        if wants_ns and not tools:
            self._degrade("util-linux `unshare`/`mount` not found on PATH", "Install util-linux")
        return mode

    def _degrade(self, why: str, fix: str = USERNS_FIX) -> None:
        c = self.config
        if c.require_isolation or not c.allow_unisolated:
            raise IsolationError(
                f"lorapop sandbox: model-written programs would run without isolation: {why}. They could read "
                f"and write your files and reach the network. {fix}; or accept the risk with "
                "executor.allow_unisolated: true (the run is then recorded as unisolated)"
                + ("; executor.require_isolation is set, which refuses even that" if c.require_isolation else ""))
        warnings.warn(f"lorapop sandbox NOT ISOLATED (executor.allow_unisolated): {why}", RuntimeWarning,
                      stacklevel=3)

    def draw_uid(self, handle: WorkerHandle) -> int:
        """A run uid for a worker (re)starting, drawn at random and unused by this executor's other workers. A run can
        read its uid: derived from the trainer's pid (as it was) it told the run that pid, the same in every worker;
        drawn per worker process it is one more thing that differs between an input's three runs."""
        with _UIDS_LOCK:
            if handle.uid is not None:  # its previous draw, freed for others
                _UIDS_TAKEN.discard(handle.uid)
            while (uid := _UIDS.randrange(UID_LO, UID_HI)) in _UIDS_TAKEN:
                pass
            _UIDS_TAKEN.add(uid)
        return uid

    @property
    def lean(self) -> bool:
        """Whether runs try a lean worker first (ExecutorConfig.lean_preload). Not without namespaces (the opt-out):
        there a worker imports from the host's files anyway, and its runs share the caller's process count, which
        twice the workers would eat into (RLIMIT_NPROC where runs may fork)."""
        return bool(self.config.lean_preload) and self.mode["mechanism"] != "none"

    def full_vm(self) -> int:
        """The address space a full worker holds as it begins serving (its hello), which each lean worker fills its
        own up to: a run's RLIMIT_AS counts its worker's mappings, and a lean run with more room than a full one
        had allocations succeed that fail there (a student's unused import then failed it). Starts a full worker
        of the default seed the first time."""
        if self._full_vm is None:
            pool = self._pool(self._default_seed())
            w = pool.get()
            try:
                self._full_vm = int(self._started(w).info.get("vm_bytes") or 0)
            finally:
                pool.put(w)
        return self._full_vm

    def _default_seed(self) -> int:
        return int(self.config.default_hashseed or self.hashseeds[0])

    def _pool(self, hashseed: int, lean: bool = False) -> queue.Queue:
        with self._lock:
            if self._closed:
                raise RuntimeError("executor is closed")
            pool = self._pools.get((hashseed, lean))
            if pool is None:
                pool = queue.Queue()
                for _ in range(max(1, int(self.config.n_workers))):
                    base = self.config.uid_base  # None: drawn when the worker starts (draw_uid)
                    w = WorkerHandle(self, hashseed, None if base is None else base + len(self._all), lean)
                    self._all.append(w)
                    pool.put(w)
                self._pools[(hashseed, lean)] = pool
            return pool

    def _started(self, w: WorkerHandle) -> WorkerHandle:
        if w.proc is None:
            try:
                w.start()
            except RuntimeError as exc:
                if self.mode["mechanism"] == "none" or self._closed:  # closed: no namespace is to blame
                    raise
                what = "user namespaces refused" if self.mode["mechanism"] == "userns" else "namespaces refused"
                self._degrade(f"{what} ({exc}); running without namespaces")
                self.mode = dict(self.mode, mechanism="none")
                w.start()
            try:
                self._check_hello(w.info)
            except IsolationError:
                w.kill()  # never left running to serve a later call unchecked
                raise
            if w.lean and self._lean_modules is None:
                self._lean_modules = frozenset(w.info.get("importable") or ())
        return w

    def _check_hello(self, info: dict) -> None:
        """Once per executor: what the worker says is in force against what was asked for."""
        if self._hello_checked:
            return
        c, gaps = self.config, []
        if c.seccomp and not info.get("seccomp"):
            self._degrade(f"no seccomp filter ({info.get('lockdown_error') or 'not installed'})",
                          "The filter is built for Linux on x86_64 and aarch64 with seccomp enabled")
        if self.mode["mechanism"] == "userns" and c.drop_privileges and not info.get("caps_dropped"):
            gaps.append(f"capabilities not dropped ({info.get('lockdown_error')})")
        if self.mode["mechanism"] != "none" and c.isolate_network and not info.get("net_isolated"):
            gaps.append("the network namespace still reaches 127.0.0.1")
        if gaps:
            self._degrade("; ".join(gaps))
        self._hello_checked = True  # only once it passed, or the opt-out accepted what is missing

    def _off_main(self, fn, *args):
        """``fn(*args)``, on a thread other than the main one. Python runs signal handlers on the main thread only,
        and a handler's exception (KeyboardInterrupt, a SIGTERM handler's SystemExit, a cancelled task) lands
        between any two steps: in the executor's own steps (a worker taken from its pool, a request sent and its
        report not yet read, the compile helper's lock taken) it left a pool short of a worker for good, every later
        verdict of a worker one run behind, or the lock held, so that ``close`` and the process's exit hung. From
        the main thread, those steps run on the executor's runner thread: an interrupt ends the caller's wait, and
        the steps finish, leaving every worker, lock and descriptor as they should be (the run's result is dropped).
        The hand-off is one put on a queue (a single call) and a wait."""
        if threading.current_thread() is not threading.main_thread():
            return fn(*args)
        answer: queue.SimpleQueue = queue.SimpleQueue()  # put and get are single calls: no lock an interrupt keeps

        def job() -> None:
            try:
                answer.put((True, fn(*args)))
            except BaseException as exc:  # noqa: BLE001 - the caller's, raised where it waits
                answer.put((False, exc))

        with self._lock:
            if self._closed:
                raise RuntimeError("executor is closed")
            if self._runner is None or not self._runner.is_alive():
                self._runner = threading.Thread(target=self._serve_jobs, name="lorapop-sandbox-runner", daemon=True)
                self._runner.start()
            runner = self._runner
        self._jobs.put(job)
        while True:
            try:
                ok, value = answer.get(timeout=1.0)
                break
            except queue.Empty:
                if not runner.is_alive():  # closed by another thread after the check above: the job never ran
                    raise RuntimeError("executor is closed") from None
        if not ok:
            raise value
        return value

    def _serve_jobs(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    @property
    def protections(self) -> dict:
        """What the first full worker of the default seed reported as in force (starts it if needed), and the
        mechanism: "root", "userns" or "none". :func:`isolated` of it says whether runs are walled off."""
        return self._off_main(self._protections)

    def _protections(self) -> dict:
        pool = self._pool(self._default_seed())
        w = pool.get()
        try:
            self._started(w)
            info = dict(w.info)
        finally:
            pool.put(w)
        return {"mechanism": self.mode["mechanism"], "network_isolated": bool(info.get("net_isolated")),
                "filesystem_isolated": bool(info.get("chroot")), "pid_namespace": bool(info.get("pid1")),
                "unprivileged": bool(info.get("drop_uid") or info.get("caps_dropped")),
                "seccomp": bool(info.get("seccomp")), "own_hostname": bool(info.get("own_hostname")),
                "rlimits": True, "fork_per_run": True, "scrubbed_env": True}

    @property
    def importable(self) -> frozenset[str] | None:
        """The modules a program can import in a run: what the full worker had loaded when it began serving
        (nothing else can be loaded after its chroot; a built-in module it had not loaded may need one that cannot
        be, so they are left out too); None without the chroot."""
        return self._off_main(self._importable)

    def _importable(self) -> frozenset[str] | None:
        pool = self._pool(self._default_seed())
        w = pool.get()
        try:
            info = self._started(w).info
        finally:
            pool.put(w)
        return frozenset(info.get("importable") or ()) if info.get("chroot") else None

    def run(self, code: str, *, timeout_s: float | None = None, hashseed: int | None = None,
            max_result_chars: int | None = None) -> ExecResult:
        """One run: on a lean worker first (ExecutorConfig.lean_preload), and again from its start on a full worker
        when it imported what the lean one lacks; only the full worker's run then counts. Never on the main thread
        (_off_main)."""
        return self._off_main(self._run, code, timeout_s, hashseed, max_result_chars)

    def _run(self, code: str, timeout_s: float | None, hashseed: int | None, max_result_chars: int | None
             ) -> ExecResult:
        seed = self._default_seed() if hashseed is None else int(hashseed)
        t = float(timeout_s if timeout_s is not None else self.config.timeout_s)
        cap = self.config.max_repr_chars if max_result_chars is None else min(self.config.max_repr_chars,
                                                                              max(1, int(max_result_chars)))
        res = self._run_on(self._pool(seed, True), code, t, cap) if self.lean and not self._needs_full(code) else None
        if res is None or res.status == ESCALATED:
            full = self._run_on(self._pool(seed, False), code, t, cap)
            # an import no text showed (a codec, a computed name): the run cost both runs' time, and is charged it
            # (validation's too_slow bounds it; a program that spun on the lean worker alone had passed as half as
            # slow as it was); an import the text shows never meets the lean worker (_needs_full)
            res = full if res is None else dataclasses.replace(full, duration_s=full.duration_s + res.duration_s)
        return res

    def _needs_full(self, code: str) -> bool:
        """Whether the program's text imports a module a lean worker lacks: its run goes to a full worker at once,
        since on a lean one it would end at that import, after doing the work before it for nothing (charged both
        runs' time, an honest late import was billed twice). Only a routing: a lean worker's run that imports what
        it lacks is run again on a full worker whatever the text showed."""
        lean = self._lean_modules
        if lean is None or "import" not in code:
            return False
        return any(name.strip() not in lean
                   for a, b in _IMPORTS.findall(code) for name in ((a,) if a else b.split(",")))

    def _run_on(self, pool: queue.Queue, code: str, t: float, cap: int) -> ExecResult:
        w = pool.get()
        try:
            res = self._started(w).call(code, t, cap)
            if res.status == "crashed" and res.error == WORKER_DIED:
                # Killed from outside (the OOM killer, an operator): a run cannot signal its worker (PID 1 of its
                # namespace, another uid), so the code is not to blame and gets one fresh worker.
                res = self._started(w).call(code, t, cap)
            return res
        except IsolationError:  # not a failure of this program: no program may run
            raise
        except Exception as exc:  # a worker that cannot start must not take the caller down
            if self._closed:  # nor judged by it: a run that met the close is no verdict (a check scored it)
                raise
            return ExecResult("crashed", None, f"sandbox: {type(exc).__name__}: {exc}"[:300], 0.0)
        finally:
            pool.put(w)

    def run_many(self, codes: list[str], *, timeout_s: float | None = None, hashseed: int | None = None,
                 max_result_chars: int | None = None) -> list[ExecResult]:
        codes = list(codes)
        out: list[ExecResult | None] = [None] * len(codes)
        if not codes:
            return []
        it = iter(range(len(codes)))
        it_lock = threading.Lock()
        stop = threading.Event()  # the caller stopped waiting (an interrupt): the others end after their run

        bar = progress("sandbox", total=len(codes), unit="runs")

        def drain():
            while not stop.is_set():
                with it_lock:
                    i = next(it, None)
                if i is None:
                    return
                out[i] = self.run(codes[i], timeout_s=timeout_s, hashseed=hashseed,
                                  max_result_chars=max_result_chars)
                with it_lock:  # the bar is not thread-safe; one worker thread updates it at a time
                    bar.advance()

        n = min(len(codes), max(1, int(self.config.n_workers)))
        threads = [threading.Thread(target=drain, daemon=True) for _ in range(n - 1)]
        with bar:
            for th in threads:
                th.start()
            try:
                drain()
                for th in threads:
                    th.join()
            except BaseException:
                stop.set()
                raise
        return out  # type: ignore[return-value]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers, self._all = self._all, []
        self._jobs.put(None)  # the runner ends after the job it may be finishing
        failed = []
        for w in workers:  # each closed whatever another's close raised (a worker that never finished starting)
            try:
                w.close()
            except Exception as exc:  # noqa: BLE001 - reported below, once every worker is closed
                failed.append(exc)
        if getattr(self, "compiler", None) is not None:
            self.compiler.close()
        if self.config.uid_base is None:  # every uid of these workers was drawn
            with _UIDS_LOCK:
                _UIDS_TAKEN.difference_update(w.uid for w in workers)
        if failed:
            raise failed[0]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
