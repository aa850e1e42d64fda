"""Every channel we know of by which one run could leave a value for a later run, tried through the trainer's
executor (run_many: one batch, one worker, so the later run is forked from the worker the earlier one ran on), and
the teacher and student programs that would profit from one, through validation and the checks. Run by
tests/test_channels.py in the test process (the root path) and, as a script, by an unprivileged user (the
user-namespace path). Standard library + lorapop only.

    python -S tests/channel_probe.py      (prints one JSON object)

For each channel a raw run writes a value (or is refused), between two runs of LOOK, which reports everything a run
can observe of its process and its filesystem: the two reports must be equal. Not in LOOK: the run's own pid, which
counts the runs its worker served (a position, not a value any run can set: runs cannot fork by default; with
``max_procs`` above 1 the worker retires after a run that made processes, tried below as ``pid_counter``).
"""

from __future__ import annotations

import json
import os
import sys

# What a run observes: every entry of its filesystem with its full metadata and extended attributes, the filesystem's
# counters, every per-process attribute a fork inherits, the interpreter state, and what the kernel hands out from a
# counter shared beyond the run (a new pipe's and pidfd's inode numbers).
LOOK = r'''
import os, sys, signal, resource, socket
def tree(p):
    st = os.lstat(p)
    try:
        xs = sorted((n, os.getxattr(p, n, follow_symlinks=False)) for n in os.listxattr(p, follow_symlinks=False))
    except OSError as e:
        xs = 'error %d' % e.errno
    out = [(p, st.st_mode, st.st_uid, st.st_gid, st.st_ino, st.st_nlink, st.st_size, st.st_atime_ns,
            st.st_mtime_ns, st.st_ctime_ns, xs)]
    if os.path.isdir(p) and not os.path.islink(p):
        for n in sorted(os.listdir(p)):
            out += tree(os.path.join(p, n))
    return out
def attempt(fn):
    try:
        return fn()
    except OSError as e:
        return 'error %d' % e.errno
def new_pipe():
    r, w = os.pipe()
    ino = os.fstat(r).st_ino
    os.close(r)
    os.close(w)
    return ino
def abstract():
    s = socket.socket(socket.AF_UNIX)
    s.bind('\0lorapop-note')
    return 'bound'
m = os.umask(0o22)
os.umask(m)
fds = []
for fd in range(64):
    try:
        os.fstat(fd)
        fds.append(fd)
    except OSError:
        pass
_result = {
    'tree': tree('/'), 'statvfs': tuple(os.statvfs('/')), 'umask': m, 'cwd': os.getcwd(),
    'env': sorted(os.environ.items()),
    'rlimits': [(n, resource.getrlimit(getattr(resource, n))) for n in sorted(dir(resource)) if n.startswith('RLIMIT_')],
    'priority': [attempt(lambda: os.getpriority(w, 0)) for w in (os.PRIO_PROCESS, os.PRIO_PGRP, os.PRIO_USER)],
    'sched': (attempt(lambda: os.sched_getscheduler(0)), attempt(lambda: os.sched_getparam(0).sched_priority),
              attempt(lambda: sorted(os.sched_getaffinity(0)))),
    'sigmask': sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    'handlers': [(int(s), str(signal.getsignal(s))) for s in sorted(signal.valid_signals())],
    'itimers': [signal.getitimer(w) for w in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)],
    'alarm': signal.alarm(0),
    'uname': attempt(lambda: tuple(os.uname())),  # refused by the filter (a fact of the machine)
    'ids': (attempt(os.getresuid), attempt(os.getresgid), attempt(os.getgroups)),  # refused: how the trainer runs
    'pid_names': sorted(n for n in ('getpid', 'getppid', 'getpgrp', 'getpgid', 'getsid') if hasattr(os, n)),
    'result_fd': (attempt(lambda: os.fstat(3).st_ino), attempt(lambda: os.dup(3))),
    'fds': [(fd, os.get_blocking(fd)) for fd in fds],
    'modules': sorted(sys.modules), 'builtins': sorted(dir(sys.modules['builtins'])),
    'collections': sorted(vars(sys.modules['collections'])), 'recursion': sys.getrecursionlimit(),
    'switch': sys.getswitchinterval(), 'flags': tuple(sys.flags),
    'pipe_inode': attempt(new_pipe), 'pidfd_inode': attempt(lambda: os.fstat(os.pidfd_open(1)).st_ino),
    'abstract_socket': attempt(abstract), 'dev_shm': os.path.exists('/dev/shm'),
    'memfd': attempt(lambda: os.memfd_create('note')),
}
'''

# name -> a run that tries to leave a value for the next one. Each ends with _result = 'done' unless the channel was
# refused (an OSError: 'refused <errno>').
WRITERS = {
    "file_in_cwd": "open('note', 'w').write('1')",
    "file_in_root": "open('/note', 'w').write('1')",
    "directory": "os.mkdir('/w/d')",
    "symlink": "os.symlink('/w', '/w/l')",
    "hard_link": "os.link('/w', '/w/l')",
    "rename": "os.rename('/w', '/v')",
    "xattr_on_w": "os.setxattr('/w', 'user.note', b'1')",
    "xattr_on_root": "os.setxattr('/', 'user.note', b'1')",
    "xattr_through_fd": "os.setxattr(os.open('/w', os.O_RDONLY), 'user.note', b'1')",
    "xattr_pinning_memory": "for i in range(4400):\n    os.setxattr('/w', 'user.n%d' % i, b'x' * 65536)",
    "xattr_security": "os.setxattr('/w', 'security.note', b'1')",
    "xattr_trusted": "os.setxattr('/w', 'trusted.note', b'1')",
    "xattr_remove": "os.removexattr('/w', 'security.selinux')",
    "timestamps_w": "os.utime('/w', (1, 1))",
    "timestamps_root": "os.utime('/', ns=(5, 5))",
    "timestamps_touch": "os.utime('/w')",
    "atime_by_reading": "os.listdir('/w')\nos.listdir('/')",
    "mode": "os.chmod('/w', 0o700)",
    "owner": "os.chown('/w', 1, 1)",
    "tmpfs_inode_counter": ("for i in range(100):\n    os.close(os.open('/w/f%d' % i, os.O_CREAT | os.O_WRONLY))\n"
                            "    os.unlink('/w/f%d' % i)"),
    "pipe_inode_counter": "for i in range(3000):\n    r, w = os.pipe()\n    os.close(r)\n    os.close(w)",
    "pidfd_inode": "os.pidfd_open(1)",
    "memfd": "os.write(os.memfd_create('note'), b'1')",
    "dev_shm": "open('/dev/shm/note', 'w').write('1')",
    "abstract_socket": "import socket\ns = socket.socket(socket.AF_UNIX)\ns.bind('\\0lorapop-note')",
    "socketpair": "import socket\nsocket.socketpair()",
    "rlimit": "resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))",
    "rlimit_stack": "resource.setrlimit(resource.RLIMIT_STACK, (1 << 20, resource.getrlimit(resource.RLIMIT_STACK)[1]))",
    "cwd": "os.chdir('/')",
    "umask": "os.umask(0o777)",
    "environment": "os.environ['NOTE'] = '1'",
    "putenv": "os.putenv('NOTE', '1')",
    "signal_handler": "signal.signal(signal.SIGUSR1, signal.SIG_IGN)",
    "signal_mask": "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})",
    "interval_timer": "signal.signal(signal.SIGALRM, signal.SIG_IGN)\nsignal.setitimer(signal.ITIMER_REAL, 30)",
    "alarm": "signal.signal(signal.SIGALRM, signal.SIG_IGN)\nsignal.alarm(30)",
    "priority": "os.setpriority(os.PRIO_PROCESS, 0, 5)",
    "nice": "os.nice(5)",
    "cpu_set": "os.sched_setaffinity(0, {0})",
    "scheduler": "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))",
    "session": "os.setsid()",
    "process_group": "os.setpgid(0, 0)",
    "host_name": "import socket\nsocket.sethostname('note')",
    "module_attribute": "sys.modules['collections'].NOTE = 1",  # a module lean and full workers both hold
    "builtins": "sys.modules['builtins'].NOTE = 1",
    "recursion_limit": "sys.setrecursionlimit(50000)",
    "switch_interval": "sys.setswitchinterval(0.5)",
    "stdin_flags": "os.set_blocking(0, False)",
    "worker_descriptors": "os.set_blocking(1, False)\nos.set_blocking(2, False)",
}
# With ctypes preloaded (not the default; where a program reaches them through the extension cache, the filter still
# refuses): System V and POSIX IPC, keyrings. Each reader reports what a later run finds under the same key.
IPC_LOOK = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "def got(rc):\n    return (rc, ctypes.get_errno() if rc == -1 else 0)\n"
            "_result = [got(libc.shmget(0x10C0FFEE, 0, 0)), got(libc.msgget(0x10C0FFEF, 0)),"
            " got(libc.semget(0x10C0FFF0, 0, 0)), got(libc.mq_open(b'/lorapop-note', 0)),"
            " got(libc.syscall(250, 0, -3, 0, 0, 0))]")  # keyctl(KEYCTL_GET_KEYRING_ID, session) on x86_64
IPC_WRITERS = {
    "sysv_shm": "libc.shmget(0x10C0FFEE, 4096, 0o1000 | 0o600)",
    "sysv_msg": "libc.msgget(0x10C0FFEF, 0o1000 | 0o600)",
    "sysv_sem": "libc.semget(0x10C0FFF0, 1, 0o1000 | 0o600)",
    "posix_mq": "libc.mq_open(b'/lorapop-note', 0o100 | 2, 0o600, None)",
    "keyring": "libc.syscall(248, b'user', b'note', b'1', 1, -3)",  # add_key to the session keyring (x86_64)
}
IPC_PRE = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
# With forks allowed (max_procs 4): a run that makes processes moves the pid counter the next run reads (a run has no
# getpid, but fork tells it its child's pid).
PID_LOOK = "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\n_result = pid"
PID_WRITER = ("import os\nfor i in range(20):\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n"
              "    os.waitpid(pid, 0)\n_result = 'done'")


# _ctypes, which the worker loaded to install the filter and then forgot, comes back from CPython's extension cache
# through _imp.create_dynamic without opening a file; a task program (no class statement, no banned name, no dunder)
# builds a C function from it and makes calls the filter refuses. The static check passes it; the filter is the
# layer that stops it (docs/METHOD.md, "Layers").
NATIVE = (
    "import fractions\ndef f(path):\n    sys = fractions.sys\n    imp = sys.modules['_imp']\n"
    "    spec = sys.modules['_frozen_importlib'].ModuleSpec('_ctypes', None, origin=path)\n"
    "    m = imp.create_dynamic(spec)\n"
    "    long = type('L', (m._SimpleCData,), {'_type_': 'l'})\n"
    "    fn = type('F', (m.CFuncPtr,), {'_flags_': m.FUNCFLAG_CDECL | m.FUNCFLAG_USE_ERRNO, '_restype_': long})\n"
    "    call = fn(m.dlsym(m.dlopen(None, 2), 'syscall'))\n"
    "    out = []\n"
    "    for nr, args in NRS:\n"
    "        m.set_errno(0)\n"
    "        rc = call(*[long(a) for a in [nr] + args])\n"
    "        out.append((rc, m.get_errno()))\n"
    "    return out")
# sched_yield (allowed: the native call works), prctl(PR_GET_DUMPABLE) (0: a crashing run starts no
# core helper on the host), then unshare(CLONE_NEWUSER), shmget(IPC_CREAT), setxattr(NULL...),
# pipe2(NULL, 0), refused; then the calls that draw on a budget of the machine or of the host user: io_setup(1, NULL)
# and the rest of the aio calls, io_uring, inotify and fanotify instances and watches, file handles, kcmp, sync,
# and a MAP_HUGETLB mapping (x86_64 numbers; without the filter the first two aio calls and inotify_init would take
# from fs.aio-max-nr and max_user_instances)
NATIVE_CALLS = [(24, []), (157, [3, 0, 0, 0, 0]), (272, [0x10000000]), (29, [0x10C0FFEE, 4096, 0o1000 | 0o600]), (188, [0, 0, 0, 0, 0]),
                (293, [0, 0]), (206, [1, 0]), (207, [0]), (208, [0, 0, 1, 0, 0]), (209, [0, 0, 0]), (210, [0, 0, 0]),
                (333, [0, 0, 1, 0, 0, 0]), (425, [1, 0]), (426, [-1, 0, 0, 0, 0, 0]), (427, [-1, 0, 0, 0]),
                (253, []), (294, [0]), (254, [-1, 0, 0]), (255, [-1, 0]), (300, [0, 0]), (301, [-1, 0, 0, 0, 0]),
                (303, [-1, 0, 0, 0, 0]), (312, [1, 1, 0, 0, 0]), (162, []), (306, [-1]),
                (9, [0, 1 << 21, 3, 0x22 | 0x40000, -1, 0])]


def wrap(body: str, pre: str = "import os, sys, signal, resource\n") -> str:
    indented = "\n".join("    " + line for line in body.splitlines())
    return (pre + "try:\n" + indented + "\n    _result = 'done'\nexcept OSError as e:\n"
            "    _result = 'refused %d' % e.errno\n")


# ---- through the trainer's path: teachers that would profit from a channel ---------------------------------------

# code_i programs honest on a fresh worker (f(5) == 10) that leave a note through one channel and answer wrong when
# they find one, so that the control (run first, or anywhere) and the students' runs would differ. Task programs may
# hold only imports and def f; each reaches os, time and signal through fractions.sys.
_PRE = ("import fractions\ndef f(x):\n    sys = fractions.sys\n    os = sys.modules['os']\n"
        "    time = sys.modules['time']\n    signal = sys.modules['signal']\n    found = False\n")
# (detect, leave): detect sets `found`
NOTES = {
    "file": ("found = os.path.exists('/w/note')", "os.close(os.open('/w/note', os.O_CREAT | os.O_WRONLY))"),
    "xattr": ("found = bool(os.listxattr('/w'))", "os.setxattr('/w', 'user.note', b'1')"),
    "timestamp": ("found = os.stat('/w').st_mtime_ns == 7", "os.utime('/w', ns=(7, 7))"),
    "mode": ("found = os.stat('/w').st_mode & 0o777 == 0o700", "os.chmod('/w', 0o700)"),
    "environment": ("found = 'NOTE' in os.environ", "os.environ['NOTE'] = '1'"),
    "umask": ("m = os.umask(0o22)\nfound = m == 0o077", "os.umask(0o077)"),
    "module": ("found = hasattr(sys.modules['fractions'], 'NOTE')", "sys.modules['fractions'].NOTE = 1"),
    "signal": ("found = signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN",
               "signal.signal(signal.SIGUSR1, signal.SIG_IGN)"),
    "pipe_inode": ("r, w = os.pipe()\nfound = os.fstat(r).st_ino % 1024 in range(700, 720)",
                   "while True:\n    r, w = os.pipe()\n    ino = os.fstat(r).st_ino\n    os.close(r)\n"
                   "    os.close(w)\n    if ino % 1024 == 699:\n        break"),
    # the timing channel: end at a chosen moment (just after a 20 ms boundary); the next run, started moments
    # later, finds itself just after one
    "end_time": ("found = 200_000 < time.time_ns() % 20_000_000 < 4_000_000",
                 "while time.time_ns() % 20_000_000 > 200_000:\n    pass"),
    # the position: the pid counts the runs the worker served, and the result pipe's inode number the pipes the
    # machine made; neither can be read (no getpid, the filter refuses fstat on the pipe)
    "pid": ("found = os.getpid() % 2 == 1", "pass"),
    "result_pipe_inode": ("found = os.fstat(3).st_ino % 4 == 0", "pass"),
}


def note_program(detect: str, leave: str) -> str:
    ind = lambda code, n: "\n".join(" " * n + line for line in code.splitlines())  # noqa: E731
    return (_PRE + "    try:\n" + ind(detect, 8) + "\n    except Exception:\n        pass\n"
            "    try:\n" + ind(leave, 8) + "\n    except Exception:\n        pass\n"
            "    return 2 * x + (1 if found else 0)")


# code_i programs honest on their own input (f(5) == 10) that, on any other input, add a bit read from a channel no
# sandbox closes (a fast clock), so that a student giving another right input (15, 25, ...) would fail by chance if
# each input ran once. Each input runs CONTROL_ROUNDS times: runs that disagree void the task.
KEYED = {"clock": "time.time_ns() // 1_000_000 % 2"}
KEYED_ANSWERS = ["5"] + [str(10 * k + 5) for k in range(1, 9)] + ["3"]  # the own input, 8 right ones, a wrong one


def keyed_program(bit: str) -> str:
    return _PRE + f"    if x == 5:\n        return 10\n    return x % 10 * 2 + {bit}"


# code_f: the reference leaves its output through a channel; a student that computes nothing reads it back.
LEAKS = {
    "file": ("os.write(os.open('/w/out', os.O_CREAT | os.O_WRONLY), repr(a + b).encode())",
             "return int(os.read(os.open('/w/out', os.O_RDONLY), 64))"),
    "xattr": ("os.setxattr('/w', 'user.out', repr(a + b).encode())", "return int(os.getxattr('/w', 'user.out'))"),
    "timestamp": ("os.utime('/w', ns=(a + b, a + b))", "return os.stat('/w').st_mtime_ns"),
    "environment": ("os.environ['OUT'] = repr(a + b)", "return int(os.environ['OUT'])"),
}


def leak_reference(leave: str) -> str:
    return ("import fractions\ndef f(a, b):\n    sys = fractions.sys\n    os = sys.modules['os']\n    try:\n"
            f"        {leave}\n    except Exception:\n        pass\n    return a + b")


def leak_student(read: str) -> str:
    return ("import fractions\ndef f(a, b):\n    sys = fractions.sys\n    os = sys.modules['os']\n    try:\n"
            f"        {read}\n    except Exception:\n        return 0")


def _fence(tag: str, body: str) -> str:
    return f"```{tag}\n{body}\n```"


def probe() -> dict:
    from lorapop.executor import ExecutorConfig, SandboxExecutor
    from lorapop.executor.lockdown import machine
    from lorapop.executor.base import DEFAULT_PRELOAD
    from lorapop.tasks import TASK_TYPES, Task
    from lorapop.tasks.code_f import CodeF
    from lorapop.tasks.validity import check_program

    import unprivileged

    out: dict = {"uid": os.getuid()}
    ex = unprivileged.probe_executor(out, ExecutorConfig(n_workers=1, timeout_s=5.0, max_repr_chars=1 << 20))
    if ex is None:
        return out
    with ex:
        out["channels"] = {}
        for name, body in WRITERS.items():
            before, wrote, after = ex.run_many([LOOK, wrap(body), LOOK])
            out["channels"][name] = {"write": [wrote.status, wrote.value, wrote.error],
                                     "before": [before.status, before.value, before.error],
                                     "after": [after.status, after.value, after.error]}
        # the teachers: validated, then checked three times with students giving the task's own input in three
        # spellings (each run is the control's own text), the same value as a float, and a wrong input
        code_i = TASK_TYPES["code_i"]
        out["teachers"] = {}
        answers = ["5", " 5", "(5)", "5.0", "3"]
        for name, (detect, leave) in NOTES.items():
            prop = code_i.parse_proposal(_fence("python", note_program(detect, leave)) + "\n" + _fence("input", "5"))
            task = code_i.validate_many([prop], ex)[0]
            got = {"valid": isinstance(task, Task), "output": getattr(task, "outputs", None),
                   "reason": getattr(task, "reason", None)}
            if isinstance(task, Task):
                got["checks"] = [[o.status for o in code_i.check_many(
                    task, [code_i.parse_answer(_fence("input", a)) for a in answers], ex)] for _ in range(3)]
            out["teachers"][name] = got
        # teachers keyed on a channel on every input but their own: checked five times each
        out["keyed"] = {}
        for name, bit in KEYED.items():
            prop = code_i.parse_proposal(_fence("python", keyed_program(bit)) + "\n" + _fence("input", "5"))
            task = code_i.validate_many([prop], ex)[0]
            got = {"valid": isinstance(task, Task), "reason": getattr(task, "reason", None)}
            if isinstance(task, Task):
                got["checks"] = [[o.status for o in code_i.check_many(
                    task, [code_i.parse_answer(_fence("input", a)) for a in KEYED_ANSWERS], ex)] for _ in range(5)]
            out["keyed"][name] = got
        # code_f: students that read what the reference left
        code_f = CodeF(n_inputs=4, n_shown=1)
        out["students"] = {}
        reply = "\n".join(_fence("input", i) for i in ("1, 2", "3, 4", "5, 6", "7, 8")) + "\n" + _fence("message", "+")
        for name, (leave, read) in LEAKS.items():
            task = code_f.validate_many([code_f.parse_proposal(reply, program=leak_reference(leave))], ex)[0]
            got = {"valid": isinstance(task, Task)}
            if isinstance(task, Task):
                got["checks"] = [o.status for o in code_f.check_many(
                    task, [code_f.parse_answer(_fence("python", leak_student(read)))] * 4, ex)]
            out["students"][name] = got
        if machine() == "x86_64":
            import _ctypes

            prog = NATIVE.replace("NRS", repr(NATIVE_CALLS))
            code_o = TASK_TYPES["code_o"]
            task = code_o.validate_many([code_o.parse_proposal(
                _fence("python", prog) + "\n" + _fence("input", repr(_ctypes.__file__)))], ex)[0]
            out["native"] = {"static_ok": check_program(prog) is None, "valid": isinstance(task, Task),
                             "output": getattr(task, "outputs", None), "reason": getattr(task, "reason", None),
                             "detail": getattr(task, "detail", None)}
    # IPC and keyrings, with ctypes preloaded
    out["ipc"] = {}
    if machine() == "x86_64":
        with SandboxExecutor(ExecutorConfig(n_workers=1, timeout_s=5.0, preload=(*DEFAULT_PRELOAD, "ctypes"))) as ex:
            for name, body in IPC_WRITERS.items():
                before, wrote, after = ex.run_many([IPC_LOOK, IPC_PRE + "_result = " + body, IPC_LOOK])
                out["ipc"][name] = {"write": [wrote.status, wrote.value], "before": [before.status, before.value],
                                    "after": [after.status, after.value]}
    # the pid counter, with forks allowed
    with SandboxExecutor(ExecutorConfig(n_workers=1, timeout_s=5.0, max_procs=4)) as ex:
        before, wrote, after = ex.run_many([PID_LOOK, PID_WRITER, PID_LOOK])
        quiet = ex.run_many([PID_LOOK, "_result = 1", PID_LOOK])
        out["pid_counter"] = {"before": before.value, "write": [wrote.status, wrote.value], "after": after.value,
                              "quiet": [quiet[0].value, quiet[2].value]}
    return out


if __name__ == "__main__":
    import unprivileged  # tests/unprivileged.py, beside this script

    unprivileged.print_probe(probe)
