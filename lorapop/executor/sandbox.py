"""Sandboxed execution of untrusted Python: long-lived isolated workers that fork once per program.

The same walls for root and for an ordinary user (docs/METHOD.md, "The sandbox", lists each layer and what it
stops). Each worker is started by util-linux ``unshare`` in its own network, mount, pid and IPC namespaces: as root
directly (mechanism "root"), as anyone else inside a user namespace whose only uid is the caller's, mapped to root
(``unshare --user --map-root-user``, mechanism "userns"). Then:

* **Separate processes, fresh every run.** Code never runs in the trainer. A worker forks a fresh child per program
  and never holds a program or a result itself: the program comes to the child, and its result goes to the trainer,
  on two new pipes per run that the worker only passes on (worker.py). So nothing a program does (patched builtins,
  monkey-patched modules, leftover processes, files) reaches the next one, and no run starts from memory that held
  another's program or result. A worker whose run left files in its working area, or changed the worker's priority,
  scheduler, CPU set or limits, retires: the trainer replaces it, and its tmpfs and namespaces die whole.
* **Data, not verdicts.** A run returns the text of ``repr(_result)``; the program can choose that text, as it can
  choose what it returns, and nothing else. Every comparison happens in the trainer (lorapop/tasks/values.py).
* **No network.** A fresh network namespace has only a downed loopback: no socket reaches the host, 127.0.0.1
  included; and the seccomp filter refuses every ``socket`` call anyway.
* **No host files.** The worker mounts a tiny tmpfs, remounted read-only, with a size-capped tmpfs (``disk_mb``) on
  its ``/w``, both nosuid/nodev/noexec, pre-imports the allowed stdlib modules and chroots there. Programs see no
  host file (no /proc, /tmp, /etc, /bin/sh) and cannot import anything that was not pre-imported. Runs work in /w,
  which must be empty again after each (else the worker retires).
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
  hold memory past a run or outside RLIMIT_AS (System V and POSIX IPC, memfd). The trainer side has its own deadline
  and replaces a worker that stops answering.
* **Own host name** (UTS namespace): every worker is ``sandbox``.
* **Scrubbed environment**: the worker starts with only PATH, LC_ALL and PYTHONHASHSEED; runs see PATH and LC_ALL.
* **Hash seeds.** Workers are pooled per PYTHONHASHSEED (fixed at interpreter start), started lazily.

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

import json
import os
import queue
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from lorapop.executor.worker import unpack_result
from lorapop.progress import progress
from lorapop.tmpdirs import owned_tempdir

WORKER_PY = Path(__file__).with_name("worker.py")
SANDBOX_PREFIX = "lorapop-sbx-"  # + owner pid: each worker's scratch root under the temp directory
WORKER_DIED = "worker died"  # ExecResult.error of a run whose worker process ended under it
RUN_STATUSES = ("ok", "error", "memory", "output_limit", "crashed")  # what a child may report of itself
_PAGE = 4096  # what a pipe always holds, even for a user past the kernel's pipe-buffer quota

DEFAULT_PRELOAD = (
    "re", "math", "cmath", "collections", "collections.abc", "itertools", "functools", "heapq", "bisect", "string",
    "fractions", "decimal", "operator", "copy", "typing", "dataclasses", "enum", "array",
    "numbers", "unicodedata", "textwrap", "json", "encodings.utf_16", "encodings.utf_32", "encodings.latin_1",
    "encodings.ascii", "encodings.unicode_escape", "encodings.raw_unicode_escape", "encodings.idna",
)


@dataclass
class ExecutorConfig:
    n_workers: int = field(default=2, metadata={"help": "worker processes per hash seed (parallel runs)"})
    timeout_s: float = field(default=5.0, metadata={"help": "default wall-clock limit per run, seconds"})
    memory_mb: int = field(default=512, metadata={"help": "address-space limit per run (RLIMIT_AS), MiB, "
                                                          "interpreter included; 0 = none"})
    disk_mb: int = field(default=64, metadata={"help": "size of each worker's private tmpfs, MiB"})
    fsize_mb: int = field(default=4, metadata={"help": "largest file a run may write (RLIMIT_FSIZE), MiB"})
    max_procs: int = field(default=1, metadata={"help": "processes and threads a run may have at once, itself "
                                                        "included (RLIMIT_NPROC); 1: no fork and no thread, so "
                                                        "memory_mb bounds every byte a run holds (each extra "
                                                        "process may take memory_mb more)"})
    max_open_files: int = field(default=64, metadata={"help": "open file descriptors per run (RLIMIT_NOFILE)"})
    max_output_chars: int = field(default=100_000, metadata={"help": "stdout+stderr chars before status "
                                                                     "output_limit; output is discarded"})
    max_repr_chars: int = field(default=400, metadata={"help": "longest repr(_result) returned (400 = the task "
                                                               "output limit); longer gives output_limit"})
    isolate_network: bool = field(default=True, metadata={"help": "network namespace (unshare --net)"})
    isolate_filesystem: bool = field(default=True, metadata={"help": "mount namespace + private tmpfs + chroot"})
    isolate_pids: bool = field(default=True, metadata={"help": "pid namespace: runs cannot see or signal other "
                                                               "processes; leftovers are killed after each run"})
    drop_privileges: bool = field(default=True, metadata={"help": "run programs without privileges: under an "
                                                                  "unprivileged uid as root, with every capability "
                                                                  "dropped in a user namespace"})
    uid_base: int | None = field(default=None, metadata={"help": "as root: first uid for runs (one per worker); "
                                                                 "None derives one from the pid"})
    seccomp: bool = field(default=True, metadata={"help": "syscall filter on every run (namespaces, mount, ptrace, "
                                                          "bpf, sockets, exec... fail with EPERM; "
                                                          "lorapop/executor/lockdown.py)"})
    allow_unisolated: bool = field(default=False, metadata={"help": "run model-written programs even where this "
                                                                    "machine gives the sandbox no isolation (neither "
                                                                    "root nor unprivileged user namespaces, or no "
                                                                    "seccomp): they can then read your files and "
                                                                    "reach the network; warned at every start and "
                                                                    "recorded in population.json and the report"})
    require_isolation: bool = field(default=False, metadata={"help": "refuse any missing protection, even with "
                                                                     "allow_unisolated"})
    default_hashseed: int = field(default=1, metadata={"help": "PYTHONHASHSEED for runs that do not name one"})
    grace_s: float = field(default=5.0, metadata={"help": "extra seconds the trainer waits for a worker before "
                                                          "replacing it"})
    python: str | None = field(default=None, metadata={"help": "interpreter for workers (default: this one)"})
    preload: tuple[str, ...] = field(default=DEFAULT_PRELOAD, metadata={"help": "stdlib modules importable by "
                                                                                "programs (nothing else is)"})
    ray: bool = field(default=False, metadata={"help": "run validation and checking jobs on Ray executor actors "
                                                     "(any node of engine.ray_address's cluster, or a local Ray), "
                                                     "each wrapping this same sandbox with every protection above; "
                                                     "needs `.venv/bin/pip install -e '.[ray]'` (lorapop/executor/ray_executor.py)"})
    ray_actors: int = field(default=2, metadata={"help": "with ray: executor actors; a batch is split across them, "
                                                         "each runs its share on its own n_workers sandbox workers"})
    ray_num_cpus: float = field(default=1.0, metadata={"help": "with ray: CPUs Ray reserves per executor actor "
                                                               "(where it places them; the sandbox itself runs "
                                                               "n_workers processes)"})

    def validate(self) -> None:
        if self.ray_actors < 1:
            raise ValueError(f"executor.ray_actors: must be >= 1, got {self.ray_actors}")
        if self.ray_num_cpus < 0:
            raise ValueError(f"executor.ray_num_cpus: must be >= 0, got {self.ray_num_cpus}")


@dataclass
class ExecResult:
    status: str  # "ok" | "error" | "timeout" | "memory" | "output_limit" | "crashed"
    value: str | None  # repr of `_result` when ok (a program that sets none gives "None")
    error: str | None  # short "Type: message", never a trainer traceback
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Executor(Protocol):
    def run(self, code: str, *, timeout_s: float | None = None, hashseed: int | None = None) -> ExecResult: ...

    def run_many(self, codes: list[str], *, timeout_s: float | None = None,
                 hashseed: int | None = None) -> list[ExecResult]: ...

    def close(self) -> None: ...


ROOT_CAPS = {"chown": 0, "kill": 5, "setgid": 6, "setuid": 7, "sys_chroot": 18, "sys_admin": 21}
# what isolated() requires of SandboxExecutor.protections
ISOLATION_KEYS = ("network_isolated", "filesystem_isolated", "pid_namespace", "unprivileged", "seccomp")


USERNS_FIX = ("Run as root, or let ordinary users create user namespaces (sysctl user.max_user_namespaces > 0; "
              "kernel.unprivileged_userns_clone=1 on Debian; kernel.apparmor_restrict_unprivileged_userns=0 on "
              "Ubuntu 24.04+; in a container, one allowed to create namespaces)")


class IsolationError(RuntimeError):
    """The sandbox cannot isolate programs here and executor.allow_unisolated does not allow running anyway."""


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


def isolated(protections: dict) -> bool:
    """Whether a run is walled off from the host: its own network, files and pids, no privileges, the filter."""
    return all(bool(protections.get(k)) for k in ISOLATION_KEYS)


class _Worker:
    """The trainer's side of one sandbox worker (lorapop/executor/worker.py): a SOCK_SEQPACKET socket carries the
    requests and the worker's reports; each run gets two fresh pipes, one the trainer writes the program into and one
    it reads the result from, whose other ends go to the worker with the request and from it to the forked child. The
    worker never holds the program or the result."""

    def __init__(self, ex: "SandboxExecutor", hashseed: int, uid: int):
        self.ex, self.hashseed, self.uid = ex, hashseed, uid
        self.proc: subprocess.Popen | None = None
        self.ctl: socket.socket | None = None
        self.info: dict = {}
        self.root: str | None = None

    def _command(self, root: str, cfg_json: str, mechanism: str) -> list[str]:
        c = self.ex.config
        py = [c.python or sys.executable, "-s", "-S", str(WORKER_PY), cfg_json]
        if mechanism == "none":
            return py
        # util-linux unshare; as an ordinary user with a user namespace whose root is this user (docs/METHOD.md)
        flags = ["--user", "--map-root-user"] if mechanism == "userns" else []
        flags += ["--fork", "--kill-child", "--ipc", "--uts"]
        if c.isolate_network:
            flags.append("--net")
        if c.isolate_pids:
            flags.append("--pid")
        if not c.isolate_filesystem:
            return ["unshare", *flags, "--", *py]
        # The chroot's root is a tiny tmpfs remounted read-only (a run that shares the worker's uid would own it);
        # the runs' working area /w is its own size-capped tmpfs. noexec on both: nothing written there runs.
        opts = "mode=0755,nosuid,nodev,noexec"
        mount = (f'mount -t tmpfs -o size=64k,{opts} tmpfs "$1" && mkdir "$1/w" && '
                 f'mount -t tmpfs -o size={int(c.disk_mb)}m,{opts} tmpfs "$1/w" && '
                 f'mount -o remount,bind,ro "$1" && shift && exec "$@"')
        return ["unshare", *flags, "--mount", "--propagation", "private", "--", "/bin/sh", "-c", mount, "sh", root,
                *py]

    def start(self) -> None:
        c, mode = self.ex.config, self.ex.mode
        # named after this process, so a run killed with -9 does not leave them behind for good (lorapop/tmpdirs.py)
        self.root = str(owned_tempdir(SANDBOX_PREFIX))
        os.chmod(self.root, 0o755)
        wcfg = {
            "timeout_s": c.timeout_s, "memory_bytes": int(c.memory_mb) << 20, "fsize_bytes": int(c.fsize_mb) << 20,
            "max_procs": c.max_procs, "max_open_files": c.max_open_files, "max_output_chars": c.max_output_chars,
            "max_repr_chars": c.max_repr_chars, "drop_uid": mode["mechanism"] == "root" and c.drop_privileges,
            "uid": self.uid, "mechanism": mode["mechanism"], "seccomp": c.seccomp,
            "drop_caps": mode["mechanism"] == "userns" and c.drop_privileges, "uts": mode["mechanism"] != "none",
            "root": self.root, "chroot": mode["mechanism"] != "none" and c.isolate_filesystem, "fallback_dir": self.root,
            "preload": list(c.preload), "env": {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
        }
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8", "PYTHONHASHSEED": str(self.hashseed)}
        self.errfile = tempfile.TemporaryFile()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(self._command(self.root, json.dumps(wcfg), mode["mechanism"]),
                                         stdin=theirs.fileno(), stdout=subprocess.DEVNULL, stderr=self.errfile,
                                         env=env, start_new_session=True, close_fds=True)
        finally:
            theirs.close()
        self.ctl = mine
        hello = self._recv(time.monotonic() + 30.0)
        if not hello or not hello.get("hello"):
            self.errfile.seek(0)
            err = self.errfile.read().decode("utf-8", "replace")[-2000:]
            self.kill()
            raise RuntimeError(f"sandbox worker failed to start: {err.strip() or 'no hello'}")
        self.info = hello

    def _recv(self, deadline: float) -> dict | None:
        """The worker's next report, or None when it ended or the deadline passed."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([self.ctl], [], [], left)
            if r:
                break
        try:
            data = self.ctl.recv(1 << 16)  # a datagram: a shorter buffer would cut a long hello (many preloads)
            return json.loads(data) if data else None
        except (OSError, ValueError):
            return None

    def call(self, code: str, timeout_s: float) -> ExecResult:
        if self.proc is None or self.proc.poll() is not None:
            self.kill()
            self.start()
        c = self.ex.config
        t0 = time.perf_counter()
        program = code.encode("utf-8", "surrogatepass")
        code_r, code_w = os.pipe()
        res_r, res_w = os.pipe()
        try:
            try:
                request = json.dumps({"timeout": timeout_s, "size": len(program)}).encode()
                socket.send_fds(self.ctl, [request], [code_r, res_w])
            except OSError:
                os.close(code_w)
                self.kill()
                return ExecResult("crashed", None, WORKER_DIED, time.perf_counter() - t0)
            finally:
                os.close(code_r)
                os.close(res_w)
            pending = {code_w}  # closed exactly once: another thread's new pipe may reuse a number closed twice
            try:
                report, raw, overflow = self._exchange(program, code_w, pending,
                                                       res_r, time.monotonic() + timeout_s + c.grace_s)
            finally:
                for fd in pending:
                    os.close(fd)
        finally:
            os.close(res_r)
        took = time.perf_counter() - t0
        if report is None or "wstatus" not in report:
            late = took >= timeout_s
            self.kill()
            return ExecResult("timeout" if late else "crashed", None,
                              "worker stopped answering" if late else WORKER_DIED, took)
        if report.get("retire"):
            self.kill()  # its tmpfs and namespaces go with it; the next call starts a fresh worker
        return _result(report, raw, overflow, timeout_s, c.max_repr_chars)

    def _exchange(self, code: bytes, code_w: int, pending: set, res_r: int, deadline: float
                  ) -> tuple[dict | None, bytes, bool]:
        """Write the program (closing ``code_w``, and taking it out of ``pending``, once it is all written), read the
        result (at most a few times ``max_repr_chars``; more is read and dropped) and wait for the worker's report.

        A result the worker's own code writes is at most ``max_repr_chars`` characters plus a short error, under one
        page whenever ``max_repr_chars`` is small (the task checks' 400): then the result pipe is read once, after
        the report, which saves the trainer a wake-up per run; a run that writes more than a pipe holds blocks until
        its wall clock ends (a timeout: it wasted its own time). With a larger ``max_repr_chars`` (benchmark
        judging) the result is read while the run goes on, so a long honest one never blocks."""
        cap = self.ex.config.max_repr_chars * 4 + 4096
        watch = self.ex.config.max_repr_chars * 4 + 1024 > _PAGE
        view, chunks, size, overflow, report = memoryview(code), [], 0, False, None

        def write_some() -> None:
            nonlocal view
            try:
                while view:
                    view = view[os.write(code_w, view[:1 << 16]):]
            except BlockingIOError:
                return  # the pipe is full: the rest when the child has read some
            except BrokenPipeError:
                view = view[:0]  # the child stopped reading: its run goes on without the rest
            pending.discard(code_w)
            os.close(code_w)  # EOF for the child

        os.set_blocking(code_w, False)
        write_some()
        res_open = True
        while report is None or (res_open and watch):
            left = deadline - time.monotonic()
            if left <= 0:
                # A report came and only the result pipe is still open: a process outside the run's reach (no pid
                # namespace, executor.allow_unisolated) holds it; what was read stands.
                return (report, b"".join(chunks), overflow) if report is not None else (None, b"", False)
            rl = ([self.ctl] if report is None else []) + ([res_r] if res_open and watch else [])
            r, w, _ = select.select(rl, [code_w] if code_w in pending else [], [], left)
            if w:
                write_some()
            if res_r in r:
                chunk = os.read(res_r, 1 << 16)
                if not chunk:
                    res_open = False  # every process that held the pipe has ended
                elif size + len(chunk) > cap:
                    overflow, size = True, cap + 1
                else:
                    chunks.append(chunk)
                    size += len(chunk)
            if self.ctl in r:
                report = self._recv(deadline) or {}
                if not report:
                    return None, b"", False
                deadline = min(deadline, time.monotonic() + 1.0)
        if not watch:  # every writer has ended (the report says the run's processes are gone): what is there is all
            os.set_blocking(res_r, False)
            try:
                while size <= cap:
                    chunk = os.read(res_r, 1 << 16)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
            except BlockingIOError:
                pass  # a process outside the run's reach still holds the pipe (no pid namespace)
            overflow = size > cap
        return report, b"".join(chunks), overflow

    def kill(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            self.proc = None
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None
        if self.root:
            # The tmpfs lived in the worker's mount namespace; on the host this is an empty dir (or, degraded,
            # the private working area itself).
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.ctl.shutdown(socket.SHUT_RDWR)  # EOF: the worker exits, its namespaces die with it
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


def _result(report: dict, raw: bytes, overflow: bool, timeout_s: float, max_repr_chars: int) -> ExecResult:
    """An ExecResult from the worker's report (trusted: how the child ended) and the bytes the child wrote (untrusted
    data: a program can write them itself, so they only ever say what its own result is)."""
    duration = float(report.get("duration", 0.0))
    if report.get("timed_out"):
        return ExecResult("timeout", None, f"wall-clock limit {timeout_s:g}s", duration)
    if overflow:
        return ExecResult("output_limit", None, f"result over {max_repr_chars} chars", duration)
    try:
        status, value, error = unpack_result(raw)
        if status not in RUN_STATUSES or (status == "ok") != (value is not None):
            raise ValueError("status")
        if value is not None and len(value) > max_repr_chars:
            return ExecResult("output_limit", None, f"repr of _result has {len(value)} chars > {max_repr_chars}",
                              duration)
        return ExecResult(status, value, None if error is None else error[:300], duration)
    except ValueError:  # UnicodeDecodeError included
        pass
    st = int(report.get("wstatus") or 0)
    if os.WIFSIGNALED(st):
        sig = os.WTERMSIG(st)
        if sig == signal.SIGXCPU:
            return ExecResult("timeout", None, f"CPU limit {report.get('cpu_s')}s", duration)
        return ExecResult("crashed", None, f"killed by signal {sig}", duration)
    code = os.WEXITSTATUS(st) if os.WIFEXITED(st) else "?"
    return ExecResult("crashed", None, f"exited with code {code} before returning a result", duration)


class SandboxExecutor:
    """The Executor. Thread-safe; workers start on first use per hash seed."""

    def __init__(self, config: ExecutorConfig | None = None, **overrides):
        self.config = config or ExecutorConfig()
        for k, v in overrides.items():
            setattr(self.config, k, v)
        self._lock = threading.Lock()
        self._pools: dict[int, queue.Queue] = {}
        self._all: list[_Worker] = []
        self._closed = False
        base = self.config.uid_base
        self._uid_base = base if base is not None else 200_000 + (os.getpid() % 100_000) * 64
        self._hello_checked = False
        self.mode = self._probe_mode()

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

    def _pool(self, hashseed: int) -> queue.Queue:
        with self._lock:
            if self._closed:
                raise RuntimeError("executor is closed")
            pool = self._pools.get(hashseed)
            if pool is None:
                pool = queue.Queue()
                for _ in range(max(1, int(self.config.n_workers))):
                    w = _Worker(self, hashseed, self._uid_base + len(self._all))
                    self._all.append(w)
                    pool.put(w)
                self._pools[hashseed] = pool
            return pool

    def _started(self, w: _Worker) -> _Worker:
        if w.proc is None:
            try:
                w.start()
            except RuntimeError as exc:
                if self.mode["mechanism"] == "none":
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

    @property
    def protections(self) -> dict:
        """What the first worker of the default seed reported as in force (starts it if needed), and the
        mechanism: "root", "userns" or "none". :func:`isolated` of it says whether runs are walled off."""
        pool = self._pool(self.config.default_hashseed)
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

    def run(self, code: str, *, timeout_s: float | None = None, hashseed: int | None = None) -> ExecResult:
        pool = self._pool(self.config.default_hashseed if hashseed is None else int(hashseed))
        t = float(timeout_s if timeout_s is not None else self.config.timeout_s)
        w = pool.get()
        try:
            res = self._started(w).call(code, t)
            if res.status == "crashed" and res.error == WORKER_DIED:
                # Killed from outside (the OOM killer, an operator): a run cannot signal its worker (PID 1 of its
                # namespace, another uid), so the code is not to blame and gets one fresh worker.
                res = self._started(w).call(code, t)
            return res
        except IsolationError:  # not a failure of this program: no program may run
            raise
        except Exception as exc:  # a worker that cannot start must not take the caller down
            return ExecResult("crashed", None, f"sandbox: {type(exc).__name__}: {exc}"[:300], 0.0)
        finally:
            pool.put(w)

    def run_many(self, codes: list[str], *, timeout_s: float | None = None,
                 hashseed: int | None = None) -> list[ExecResult]:
        codes = list(codes)
        out: list[ExecResult | None] = [None] * len(codes)
        if not codes:
            return []
        it = iter(range(len(codes)))
        it_lock = threading.Lock()

        bar = progress("sandbox", total=len(codes), unit="runs")

        def drain():
            while True:
                with it_lock:
                    i = next(it, None)
                if i is None:
                    return
                out[i] = self.run(codes[i], timeout_s=timeout_s, hashseed=hashseed)
                with it_lock:  # the bar is not thread-safe; one worker thread updates it at a time
                    bar.advance()

        n = min(len(codes), max(1, int(self.config.n_workers)))
        threads = [threading.Thread(target=drain, daemon=True) for _ in range(n - 1)]
        with bar:
            for th in threads:
                th.start()
            drain()
            for th in threads:
                th.join()
        return out  # type: ignore[return-value]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers, self._all = self._all, []
        for w in workers:
            w.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
