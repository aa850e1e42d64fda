"""Code that runs inside the sandbox: one long-lived worker, the template every run is forked from. Standard library
only; started by handle.py (``python -s -S -c LAUNCH``, under ``unshare``, after a shell mounted its tmpfs) with a
scrubbed environment and a unix socket (``SOCK_SEQPACKET``) on fd 0: its config, then requests.

**The worker never holds a program, an answer or a result.** For each run the trainer sends a small request (the time
limit) with two fresh pipe ends attached: the read end of the pipe the trainer writes the program into, and the write
end of the pipe the trainer reads the result from. The worker forks; the child reads its program, runs it and writes
its result straight to the trainer; the worker only waits, cleans up and reports how the child ended. So every run
starts as a copy of one process that has never held model-written text, and nothing of an earlier run (not even
freed memory that once held it) is in that copy.

Startup, once per worker:

1. pre-import what programs may use (codecs kept compiled: stored.py) and lockdown.py: nothing loads after the chroot;
2. its own host name (UTS namespace); with a private mount namespace, chroot into ``.``, the tmpfs it was started in
   (no host file is visible afterwards, /proc included, and the worker never holds the tmpfs's host path);
3. in a user namespace, give up every capability; install the seccomp filter (both inherited by every fork), then
   drop lockdown and ctypes from the modules (a run can still reach native code: the filter bounds it, METHOD.md);
4. the limits that are the same for every run (file size, open files, no core), the runs' environment;
5. hello on the socket with the protections that are actually in force.

Per run: fork; the child unblocks signals, closes every descriptor but its two pipe ends (the worker's own are open
files it shares, whose flags and locks a run could set for the next), sets its own limits (CPU, address space,
processes), drops to the run uid as root, reads its program (compiled by the executor's helper where its interpreter
is this one: compiler.py), runs it as a fresh ``__main__`` module and writes
``repr(_result)`` or its error. The worker waits for the child's exit up to the wall clock, then kills every other
process of the namespace (as its PID 1; else the run's process group), reaps, and re-reads everything of itself a run
could reach (health.py: the runs' read-only filesystem whole, its limits, priority, scheduler, CPU set, host name;
the pid counter where runs may fork). Anything changed and it answers ``retire`` and exits, so the trainer starts
a fresh worker: the tmpfs and the namespaces die with it, whole."""

import builtins
import json
import marshal
import os
import _signal
import signal
import socket
import struct
import sys
import time

import resource

_HDR = struct.Struct(">I")
# Per run, in fixed binary forms rather than JSON, whose encoder and decoder touched 50 of the worker's pages a run:
# each was shared with the run just forked, so copied again (the hello and the config stay JSON). A request: the
# run's wall clock (s), the program's length in bytes, whether it comes compiled (marshal's bytes from a helper whose
# compiler_id() is this worker's: compiler.py), with two pipe ends attached
REQUEST = struct.Struct(">dQ?")
REPORT = struct.Struct(">ci?dq")  # b"R", wait status, timed out, duration (s), RLIMIT_CPU (s); then why to retire
_CMSG = socket.CMSG_SPACE(8)  # two descriptors' room
_repr, _len, _isinstance, _str = repr, len, isinstance, str  # a program that rebinds builtins: its result still goes
_SIGCHLD = {signal.SIGCHLD}
SIGPENDING = 16  # queued signals per run's user (RLIMIT_SIGPENDING)
RESULT_FD = 3  # lockdown.RESULT_FD: where the result pipe is while the program runs
# repr(_result) as a script's last line takes it: as deep as the program's module, with the program's globals and
# locals, the name repr looked up first as there; the repr called a constant of the code (no name a program could
# rebind; [repr, None][1]: a callee the compiler accepts)
_REPR = compile("[repr, None][1](_result)", "<result>", "eval")
_REPR = _REPR.replace(co_consts=tuple(_repr if c is None else c for c in _REPR.co_consts))
_STDIO = (sys.stdout, sys.stderr)  # kept, so a run that puts its own in their place frees nothing (28 page copies)
_LEAN = []  # a lean worker's stored.Escalate, armed in each run's child, and the room it keeps (main)
_HELD = []  # the worker's socket and health state, kept: a run's child leaves the loop's frames without freeing them


class _OutputLimit(BaseException):
    """Raised by the capped stdout once a program printed too much; BaseException so `except Exception` in the
    program cannot swallow it (a bare `except:` still can, which only wastes its own time budget)."""


class _CappedOut:
    """Stands in for sys.stdout or sys.stderr: a script's text stream as far as writing goes (str only, UTF-8, and its
    errors: what stdout cannot encode raises as in a script), counting the characters both streams took against one
    limit and discarding them."""
    encoding = "utf-8"

    def __init__(self, name, errors, count):
        self.name, self.errors, self.count = name, errors, count  # count: [characters so far, limit], shared

    def write(self, s):
        if not _isinstance(s, _str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        _str.encode(s, "utf-8", self.errors)
        n = _str.__len__(s)
        self.count[0] += n
        if self.count[0] > self.count[1]:
            raise _OutputLimit()
        return n

    def flush(self):
        pass

    def isatty(self):
        return False


def write_all(fd, data):
    """Every byte of ``data`` to ``fd``, in as many writes as it takes (a signal cuts a write short)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd, n):
    """``n`` bytes, or fewer if the writer closed first (reads of exactly what is left: no large buffer to fault in,
    which in a freshly forked child costs more than the read)."""
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, n - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _describe(exc):
    try:
        msg = str(exc)
    except BaseException:  # a hostile __str__
        msg = "<unprintable>"
    try:
        name = type(exc).__name__
    except BaseException:
        name = "Exception"
    text = f"{name}: {msg}" if msg else name
    return text if len(text) <= 300 else text[:297] + "..."


def pack_result(status, value, error):
    """A 4-byte big-endian length, then NUL-separated fields, built without json or any builtin a program may have
    rebound."""
    v = "0" if value is None else "1" + value
    e = "0" if error is None else "1" + error.replace("\x00", "\\x00")
    body = (status + "\x00" + v + "\x00" + e).encode("utf-8", "backslashreplace")
    return _HDR.pack(_len(body)) + body


def compiler_id():
    """What a program compiled in another process must share with this interpreter to be loaded here unchanged: the
    version and bytecode, the longest int literal read, whether code keeps column positions, the optimization level."""
    digits = getattr(sys, "get_int_max_str_digits", lambda: None)()
    columns = list(compile("x", "", "eval").co_positions())[-1][2] is not None
    magic = sys.modules["_frozen_importlib_external"].MAGIC_NUMBER.hex()
    return f"{sys.version} {magic} {digits} {columns} {sys.flags.optimize}"


def _prepare(cfg, code_fd, res_fd, cpu_s, size, compiled, reset_dumpable):
    """The child's setup, in a frame of its own that is gone before the program runs; returns the program's text, or
    its code compiled by the executor's helper (marshal's bytes)."""
    # _signal, not signal's wrappers, which make enum members: each object a child makes costs it page copies (30)
    _signal.pthread_sigmask(_signal.SIG_SETMASK, ())  # the worker blocks SIGCHLD; a program starts with none
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)  # ignored by the worker only
    os.setpgid(0, 0)  # its own group, in a pid namespace too: kill(0, 9) would hit the worker's `unshare` parent
    # Nothing of the worker's own descriptors: 0, 1 and 2 (its dead pipes) are open file descriptions shared
    # with the worker, whose flags, pipe size and locks a run could set for the next run to read.
    lo, hi = sorted((code_fd, res_fd))
    os.closerange(0, lo)
    os.closerange(lo + 1, hi)
    os.closerange(hi + 1, cfg["max_open_files"])  # the worker's socket to the trainer among them
    if res_fd != RESULT_FD:  # the one descriptor the filter keeps a run from reading the inode of (lockdown.py);
        os.dup2(res_fd, RESULT_FD), os.close(res_fd)  # first, so a failed setup below still reports why
    # Per run: CPU (per process), the address space (off the worker: a small limit fails runs, never the worker)
    # and the process count (one by default: no fork or thread, so that limit bounds every byte a run holds).
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    if cfg["memory_bytes"]:  # DATA and RSS alike: a run reads them, and the host's would tell it the host's
        for which in (resource.RLIMIT_AS, resource.RLIMIT_DATA, resource.RLIMIT_RSS):
            resource.setrlimit(which, (cfg["memory_bytes"],) * 2)
    if cfg["nproc"]:
        resource.setrlimit(resource.RLIMIT_NPROC, (cfg["nproc"],) * 2)
    if cfg["drop_uid"]:
        os.setgroups([])
        os.setresgid(cfg["uid"], cfg["uid"], cfg["uid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
        if cfg["ctypes_path"] and reset_dumpable:
            cfg["nondumpable"](cfg["ctypes_path"])
    os.chdir(cfg["work"])
    code = _read_exact(code_fd, size)
    code = code if compiled else code.decode("utf-8", "surrogatepass")
    os.close(code_fd)
    return code


def _child(forked):
    """Runs in the forked child, at the top of its stack; never returns. Its frame, the one above the program's, holds
    the program's text and output limits; ``forked`` (run config, setup) is freed whole before the program runs."""
    status, value, error = "crashed", None, None
    cfg, setup = forked[0], forked[1:]
    del forked
    max_out, max_repr = cfg["max_output_chars"], cfg["max_repr_chars"]
    try:
        try:
            code = _prepare(cfg, *setup)
        finally:
            del cfg, setup
        if _LEAN:  # from here on an import the worker lacks is the program's (a compile's included)
            _LEAN[0].armed = True
        g = {"__name__": "__main__", "__builtins__": builtins}
        try:
            # compiled by the helper (no compiler's garbage on pages shared with the worker: 70 page copies a run);
            # before the streams are the run's, so its compile's warnings count against no limit, as in a script
            program = compile(code, "<program>", "exec") if _isinstance(code, _str) else marshal.loads(code)
            del code
            count = [0, max_out]
            sys.stdout = sys.__stdout__ = _CappedOut("<stdout>", "surrogateescape", count)
            sys.stderr = sys.__stderr__ = _CappedOut("<stderr>", "backslashreplace", count)
            exec(program, g)
            try:
                text = eval(_REPR, g)
            except NameError as exc:  # no _result reads None, only where the program never names it (the trainer's
                tb = exc.__traceback__  # always does) and only the lookup's own error, raised in _REPR's frame
                while tb.tb_next is not None:
                    tb = tb.tb_next
                if (type(exc) is not NameError or exc.name != "_result" or tb.tb_frame.f_code is not _REPR
                        or "_result" in g or "_result" in program.co_names):
                    raise
                text = "None"
            text = _str.__str__(text)  # a str subclass's methods never run (repr makes sure it is one)
            if _len(text) > max_repr:
                status, error = "output_limit", f"repr of _result has {_len(text)} chars > {max_repr}"
            else:
                _str.encode(text, "utf-8")  # text that is no UTF-8 (a lone surrogate) is no literal: the run fails
                status, value = "ok", text
        except _OutputLimit:
            status, error = "output_limit", f"printed more than {max_out} chars"
        except MemoryError:
            status, error = "memory", "MemoryError"
        except BaseException as exc:  # SystemExit and KeyboardInterrupt included: the program's own failure
            status, error = "error", _describe(exc)
    except MemoryError:
        status, error = "memory", "MemoryError"
    except BaseException as exc:
        status, error = "crashed", "sandbox setup failed: " + _describe(exc)
    try:
        write_all(RESULT_FD, pack_result(status, value, error))
    except BaseException:
        pass
    os._exit(0)


def _worker_limits(cfg, pinned=()):
    """Limits that hold for every run alike, set once on the worker and inherited by each fork. None of them binds the
    worker itself: it writes only to its socket and keeps a handful of descriptors."""
    # Queued real-time signals are counted per user (up the user-namespace chain to the host user, whose own
    # sigqueue and timers fail once the count reaches their limit) and a run can queue one per kill() to itself; a
    # program's own handlers need none queued (standard signals do not queue).
    for which, val in ((resource.RLIMIT_FSIZE, (cfg["fsize_bytes"],) * 2),
                       (resource.RLIMIT_NOFILE, (cfg["max_open_files"],) * 2),
                       (resource.RLIMIT_CORE, (0, 0)),
                       (resource.RLIMIT_SIGPENDING, (SIGPENDING,) * 2), *pinned):
        resource.setrlimit(which, val)


def _wait(pid, deadline):
    """The child's wait status, or None when the wall clock ran out first. SIGCHLD is blocked in the worker and
    taken with sigtimedwait: no handler, so a run cannot interrupt the worker with a signal of its own."""
    while True:
        try:
            got, st = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return 0
        if got == pid:
            return st
        left = deadline - time.perf_counter()
        if left <= 0:
            return None
        signal.sigtimedwait(_SIGCHLD, left)


def _reap(pid, is_pid1):
    """Kill whatever the run left and reap it all. Only as PID 1 of a private pid namespace is kill(-1) confined to the
    run's processes; anywhere else it would hit the whole machine, so there the run's process group is killed."""
    if is_pid1:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
    else:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    while True:
        try:
            got, _ = os.waitpid(-1, 0 if is_pid1 else os.WNOHANG)
        except ChildProcessError:
            return
        if got == 0:
            return


def _run_one(req, fds, cfg, state):
    timeout = req[0] or cfg["timeout_s"]
    # RLIMIT_CPU from the longer of the request's clock and the config's: a run reads its limits, and one derived
    # from the request would tell a check's runs (shorter clock) from validation's; the wall clock still holds it
    cpu_s = max(1, int(max(timeout, cfg["timeout_s"]) + 1.999))
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the run's child: back to the top of the module with what _child needs (_serve, below)
        try:
            return (cfg, *fds, cpu_s, req[1], req[2], cfg["dumpable_after_setuid"]())
        except BaseException:  # never on as a second worker; the trainer reads no result: "crashed"
            os._exit(1)
    os.close(fds[0]), os.close(fds[1])
    wstatus = _wait(pid, t0 + timeout)
    timed_out, duration = wstatus is None, time.perf_counter() - t0
    if timed_out:
        try:
            os.kill(-1 if cfg["pid1"] else pid, signal.SIGKILL)  # as PID 1 the filter lets it kill no single pid
            _, wstatus = os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            wstatus = 0
    _reap(pid, cfg["pid1"])
    state["last_pid"] = pid if state["fork_probe"] else 1  # a pid kept only where the probe needs it (health.py)
    retire = state["check"](state, _describe) or ""
    return REPORT.pack(b"R", wstatus, timed_out, duration, cpu_s) + retire.encode("utf-8", "replace")


def _recv_request(ctl):
    """(the request's bytes, every descriptor it carries: two pipe ends, or the caller closes them all)."""
    data, anc, _, _ = ctl.recvmsg(64, _CMSG)
    return data, [fd for level, kind, raw in anc if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
                  for fd in memoryview(raw[:len(raw) & ~3]).cast("i")]


def main():
    import ambient  # beside this file: the configuration, and the machine's facts hidden from runs
    ctl = socket.socket(fileno=os.dup(0))  # the trainer's SOCK_SEQPACKET socket: requests in, reports out
    cfg = ambient.read_config(ctl)
    # fds 0/1 become dead ends (reads give EOF, writes EPIPE); 2 stays the trainer's error file until the hello, so a
    # failed start can say why.
    null_in_r, null_in_w = os.pipe()
    null_out_r, null_out_w = os.pipe()
    os.dup2(null_in_r, 0), os.dup2(null_out_w, 1)
    for fd in (null_in_r, null_in_w, null_out_r, null_out_w):
        os.close(fd)
    ambient.reset_inherited()  # the trainer's umask and ignored signals: a run reads both
    import health, stored  # beside this file, found before the chroot hides them (no ctypes in them: runs may see them)
    loaded, kept = stored.preimport(cfg["preload"]), stored.install(cfg.get("stored", ()))  # kept compiled, not loaded
    import gc

    lean = (int(cfg.get("pad_to") or 0),) if cfg.get("escalate") else ()  # a lean worker (handle.py): its room
    statm = os.open("/proc/self/statm", os.O_RDONLY)  # before the chroot hides /proc: the size read below
    is_pid1 = os.getpid() == 1
    net_isolated = ambient.no_network()  # before the chroot: sockets cannot be made after the filter
    own_hostname = ambient.own_hostname(cfg)
    lockdown = _load_lockdown(cfg)  # before the chroot, which hides its file
    dumpable_after_setuid = ambient.dumpable_after_setuid()  # opens its file before the chroot hides /proc
    nproc = int(cfg["max_procs"])
    if nproc > 1 and not cfg.get("drop_uid"):  # runs share the worker's uid
        nproc += ambient.nproc_base(cfg.get("mechanism") == "userns")
    root = cfg.get("root")
    chrooted = False
    if cfg.get("chroot"):  # the command mounted the tmpfs and started this process in it (handle.py)
        # ".": the scratch path (its name holds the trainer's pid) never in this process, where freed memory keeps it
        os.chroot(".")  # as root, or as the root of the worker's own user namespace
        os.chdir("/")
        chrooted = True
        work = "/w"
    else:
        work = os.path.join(root, "w")
    os.makedirs(work, mode=0o755, exist_ok=True)  # made by the mount command, on a filesystem now read-only
    drop = bool(cfg.get("drop_uid")) and os.geteuid() == 0
    # A run cannot signal PID 1 of its pid namespace except through a handler the worker installed: Python's SIGINT
    # one is the only one, and with a single mapped uid (user namespace) runs are allowed to send it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    frame, depth = sys._getframe(), 2  # the frames above a program: _child runs as deep as main, two exec calls
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    locked = _lockdown(cfg, lockdown, is_pid1, depth)
    del lockdown  # its module (and ctypes through it) is unreachable from here on; gc.collect below frees it
    _worker_limits(cfg, ambient.pinned_limits())
    hashseed = os.environ.get("PYTHONHASHSEED")  # already fixed for this interpreter; runs need not see it
    # The runs' environment, set once here and inherited by every fork.
    os.environ.clear()
    os.environ.update(cfg["env"])
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGCHLD)
    run_cfg = {"pid1": is_pid1, "work": work, "uid": cfg["uid"], "drop_uid": drop, "nproc": nproc,
               "memory_bytes": cfg["memory_bytes"], "max_output_chars": cfg["max_output_chars"],
               "max_repr_chars": cfg["max_repr_chars"], "max_open_files": cfg["max_open_files"],
               "timeout_s": cfg["timeout_s"], "ctypes_path": locked.pop("ctypes_path", None),
               "dumpable_after_setuid": dumpable_after_setuid, "nondumpable": ambient.nondumpable}
    hello = {"hello": True, "compiler": compiler_id(), "pid1": is_pid1, "chroot": chrooted, "drop_uid": drop,
             "uid": cfg["uid"], "nproc": nproc, "net_isolated": net_isolated, "own_hostname": own_hostname,
             "hashseed": hashseed, "preloaded": loaded, "lean": bool(lean),
             "importable": sorted({*sys.modules, *kept} - {"__main__", "ambient", "health", "stored"}), **locked}
    del cfg, loaded, locked, kept
    os.dup2(1, 2)  # nothing a run writes reaches the trainer's error file
    ambient.hide_interpreter(chrooted)
    gc.collect()
    gc.freeze()  # fewer copy-on-write page faults in forked children
    per_run = [resource.RLIMIT_CPU, *([resource.RLIMIT_AS, resource.RLIMIT_DATA, resource.RLIMIT_RSS]
                                      if run_cfg["memory_bytes"] else []), *([resource.RLIMIT_NPROC] if nproc else [])]
    state = health.baseline("/" if chrooted else work, fork_probe=is_pid1 and nproc > 1, own_fs=chrooted,
                            per_run=per_run)
    state["check"] = health.check
    hello["vm_bytes"] = ambient.address_space(statm)
    for pad_to in lean:
        _go_lean(stored.Escalate(), pad_to - hello["vm_bytes"])
    ctl.send(json.dumps(hello).encode("utf-8"))
    _HELD.extend((ctl, state))  # nothing a run could not read itself (health.baseline); not the config
    del hello
    return ctl, run_cfg, state


def _go_lean(finder, pad):
    """A lean worker's last finder (stored.Escalate) and room: a run's RLIMIT_AS counts its worker's mappings, so it
    fills its address space (never memory: calloc'd pages no one touches) up to a full worker's by ``pad`` bytes."""
    _LEAN.append(finder)
    sys.meta_path.append(finder)
    if pad > 0:
        _LEAN.append(bytes(pad))


def _serve(ctl, run_cfg, state):
    """Requests until the trainer closes (then None); in a run's child, what :func:`_child` needs, returned from every
    frame of the loop (a program can walk the frames above its own; no traceback keeps one alive)."""
    while True:
        went = _serve_one(ctl, run_cfg, state)
        if went is not True:
            return went or None


def _serve_one(ctl, run_cfg, state):
    """One request: run it, report; True to go on, False to stop, a tuple in the run's child."""
    try:
        data, fds = _recv_request(ctl)
    except OSError:
        return False
    if not data:
        return False  # the trainer closed its end: the namespaces die with this process
    if len(fds) != 2:
        for fd in fds:
            os.close(fd)
        ctl.send(b'{"error": "a run request carries two pipe ends"}')
        return True
    try:
        resp = _run_one(REQUEST.unpack(data), fds, run_cfg, state)
        if type(resp) is tuple:
            ctl.detach()  # the child closes the descriptor itself; the socket's finalizer would format a warning
            return resp
    except Exception as exc:  # the worker itself must survive anything a run does
        resp = REPORT.pack(b"R", 0, False, 0.0, 0) + ("worker: " + _describe(exc)).encode("utf-8", "replace")
    ctl.send(resp)
    return len(resp) == REPORT.size  # a report with no reason to retire


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


def _lockdown(cfg, loaded, own_pids, depth):
    """Drop capabilities (user namespace: the worker is root of it only to mount and chroot), install the seccomp
    filter and count the ``depth`` frames above a program out of its recursion depth (else raise its limit by as
    many), all inherited by every run. Then forget lockdown and ctypes, so programs cannot import them: only the
    preloaded modules stay importable. Returns what is in force, for the hello."""
    out = {"seccomp": False, "caps_dropped": False, "lockdown_error": None, "recursion": "raised"}
    mod, before = loaded or (None, set(sys.modules))
    errors = []
    if isinstance(mod, Exception):
        errors.append(f"lockdown: {_describe(mod)}")
    elif mod is not None:
        out["recursion"] = "rebased" if mod.rebase_recursion(depth) else "raised"
        try:
            mod.nondumpable()
            out["ctypes_path"] = sys.modules["_ctypes"].__file__  # for a run that changes its uid (ambient.nondumpable)
        except Exception as exc:
            errors.append(f"dumpable: {_describe(exc)}")
        if cfg.get("drop_caps"):
            try:
                mod.drop_capabilities()
                out["caps_dropped"] = True
            except Exception as exc:
                errors.append(f"capabilities: {_describe(exc)}")
        if cfg.get("seccomp"):
            try:
                out["seccomp"] = mod.install_seccomp(own_pids)  # the architecture's name
            except Exception as exc:
                errors.append(f"seccomp: {_describe(exc)}")
    if out["recursion"] != "rebased":
        sys.setrecursionlimit(sys.getrecursionlimit() + depth)
    for name in set(sys.modules) - before:  # ctypes' functions keep its globals alive: its file attributes cut first
        sys.modules["ambient"].hide_module(sys.modules.pop(name))
    out["lockdown_error"] = "; ".join(errors) or None
    return out


if __name__ == "__main__":
    _forked = _serve(*main())
    if _forked:  # a run's child
        _child(globals().pop("_forked"))  # one argument: the call moves it into _child, nothing above keeps it
