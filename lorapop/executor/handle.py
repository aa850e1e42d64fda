"""The trainer's side of one sandbox worker process: its start under ``unshare`` (namespaces, the chroot's tmpfs),
the request on its control socket, the program and result on two fresh pipes per run, the result's reading and
limits, and the worker's end. :class:`~.sandbox.SandboxExecutor` pools these handles; the code that runs inside the
worker is :mod:`.worker`."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lorapop.tmpdirs import owned_tempdir

from .base import ESCALATED, RUN_STATUSES, WORKER_DIED, ExecResult, ready
from .stored import ESCALATE_EXIT
from .worker import _HDR, REPORT, REQUEST  # the result's length prefix (pack_result); a run's request and report

WORKER_PY = Path(__file__).with_name("worker.py")
# The worker's source compiled under its bare name, so that no frame of it names the install path (ambient.py); its
# directory goes on sys.path for the modules beside it, and no name of the launcher's stays for a run to read.
LAUNCH = ("import sys; sys.path.insert(0, sys.argv[1]); "
          "exec(compile(open(sys.argv[1] + '/worker.py', 'rb').read(), 'worker.py', 'exec'), {'__name__': '__main__'})")
SANDBOX_PREFIX = "lorapop-sbx-"  # + owner pid: each worker's scratch root under the temp directory
_PAGE = 4096  # what a pipe always holds, even for a user past the kernel's pipe-buffer quota
READ_REST_S = 0.002  # after a short read of a result the pipe waits this long: at most 500 wake-ups a second


# Imports every codec module of the interpreter's standard library in a bare interpreter (the worker's flags) and
# prints "codec NAME" for each and "needs NAME" for every other module their imports loaded: the worker keeps the
# codecs compiled (stored.py) and loads what they need, so that each imports in a run exactly where it imports in a
# script, and fails the same way where it fails there (another platform's). posix and encodings are loaded at every
# start: listing the directory loads nothing more.
_CODEC_PROBE = """import posix, sys
before = set(sys.modules)
names = sorted("encodings." + f[:-3] for f in posix.listdir(sys.modules["encodings"].__path__[0])
               if f.endswith(".py") and f != "__init__.py")
for name in names:
    try:
        __import__(name)
    except Exception:
        pass
needs = sorted(set(sys.modules) - before - set(names))
print("\\n".join(["codec " + n for n in names] + ["needs " + n for n in needs]))
"""


@functools.lru_cache(maxsize=4)  # once per interpreter, not at every worker start
def codec_modules(python: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the codec modules of ``python``'s standard library, the other modules they import). Found
    in a child interpreter: importing them here would load them into the trainer. A probe that fails gives none."""
    try:
        out = subprocess.run([python, "-s", "-S", "-c", _CODEC_PROBE], capture_output=True, text=True, timeout=60,
                             cwd="/", env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}, check=True)
    except (OSError, subprocess.SubprocessError):
        return (), ()
    rows = [line.split(" ", 1) for line in out.stdout.splitlines() if " " in line]
    return (tuple(n for kind, n in rows if kind == "codec"), tuple(n for kind, n in rows if kind == "needs"))


def unpack_result(data):
    """(status, value, error) of worker.pack_result's bytes; raises ValueError on anything else (the bytes come from
    the run's own process, which may have written them itself)."""
    if len(data) < _HDR.size or _HDR.unpack(data[:_HDR.size])[0] != len(data) - _HDR.size:
        raise ValueError("malformed result length")
    parts = data[_HDR.size:].decode("utf-8").split("\x00")
    if len(parts) != 3 or not parts[1] or not parts[2] or parts[1][0] not in "01" or parts[2][0] not in "01":
        raise ValueError("malformed result")
    status, v, e = parts
    return status, (v[1:] if v[0] == "1" else None), (e[1:] if e[0] == "1" else None)


class WorkerHandle:
    """The trainer's side of one sandbox worker (lorapop/executor/worker.py): a SOCK_SEQPACKET socket carries the
    requests and the worker's reports; each run gets two fresh pipes, one the trainer writes the program into and one
    it reads the result from, whose other ends go to the worker with the request and from it to the forked child. The
    worker never holds the program or the result."""

    def __init__(self, ex: Any, hashseed: int, uid: int, lean: bool = False):
        """``ex``: the executor whose ``config`` and ``mode`` (its isolation mechanism) the worker starts with;
        ``lean``: a worker with only ``lean_preload``, whose runs that import anything else end "escalated"."""
        self.ex, self.hashseed, self.uid, self.lean = ex, hashseed, uid, lean
        self.proc: subprocess.Popen | None = None
        self.ctl: socket.socket | None = None
        self.info: dict = {}
        self.root: str | None = None
        self.served = 0  # runs since this worker started

    def _command(self, root: str, mechanism: str) -> list[str]:
        c = self.ex.config
        py = [c.python or sys.executable, "-s", "-S", "-c", LAUNCH, str(WORKER_PY.parent)]
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
        # The chroot's root is a tmpfs holding one empty directory, /w (the runs' working directory), then made
        # read-only, superblock and mount both: no run can write a file, an extended attribute or a timestamp
        # anywhere, so every run finds the same filesystem and leaves nothing in it (worker.py).
        # nr_inodes fixed: by default a tmpfs may hold half the machine's RAM pages in inodes, and statvfs says so
        opts = "mode=0755,nosuid,nodev,noexec,nr_inodes=64"
        opts = f"size={int(c.disk_mb)}m,{opts}"
        # The worker starts in the tmpfs and chroots into "." (worker.py): the scratch path, whose name holds this
        # process's pid, is in no argument, variable or string of the worker, whose memory its runs can read. The
        # shell's PWD and OLDPWD would be that path (and this process's directory) in the worker's environment.
        mount = (f'umask 022 && mount -t tmpfs -o {opts} tmpfs "$1" && mkdir -m 755 "$1/w" && '
                 f'mount -t tmpfs -o remount,ro,{opts} tmpfs "$1" && mount -o remount,bind,ro "$1" && cd "$1" && '
                 'unset PWD OLDPWD && shift && exec "$@"')
        return ["unshare", *flags, "--mount", "--propagation", "private", "--", "/bin/sh", "-c", mount, "sh", root,
                *py]

    def start(self) -> None:
        if getattr(self.ex, "_closed", False):  # a run finishing after close (an interrupted caller's): no worker
            raise RuntimeError("executor is closed")
        c, mode = self.ex.config, self.ex.mode
        # named after this process, so a run killed with -9 does not leave them behind for good (lorapop/tmpdirs.py)
        self.root = str(owned_tempdir(SANDBOX_PREFIX))
        os.chmod(self.root, 0o755)
        chroot = mode["mechanism"] != "none" and c.isolate_filesystem
        self.served = 0
        if c.uid_base is None:  # a fresh uid for each worker process (sandbox.py, draw_uid)
            self.uid = self.ex.draw_uid(self)
        codecs = codec_modules(c.python or sys.executable) if c.preload_codecs and not self.lean else ((), ())
        wcfg = {
            "timeout_s": c.timeout_s, "memory_bytes": int(c.memory_mb) << 20, "fsize_bytes": int(c.fsize_mb) << 20,
            "max_procs": c.max_procs, "max_open_files": c.max_open_files, "max_output_chars": c.max_output_chars,
            "max_repr_chars": c.max_repr_chars, "drop_uid": mode["mechanism"] == "root" and c.drop_privileges,
            "uid": self.uid, "mechanism": mode["mechanism"], "seccomp": c.seccomp,
            "drop_caps": mode["mechanism"] == "userns" and c.drop_privileges, "uts": mode["mechanism"] != "none",
            "root": None if chroot else self.root, "chroot": chroot,
            "preload": [m for m in c.lean_preload if m in c.preload] if self.lean else [*c.preload, *codecs[1]],
            "stored": codecs[0],
            "escalate": self.lean, "pad_to": self.ex.full_vm() if self.lean else 0,
            "env": {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "TZ": "UTC"},
        }
        # TZ: the time module reads the zone when the worker imports it, before the chroot hides the host's
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8", "TZ": "UTC",
               "PYTHONHASHSEED": str(self.hashseed)}
        self.errfile = tempfile.TemporaryFile()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(self._command(self.root, mode["mechanism"]),
                                         stdin=theirs.fileno(), stdout=subprocess.DEVNULL, stderr=self.errfile,
                                         env=env, start_new_session=True, close_fds=True, cwd="/")
        finally:
            theirs.close()
        self.ctl = mine
        try:  # on the socket, not in the argument list, which a run could read (lorapop/executor/ambient.py)
            mine.send(json.dumps(wcfg).encode("utf-8"))
        except OSError:
            pass  # the worker is gone already: no hello below says so, with its error output
        hello = self._recv(time.monotonic() + 30.0)
        if not hello or not hello.get("hello"):
            self.errfile.seek(0)
            err = self.errfile.read().decode("utf-8", "replace")[-2000:]
            self.kill()
            raise RuntimeError(f"sandbox worker failed to start: {err.strip() or 'no hello'}")
        self.info = hello
        if getattr(self.ex, "_closed", False):  # closed while this one started: close may have passed it already
            self.kill()
            raise RuntimeError("executor is closed")

    def _recv(self, deadline: float) -> dict | None:
        """The worker's next report, or None when it ended or the deadline passed."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _ = ready([self.ctl], [], left)
            if r:
                break
        try:
            data = self.ctl.recv(1 << 16)  # a datagram: a shorter buffer would cut a long hello (many preloads)
            if data[:1] == b"R":  # a run's report (worker.REPORT); anything else is JSON
                _, wstatus, timed_out, duration, cpu_s = REPORT.unpack_from(data)
                return {"wstatus": wstatus, "timed_out": timed_out, "duration": duration, "cpu_s": cpu_s,
                        "retire": data[REPORT.size:].decode("utf-8", "replace")}
            return json.loads(data) if data else None
        except (OSError, ValueError, struct.error):
            return None

    def call(self, code: str, timeout_s: float, max_chars: int | None = None) -> ExecResult:
        """One run. ``max_chars``: the longest result taken (at most the config's ``max_repr_chars``, the default);
        no more of a longer one is read than that many characters can take."""
        if self.proc is None or self.proc.poll() is not None or self.ctl is None:
            self.kill()
            self.start()
        c = self.ex.config
        cap = c.max_repr_chars if max_chars is None else min(c.max_repr_chars, max_chars)
        t0 = time.perf_counter()
        compiled = self.ex.compiler.compile(code)  # by the helper (compiler.py), for this worker's interpreter only
        compiled = compiled if compiled is not None and self.ex.compiler.ident == self.info.get("compiler") else None
        program = code.encode("utf-8", "surrogatepass") if compiled is None else compiled
        # Every pipe end this call opened and has not closed, closed exactly once whatever happens (another thread's
        # new pipe may reuse a number closed twice): the program's write end leaves it once _exchange wrote it all.
        pending: set[int] = set()
        try:
            code_r, code_w = os.pipe()
            pending.update((code_r, code_w))
            res_r, res_w = os.pipe()
            pending.update((res_r, res_w))
            try:
                request = REQUEST.pack(timeout_s, len(program), compiled is not None)
                socket.send_fds(self.ctl, [request], [code_r, res_w])
            except OSError:
                self.kill()
                return ExecResult("crashed", None, WORKER_DIED, time.perf_counter() - t0)
            finally:
                for fd in (code_r, res_w):  # the worker's now (or nobody's)
                    pending.discard(fd)
                    os.close(fd)
            report, raw, overflow = self._exchange(program, code_w, pending, res_r,
                                                   time.monotonic() + timeout_s + c.grace_s, cap)
        except BaseException:
            # Ended anywhere after the request may have gone and before its report was read (an exception of the
            # trainer's own, raised in any step): the report would be read as the next run's, and every later
            # verdict of this worker one run behind. The main thread's interrupts never land here (sandbox.py,
            # _off_main); a MemoryError could.
            self.kill()
            raise
        finally:
            for fd in pending:
                os.close(fd)
        took = time.perf_counter() - t0
        if report is None or "wstatus" not in report:
            late = took >= timeout_s
            self.kill()
            return ExecResult("timeout" if late else "crashed", None,
                              "worker stopped answering" if late else WORKER_DIED, took)
        self.served += 1
        if report.get("retire") or self.served >= c.worker_max_runs:
            self.kill()  # its tmpfs and namespaces go with it; the next call starts a fresh worker
        if self.lean and escalated(report):
            return ExecResult(ESCALATED, None, None, float(report.get("duration", 0.0)))
        return run_result(report, raw, overflow, timeout_s, cap)

    def _exchange(self, code: bytes, code_w: int, pending: set, res_r: int, deadline: float, max_chars: int
                  ) -> tuple[dict | None, bytes, bool]:
        """Write the program (closing ``code_w``, and taking it out of ``pending``, once it is all written), read the
        result (at most a few times ``max_chars``, the call's cap; more is read and dropped) and wait for the worker's
        report.

        A result the worker's own code writes is at most ``max_repr_chars`` characters plus a short error, under one
        page whenever ``max_repr_chars`` is small (the task checks' 400): then the result pipe is read once, after
        the report, which saves the trainer a wake-up per run; a run that writes more than a pipe holds blocks until
        its wall clock ends (a timeout: it wasted its own time). With a larger ``max_repr_chars`` (benchmark judging)
        the result is read while the run goes on, so a long honest one never blocks."""
        cap = max_chars * 4 + 4096
        # what the worker's own code may write (the config's cap) decides whether the pipe must be read while it runs
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
        res_open, rest_until = True, 0.0
        while report is None or (res_open and watch):
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                # A report came and only the result pipe is still open: a process outside the run's reach (no pid
                # namespace, executor.allow_unisolated) holds it; what was read stands.
                return (report, b"".join(chunks), overflow) if report is not None else (None, b"", False)
            # After a short read the pipe is left alone for READ_REST_S: a run writing its result a byte at a time
            # would otherwise wake this thread (holding the GIL) once per write for its whole wall clock; an honest
            # result comes in a few large writes and loses at most READ_REST_S per short one.
            reading = res_open and watch and now >= rest_until
            rl = ([self.ctl] if report is None else []) + ([res_r] if reading else [])
            wait = left if reading or not (res_open and watch) else min(left, rest_until - now)
            r, w = ready(rl, [code_w] if code_w in pending else [], wait)
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
                if 0 < len(chunk) < _PAGE:
                    rest_until = time.monotonic() + READ_REST_S
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
        if self.proc is not None and self.proc.poll() is None and self.ctl is not None:
            try:
                self.ctl.shutdown(socket.SHUT_RDWR)  # EOF: the worker exits, its namespaces die with it
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


def escalated(report: dict) -> bool:
    """Whether a lean worker's run ended at an import its worker lacks (stored.py, Escalate): the exit code alone
    decides, whatever the run wrote, so the full worker's run is the only one that counts. A program that exits so
    on its own gets the same: its run again on a full worker, where that exit is a crash like any other."""
    st = int(report.get("wstatus") or 0)
    return not report.get("timed_out") and os.WIFEXITED(st) and os.WEXITSTATUS(st) == ESCALATE_EXIT


def run_result(report: dict, raw: bytes, overflow: bool, timeout_s: float, max_repr_chars: int) -> ExecResult:
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
