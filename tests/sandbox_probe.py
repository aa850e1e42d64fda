"""Hostile programs through the trainer's own entry points, run by tests/test_isolation.py in the test process (the
root path) and, as a script, by an unprivileged user (the user-namespace path). Standard library + lorapop only.

    python -S tests/sandbox_probe.py HOST_JSON      (prints one JSON object)

HOST_JSON names what the test set up on the host: a secret file, a writable directory for marker files, a TCP
listener on 127.0.0.1 and a unix socket (and, for the control run, executor overrides and "proposals_only"). Every program here passes the static check (the probe records it), so the
sandbox itself is what must stop it.
"""

from __future__ import annotations

import json
import os
import sys

# Syscall numbers written out again here, independently of lorapop/executor/lockdown.py, so a wrong entry there
# shows up as a call that is not refused.
SYSCALLS = {
    "x86_64": {"unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
               "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "keyctl": 250, "add_key": 248,
               "request_key": 249, "bpf": 321, "perf_event_open": 298, "init_module": 175, "finit_module": 313,
               "delete_module": 176, "reboot": 169, "kexec_load": 246, "kexec_file_load": 320, "socket": 41,
               "socketpair": 53, "execve": 59, "execveat": 322, "clone": 56, "clone3": 435,
               "io_uring_setup": 425, "userfaultfd": 323, "open_by_handle_at": 304, "fsopen": 430,
               "prlimit64": 302},
    "aarch64": {"unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
                "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "keyctl": 219, "add_key": 217,
                "request_key": 218, "bpf": 280, "perf_event_open": 241, "init_module": 105, "finit_module": 273,
                "delete_module": 106, "reboot": 142, "kexec_load": 104, "kexec_file_load": 294, "socket": 198,
                "socketpair": 199, "execve": 221, "execveat": 281, "clone": 220, "clone3": 435,
                "io_uring_setup": 425, "userfaultfd": 282, "open_by_handle_at": 265, "fsopen": 430,
                "prlimit64": 261},
}
# Memory that could outlive a run, and the worker's scheduling, priority, CPU set and host name: numbers again written
# out independently (x86_64, aarch64)
for _name, (_x86, _arm) in {
        "shmget": (29, 194), "shmat": (30, 196), "shmctl": (31, 195), "shmdt": (67, 197), "msgget": (68, 186),
        "msgsnd": (69, 189), "msgrcv": (70, 188), "msgctl": (71, 187), "semget": (64, 190), "semop": (65, 193),
        "semctl": (66, 191), "semtimedop": (220, 192), "mq_open": (240, 180), "mq_unlink": (241, 181),
        "mq_timedsend": (242, 182), "mq_timedreceive": (243, 183), "mq_notify": (244, 184),
        "mq_getsetattr": (245, 185), "memfd_create": (319, 279), "memfd_secret": (447, 447),
        "setpriority": (141, 140), "sched_setparam": (142, 118), "sched_setscheduler": (144, 119),
        "sched_setaffinity": (203, 122), "sched_setattr": (314, 274), "ioprio_set": (251, 30),
        "sethostname": (170, 161), "setdomainname": (171, 162), "setxattr": (188, 5), "lsetxattr": (189, 6),
        "fsetxattr": (190, 7), "removexattr": (197, 14), "lremovexattr": (198, 15), "fremovexattr": (199, 16),
        "pipe2": (293, 59), "pidfd_open": (434, 434), "setxattrat": (463, 463), "removexattrat": (466, 466),
        "io_setup": (206, 0), "io_destroy": (207, 1), "io_getevents": (208, 4), "io_submit": (209, 2),
        "io_cancel": (210, 3), "io_pgetevents": (333, 292), "io_uring_enter": (426, 426),
        "io_uring_register": (427, 427), "inotify_init1": (294, 26), "inotify_add_watch": (254, 27),
        "inotify_rm_watch": (255, 28), "fanotify_init": (300, 262), "fanotify_mark": (301, 263),
        "name_to_handle_at": (303, 264), "kcmp": (312, 272), "sync": (162, 81), "syncfs": (306, 267),
        "mmap_hugetlb": (9, 222), "uname": (63, 160), "sysinfo": (99, 179), "sched_getaffinity": (204, 123),
        "times": (100, 153),
        # process ids, and the calls that tell whether a pid exists (written out again independently)
        "getpid": (39, 172), "getppid": (110, 173), "gettid": (186, 178), "getpgid": (121, 155),
        "getsid": (124, 156), "tkill": (200, 130), "tgkill": (234, 131), "rt_sigqueueinfo": (129, 138),
        "rt_tgsigqueueinfo": (297, 240), "capget": (125, 90), "ioprio_get": (252, 31), "get_robust_list": (274, 100),
        "migrate_pages": (256, 238), "move_pages": (279, 239), "pidfd_send_signal": (424, 424),
        "process_madvise": (440, 440),
        # allowed with some arguments only: another pid, a signal other than SIGKILL, another process's clock, the
        # result pipe's descriptor
        "kill_probe": (62, 129), "getpriority_other": (140, 141), "sched_getparam_other": (143, 121),
        "sched_getscheduler_other": (145, 120), "sched_rr_get_interval_other": (148, 127),
        "sched_getattr_other": (315, 275), "clock_gettime_other": (228, 113), "clock_getres_other": (229, 114),
        "clock_nanosleep_other": (230, 115), "timer_create_other": (222, 107), "fstat_result": (5, 80),
        "newfstatat_result": (262, 79), "statx_result": (332, 291), "dup_result": (32, 23),
        "dup3_result": (292, 24), "fcntl_result": (72, 25), "prctl_dumpable": (157, 167),
        "setpgid_other": (109, 154), "fcntl_setown": (72, 25), "clock_settime_other": (227, 112),
        "clock_adjtime_other": (305, 266),
        # a thread id handed back or tested; the user and group ids (root or an ordinary user's namespace)
        "set_tid_address": (218, 96), "timer_create": (222, 107), "futex_trylock_pi": (202, 98),
        "futex_lock_pi_private": (202, 98), "getuid": (102, 174), "geteuid": (107, 175), "getgid": (104, 176),
        "getegid": (108, 177), "getresuid": (118, 148), "getresgid": (120, 150), "getgroups": (115, 158),
        # host facts in read-only calls: the boot's anonymous inode, the clock discipline, NUMA, LSMs, RWF flags
        "eventfd2": (290, 19), "epoll_create1": (291, 20), "signalfd4": (289, 74), "timerfd_create": (283, 85),
        "adjtimex": (159, 171), "clock_adjtime": (305, 266), "get_mempolicy": (239, 236), "membarrier": (324, 283),
        "preadv2": (327, 286), "pwritev2": (328, 287), "landlock_create_ruleset": (444, 444),
        "prctl_get_securebits": (157, 167), "prctl_get_timerslack": (157, 167),
        "seccomp": (317, 277), "setfsuid": (122, 151), "setfsgid": (123, 152), "set_mempolicy": (238, 237),
        "mbind": (237, 235), "set_mempolicy_home_node": (450, 450), "statmount": (457, 457),
        "listmount": (458, 458), "open_tree_attr": (467, 467), "openat2": (437, 437),
        "statx_mnt_id": (332, 291), "openat_noatime": (257, 56),
        "lsm_get_self_attr": (459, 459), "lsm_list_modules": (461, 461),
        # calls newer than the filter's review: file_getattr, file_setattr, and numbers no kernel has yet
        "file_getattr": (468, 468), "file_setattr": (469, 469), "unassigned_480": (480, 480),
        "unassigned_511": (511, 511),
        # the ninth review: statx whole (the mount id with any mask), a machine-wide quota sync, the one LSM call
        # left, the reads of extended attributes (an SELinux host's labels), a pidfd through clone, O_NOATIME set
        # on an open file
        "statx_plain": (332, 291), "quotactl": (179, 60), "quotactl_fd": (443, 443),
        "lsm_set_self_attr": (460, 460), "getxattr": (191, 8), "lgetxattr": (192, 9), "fgetxattr": (193, 10),
        "listxattr": (194, 11), "llistxattr": (195, 12), "flistxattr": (196, 13), "getxattrat": (464, 464),
        "listxattrat": (465, 465), "clone_pidfd": (56, 220), "fcntl_setfl_noatime": (72, 25)}.items():
    SYSCALLS["x86_64"][_name], SYSCALLS["aarch64"][_name] = _x86, _arm
SYSCALLS["x86_64"]["getpgrp"] = 111  # aarch64 has getpgid only
SYSCALLS["x86_64"]["dup2_result"] = 33  # aarch64 has dup3 only
# Arguments chosen so that, without the filter, each call fails with something other than EPERM or does nothing
# harmful (CLONE_NEWUSER|CLONE_FS is EINVAL; reboot with a wrong magic is EINVAL; prlimit64 on pid 1 only reads).
CALL_ARGS = {
    "unshare": (0,), "setns": (-1, 0), "mount": (0, 0, 0, 0, 0), "umount2": (b"/nonexistent-lorapop", 0),
    "pivot_root": (0, 0), "chroot": (b"/nonexistent-lorapop",), "ptrace": (0x4206, 0, 0, 0),
    "process_vm_readv": ("self", 0, 0, 0, 0, 0), "process_vm_writev": ("self", 0, 0, 0, 0, 0),
    "keyctl": (-1, 0, 0, 0, 0), "add_key": (0, 0, 0, 0, 0), "request_key": (0, 0, 0, 0), "bpf": (-1, 0, 0),
    "perf_event_open": (0, 0, -1, -1, 0), "init_module": (0, 0, 0), "finit_module": (-1, 0, 0),
    "delete_module": (0, 0), "reboot": (0, 0, 0, 0), "kexec_load": (0, 0, 0, 0), "kexec_file_load": (-1, -1, 0, 0, 0),
    "socket": (2, 1, 0), "socketpair": (1, 1, 0, 0), "execve": (b"/nonexistent-lorapop", 0, 0),
    "execveat": (-1, b"", 0, 0, 0), "clone": (0x10000000 | 0x200, 0, 0, 0, 0), "clone3": (0, 0),
    "io_uring_setup": (0, 0), "userfaultfd": (-1,), "open_by_handle_at": (-1, 0, 0), "fsopen": (0, 0),
    "prlimit64": (1, 7, 0, 0),
    # missing keys (no IPC_CREAT), bad ids, bad "which" values, NULL or over-long names: without the filter each fails
    # with something other than EPERM and changes nothing, even for root
    "shmget": (0x10C0FFEE, 4096, 0), "shmat": (-1, 0, 0), "shmctl": (-1, 0, 0), "shmdt": (0,),
    "msgget": (0x10C0FFEE, 0), "msgsnd": (-1, 0, 0, 0), "msgrcv": (-1, 0, 0, 0, 0), "msgctl": (-1, 0, 0),
    "semget": (0x10C0FFEE, 1, 0), "semop": (-1, 0, 0), "semctl": (-1, 0, 0, 0), "semtimedop": (-1, 0, 0, 0),
    "mq_open": (0, 0, 0, 0), "mq_unlink": (0,), "mq_timedsend": (-1, 0, 0, 0, 0), "mq_timedreceive": (-1, 0, 0, 0, 0),
    "mq_notify": (-1, 0), "mq_getsetattr": (-1, 0, 0), "memfd_create": (0, 0), "memfd_secret": (0xFFFF,),
    "setpriority": (99, 0, 0), "sched_setparam": (0, 0), "sched_setscheduler": (0, 99, 0),
    "sched_setaffinity": (0, 0, 0), "sched_setattr": (0, 0, 0), "ioprio_set": (99, 0, 0),
    "sethostname": (0, -1), "setdomainname": (0, -1),
    # NULL paths and names, a bad descriptor, a bad pipe flag, pid 0: EFAULT, EBADF or EINVAL without the filter
    "setxattr": (0, 0, 0, 0, 0), "lsetxattr": (0, 0, 0, 0, 0), "fsetxattr": (-1, 0, 0, 0, 0), "removexattr": (0, 0),
    "lremovexattr": (0, 0), "fremovexattr": (-1, 0), "pipe2": (0, -1), "pidfd_open": (0, 0),
    "setxattrat": (-1, 0, 0, 0, 0, 0), "removexattrat": (-1, 0, 0, 0),
}
# Without the filter: the ids come back (0 errno), a pid that does not exist is ESRCH, NULL buffers EFAULT, bad
# descriptors EBADF, and the result pipe's descriptor (3) is copied or read (0 errno).
_OTHER_CLOCK = (~999_999 << 3) | 2  # MAKE_PROCESS_CPUCLOCK(999999, CPUCLOCK_SCHED)
CALL_ARGS.update({
    "getpid": (), "getppid": (), "gettid": (), "getpgid": (0,), "getsid": (0,), "getpgrp": (),
    "tkill": (999_999, 0), "tgkill": (999_999, 999_999, 0), "rt_sigqueueinfo": (999_999, 0, 0),
    "rt_tgsigqueueinfo": (999_999, 999_999, 0, 0), "capget": (0, 0), "ioprio_get": (99, 0),
    "get_robust_list": (999_999, 0, 0), "migrate_pages": (999_999, 0, 0, 0), "move_pages": (999_999, 0, 0, 0, 0, 0),
    "pidfd_send_signal": (-1, 0, 0, 0), "process_madvise": (-1, 0, 0, 0, 0),
    "kill_probe": (999_999, 0), "getpriority_other": (0, 999_999), "sched_getparam_other": (999_999, 0),
    "sched_getscheduler_other": (999_999,), "sched_rr_get_interval_other": (999_999, 0),
    "sched_getattr_other": (999_999, 0, 0, 0), "clock_gettime_other": (_OTHER_CLOCK, 0),
    "clock_getres_other": (_OTHER_CLOCK, 0), "clock_nanosleep_other": (_OTHER_CLOCK, 0, 0, 0),
    "timer_create_other": (_OTHER_CLOCK, 0, 0), "fstat_result": (3, 0), "newfstatat_result": (3, b"", 0, 0x1000),
    "statx_result": (3, b"", 0x1000, 0, 0), "dup_result": (3,), "dup3_result": (3, 60, 0), "dup2_result": (3, 61),
    "fcntl_result": (3, 3), "prctl_dumpable": (4, 1, 0, 0, 0), "setpgid_other": (999_999, 1 << 30),
    "fcntl_setown": (-1, 8, 999_999), "clock_settime_other": (_OTHER_CLOCK, 0), "clock_adjtime_other": (_OTHER_CLOCK, 0),
    # without the filter: the caller's tid; EFAULT (NULL sigevent out, NULL futex word; FUTEX_LOCK_PI with the private
    # flag, which the filter masks off); the ids
    "set_tid_address": (0,), "timer_create": (0, 0, 0), "futex_trylock_pi": (0, 8, 0, 0, 0, 0),
    "futex_lock_pi_private": (0, 6 | 128, 0, 0, 0, 0), "getuid": (), "geteuid": (), "getgid": (), "getegid": (),
    "getresuid": (0, 0, 0), "getresgid": (0, 0, 0), "getgroups": (0, 0),
    # without the filter: EINVAL (bad flags or size, no such device), EFAULT (NULL buffers) or EBADF; sysfs(3) the
    # count of the host's filesystem types; eventfd(0) a descriptor (closed)
    "eventfd2": (0, -1), "epoll_create1": (-1,), "signalfd4": (-1, 0, 8, -1), "timerfd_create": (-1, 0),
    "adjtimex": (0,), "clock_adjtime": (0, 0), "get_mempolicy": (0, 0, 0, 0, -1), "membarrier": (-1, 0, 0),
    "preadv2": (-1, 0, 0, 0, 0, 0), "pwritev2": (-1, 0, 0, 0, 0, 0), "landlock_create_ruleset": (0, 0, -1),
    "lsm_get_self_attr": (0, 0, 0, -1), "lsm_list_modules": (0, 0, -1), "eventfd": (0,), "epoll_create": (0,),
    "signalfd": (-1, 0, 8), "ustat": (0, 0), "sysfs": (3,), "prctl_get_securebits": (27, 0, 0, 0, 0),
    "prctl_get_timerslack": (30, 0, 0, 0, 0),
    # without the filter: EINVAL (a bad operation, mode or flag), EFAULT or EBADF; setfsuid(-1) the current one
    "seccomp": (-1, 0, 0), "setfsuid": (-1,), "setfsgid": (-1,), "set_mempolicy": (-1, 0, 0),
    "mbind": (0, 0, -1, 0, 0, 0), "set_mempolicy_home_node": (0, 0, 0, -1), "statmount": (0, 0, 0, -1),
    "listmount": (0, 0, 0, -1), "open_tree_attr": (-1, 0, 0, 0, 0), "openat2": (-1, 0, 0, 0),
    # statx asking for mount ids (EBADF without the filter), open with O_NOATIME (ENOENT)
    "statx_mnt_id": (-1, b"", 0, 0x4000, 0), "openat_noatime": (-100, b"/nonexistent-lorapop", 0o1000000, 0),
    "open_noatime": (b"/nonexistent-lorapop", 0o1000000, 0),
    # without the filter EBADF, or ENOSYS on a kernel without them
    "file_getattr": (-1, 0, 0, 0, 0), "file_setattr": (-1, 0, 0, 0, 0), "unassigned_480": (), "unassigned_511": (),
    # without the filter: EBADF, EFAULT or EINVAL (a bad command, bad flags, CLONE_THREAD without CLONE_SIGHAND)
    "statx_plain": (-1, b"", 0, 0x7FF, 0), "quotactl": (-1, 0, 0, 0), "quotactl_fd": (-1, 0, 0, 0),
    "lsm_set_self_attr": (0, 0, 0, -1), "getxattr": (0, 0, 0, 0), "lgetxattr": (0, 0, 0, 0),
    "fgetxattr": (-1, 0, 0, 0), "listxattr": (0, 0, 0), "llistxattr": (0, 0, 0), "flistxattr": (-1, 0, 0),
    "getxattrat": (-1, 0, 0, 0, 0), "listxattrat": (-1, 0, 0, 0, 0), "clone_pidfd": (0x1000 | 0x10000, 0, 0, 0, 0),
    "fcntl_setfl_noatime": (-1, 4, 0o1000000),
})
SYSCALLS["x86_64"]["pipe"] = 22  # aarch64 has pipe2 only
# x86_64 only: the old eventfd/epoll/signalfd, ustat (a device's free space, looked up among all the machine's
# filesystems) and sysfs (the host kernel's filesystem types)
SYSCALLS["x86_64"].update({"eventfd": 284, "epoll_create": 213, "signalfd": 282, "ustat": 136, "sysfs": 139,
                           "open_noatime": 2})
CALL_ARGS["pipe"] = (0,)
SYSCALLS["x86_64"]["inotify_init"] = 253  # aarch64 has inotify_init1 only
# Zero events, context 0, bad descriptors, bad flags, pid 0: EINVAL, EBADF or ESRCH without the filter (inotify_init
# makes a descriptor, closed below; sync flushes the machine's dirty pages once). mmap of one page with MAP_HUGETLB:
# ENOMEM where the machine has no huge pages, a mapping where it has.
CALL_ARGS.update({
    "io_setup": (0, 0), "io_destroy": (0,), "io_getevents": (0, 0, 0, 0, 0), "io_submit": (0, 0, 0),
    "io_cancel": (0, 0, 0), "io_pgetevents": (0, 0, 0, 0, 0, 0), "io_uring_enter": (-1, 0, 0, 0, 0, 0),
    "io_uring_register": (-1, 0, 0, 0), "inotify_init": (), "inotify_init1": (-1,), "inotify_add_watch": (-1, 0, 0),
    "inotify_rm_watch": (-1, 0), "fanotify_init": (0xFFFFFFFF, 0), "fanotify_mark": (-1, 0, 0, 0, 0),
    "name_to_handle_at": (-1, 0, 0, 0, 0), "kcmp": (0, 0, 99, 0, 0), "sync": (), "syncfs": (-1,),
    "mmap_hugetlb": (0, 4096, 3, 0x22 | 0x40000, -1, 0),
    # facts of the machine: NULL buffers (EFAULT), a zero-length CPU set (EINVAL); times(NULL) only reads the clock
    "uname": (0,), "sysinfo": (0,), "sched_getaffinity": (0, 0, 0), "times": (0,),
})
# ENOSYS, so libc falls back to clone, and does a flagless preadv2/pwritev2 as preadv/pwritev; statx and the calls
# newer than the review ENOSYS, as on a kernel without them; every other call: EPERM
EXPECTED_ERRNO = {"clone3": 38, "preadv2": 38, "pwritev2": 38, "file_getattr": 38, "file_setattr": 38,
                  "unassigned_480": 38, "unassigned_511": 38, "statx_plain": 38, "statx_mnt_id": 38,
                  "statx_result": 38}


# Real-time signals queued by kill() to itself count against the user's pending-signal budget (the host user's, in
# a user namespace); the run queues 2000 and counts what it can take back
SIGQUEUE = ("import signal, os\nsig = signal.SIGRTMIN\nsignal.pthread_sigmask(signal.SIG_BLOCK, {sig})\n"
            "for i in range(2000):\n    os.kill(0, sig)\nn = 0\n"
            "while signal.sigtimedwait({sig}, 0) is not None:\n    n += 1\n_result = n")


def syscall_program(arch: str) -> str:
    """A program (it needs ctypes preloaded) that makes every refused call and returns {name: errno or 0}."""
    return (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        f"nrs = {SYSCALLS[arch]!r}\n"
        f"args = {CALL_ARGS!r}\n"
        "out = {}\n"
        "for name, nr in nrs.items():\n"
        "    a = [0 if x == 'self' else x for x in args[name]]\n"
        "    a = [ctypes.c_long(x) if isinstance(x, int) else ctypes.c_char_p(x) for x in a]\n"
        "    ctypes.set_errno(0)\n"
        "    rc = libc.syscall(ctypes.c_long(nr), *a)\n"
        "    out[name] = ctypes.get_errno() if rc == -1 else 0\n"
        "    if rc > 0 and name in ('socket', 'userfaultfd', 'io_uring_setup', 'fsopen', 'inotify_init',\n"
        "                                'dup_result', 'dup2_result', 'dup3_result', 'eventfd'):\n"
        "        os.close(rc)\n"
        "_result = out\n"
    )


def proposals(host: dict) -> dict[str, tuple[str, str]]:
    """name -> (program, input): the issue's four programs first, then their kin."""
    secret, drop, port, unix = host["secret_file"], host["drop_dir"], host["tcp_port"], host["unix_socket"]

    def mark(name: str) -> str:
        return repr(os.path.join(drop, name))

    os_ = "import _frozen_importlib_external as b\n"  # its `_os` is the posix module: the static check lets it by
    return {
        "linecache_read": ("import linecache\ndef f(p):\n    return linecache.getlines(p)", repr(secret)),
        "codecs_write": ("import codecs\ndef f(p):\n    with codecs.open(p, 'w') as fh:\n        fh.write('x')\n"
                         "    return 1", mark("codecs_write")),
        "xml_sax_url": ("import xml.sax\ndef f(u):\n    xml.sax.parse(u, xml.sax.ContentHandler())\n    return 1",
                        repr(f"http://127.0.0.1:{port}/")),
        "pydoc_pager_shell": ("import pydoc\ndef f(p):\n    pydoc.pipepager('x', 'touch ' + p)\n    return 1",
                              mark("pydoc_pager_shell")),
        "codecs_read": ("import codecs\ndef f(p):\n    with codecs.open(p) as fh:\n        return fh.read()",
                        repr(secret)),
        "io_read": ("import _io\ndef f(p):\n    return _io.open(p).read()", repr(secret)),
        "mimetypes_read": ("import mimetypes\ndef f(p):\n    return mimetypes.read_mime_types(p)", repr(secret)),
        "posix_read": (os_ + "def f(p):\n    return b._os.read(b._os.open(p, 0), 4096)", repr(secret)),
        "io_write": ("import _io\ndef f(p):\n    _io.open(p, 'w').write('x')\n    return 1", mark("io_write")),
        "wave_write": ("import wave\ndef f(p):\n    w = wave.open(p, 'wb')\n    w.setnchannels(1)\n"
                       "    w.setsampwidth(1)\n    w.setframerate(8000)\n    w.close()\n    return 1",
                       mark("wave_write")),
        "nntplib_tcp": ("import nntplib\ndef f(port):\n    return nntplib.NNTP('127.0.0.1', port).getwelcome()",
                        repr(port)),
        "socket_tcp": ("import _socket\ndef f(port):\n    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\n"
                       "    s.connect(('127.0.0.1', port))\n    return 1", repr(port)),
        "socket_unix": ("import _socket\ndef f(p):\n    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)\n"
                        "    s.connect(p)\n    return 1", repr(unix)),
        "posix_system": (os_ + "def f(p):\n    return b._os.system('touch ' + p)", mark("posix_system")),
        "posix_execv": (os_ + "def f(p):\n    b._os.execv('/bin/sh', ['sh', '-c', 'touch ' + p])",
                        mark("posix_execv")),
        "posix_spawn": (os_ + "def f(p):\n    return b._os.posix_spawn('/bin/sh', ['sh', '-c', 'touch ' + p], {})",
                        mark("posix_spawn")),
    }


# The kin modules are not importable in the sandbox by default (the chroot holds only the preloaded ones); a second
# pass preloads them, so the same programs meet the namespaces and the filter instead of an ImportError.
KIN_MODULES = ("linecache", "codecs", "mimetypes", "wave", "nntplib", "pydoc", "subprocess", "xml.sax",
               "xml.sax.saxutils", "xml.sax.expatreader", "urllib.request")


# Runs that bypass the static check (as the executor's own tests do): a double-forked setsid process that must not
# outlive its run, and fork still working under the limits.
# (No pipe between them: the filter refuses new pipes. In the run's pid namespace the grandchild's pid is the child's
# plus one.)
LEFTOVER = ("import os, time\nchild = os.fork()\nif child == 0:\n    os.setsid()\n    pid = os.fork()\n"
            "    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    os._exit(0)\n"
            "time.sleep(0.2)\n_result = child + 1")
# A run may signal no single pid but 0, 1 and -1 (any other would tell it which pids exist): kill(-1, SIGKILL)
# reaches every process of the namespace but the run and PID 1, and finds none when nothing was left.
ALIVE = ("import os\ntry:\n    os.kill(-1, 9)\n    _result = 'alive'\nexcept ProcessLookupError:\n"
         "    _result = 'gone'")
FORK_BOMB = ("import os, time\npids = []\nwhile True:\n    try:\n        pid = os.fork()\n    except OSError:\n"
             "        break\n    if pid == 0:\n        time.sleep(5)\n        os._exit(0)\n    pids.append(pid)\n"
             "_result = len(pids)")
# What a run could do to its own worker where both share a uid (user namespace): the signal Python handles, and
# cutting the worker's limits; then a plain run must still be served by the same, healthy worker.
AT_WORKER = ["import os, signal\nos.kill(1, signal.SIGINT)\n_result = 'sent'",
             "import resource\nresource.prlimit(1, resource.RLIMIT_NOFILE, (3, 3))\n_result = 'cut'",
             "_result = 'served'"]
FORK = ("import os\npid = os.fork()\nif pid == 0:\n    os._exit(7)\n_, st = os.waitpid(pid, 0)\n"
        "_result = os.WEXITSTATUS(st)")


def verdicts(props: dict, results: list) -> dict:
    """name -> what validation made of the proposal (a Task's outputs, or an Invalid's reason and detail)."""
    return {k: {"valid": hasattr(r, "outputs"), "reason": getattr(r, "reason", None),
                "detail": getattr(r, "detail", None), "outputs": getattr(r, "outputs", None)}
            for k, r in zip(props, results)}


def probe(host: dict) -> dict:
    from lorapop.executor import ExecutorConfig, SandboxExecutor
    from lorapop.executor.lockdown import machine
    from lorapop.executor.base import DEFAULT_PRELOAD
    from lorapop.tasks import TASK_TYPES
    from lorapop.tasks.common import fence
    from lorapop.tasks.validity import check_program

    code_o = TASK_TYPES["code_o"]
    props = proposals(host)
    out: dict = {"uid": os.getuid(), "static_ok": {k: check_program(p) is None for k, (p, _) in props.items()}}
    try:
        # max_procs 4: runs may fork here, so the fork bomb meets the process limit, the leftover meets the cleanup
        # and exec meets the filter (the default, 1, refuses every fork: tests/test_verdicts.py)
        ex = SandboxExecutor(ExecutorConfig(**{"timeout_s": 2.0, "n_workers": 1, "memory_mb": 256, "max_procs": 4,
                                               **host.get("executor", {})}))
        out["protections"] = ex.protections
    except RuntimeError as exc:
        out["refused"] = str(exc)
        return out
    try:
        parsed = [code_o.parse_proposal(fence("python", p) + "\n" + fence("input", i)) for p, i in props.values()]
        results = code_o.validate_many(parsed, ex)
        out["proposals"] = verdicts(props, results)
        if host.get("proposals_only"):
            return out
        left = ex.run(LEFTOVER)
        out["leftover"] = [left.status, left.value]
        out["leftover_after"] = ex.run(ALIVE.format(pid=int(left.value))).value if left.ok else None
        out["fork"] = ex.run(FORK).value
        bomb = ex.run(FORK_BOMB, timeout_s=3.0)
        out["fork_bomb"] = [bomb.status, bomb.value, bomb.duration_s, ex.config.max_procs]
        out["at_worker"] = [[r.status, r.value, r.error] for r in (ex.run(c) for c in AT_WORKER)]
        q = ex.run(SIGQUEUE)
        out["sigqueue"] = [q.status, q.value, q.error]
    finally:
        ex.close()
    with SandboxExecutor(ExecutorConfig(timeout_s=2.0, n_workers=1, preload=(*DEFAULT_PRELOAD, *KIN_MODULES),
                                        max_procs=4, **host.get("executor", {}))) as ex:
        out["preloaded"] = {k: ex.run(c).error for k, c in
                            (("kin", "import " + ", ".join(KIN_MODULES)),)}
        results = code_o.validate_many(parsed, ex)
        out["proposals_preloaded"] = verdicts(props, results)
    with SandboxExecutor(ExecutorConfig(timeout_s=5.0, n_workers=1, max_repr_chars=4000,
                                        preload=(*DEFAULT_PRELOAD, "ctypes"))) as ex:
        r = ex.run(syscall_program(machine()))
        out["syscalls"] = [r.status, r.value, r.error]
    return out


def main() -> None:
    print(json.dumps(probe(json.loads(sys.argv[1]))))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
