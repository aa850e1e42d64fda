"""Code that runs inside the sandbox: one long-lived worker that forks once per program.

Standard library only; started by `lorapop.executor.sandbox` as ``python -s -S worker.py CONFIG_JSON`` (usually under
``unshare [--user --map-root-user] --net --mount --pid --ipc``, after a shell has mounted its tmpfs), with a scrubbed
environment. Startup, once per worker:

1. pre-import the modules task programs may use (after the chroot nothing else can be imported), and lockdown.py;
2. with a private mount namespace: chroot into the tmpfs (no host file is visible afterwards, /proc included);
3. in a user namespace, give up every capability; install the seccomp filter (both inherited by every fork), then
   drop lockdown and ctypes from ``sys.modules`` unless they were asked for;
4. replace its own environment by the runs' one (PATH and LC_ALL only) and set the limits that are the same for
   every run (file size, process count, open files, no core), all inherited by every fork;
5. say hello on the protocol pipe with the protections that are actually in force.

Per run: make a private directory (owned by the run uid as root), fork; the child sets its own rlimits (CPU,
address space), drops to an unprivileged uid as root, points fds 0/1/2 at dead pipes, runs the code as a fresh
``__main__`` module and reports ``repr(_result)``. The parent enforces the wall clock, kills the run's process group
and, when it is PID 1 of its own pid namespace, every other process in the namespace (catches children that escaped
with setsid), reaps, and removes the directory (and, where runs share its uid, anything else they left in /w).

Protocol on fds 0/1 (replaced by private high fds at startup): 4-byte big-endian length + JSON object.
"""

import builtins
import json
import os
import select
import shutil
import signal
import struct
import sys
import time

try:
    import resource
except ImportError:  # pragma: no cover - non-POSIX
    resource = None

_HDR = struct.Struct(">I")
# Bound at import so a program that rebinds builtins cannot break the reporting of its own result.
_repr, _len, _isinstance, _str, _type, _BaseException = repr, len, isinstance, str, type, BaseException


class _OutputLimit(BaseException):
    """Raised by the capped stdout once a program printed too much; BaseException so `except Exception` in the
    program cannot swallow it (a bare `except:` still can, which only wastes its own time budget)."""


class _CappedOut:
    """Stand-in for sys.stdout/sys.stderr: counts characters and discards them."""

    def __init__(self, limit):
        self.limit = limit
        self.n = 0
        self.encoding = "utf-8"

    def write(self, s):
        self.n += len(s) if isinstance(s, str) else 0
        if self.n > self.limit:
            raise _OutputLimit()
        return len(s) if isinstance(s, str) else 0

    def flush(self):
        pass

    def isatty(self):
        return False


def _read_exact(fd, n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _send(fd, obj):
    data = json.dumps(obj).encode("utf-8")
    _write_all(fd, _HDR.pack(len(data)) + data)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _short(text, n=300):
    return text if len(text) <= n else text[: n - 3] + "..."


def _describe(exc):
    try:
        msg = str(exc)
    except BaseException:  # a hostile __str__
        msg = "<unprintable>"
    try:
        name = type(exc).__name__
    except BaseException:
        name = "Exception"
    return _short(f"{name}: {msg}" if msg else name)


def _pack_result(status, value, error):
    """NUL-separated fields, built without json or any builtin a program may have rebound."""
    v = "0" if value is None else "1" + value
    e = "0" if error is None else "1" + error.replace("\x00", "\\x00")
    return (status + "\x00" + v + "\x00" + e).encode("utf-8", "backslashreplace")


def _unpack_result(data):
    status, v, e = data.decode("utf-8").split("\x00")
    return status, (v[1:] if v[0] == "1" else None), (e[1:] if e[0] == "1" else None)


def _child(code, cfg, uid, run_dir, res_w, fds):
    """Runs in the forked child; never returns."""
    status, value, error = "crashed", None, None
    try:
        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # ignored by the worker only
        os.dup2(fds["null_in"], 0)
        os.dup2(fds["null_out"], 1)
        os.dup2(fds["null_out"], 2)
        for fd in fds.values():
            if fd > 2:
                os.close(fd)
        if resource is not None:
            # Per run: CPU (counted per process, and the timeout may differ per request) and the address space
            # (kept off the worker so a small limit can only fail runs, never the worker). The other limits were
            # set once on the worker by _worker_limits and are inherited.
            cpu = int(cfg["cpu_s"])
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
            if cfg["memory_bytes"]:
                resource.setrlimit(resource.RLIMIT_AS, (cfg["memory_bytes"],) * 2)
        if cfg["drop_uid"]:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        os.chdir(run_dir)
        out = _CappedOut(cfg["max_output_chars"])
        sys.stdout = sys.stderr = sys.__stdout__ = sys.__stderr__ = out
        g = {"__name__": "__main__", "__builtins__": builtins}
        try:
            exec(compile(code, "<program>", "exec"), g)
            result = g.get("_result")
            text = _repr(result)
            if not _isinstance(text, _str):
                raise TypeError("__repr__ returned non-string")
            if _len(text) > cfg["max_repr_chars"]:
                status, error = "output_limit", f"repr of _result has {_len(text)} chars > {cfg['max_repr_chars']}"
            else:
                status, value = "ok", text
        except _OutputLimit:
            status, error = "output_limit", f"printed more than {cfg['max_output_chars']} chars"
        except MemoryError:
            status, error = "memory", "MemoryError"
        except SyntaxError as exc:
            status, error = "error", _describe(exc)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt included: the program's own failure
            status, error = "error", _describe(exc)
    except MemoryError:
        status, error = "memory", "MemoryError"
    except BaseException as exc:
        status, error = "crashed", "sandbox setup failed: " + _describe(exc)
    try:
        data = _pack_result(status, value, error)
        _write_all(res_w, _HDR.pack(_len(data)) + data)
    except BaseException:
        pass
    os._exit(0)


def _worker_limits(cfg):
    """Limits that hold for every run alike, set once on the worker and inherited by each fork (setting them in
    every child cost ~0.05 ms per run). None of them binds the worker itself: it writes only to pipes, keeps a
    handful of descriptors, and as root is exempt from RLIMIT_NPROC."""
    if resource is None:
        return
    lim = [
        (resource.RLIMIT_FSIZE, (cfg["fsize_bytes"],) * 2),
        (resource.RLIMIT_NOFILE, (cfg["max_open_files"],) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    if cfg["drop_uid"] or cfg.get("mechanism") == "userns":
        # Counted per real uid (per user namespace and uid): each worker has its own run uid, or its own user
        # namespace, so a fork bomb only starves itself. The worker is not exempt in a user namespace (it holds no
        # capability outside it); it keeps a single process between runs, so it stays under the limit.
        nproc = cfg["max_procs"] + cfg.get("nproc_base", 0)
        lim.append((resource.RLIMIT_NPROC, (nproc, nproc)))
    for which, val in lim:
        resource.setrlimit(which, val)


def _nproc_base(release=None):
    """Processes the caller's uid already has that RLIMIT_NPROC would count against the runs' limit: none from
    Linux 5.14 on (the count is per user namespace and uid); before it the count is per uid across the machine,
    so a user namespace's runs share it with every other process of the user. Read from /proc before the chroot
    (a fresh pid namespace still sees the host's /proc); an estimate, since the user's other processes come and go."""
    parts = (release or os.uname().release).split(".")
    try:
        if (int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)) >= (5, 14):
            return 0
    except (ValueError, IndexError):
        return 0
    uid, n = str(os.getuid()), 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/status") as fh:
                    n += any(line.startswith("Uid:") and line.split()[1] == uid for line in fh)
            except OSError:
                pass
    return n


def _reap_namespace(is_pid1):
    """Kill whatever a run left behind. Only as PID 1 of a private pid namespace is kill(-1) confined to the run's
    processes; anywhere else it would hit the whole machine, so it is never used there."""
    if is_pid1:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
    while True:
        try:
            pid, _ = os.waitpid(-1, 0 if is_pid1 else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _remove(path):
    """Remove a file or tree a run left, whatever modes it set on it (runs that share the worker's uid own it)."""
    tried = set()

    def remove(p, func=os.unlink):
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, onerror=retry)
        else:
            try:
                func(p)
            except OSError:
                pass

    def retry(func, p, _exc):
        if p in tried:
            return
        tried.add(p)
        for q in (os.path.dirname(p), p):
            if not os.path.islink(q):
                try:
                    os.chmod(q, 0o700)
                except OSError:
                    pass
        remove(p, func)

    remove(path)


def _run_one(req, cfg, state):
    code = req["code"]
    timeout = float(req.get("timeout") or cfg["timeout_s"])
    cfg = dict(cfg, cpu_s=max(1, int(timeout + 1.999)))
    state["n"] += 1
    run_dir = os.path.join(state["work"], str(state["n"]))
    os.mkdir(run_dir, 0o700)
    if cfg["drop_uid"]:
        os.chown(run_dir, state["uid"], state["uid"])
    res_r, res_w = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.close(res_r)
        _child(code, cfg, state["uid"], run_dir, res_w, state["fds"])
    os.close(res_w)
    try:
        os.setpgid(pid, pid)  # also done by the child; whichever runs first wins the race
    except OSError:
        pass
    buf, timed_out, cap = b"", False, cfg["max_repr_chars"] * 8 + 4096
    deadline = t0 + timeout
    poller = select.poll()
    poller.register(res_r, select.POLLIN | select.POLLHUP)
    while True:
        if len(buf) >= 4 and len(buf) >= 4 + _HDR.unpack(buf[:4])[0]:
            break
        left = deadline - time.perf_counter()
        if left <= 0:
            timed_out = True
            break
        if not poller.poll(left * 1000):
            continue
        chunk = os.read(res_r, 65536)
        if not chunk or len(buf) > cap:
            break
        buf += chunk
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        _, wstatus = os.waitpid(pid, 0)
    except ChildProcessError:
        wstatus = 0
    duration = time.perf_counter() - t0
    os.close(res_r)
    _reap_namespace(state["is_pid1"])
    try:
        os.rmdir(run_dir)  # the common case (nothing written) without rmtree's directory walk
    except OSError:
        _remove(run_dir)
    if state["sweep"]:
        os.chmod(state["work"], 0o755)  # the run owned it and may have changed it
        for name in os.listdir(state["work"]):
            _remove(os.path.join(state["work"], name))
    if timed_out:
        return {"status": "timeout", "value": None, "error": f"wall-clock limit {timeout:g}s", "duration": duration}
    try:
        n = _HDR.unpack(buf[:4])[0]
        status, value, error = _unpack_result(buf[4 : 4 + n])
    except Exception:
        status, value = "crashed", None
        if os.WIFSIGNALED(wstatus):
            sig = os.WTERMSIG(wstatus)
            if sig == signal.SIGXCPU:
                status, error = "timeout", f"CPU limit {cfg['cpu_s']}s"
            else:
                error = f"killed by signal {sig}"
        else:
            error = f"exited with code {os.WEXITSTATUS(wstatus) if os.WIFEXITED(wstatus) else '?'} before returning a result"
    return {"status": status, "value": value, "error": error, "duration": duration}


def _preimport(names):
    loaded = []
    for name in names:
        try:
            __import__(name)
            loaded.append(name)
        except Exception:
            pass
    return loaded


def main():
    cfg = json.loads(sys.argv[1])
    # Private copies of the protocol pipe; 0/1/2 become dead ends so nothing a run inherits reaches the trainer.
    proto_in, proto_out = os.dup(0), os.dup(1)
    null_in_r, null_in_w = os.pipe()
    os.close(null_in_w)  # reading gives EOF forever
    null_out_r, null_out_w = os.pipe()
    os.close(null_out_r)  # writing gives EPIPE (Python ignores SIGPIPE)
    os.dup2(null_in_r, 0)
    os.dup2(null_out_w, 1)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    loaded = _preimport(cfg["preload"])
    import gc

    is_pid1 = os.getpid() == 1
    net_isolated = _no_network()  # before the chroot: socket cannot be imported after it
    lockdown = _load_lockdown(cfg)  # before the chroot too, for the same reason
    if cfg.get("mechanism") == "userns":
        cfg["nproc_base"] = _nproc_base()
    root = cfg.get("root")
    chrooted = False
    if root and cfg.get("chroot"):  # the command mounted the tmpfs there (sandbox.py)
        os.chroot(root)  # as root, or as the root of the worker's own user namespace
        os.chdir("/")
        chrooted = True
        work = "/w"
    else:
        work = os.path.join(root or cfg["fallback_dir"], "w")
    os.makedirs(work, mode=0o755, exist_ok=True)
    drop = bool(cfg.get("drop_uid")) and os.geteuid() == 0
    cfg["drop_uid"] = drop
    # A run cannot signal PID 1 of its pid namespace except through a handler the worker installed: Python's SIGINT
    # one is the only one, and with a single mapped uid (user namespace) runs are allowed to send it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    locked = _lockdown(cfg, lockdown)
    state = {
        "n": 0,
        "work": work,
        "uid": cfg["uid"],
        "is_pid1": is_pid1,
        "sweep": not drop,  # runs that own the working area can leave entries beside their own directory
        "fds": {"null_in": null_in_r, "null_out": null_out_w, "proto_in": proto_in, "proto_out": proto_out},
    }
    _worker_limits(cfg)
    hashseed = os.environ.get("PYTHONHASHSEED")  # already fixed for this interpreter; runs need not see it
    # The runs' environment, set once here and inherited by every fork (rebuilding os.environ in each child cost
    # ~0.2 ms of a ~2 ms run).
    os.environ.clear()
    os.environ.update(cfg["env"])
    gc.collect()
    gc.freeze()  # fewer copy-on-write page faults in forked children
    _send(proto_out, {"hello": True, "pid1": is_pid1, "chroot": chrooted, "drop_uid": drop, "uid": cfg["uid"],
                      "net_isolated": net_isolated, "hashseed": hashseed, "preloaded": loaded, **locked})
    while True:
        hdr = _read_exact(proto_in, 4)
        if hdr is None:
            return
        req = json.loads(_read_exact(proto_in, _HDR.unpack(hdr)[0]).decode("utf-8"))
        try:
            resp = _run_one(req, cfg, state)
        except Exception as exc:  # the worker itself must survive anything a run does
            resp = {"status": "crashed", "value": None, "error": "worker: " + _describe(exc), "duration": 0.0}
        resp["id"] = req.get("id")
        _send(proto_out, resp)


def _load_lockdown(cfg):
    """Import lockdown.py (and ctypes) while host files are still visible; returns (module, modules loaded before)."""
    if not (cfg.get("seccomp") or cfg.get("drop_caps")):
        return None
    before = set(sys.modules)
    try:
        import lockdown
    except Exception as exc:  # pragma: no cover - a broken install
        return exc, before
    return lockdown, before


def _lockdown(cfg, loaded):
    """Drop capabilities (user namespace: the worker is root of it only to mount and chroot) and install the seccomp
    filter; both are inherited by every run. Then forget lockdown and ctypes, so programs cannot import them: only
    the preloaded modules stay importable. Returns what is in force, for the hello."""
    out = {"seccomp": False, "caps_dropped": False, "lockdown_error": None}
    if loaded is None:
        return out
    mod, before = loaded
    errors = []
    if isinstance(mod, Exception):
        errors.append(f"lockdown: {_describe(mod)}")
    else:
        if cfg.get("drop_caps"):
            try:
                mod.drop_capabilities()
                out["caps_dropped"] = True
            except Exception as exc:
                errors.append(f"capabilities: {_describe(exc)}")
        if cfg.get("seccomp"):
            try:
                out["seccomp"] = mod.install_seccomp()  # the architecture's name
            except Exception as exc:
                errors.append(f"seccomp: {_describe(exc)}")
    for name in set(sys.modules) - before:
        del sys.modules[name]
    out["lockdown_error"] = "; ".join(errors) or None
    return out


def _no_network():
    """True when no interface other than loopback exists and loopback cannot reach anything (fresh netns)."""
    import socket

    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.connect(("127.0.0.1", 9))
            return False
        finally:
            s.close()
    except OSError:
        return True


if __name__ == "__main__":
    main()
