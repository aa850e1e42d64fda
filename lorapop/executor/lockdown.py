"""Kernel-side lockdown of a sandbox worker: a seccomp filter and, inside a user namespace, dropping every capability.

Standard library only (ctypes over the libc already loaded in the process: no libseccomp, no file access), because
the worker imports it as a top-level module after its chroot, uses it once and then forgets it (see worker.py).

The filter is written as classic BPF here rather than through libseccomp/pyseccomp: it is a dozen lines, needs no
dependency, and its two syscall tables (x86_64, aarch64; the only architectures it is built for, anything else gets
:class:`Unsupported`) are below for review. It is a deny list, not an allow list: the interpreter and the standard
library need a long and version-dependent list of calls (futex, rseq, getrandom, statx, clone for threads...), and a
missing entry in an allow list breaks ordinary programs on some kernel or libc; the calls refused here are the ones a
code-reasoning task never needs and that widen the kernel surface or cross the sandbox's walls.

Refused calls return EPERM, so they fail inside the program as an OSError (an error run), never by killing anything;
``clone3`` returns ENOSYS instead (its flags live in memory a filter cannot read; libc then falls back to ``clone``,
whose flags it can). Calls made through another ABI (i386 ``int 0x80`` on x86_64, x32) are all refused. A deny list
covers the calls someone reviewed: every call numbered above the last one reviewed here (``REVIEWED_UP_TO``) answers
ENOSYS, as on a kernel that lacks it, so a call a newer kernel adds is refused until it is reviewed, and no run can
tell a newer kernel from an older one by it.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct
import sys

# <linux/audit.h>
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

# Refused with EPERM. Numbers from the kernel's arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/
# unistd.h (aarch64); calls numbered 424 and up are the same on every architecture.
_COMMON = {
    "pidfd_getfd": 438, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
    "fspick": 433, "mount_setattr": 442, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "landlock_create_ruleset": 444, "lsm_get_self_attr": 459, "lsm_list_modules": 461,
    "statmount": 457, "listmount": 458, "open_tree_attr": 467, "set_mempolicy_home_node": 450, "openat2": 437,
    "memfd_secret": 447, "pidfd_open": 434, "setxattrat": 463, "removexattrat": 466,
    "pidfd_send_signal": 424, "process_madvise": 440,
    # reads of extended attributes (an SELinux or Smack host labels the runs' tmpfs with the trainer's context;
    # nothing else of the runs' filesystem has any), the one LSM call left (which security modules the host runs, by
    # which of them answers), and quotactl_fd (below)
    "getxattrat": 464, "listxattrat": 465, "lsm_set_self_attr": 460, "quotactl_fd": 443,
}
# Memory a run could pin outside its address-space limit and keep past its end (SysV shared memory, message
# queues and semaphores, POSIX message queues, memfd), and the calls that would let a run change its worker's
# scheduling, priority, CPU set or host name for every later run. x86_64 numbers first, then aarch64.
_STATE = {
    "shmget": (29, 194), "shmat": (30, 196), "shmctl": (31, 195), "shmdt": (67, 197), "msgget": (68, 186),
    "msgsnd": (69, 189), "msgrcv": (70, 188), "msgctl": (71, 187), "semget": (64, 190), "semop": (65, 193),
    "semctl": (66, 191), "semtimedop": (220, 192), "mq_open": (240, 180), "mq_unlink": (241, 181),
    "mq_timedsend": (242, 182), "mq_timedreceive": (243, 183), "mq_notify": (244, 184), "mq_getsetattr": (245, 185),
    "memfd_create": (319, 279), "setpriority": (141, 140), "sched_setparam": (142, 118),
    "sched_setscheduler": (144, 119), "sched_setaffinity": (203, 122), "sched_setattr": (314, 274),
    "ioprio_set": (251, 30), "sethostname": (170, 161), "setdomainname": (171, 162),
    # Extended attributes pin kernel memory outside every limit and would carry a value to the next run (the
    # filesystem is read-only as well); a new pipe takes its inode number from a counter the whole machine shares,
    # which a run could move for the next run to read (pidfd_open: the same through the pid's inode).
    "setxattr": (188, 5), "lsetxattr": (189, 6), "fsetxattr": (190, 7), "removexattr": (197, 14),
    "lremovexattr": (198, 15), "fremovexattr": (199, 16), "pipe2": (293, 59),
    "getxattr": (191, 8), "lgetxattr": (192, 9), "fgetxattr": (193, 10), "listxattr": (194, 11),
    "llistxattr": (195, 12), "flistxattr": (196, 13),
    # Budgets the kernel keeps for the whole machine or for the host user, not for the run: asynchronous I/O
    # contexts count against fs.aio-max-nr (every process on the machine; a run that takes them all makes every
    # other io_setup fail with EAGAIN), inotify instances and watches against the user's max_user_instances and
    # max_user_watches (charged up the user-namespace chain to the user who runs the trainer), fanotify groups and
    # marks likewise. Handles and kernel-object comparisons (name_to_handle_at, kcmp) name things outside the run;
    # sync and syncfs flush every dirty page of the machine's filesystems. A code-reasoning task needs none of them.
    "io_setup": (206, 0), "io_destroy": (207, 1), "io_getevents": (208, 4), "io_submit": (209, 2),
    "io_cancel": (210, 3), "io_pgetevents": (333, 292), "inotify_init1": (294, 26),
    "inotify_add_watch": (254, 27), "inotify_rm_watch": (255, 28), "fanotify_init": (300, 262),
    "fanotify_mark": (301, 263), "name_to_handle_at": (303, 264), "kcmp": (312, 272), "sync": (162, 81),
    "syncfs": (306, 267),
    # quotactl(Q_SYNC, NULL) needs no privilege and syncs every filesystem of the machine that has quotas on
    "quotactl": (179, 60),
    # Facts of the machine the namespaces do not cover, the same in every run of a trainer (so a task keyed on them
    # validates and reproduces, and no student can know them) and a leak of the host: the kernel's release and
    # version (uname: only the node name is the UTS namespace's, and glibc's gethostname is uname too), the host's
    # total and free memory and uptime (sysinfo, which glibc's sysconf(_SC_PHYS_PAGES) uses), its CPU set (the
    # count os.cpu_count falls back to once /sys and /proc are gone) and the ticks since boot (times). Hidden by
    # refusing them (ambient.py, docs/METHOD.md "Facts of the machine").
    "uname": (63, 160), "sysinfo": (99, 179), "sched_getaffinity": (204, 123), "times": (100, 153),
    # Process ids. In the worker's pid namespace a run's pid counts the runs its worker forked, and its parity or
    # any other bit of it is a key a teacher could use to answer differently in some runs than in others; outside
    # one it counts the machine's processes. Every call that returns an id of a process, thread or group, or that
    # tells whether a given pid exists (queuing a signal to it, reading its capabilities, I/O priority, robust
    # futex list or pages), is refused, so the value is never known to a run (ambient.py removes the Python names
    # too). setpgid, kill and fcntl, which take a pid, are limited below (setpgid(0, 0); SIGKILL; no F_SETOWN).
    "getpid": (39, 172), "getppid": (110, 173), "gettid": (186, 178), "getpgid": (121, 155), "getsid": (124, 156),
    "tkill": (200, 130), "tgkill": (234, 131), "rt_sigqueueinfo": (129, 138), "rt_tgsigqueueinfo": (297, 240),
    "capget": (125, 90), "ioprio_get": (252, 31), "get_robust_list": (274, 100), "migrate_pages": (256, 238),
    "move_pages": (279, 239),
    # The same id through calls that return or test it: set_tid_address returns the caller's thread id (glibc
    # calls it once, at start, before the filter); timer_create with SIGEV_THREAD_ID succeeds only for the caller's
    # own tid (its sigevent lies in memory the filter cannot read, so the call goes whole: CPython's timers are
    # setitimer); the priority-inheritance futex operations are below.
    "set_tid_address": (218, 96), "timer_create": (222, 107),
    # The user and group ids: a run reads its uid, which is the run uid as root and 0 of the worker's user namespace
    # for an ordinary user, so any of them would tell how the trainer runs (a fact of the host, the same in all its
    # runs). Refused, every run reads the same (uid_t)-1; the setters the worker uses stay.
    "getuid": (102, 174), "geteuid": (107, 175), "getgid": (104, 176), "getegid": (108, 177),
    "getresuid": (118, 148), "getresgid": (120, 150), "getgroups": (115, 158),
    # More facts of the host that read-only calls report. eventfd, epoll, signalfd and timerfd descriptors all point
    # at the one anonymous inode the kernel made at boot: fstat gives its number, device and times (the boot, to the
    # nanosecond) and its owner (0 as root, the overflow uid in a user namespace). The kernel's clock discipline
    # (adjtimex, clock_adjtime's read: the machine's crystal drift on an NTP host). Which NUMA nodes, security
    # modules, landlock ABI and membarrier commands the kernel has. None of them serves a code-reasoning task.
    "eventfd2": (290, 19), "epoll_create1": (291, 20), "signalfd4": (289, 74), "timerfd_create": (283, 85),
    "adjtimex": (159, 171), "clock_adjtime": (305, 266), "get_mempolicy": (239, 236), "membarrier": (324, 283),
    # The same inode through a seccomp listener; the run's filesystem uid through setfsuid(-1)'s answer (how the
    # trainer runs); the host's mounts by id (statmount, listmount: EPERM or ENOENT) and NUMA nodes (which node
    # masks set_mempolicy or mbind accept).
    "seccomp": (317, 277), "setfsuid": (122, 151), "setfsgid": (123, 152), "set_mempolicy": (238, 237),
    "mbind": (237, 235),
    # The process's own priority and scheduling policy: a run would read the host's nice value and policy (the
    # trainer's `nice -n 7`, `chrt -b`), the same in all its runs and unknowable to a student. The worker reads them
    # as refused too (health.py), and no run can change them (setpriority and sched_set* above).
    "getpriority": (140, 141), "sched_getparam": (143, 121), "sched_getscheduler": (145, 120),
    "sched_rr_get_interval": (148, 127), "sched_getattr": (315, 275),
}
DENIED = {
    "x86_64": {
        "socket": 41, "socketpair": 53, "execve": 59, "pipe": 22, "ptrace": 101, "syslog": 103, "pivot_root": 155,
        "chroot": 161, "acct": 163, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169,
        "init_module": 175, "delete_module": 176, "kexec_load": 246, "add_key": 248, "request_key": 249,
        "keyctl": 250, "unshare": 272, "perf_event_open": 298, "open_by_handle_at": 304, "setns": 308,
        "process_vm_readv": 310, "process_vm_writev": 311, "finit_module": 313, "kexec_file_load": 320,
        "bpf": 321, "execveat": 322, "userfaultfd": 323, "inotify_init": 253, "getpgrp": 111, **_COMMON,
        # the old forms of the calls above, and two that only x86_64 has: ustat(dev) looks the device up among all
        # the machine's filesystems (the host's root disk's free space, /dev/shm's size: its RAM) and sysfs lists
        # the filesystem types the host's kernel has loaded
        "eventfd": 284, "epoll_create": 213, "signalfd": 282, "ustat": 136, "sysfs": 139,
        **{name: nrs[0] for name, nrs in _STATE.items()},
    },
    "aarch64": {
        "socket": 198, "socketpair": 199, "execve": 221, "ptrace": 117, "syslog": 116, "pivot_root": 41,
        "chroot": 51, "acct": 89, "mount": 40, "umount2": 39, "swapon": 224, "swapoff": 225, "reboot": 142,
        "init_module": 105, "delete_module": 106, "kexec_load": 104, "add_key": 217, "request_key": 218,
        "keyctl": 219, "unshare": 97, "perf_event_open": 241, "open_by_handle_at": 265, "setns": 268,
        "process_vm_readv": 270, "process_vm_writev": 271, "finit_module": 273, "kexec_file_load": 294,
        "bpf": 280, "execveat": 281, "userfaultfd": 282, **_COMMON,
        **{name: nrs[1] for name, nrs in _STATE.items()},
    },
}
# Calls allowed only with some arguments, as (x86_64, aarch64) numbers: the "refuse when" rules below.
# kill(pid, sig) with any signal but SIGKILL (the worker's own use): kill(pid, 0) tells whether a pid exists, so
# a run could find its own pid by trying them. In a pid namespace of the worker's own, SIGKILL too goes only to
# pids 0, 1 and -1 (the worker kills a timed-out run with kill(-1)): killing pid after pid, a run would die at its
# own, and whether it died is a report (its verdict), so "ok" or "crashed" would follow its pid.
KILL = (62, 129)
# prctl(PR_SET_DUMPABLE, 1): a run turning core dumps back on (the worker cleared the flag: where the machine's
# core_pattern is a pipe, the kernel would start that helper on the host for a crashing run whatever RLIMIT_CORE says).
# Setting it to 0 stays: a run that changes its uid clears it again (worker.py).
PRCTL, PR_GET_DUMPABLE_, PR_SET_DUMPABLE_ = (157, 167), 3, 4
# Clocks of other processes and threads: a negative clock id names one by pid (MAKE_PROCESS_CPUCLOCK), and reading it
# tells whether that pid exists. The clocks programs use (realtime, monotonic, their own CPU time) are positive.
CLOCK_ID_CALLS = {"clock_gettime": (228, 113), "clock_getres": (229, 114), "clock_nanosleep": (230, 115),
                  "clock_settime": (227, 112)}
# futex(uaddr, op, ...) with a priority-inheritance operation looks up the tid written in the futex word: EDEADLK
# when it is the caller's own, ESRCH when no such task exists, so a run could find its tid by trying them. Python
# never takes a PI lock. op & FUTEX_CMD_MASK: LOCK_PI, UNLOCK_PI, TRYLOCK_PI, WAIT_REQUEUE_PI, CMP_REQUEUE_PI, LOCK_PI2.
FUTEX, FUTEX_CMD_MASK, FUTEX_PI_OPS = (202, 98), 0x7F, (6, 7, 8, 11, 12, 13)
# setpgid(pid, pgid) other than setpgid(0, 0), which each run makes of itself (worker.py): for any other pid it says
# ESRCH where no such process exists and EPERM where one does, so a run could find its own pid by trying them.
SETPGID = (109, 154)
# fcntl(fd, F_SETOWN or F_SETOWN_EX, pid) looks the pid up (ESRCH where none exists): the same probe, on any open fd.
F_SETOWN, F_SETOWN_EX = 8, 15
# The run's result pipe is moved to this descriptor (worker.py) and nothing may read its inode or copy it: a pipe's
# inode number comes from a counter the whole machine shares, which advances by two with every run, so its low bits
# would be a value the same in every run of a check (a key for answering differently to students than to the
# control's validation) and its high bits a clock. fstat is newfstatat(fd, "", AT_EMPTY_PATH) in current glibc.
RESULT_FD = 3
# statx answers ENOSYS, as on a kernel before it (glibc then falls back; Python's os.stat is newfstatat): it fills in
# the mount id whatever its mask asks, and mount ids count the machine's mounts. O_NOATIME on open: allowed
# only to a file's owner, which the run is in a user namespace (uid 0 there) and is not as root (its own uid), so
# it tells how the trainer runs; openat2's flags lie in memory the filter cannot read, so it goes whole (above).
STATX = (332, 291)
OPEN_FLAGS, O_NOATIME = {"x86_64": ((2, 1), (257, 2)), "aarch64": ((56, 2),)}, 0o1000000
F_SETFL = 4  # fcntl(fd, F_SETFL, O_NOATIME) asks the same of an open file
RESULT_FD_CALLS = {"fstat": (5, 80), "newfstatat": (262, 79), "dup": (32, 23),
                   "dup2": (33, None), "dup3": (292, 24), "fcntl": (72, 25)}
CLONE = {"x86_64": 56, "aarch64": 220}
# The last call number reviewed for this filter, the same on every architecture (open_tree_attr, Linux 6.15): each
# call above it answers ENOSYS (file_getattr and file_setattr came next, and would set a file's attributes)
REVIEWED_UP_TO = 467
CLONE3 = 435
# preadv2/pwritev2 answer EOPNOTSUPP for the RWF_* flags the kernel does not know: which it knows is its version, in
# plain Python (os.preadv with flags). ENOSYS, as for clone3: glibc then does a flagless call as preadv and refuses
# any flag itself, the same on every kernel.
PREADV2 = {"x86_64": (327, 328), "aarch64": (286, 287)}
PRLIMIT64 = {"x86_64": 302, "aarch64": 261}
MMAP, MAP_HUGETLB = {"x86_64": 9, "aarch64": 222}, 0x40000
# clone() flags that make a new namespace (CLONE_NEWTIME only exists for clone3/unshare), and CLONE_PIDFD: a pidfd's
# inode number counts the machine's processes (pidfs), and its PIDFD_GET_INFO gives the trainer's cgroup and the
# run's uid (where max_procs lets a run fork; pidfd_open is refused above)
CLONE_REFUSED_MASK = (0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
                      | 0x00001000)

# classic BPF opcodes and seccomp return values
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K, _AND_K = 0x20, 0x15, 0x35, 0x45, 0x06, 0x54
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_X32_BIT = 0x40000000

PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_NO_NEW_PRIVS, PR_SET_DUMPABLE, PR_SET_TIMERSLACK = 22, 2, 38, 4, 29
PR_SET_THP_DISABLE = 41
PR_CAPBSET_READ, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 23, 24, 28, 47, 4
# NOROOT, NO_SETUID_FIXUP and NO_CAP_AMBIENT_RAISE, each with its lock, and KEEP_CAPS locked off: nothing the
# process does later (setuid, exec) can hand capabilities back
SECUREBITS_LOCKED = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80


class Unsupported(RuntimeError):
    """This machine cannot get the filter (architecture, byte order, or a kernel without seccomp)."""


def machine() -> str:
    m = platform.machine().lower()
    m = {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)
    if m not in DENIED:
        raise Unsupported(f"no seccomp filter for architecture {m!r} (built for {', '.join(DENIED)})")
    if sys.byteorder != "little":
        raise Unsupported(f"no seccomp filter for big-endian {m}")
    return m


def _ins(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(arch: str, own_pids: bool = False) -> bytes:
    """The BPF program (struct sock_filter[]) for ``arch``; ``own_pids``: see :func:`install_seccomp`."""
    eperm, enosys = _RET_ERRNO | errno.EPERM, _RET_ERRNO | errno.ENOSYS
    denied = sorted(set(DENIED[arch].values()))
    # seccomp_data: int nr @0, u32 arch @4, u64 ip @8, u64 args[6] @16 (low half first: little-endian only)
    prog = [
        _ins(_LD_W_ABS, 0, 0, 4),
        _ins(_JEQ_K, 1, 0, AUDIT_ARCH[arch]),
        _ins(_RET_K, 0, 0, eperm),  # another ABI: refuse everything
        _ins(_LD_W_ABS, 0, 0, 0),
    ]
    if arch == "x86_64":
        prog += [_ins(_JGE_K, 0, 1, _X32_BIT), _ins(_RET_K, 0, 0, eperm)]
    prog += [_ins(_JGE_K, 0, 1, REVIEWED_UP_TO + 1), _ins(_RET_K, 0, 0, enosys)]
    prog += _lookup(denied) + [_ins(_RET_K, 0, 0, eperm)]
    col = 0 if arch == "x86_64" else 1
    nosys = (CLONE3, *PREADV2[arch], STATX[col])
    prog += [_ins(_JEQ_K, len(nosys) - 1 - i, int(i == len(nosys) - 1), nr) for i, nr in enumerate(nosys)]
    prog += [
        _ins(_RET_K, 0, 0, enosys),
        # clone(flags, ...): flags is args[0]; all the CLONE_NEW* bits and CLONE_PIDFD are in its low 32 bits
        _ins(_JEQ_K, 0, 3, CLONE[arch]),
        _ins(_LD_W_ABS, 0, 0, 16),
        _ins(_JSET_K, 0, 1, CLONE_REFUSED_MASK),
        _ins(_RET_K, 0, 0, eperm),
        # mmap(..., flags, ...) with MAP_HUGETLB: huge pages come from a pool the whole machine shares
        # (vm.nr_hugepages), outside every limit of the run; flags is args[3]
        _ins(_LD_W_ABS, 0, 0, 0),
        _ins(_JEQ_K, 0, 3, MMAP[arch]),
        _ins(_LD_W_ABS, 0, 0, 40),
        _ins(_JSET_K, 0, 1, MAP_HUGETLB),
        _ins(_RET_K, 0, 0, eperm),
        # prlimit64(pid, ...) on anything but itself (pid 0): with one mapped uid a run could otherwise cut its own
        # worker's limits (setrlimit is prlimit64 with pid 0 in libc, so programs keep it)
        _ins(_LD_W_ABS, 0, 0, 0),
        _ins(_JEQ_K, 0, 5, PRLIMIT64[arch]),
        _ins(_LD_W_ABS, 0, 0, 16),
        _ins(_JEQ_K, 0, 2, 0),
        _ins(_LD_W_ABS, 0, 0, 20),
        _ins(_JEQ_K, 1, 0, 0),
        _ins(_RET_K, 0, 0, eperm),
    ]
    prog += _allow_only(KILL[col], 1, (9,))
    if own_pids:  # kill(pid, SIGKILL) only on 0 (its own group), 1 (dropped) and -1 (all but itself and PID 1)
        prog += _allow_only(KILL[col], 0, (0, 1, 0xFFFFFFFF))
    prog += _allow_only(SETPGID[col], 0, (0,)) + _allow_only(SETPGID[col], 1, (0,))
    for cmd in (F_SETOWN, F_SETOWN_EX):
        prog += _refuse_if(RESULT_FD_CALLS["fcntl"][col], 1, _JEQ_K, cmd)
    # prctl only to read or clear the dumpable flag (0 in every run): its other options read the host's (the timer
    # slack a trainer set, the speculation mitigations) or how the trainer runs (securebits, the bounding set)
    prog += _allow_only(PRCTL[col], 0, (PR_GET_DUMPABLE_, PR_SET_DUMPABLE_))
    prog += [  # prctl(PR_SET_DUMPABLE, anything but 0)
        _ins(_LD_W_ABS, 0, 0, 0),
        _ins(_JEQ_K, 0, 5, PRCTL[col]),
        _ins(_LD_W_ABS, 0, 0, 16),
        _ins(_JEQ_K, 0, 3, PR_SET_DUMPABLE_),
        _ins(_LD_W_ABS, 0, 0, 24),
        _ins(_JEQ_K, 1, 0, 0),
        _ins(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM),
    ]
    for nrs in CLOCK_ID_CALLS.values():
        prog += _refuse_if(nrs[col], 0, _JSET_K, 0x80000000)
    prog += _refuse_in(FUTEX[col], 1, FUTEX_CMD_MASK, FUTEX_PI_OPS)
    prog += _refuse_both(RESULT_FD_CALLS["fcntl"][col], (1, _JEQ_K, F_SETFL), (2, _JSET_K, O_NOATIME))
    for nr, arg in OPEN_FLAGS[arch]:
        prog += _refuse_if(nr, arg, _JSET_K, O_NOATIME)
    for nrs in RESULT_FD_CALLS.values():
        if nrs[col] is not None:
            prog += _refuse_if(nrs[col], 0, _JEQ_K, RESULT_FD)
    return b"".join(prog + [_ins(_RET_K, 0, 0, _RET_ALLOW)])


def _refuse_if(nr: int, arg: int, test: int, k: int) -> list[bytes]:
    """Call ``nr`` refused with EPERM when the low 32 bits of argument ``arg`` match ``k`` under ``test`` (equality, or
    any bit of ``k`` set); every other call goes on to the next rule. Each argument tested is a 32-bit int to the
    kernel (a pid, a signal, a clock id, a descriptor, a command), so the low half is all of it."""
    return [
        _ins(_LD_W_ABS, 0, 0, 0),
        _ins(_JEQ_K, 0, 3, nr),
        _ins(_LD_W_ABS, 0, 0, 16 + 8 * arg),
        _ins(test, 0, 1, k),
        _ins(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM),
    ]


def _refuse_both(nr: int, first: tuple[int, int, int], second: tuple[int, int, int]) -> list[bytes]:
    """Call ``nr`` refused with EPERM when both its ``(argument, test, k)`` conditions hold (as in :func:`_refuse_if`,
    on the low 32 bits); every other call goes on to the next rule."""
    (a1, t1, k1), (a2, t2, k2) = first, second
    return [
        _ins(_LD_W_ABS, 0, 0, 0),
        _ins(_JEQ_K, 0, 5, nr),
        _ins(_LD_W_ABS, 0, 0, 16 + 8 * a1),
        _ins(t1, 0, 3, k1),
        _ins(_LD_W_ABS, 0, 0, 16 + 8 * a2),
        _ins(t2, 0, 1, k2),
        _ins(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM),
    ]


def _refuse_in(nr: int, arg: int, mask: int, values: tuple[int, ...]) -> list[bytes]:
    """Call ``nr`` refused with EPERM when the low 32 bits of argument ``arg``, masked with ``mask``, are one of
    ``values``; every other call goes on to the next rule."""
    m = len(values)
    return ([_ins(_LD_W_ABS, 0, 0, 0), _ins(_JEQ_K, 0, m + 3, nr), _ins(_LD_W_ABS, 0, 0, 16 + 8 * arg),
             _ins(_AND_K, 0, 0, mask)]
            + [_ins(_JEQ_K, m - 1 - i, int(i == m - 1), v) for i, v in enumerate(values)]
            + [_ins(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)])


def _allow_only(nr: int, arg: int, values: tuple[int, ...]) -> list[bytes]:
    """Call ``nr`` refused with EPERM unless the low 32 bits of argument ``arg`` are one of ``values`` (as
    :func:`_refuse_if`, each a 32-bit int to the kernel); every other call goes on to the next rule."""
    m = len(values)
    return ([_ins(_LD_W_ABS, 0, 0, 0), _ins(_JEQ_K, 0, m + 2, nr), _ins(_LD_W_ABS, 0, 0, 16 + 8 * arg)]
            + [_ins(_JEQ_K, m - i, 0, v) for i, v in enumerate(values)]
            + [_ins(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)])


def _lookup(nrs: list[int]) -> list[bytes]:
    """A binary search of the sorted ``nrs`` for the call number in the accumulator: it jumps to the instruction just
    after it when the number is one of them, and to the one after that when not (about log2(len(nrs)) comparisons
    for every call a run makes, instead of one per denied number)."""
    def block(lo: int, hi: int) -> list[tuple]:  # (code, jt, jf, k), jumps symbolic: "hit", "miss" or a count
        if hi - lo <= 3:
            out = [(_JEQ_K, "hit", 0, nr) for nr in nrs[lo:hi]]
            return out[:-1] + [(_JEQ_K, "hit", "miss", nrs[hi - 1])]
        mid = (lo + hi) // 2
        left = block(lo, mid)
        return [(_JGE_K, len(left), 0, nrs[mid])] + left + block(mid, hi)

    code = block(0, len(nrs))
    n = len(code)

    def off(target, i: int) -> int:
        o = {"hit": n - i - 1, "miss": n - i}.get(target, target)
        if not 0 <= o <= 255:
            raise ValueError(f"BPF jump of {o}")
        return o

    return [_ins(c, off(jt, i), off(jf, i), k) for i, (c, jt, jf, k) in enumerate(code)]


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)  # the libc this process already has loaded: no file is opened
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return ctypes, libc


def _check(ctypes, rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {errno.errorcode.get(e, e)}")


def install_seccomp(own_pids: bool = False) -> str:
    """Set no_new_privs and install the filter on the calling thread (inherited by every fork). Returns the arch.
    ``own_pids``: the caller is PID 1 of its own pid namespace, and kill() is allowed only on pids 0, 1 and -1 (see
    build_filter). Raises Unsupported where no filter can be installed."""
    arch = machine()
    ctypes, libc = _libc()
    prog = build_filter(arch, own_pids)
    buf = ctypes.create_string_buffer(prog, len(prog))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    _check(ctypes, libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    rc = libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0)
    if rc != 0:
        e = ctypes.get_errno()
        raise Unsupported(f"the kernel refused the seccomp filter: {errno.errorcode.get(e, e)}")
    return arch


def nondumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0), inherited by every fork: where the machine's core_pattern is a pipe (apport,
    systemd-coredump), a crashing run would otherwise make the kernel start that helper on the host, whatever
    RLIMIT_CORE says. And what a trainer may have set and exec keeps: the timer slack back to the kernel's 50 us,
    transparent huge pages allowed (a run reads either back: the slack natively, huge pages by its fault count), the
    personality back to plain Linux (a trainer started under ``setarch`` flags)."""
    ctypes, libc = _libc()
    _check(ctypes, libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "PR_SET_DUMPABLE")
    _check(ctypes, libc.prctl(PR_SET_TIMERSLACK, 50_000, 0, 0, 0), "PR_SET_TIMERSLACK")
    _check(ctypes, libc.prctl(PR_SET_THP_DISABLE, 0, 0, 0, 0), "PR_SET_THP_DISABLE")  # inherited across exec too
    if libc.personality(0) == -1:  # PER_LINUX
        _check(ctypes, -1, "personality")


def rebase_recursion(frames: int) -> bool:
    """Make the interpreter count the thread's depth ``frames`` lower, its recursion limit unchanged: a program then
    runs, beneath the worker's own frames, at the depth a script's code runs at, and ``sys.getrecursionlimit``, an
    absolute ``sys.setrecursionlimit(N)`` and every RecursionError (where, and its message) are a script's, through
    the interpreter's own functions. Raising the limit by ``frames`` instead gave the same headroom at the default
    limit only (a program read 1005, and ``setrecursionlimit(2000)`` left it ``frames`` fewer than a script).

    The depth is the thread's limit minus its remaining budget (CPython's thread state); ``sys.setrecursionlimit``
    moves both. So the limit is raised by ``frames`` (the budget with it) and then the two copies of the limit, the
    thread's and the interpreter's, are written back, found as the only ints of those structures that follow two
    distinct limits set in turn. False where either is not found exactly once (another interpreter's layout: then
    nothing is written, the limit is left as it was, and the caller raises it instead)."""
    base = sys.getrecursionlimit()
    try:
        done = _rebase_recursion(frames, base)
    except Exception:  # noqa: BLE001 - a missing pythonapi function: the same fallback
        done = False
    if not done:
        sys.setrecursionlimit(base)
    return done


def _rebase_recursion(frames: int, base: int) -> bool:
    api = ctypes.pythonapi
    api.PyThreadState_Get.restype = api.PyInterpreterState_Get.restype = ctypes.c_void_p
    structs = ((api.PyThreadState_Get(), 128), (api.PyInterpreterState_Get(), 4096))  # ints read from each
    marks = (base + frames, base + frames + 54_321)
    seen = []
    for mark in marks:
        sys.setrecursionlimit(mark)
        seen.append([list((ctypes.c_int * n).from_address(addr)) for addr, n in structs])
    sys.setrecursionlimit(marks[0])
    fields = []
    for k, (addr, n) in enumerate(structs):
        hits = [i for i in range(n) if seen[0][k][i] == marks[0] and seen[1][k][i] == marks[1]]
        if len(hits) != 1:
            return False
        fields.append((addr, hits[0]))
    for addr, i in fields:
        (ctypes.c_int * (i + 1)).from_address(addr)[i] = base
    return sys.getrecursionlimit() == base


def drop_capabilities() -> None:
    """Give up every capability for good: lock the securebits, clear the ambient and bounding sets, then empty the
    effective, permitted and inheritable sets. Meant for the root of a user namespace, whose capabilities cover that
    namespace (its mounts, its chroot, its files)."""
    ctypes, libc = _libc()
    _check(ctypes, libc.prctl(PR_SET_SECUREBITS, SECUREBITS_LOCKED, 0, 0, 0), "PR_SET_SECUREBITS")
    _check(ctypes, libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "PR_CAP_AMBIENT_CLEAR_ALL")
    cap = 0
    while libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0:  # up to the kernel's CAP_LAST_CAP
        _check(ctypes, libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"PR_CAPBSET_DROP {cap}")
        cap += 1
    hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable}, all zero
    _check(ctypes, libc.capset(hdr, data), "capset")
