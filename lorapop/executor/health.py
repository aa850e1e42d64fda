"""The sandbox worker's health check (lorapop/executor/worker.py imports it as a top-level module, before its chroot):
what of the worker a run could reach, read whole so it can be compared after every run.

Standard library only.
"""

import os

try:
    import resource
except ImportError:  # pragma: no cover - non-POSIX
    resource = None


def baseline(fs_top, fork_probe, own_fs=True, per_run=()):
    """The state :func:`check` compares against: what a run could reach, read now (after the worker's setup).
    ``fs_top``: the root of the runs' filesystem; ``fork_probe``: runs may fork inside a pid namespace; ``own_fs``:
    the filesystem is the worker's own tmpfs, so its counters are the runs' alone (without a chroot, the working area
    lies on a host filesystem whose free space other processes move all the time); ``per_run``: the limits each run
    sets for itself, left out: no run reads the worker's (each reads its own) and none can set them (prlimit on
    another process is refused), while the baseline, which a run can reach (the worker keeps it), would hand it the
    host's (RLIMIT_NPROC follows the machine's memory). Everything kept is what a run reads itself."""
    limits = sorted(n for n in dir(resource) if n.startswith("RLIMIT_") and getattr(resource, n) not in per_run) \
        if resource is not None else []
    state = {"fs_top": fs_top, "fork_probe": fork_probe, "last_pid": 1, "own_fs": own_fs,
             "rlimits": tuple(getattr(resource, n) for n in limits)}
    # What the filter refuses to the worker now it refuses to every run for the worker's life (a seccomp filter
    # cannot be removed): such a call is not made again after each run, where each refusal raised an exception.
    refused = {name for name, call, args in _PROBES if _or_refused(call, *args) == "refused"}
    state["xattrs"] = _or_refused(os.listxattr, fs_top) != "refused"  # a directory: no link to follow
    state["probes"] = tuple((call, args) for name, call, args in _PROBES if name not in refused)
    state["names"] = ("filesystem", "filesystem counters", *limits,
                      *(name for name, _, _ in _PROBES if name not in refused))
    observable(state)  # once to settle: reading a directory may set its access time, once (relatime)
    # Kept as read: the worker holds this state where no run's child frees it (worker._HELD), so the hundreds of
    # numbers, tuples and stat results are not freed on pages the child shares with it (about 45 copies a run)
    state["observable"] = observable(state)
    return state


def _tree(top, xattrs=True):
    """Every entry under ``top`` (itself included), depth first: its full ``lstat`` (inode, mode, owner, size, link
    count, the three timestamps to the nanosecond) and its extended attributes with their values (unless the filter
    refuses them to every process of the worker: ``xattrs`` False)."""
    # As few Python calls and objects as the reading allows: it runs in the worker after every run, and each page it
    # writes (objects made, functions called) was shared with the run just forked, so is copied again each time.
    out, stack = [], [top]
    while stack:
        path = stack.pop()
        st = _lstat(path)
        out.append((path, st, st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns, _xattrs(path) if xattrs else ()))
        if st.st_mode & 0o170000 == 0o040000:  # a directory (lstat: never a link's target)
            base = path if path.endswith("/") else path + "/"
            for name in sorted(_listdir(path)):
                stack.append(base + name)
    return out


def _xattrs(path):
    """``path``'s extended attributes with their values, sorted by name."""
    try:
        return tuple((name, os.getxattr(path, name, follow_symlinks=False))
                     for name in sorted(os.listxattr(path, follow_symlinks=False)))
    except OSError:
        return (("<unreadable>", b""),)


def observable(state):
    """Everything of the worker that a run forked from it can observe and that any run can reach to change, so that a
    run which changed any of it cannot hand the change to the next run: the whole filesystem the runs see (every
    entry, its metadata, timestamps and extended attributes; the filesystem's block and inode counters), every
    resource limit (each named when it changed), the priority, scheduler and CPU set (which another process of the
    same uid could set on the worker, were the calls not refused) and the host and domain name. Categories are read
    whole (every entry, every RLIMIT_*), not as a list of fields known to have leaked. What the filter refuses to the
    worker is left out: it refuses it to every run alike, so no run can read it, nor hand anything to the next run
    through it.

    Not re-read after each run: the worker's process-private state (environment, working directory, umask, signal
    mask and handlers, descriptors, credentials, process group). A run gets a copy of it at fork, and nothing a run
    can call reaches the original: no ptrace, process_vm_writev or pidfd_getfd (the filter), no /proc (the chroot),
    and the worker's descriptors are closed in the run (its shared open files were the one way in).

    Read as the calls return it and compared as values, in as few Python calls and objects as the reading allows:
    it runs in the worker after every run, and each page it writes (objects made, functions called) was shared with
    the run just forked, so is copied again each time (a text form of it cost 30 page copies a run more)."""
    top = state["fs_top"]
    seen = [_tree(top, state["xattrs"]), _statvfs(top) if state["own_fs"] else None]
    for which in state["rlimits"]:  # one list, no map or comprehension objects made
        seen.append(_getrlimit(which))
    for call, args in state["probes"]:
        seen.append(call(*args))
    return seen


def _or_refused(call, *args):
    """``call(*args)``, or ``"refused"`` where the filter refuses it to the worker and every run alike (lockdown.py:
    what no run can read, no run can hand to the next through it either)."""
    try:
        return call(*args)
    except PermissionError:
        return "refused"


def check(state, describe):
    """None when the worker may serve another run, else why it must be replaced (``describe``: the worker's own
    exception formatter)."""
    try:
        now = observable(state)
    except OSError as exc:
        return "health check failed: " + describe(exc)
    if now != state["observable"]:
        what = [name for name, a, b in zip(state["names"], now, state["observable"]) if a != b]
        return "the run changed what the next run would see: " + ", ".join(what)
    if state["fork_probe"]:
        # A run allowed to fork advances the pid counter the next run reads (its own pid): the next fork must get
        # the pid right after the run's, or the worker retires.
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        if pid != state["last_pid"] + 1:
            return f"the run made {pid - state['last_pid'] - 1} processes (pid counter moved)"
        state["last_pid"] = pid
    return None


_PROBES = (("priority", os.getpriority, (os.PRIO_PROCESS, 0)), ("scheduler", os.sched_getscheduler, (0,)),
           ("scheduler priority", os.sched_getparam, (0,)), ("CPU set", os.sched_getaffinity, (0,)),
           ("host name", os.uname, ()))
_lstat, _listdir, _statvfs = os.lstat, os.listdir, os.statvfs
_getrlimit = resource.getrlimit if resource is not None else None
