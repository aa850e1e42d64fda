"""What a sandbox worker hides of its machine from the runs forked from it (worker.py imports it as a top-level module
beside itself, before its chroot; standard library only).

A program that reads a fact of the machine (its CPU count, memory, kernel release, the interpreter's install path)
gets a value that is the same in every run of one trainer, so its task validates and its control reproduces, while
no student can know it, and the value tells the run about the host. Whatever of that can be hidden is hidden here or
by the filter (lockdown.py refuses uname, sysinfo, sched_getaffinity and times); docs/METHOD.md ("Facts of the
machine") lists what stays observable and why that is bounded.

* The worker's host name is ``sandbox`` (its own UTS namespace), and a fresh network namespace is checked to reach
  nothing.
* The worker's configuration comes on its control socket, never in its argument list (``sys.argv`` would hand a run
  the run uid, the mechanism and the host scratch path, whose name holds the trainer's pid).
* The interpreter's own record of where it lives is blanked: ``sys.argv``, ``sys.orig_argv``, ``sys.executable``,
  the prefixes, ``sys.path`` and the import caches (nothing can be imported after the chroot anyway), and every
  loaded module's ``__file__``, ``__cached__``, ``__path__`` and spec origin.
* The file name in every code object of the worker's heap (the standard library's functions, the worker's own) is cut
  to its base name, so that walking from a module to a function's code gives ``fractions.py``, not the user's home
  directory. Frames already running when this is done (the worker's main loop) keep their code: the worker is
  started from source compiled under the bare name ``worker.py`` (lorapop/executor/handle.py), so they hold nothing
  more.
* The process-id functions are removed from ``os``, ``posix`` and ``_thread`` (``getpid``, ``getppid``, ``getpgrp``,
  ``getpgid``, ``getsid``, ``get_native_id``; ``time.pthread_getcpuclockid``, whose clock id glibc builds from the
  thread id it keeps without a system call): the filter refuses the calls behind the first ones, after which they
  would return -1 in every run, a constant no student could know; without the names a program that asks fails.
"""

import gc
import json
import os
import socket
import sys

CONFIG_MAX_BYTES = 1 << 20


def read_config(ctl):
    """The worker's configuration: the first datagram on its control socket."""
    data = ctl.recv(CONFIG_MAX_BYTES)
    if not data:
        raise SystemExit("sandbox worker: no configuration on the control socket")
    return json.loads(data)


def hide_interpreter(chrooted=True):
    """Blank the interpreter's paths and every module's file attributes; cut every code object's file name to its
    base name. Called once, after the last import and before the first run is forked. Without a chroot (no
    filesystem isolation: the host's files are the runs' to read anyway) the import path and the modules' own
    paths are left, so that imports go on working."""
    sys.argv[:] = [""]
    hide_process_ids()
    for name in ("orig_argv",):
        if hasattr(sys, name):
            setattr(sys, name, [])
    for name in ("executable", "_base_executable"):
        if hasattr(sys, name):
            setattr(sys, name, "")
    for name in ("prefix", "exec_prefix", "base_prefix", "base_exec_prefix"):
        setattr(sys, name, "/")
    if hasattr(sys, "_stdlib_dir"):  # the standard library's directory; frozen modules' file names are made from it
        sys._stdlib_dir = None
    fence_sysconf()
    if chrooted:
        sys.path[:] = []
        sys.path_importer_cache.clear()
        sys.modules.get("linecache") and sys.modules["linecache"].cache.clear()
        for mod in list(sys.modules.values()):
            hide_module(mod)
        # and every module namespace no longer in sys.modules: an extension's copy of its first namespace (CPython
        # keeps it to re-create the module) and the namespaces of modules dropped while their functions live on
        for d in [o for o in gc.get_objects() if type(o) is dict and "__file__" in o]:
            hide_namespace(d)
    _rename_code()


def reset_inherited():
    """What a process inherits across exec from whoever started it, the same on every host instead: the umask (a
    trainer's 002, 027 or 077, which ``os.umask`` reads back) and every signal's disposition (a trainer under nohup
    ignores SIGHUP, and an ignored signal stays ignored across exec). SIGPIPE and SIGXFSZ ignored, as Python starts
    them (a write to a closed pipe or past the file size limit is an error, not a death); SIGINT is the worker's."""
    import signal

    os.umask(0o022)
    ignored = {signal.SIGPIPE, signal.SIGXFSZ}
    for sig in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP, signal.SIGINT}:
        try:
            signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)
        except (OSError, ValueError, RuntimeError):  # the few glibc keeps for itself
            pass


def dumpable_after_setuid():
    """A function telling whether a run that drops to its uid is left dumpable: fs.suid_dumpable, the flag a uid change
    leaves, read for each run (it can change while a worker lives) through a descriptor opened here, before the chroot
    hides /proc. At 0, the kernel's default, the run is non-dumpable without the worker's prctl (``nondumpable``: a
    third of a millisecond a run, most of it the collection after it); where the file cannot be read, every run
    clears the flag itself. Runs never hold the descriptor: a child closes all but its two pipes."""
    try:
        fd = os.open("/proc/sys/fs/suid_dumpable", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return lambda: True

    def dumpable():
        try:
            return os.pread(fd, 8, 0).strip() != b"0"
        except OSError:
            return True
    return dumpable


def nondumpable(path):
    """prctl(PR_SET_DUMPABLE, 0) again after the run's uid changed the flag to fs.suid_dumpable (2 where apport is
    installed), through the cached _ctypes extension (a run's route too; the filter is what bounds native code)."""
    import _imp
    m = _imp.create_dynamic(sys.modules["_frozen_importlib"].ModuleSpec("_ctypes", None, origin=path))
    # call_function: a C call on int arguments, with no ctypes type made for it (slower, and garbage a run could find)
    rc = m.call_function(m.dlsym(m.dlopen(None, 2), "prctl"), (4, 0, 0, 0, 0))  # PR_SET_DUMPABLE
    # nothing of it stays for the program: a run starts as the worker left it (no _ctypes module, no ctypes type)
    del m
    sys.modules.pop("_ctypes", None)
    gc.collect()
    if rc != 0:
        raise OSError("prctl(PR_SET_DUMPABLE, 0) failed")


_RLIMIT_LOCKS = 10  # Linux's number on every architecture; Python names it not, resource.getrlimit(10) reads it


def nproc_base(userns, release=None):
    """Processes the caller's uid already has that RLIMIT_NPROC counts against a run that may fork (``max_procs`` >
    1) and shares its uid: in a user namespace from Linux 5.14 on, the count is per namespace and uid (the ``unshare``
    process and the worker); before 5.14, and without namespaces, it is per uid across the machine, so the runs share
    it with every other process of the user. Read from /proc before the chroot; an estimate, since the user's other
    processes come and go."""
    parts = (release or os.uname().release).split(".")
    try:
        if userns and (int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)) >= (5, 14):
            return 2
    except (ValueError, IndexError):
        return 2
    uid, n = str(os.getuid()), 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/status") as fh:
                    n += any(line.startswith("Uid:") and line.split()[1] == uid for line in fh)
            except OSError:
                pass
    return n


def address_space(statm_fd):
    """Bytes of address space this process maps, read from ``statm_fd`` (its /proc/self/statm, opened before the
    chroot hid /proc), which it closes."""
    import resource

    try:
        return int(os.pread(statm_fd, 64, 0).split()[0]) * resource.getpagesize()
    finally:
        os.close(statm_fd)


def pinned_limits():
    """Limits a run can read that would otherwise be the host's (its ulimits), the same on every machine instead:
    none of locked memory, message queues, real-time priority or time, nice or file leases; the stack 8 MiB (glibc's
    usual default) unless the host's hard limit is lower. Every other limit is set by worker.py (the address space,
    data and resident size from ``executor.memory_mb``, CPU, processes, files, core, queued signals). (resource,
    limit) pairs for worker.py to set."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_STACK)[1]
    stack = 8 << 20 if hard == resource.RLIM_INFINITY else min(8 << 20, hard)
    return [(resource.RLIMIT_MEMLOCK, (0, 0)), (resource.RLIMIT_MSGQUEUE, (0, 0)), (resource.RLIMIT_RTPRIO, (0, 0)),
            (resource.RLIMIT_RTTIME, (0, 0)), (resource.RLIMIT_NICE, (0, 0)), (_RLIMIT_LOCKS, (0, 0)),
            (resource.RLIMIT_STACK, (stack, stack))]


# sysconf names glibc answers from the CPU itself (cpuid), no system call the filter could refuse: the caches' sizes,
# associativity and line sizes (_SC_LEVEL1_ICACHE_SIZE .. _SC_LEVEL4_CACHE_LINESIZE, numbers Python has no names for)
# and the signal stack's minimum, which follows the CPU's register file (AVX-512 or not).
HOST_SYSCONF = frozenset(range(185, 200)) | {249, 250}


def fence_sysconf():
    """``os.sysconf`` answers only the names ``os.sysconf_names`` lists, less :data:`HOST_SYSCONF`; any other number
    is unrecognized, as for a name glibc does not know. A program that builds a fresh ``posix`` module (or reaches
    the original function through the closure) still reads them: docs/METHOD.md "Facts of the machine"."""
    real, names = os.sysconf, dict(os.sysconf_names)
    allowed = frozenset(names.values()) - HOST_SYSCONF

    def sysconf(name):
        num = names.get(name, -1) if isinstance(name, str) else name
        if num not in allowed:
            raise ValueError("unrecognized configuration name")
        return real(num)

    os.sysconf = sysconf
    if "posix" in sys.modules:
        sys.modules["posix"].sysconf = sysconf
    for key in [k for k, v in names.items() if v not in allowed]:
        del os.sysconf_names[key]  # the posix module's own table too: one dict


PROCESS_ID_NAMES = ("getpid", "getppid", "getpgrp", "getpgid", "getsid", "get_native_id", "pthread_getcpuclockid")


def hide_process_ids():
    """Remove the process-id functions from every module that holds them (lockdown.py refuses the calls)."""
    for name in ("os", "posix", "_thread", "time"):  # time.pthread_getcpuclockid: a clock id that is ~tid << 3
        mod = sys.modules.get(name)
        for attr in PROCESS_ID_NAMES:
            if mod is not None and attr in vars(mod):
                delattr(mod, attr)


def hide_module(mod):
    d = getattr(mod, "__dict__", None)
    if isinstance(d, dict):
        hide_namespace(d)


def hide_namespace(d):
    """A module's namespace with its file attributes, spec and loader cut to base names (or emptied)."""
    for key in ("__file__", "__cached__"):
        if isinstance(d.get(key), str):
            d[key] = os.path.basename(d[key])
    if isinstance(d.get("__path__"), list):
        d["__path__"] = []
    spec = d.get("__spec__")
    for attr in ("origin", "cached"):
        val = getattr(spec, attr, None)
        if isinstance(val, str) and os.sep in val:
            try:
                setattr(spec, attr, os.path.basename(val))
            except (AttributeError, TypeError):
                pass
    if getattr(spec, "submodule_search_locations", None):
        spec.submodule_search_locations = []
    state = getattr(spec, "loader_state", None)  # a frozen module's: its source file's full name
    for attr, val in list(getattr(state, "__dict__", {}).items()):
        if isinstance(val, str) and os.sep in val:
            setattr(state, attr, os.path.basename(val))
    loader = d.get("__loader__")
    for attr in ("path", "archive"):
        if isinstance(getattr(loader, attr, None), str):
            try:
                setattr(loader, attr, os.path.basename(getattr(loader, attr)))
            except (AttributeError, TypeError):
                pass


def _rename_code():
    """Every function's code (and the code nested in its constants) with its file name cut to the base name. In place,
    through ``_imp._fix_co_filename`` (what importlib does when a cached module has moved): a new code object would
    start cold in every run, so each function a run calls would be warmed up again there, writing to its code's
    memory, which the fork shares with the worker (about 27 more page copies a run, measured). A code tree whose
    nested code holds another file name than its top (not seen in the standard library) is replaced instead."""
    import _imp

    done = {}

    def renamed(code):
        got = done.get(id(code))
        if got is not None:
            return got[1]
        consts = tuple(renamed(c) if isinstance(c, type(code)) else c for c in code.co_consts)
        new = code.replace(co_filename=os.path.basename(code.co_filename), co_consts=consts)
        done[id(code)] = (code, new)  # the old one kept alive so that its id is not reused meanwhile
        return new

    func = type(_rename_code)
    for obj in gc.get_objects():
        if type(obj) is func:
            code = obj.__code__
            if os.sep in code.co_filename:
                _imp._fix_co_filename(code, os.path.basename(code.co_filename))
            if not _bare(code):
                try:
                    obj.__code__ = renamed(code)
                except (ValueError, TypeError):  # a closure whose free variables no longer match: left as it is
                    pass


def _bare(code):
    """No file name with a directory in ``code`` or the code nested in its constants."""
    return os.sep not in code.co_filename and all(_bare(c) for c in code.co_consts if isinstance(c, type(code)))


HOSTNAME = "sandbox"  # every worker's host name: outputs cannot depend on the machine's


def own_hostname(cfg):
    """Set the UTS namespace's host name (as its root, before any capability is dropped): runs see ``sandbox``,
    never the machine's name. False where the worker has no UTS namespace of its own."""
    if not cfg.get("uts"):
        return False
    try:
        socket.sethostname(HOSTNAME)
    except OSError:
        return False
    return socket.gethostname() == HOSTNAME


def no_network():
    """True when no interface other than loopback exists and loopback cannot reach anything (fresh netns)."""
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.connect(("127.0.0.1", 9))
            return False
        finally:
            s.close()
    except OSError:
        return True
