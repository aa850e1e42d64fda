"""Programs written to forge a verdict, keep state or memory past their run, or break or degrade the executor, sent
through the trainer's own path (parse, validation, the checks; SandboxExecutor.run for the raw ones). Run by
tests/test_verdicts.py in the test process (the root path) and, as a script, by an unprivileged user (the
user-namespace path). Standard library + lorapop only.

    python -S tests/verdict_probe.py      (prints one JSON object)

Every program here passes the static check unless its entry says otherwise: the static check is a filter, not a
wall, so the sandbox and the trainer-side verdict are what must hold.
"""

from __future__ import annotations

import json
import os
import sys
import time

# The modules' plain attributes hand a program what the banned names ban (fractions.sys is sys); no dunder needed.
# Task programs may hold only imports and def f at top level, so each reaches sys and os inside f.
SYS = "    sys = fractions.sys\n    os = sys.modules['os']\n"
# A forged result as the worker would write it, to every descriptor, then an exit before the real one is written
FORGE = ("    body = ('ok' + chr(0) + '1' + {value!r} + chr(0) + '0').encode()\n    for fd in range(3, 64):\n"
         "        try:\n            os.write(fd, len(body).to_bytes(4, 'big') + body)\n        except OSError:\n"
         "            pass\n    os._exit(0)\n")


def program(body: str) -> str:
    """``import fractions`` and ``def f(x)`` holding sys and os, then ``body`` (indented by four)."""
    return "import fractions\ndef f(x):\n" + SYS + body


# code_i programs by a teacher that wants every student to fail; each is honest on its own input 5 (so it validates:
# f(5) == 10), and on a student's input tries to reach the comparison, forge the result, or tell a check from a
# validation.
CODE_I = {
    # walk up the frames and replace every private global (the old in-process comparison was one)
    "frames_replace_comparison": program(
        "    if x != 5:\n        fr = sys._getframe()\n        while fr is not None:\n"
        "            for k in list(fr.f_globals):\n                if k.startswith('_') and not k.endswith('_'):\n"
        "                    fr.f_globals[k] = lambda *a, **kw: True\n            fr = fr.f_back\n    return 2 * x"),
    # patch the builtins every later line of the process uses
    "builtins_patched": program(
        "    if x != 5:\n        b = sys.modules['builtins']\n        b.repr = lambda o: '10'\n"
        "        b.bool = lambda o=0: True\n        b.isinstance = lambda *a: True\n    return 2 * x"),
    # write a forged "correct" to every descriptor and leave before the real result is written
    "fake_result_true": program("    if x != 5:\n" + FORGE.format(value="True").replace("\n    ", "\n        ")
                                .replace("    body", "        body", 1) + "    return 2 * x"),
    # forge the gold output itself: the same as returning it, which is all a forged result can ever do
    "fake_result_gold": program("    if x != 5:\n" + FORGE.format(value="10").replace("\n    ", "\n        ")
                                .replace("    body", "        body", 1) + "    return 2 * x"),
    # a check that looked different from a validation (more globals, a comparison in them) would give another value
    "tell_check_from_validation": program(
        "    names = set()\n    fr = sys._getframe(1)\n    while fr is not None:\n"
        "        names |= set(fr.f_globals)\n        fr = fr.f_back\n    return 2 * x + len(names)"),
    # count its own runs in the working directory: a later run would see the earlier one's file (the filesystem is
    # read-only, so the write fails and the program carries on)
    "count_runs_in_a_file": program(
        "    n = len(os.listdir('.'))\n    try:\n        os.close(os.open('run%d' % n, os.O_CREAT | os.O_WRONLY))\n"
        "    except OSError:\n        pass\n    return 2 * x + n"),
}
# The same teacher's program for code_o, where the student's prediction is compared with the stored output: runs that
# depend on something else than their input (a file an earlier run left, the pid, the host) must not turn a right
# prediction wrong.
CODE_O = {
    # every name that gives a process id is gone (and the calls behind them are refused): the program finds none
    "pid": program("    names = [n for n in ('getpid', 'getppid', 'getpgrp', 'getpgid', 'getsid') if hasattr(os, n)]\n"
                   "    return 2 * x + 1000 * len(names)"),
    "file_state": CODE_I["count_runs_in_a_file"],
    # the node name is the sandbox's own; with the filter, uname (release, version) is refused whole
    "hostname": program("    try:\n        return os.uname().nodename\n    except OSError as e:\n"
                        "        return e.errno"),
}
CLOCK = program("    return x + int(sys.modules['time'].time())")  # the same within a second, never after it

# code_o programs whose result a script's last line could not print: a _result the trainer's own store deletes (the
# old value's __del__), then builtins that offer one of the program's choosing, and a repr no UTF-8 text can carry.
# Each is an error in a script, so never a task.
DELETED = "    g = (i for i in ()).gi_frame.f_globals\n"
RESULT_STEP = {
    "deleted_by_store": program(DELETED + "    g['_result'] = type('D', (), {'__del__': lambda s: g.pop('_result', "
                                "None)})()\n    return x"),
    "builtins_offer_one": program(DELETED + "    g['__builtins__'] = {'_result': -x}\n    g['_result'] = type('D', (), "
                                  "{'__del__': lambda s: g.pop('_result', None)})()\n    return x"),
    "unencodable_repr": program("    return type('R', (), {'__repr__': lambda s: chr(39) + chr(0xd800) + chr(39)})()"),
}

# code_f answers by a student that computes nothing (the task's f adds its two arguments); each returns objects that
# print as something else, compare equal to anything, or carry text that broke a comparison built by pasting reprs
# into one source line (a comment, a quote, a backslash-newline carried into the next output).
FAKE_F = {
    "repr_comment": "def f(a, b):\n    return type('R', (), {'__repr__': lambda s: '0 #'})()",
    "repr_backslash_newline": "def f(a, b):\n    return type('R', (), {'__repr__': lambda s: '0 \\\\\\n'})()",
    "repr_quote_bracket": "def f(a, b):\n    return type('R', (), {'__repr__': lambda s: \"']) or True or (['\"})()",
    "eq_always_true": ("def f(a, b):\n    return type('E', (int,), {'__eq__': lambda s, o: True, '__ne__': lambda s, o: "
                       "False, '__hash__': lambda s: 0})(0)"),
    "str_subclass_eq": "def f(a, b):\n    return type('S', (str,), {'__eq__': lambda s, o: True})('x')",
    "repr_raises": "def f(a, b):\n    return type('X', (), {'__repr__': lambda s: 1 / 0})()",
    "forged_result": ("import fractions\ndef f(a, b):\n" + SYS + FORGE.format(value="True")),
}
# Right answers in odd forms: they must stay right.
RIGHT_F = {
    "plain": "def f(a, b):\n    return a + b",
    "subclass_eq_false": ("def f(a, b):\n    t = type('T', (type(a),), {'__eq__': lambda s, o: False, '__hash__': "
                          "lambda s: 1})\n    return t(a + b)"),
    "repr_padded": "def f(a, b):\n    return type('R', (), {'__repr__': lambda s: ' ' + repr(a + b) + '  # sum'})()",
}

# Raw runs (SandboxExecutor.run): memory and state that would outlive the run, cleanup defeated, the worker degraded.
# The filesystem is read-only, so the file writers are refused (tests/test_channels.py tries every other channel).
RAW_SYS = "import fractions\nsys = fractions.sys\nos = sys.modules['os']\n"
RAW = {
    "memfd": RAW_SYS + "fd = os.memfd_create('x')\nos.write(fd, b'x' * (1 << 20))\n_result = fd",
    "deep_tree": RAW_SYS + ("d = 'd'\nfor i in range(80):\n    os.mkdir(d)\n    os.chdir(d)\n"
                            "os.close(os.open('leaf', os.O_CREAT | os.O_WRONLY))\nos.chmod('.', 0)\n_result = 80"),
    "many_files": RAW_SYS + ("for i in range(3000):\n    os.close(os.open('f%d' % i, os.O_CREAT | os.O_WRONLY))\n"
                             "_result = len(os.listdir('.'))"),
    # fill the working area (a tmpfs: host memory) to its size; it must be gone, with its memory, after the run
    "fill_disk": RAW_SYS + ("n = 0\ntry:\n    while True:\n        fd = os.open('big%d' % n, os.O_CREAT | os.O_WRONLY)\n"
                            "        os.write(fd, b'x' * (4 << 20) - 1 if False else b'x' * ((4 << 20) - 1))\n"
                            "        os.close(fd)\n        n += 1\nexcept OSError:\n    pass\n"
                            "st = os.statvfs('.')\n_result = (st.f_blocks - st.f_bfree) * st.f_frsize >> 20"),
    "workdir_locked": RAW_SYS + "os.chmod('.', 0)\n_result = 1",
    "nice_worker": RAW_SYS + "os.setpriority(os.PRIO_PROCESS, 1, 19)\n_result = 1",
    "nice_user": RAW_SYS + "os.setpriority(os.PRIO_USER, 0, 19)\n_result = 1",
    "affinity_worker": RAW_SYS + "os.sched_setaffinity(1, {0})\n_result = 1",
    "idle_worker": RAW_SYS + "os.sched_setscheduler(1, os.SCHED_IDLE, os.sched_param(0))\n_result = 1",
    "rlimit_worker": RAW_SYS + "import resource\nresource.prlimit(1, resource.RLIMIT_NOFILE, (3, 3))\n_result = 1",
    "hostname_set": RAW_SYS + "import socket\nsocket.sethostname('mine')\n_result = 1",
}
# With ctypes preloaded (not the default; the only way a program reaches these calls): SysV memory and queues
RAW_CTYPES = {
    "shm_sysv": ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                 "i = libc.shmget(0x10C0FFEE, 300 << 20, 0o1000 | 0o600)\n_result = (i, ctypes.get_errno())"),
    "msg_sysv": ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                 "_result = (libc.msgget(0x10C0FFEF, 0o1000 | 0o600), ctypes.get_errno())"),
    "sem_sysv": ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                 "_result = (libc.semget(0x10C0FFF0, 4, 0o1000 | 0o600), ctypes.get_errno())"),
}
# What a later run sees: its working area, its host name, its own priority, scheduler and CPU set, and what of the
# worker or of earlier runs it can reach (ctypes or lockdown anywhere, open descriptors beyond 0-2 and its result).
LOOK = RAW_SYS + (
    "seen = set()\nfr = sys._getframe()\nwhile fr is not None:\n"
    "    for v in list(fr.f_locals.values()) + list(fr.f_globals.values()):\n"
    "        if type(v) is type(sys):\n            seen.add(v.__name__)\n"
    "    fr = fr.f_back\nseen |= set(sys.modules)\n"
    "gc = sys.modules['_frozen_importlib']._gcd_import('gc')\n"
    "ct = sum('ctypes' in str(type(o)) or 'lockdown' in str(type(o)) for o in gc.get_objects())\n"
    "fds = []\nfor fd in range(64):\n    try:\n        os.fstat(fd)\n        fds.append(fd)\n    except OSError as e:\n"
    "        if e.errno != 9:\n            fds.append(fd)  # open, and refused (the result pipe: lockdown.py)\n"
    "st = os.statvfs('.')\n"
    "def attempt(fn):\n    try:\n        return fn()\n    except OSError as e:\n        return e.errno\n"
    "_result = {'listdir': os.listdir('.'), 'fresh': st.f_bfree == st.f_blocks,\n"
    "           'host': attempt(lambda: os.uname().nodename),\n"
    "           'nice': attempt(lambda: os.getpriority(os.PRIO_PROCESS, 0)),\n"
    "           'sched': attempt(lambda: os.sched_getscheduler(0)),\n"
    "           'cpus': attempt(lambda: len(os.sched_getaffinity(0))), 'modules': sorted(m for m in seen if 'ctypes' in m or\n"
    "           'lockdown' in m), 'ctypes_objects': ct, 'fds': fds}")


def shmem_kb() -> int:
    """The host's shared memory (tmpfs, SysV, memfd), from /proc/meminfo."""
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("Shmem:"):
                return int(line.split()[1])
    return -1


def _fence(tag: str, body: str) -> str:
    return f"```{tag}\n{body}\n```"


def _task(ty, program: str, inputs: list[str], ex, n_inputs: int = 1):
    """A teacher's reply through parse_proposal and validation."""
    if ty.name == "code_f":
        reply = "\n".join(_fence("input", i) for i in inputs) + "\n" + _fence("message", "adds")
        prop = ty.parse_proposal(reply, program=program)
    else:
        prop = ty.parse_proposal(_fence("python", program) + "\n" + _fence("input", inputs[0]))
    return ty.validate_many([prop], ex)[0]


def _statuses(ty, task, replies: list[str], ex) -> list[str]:
    return [o.status for o in ty.check_many(task, [ty.parse_answer(r) for r in replies], ex)]


# A set of two strings whose iteration order is the order they were written in under each of the executor's three
# hash seeds (they share a slot): f(s) = list(s)[0] on {a, b} validates with output a and reproduces in every round
# of a check, and {b, a}, equal by value, gives b in the sandbox: AZR's wrong answer. The trainer's own process has
# another hash seed, where the two spellings mostly iterate alike.
ORDER_PROGRAM = "def f(s):\n    return list(s)[0]"
WORDS = 1500  # about one pair in 50,000 keeps its written order under three seeds
WRITTEN = (f"ws = ['w%d' % i for i in range({WORDS})]\n_result = [i * {WORDS} + j for i in range({WORDS}) "
           f"for j in range(i + 1, {WORDS}) if list(set([ws[i], ws[j]]))[0] == ws[i] "
           "and list(set([ws[j], ws[i]]))[0] == ws[j]]")


def set_order(code_i, ex, keep: int = 6) -> dict:
    """Pairs found by running in the sandbox itself under each seed; each becomes a code_i task, checked with the
    answer respelled the other way round, and with the task's own text in other white space and parentheses."""
    from lorapop.executor import ExecutorConfig, SandboxExecutor
    from lorapop.tasks import Task

    found = None  # a second executor with the same seeds, for a result longer than a task's output may be
    with SandboxExecutor(ExecutorConfig(hashseeds=ex.hashseeds, max_repr_chars=1 << 20)) as finder:
        for seed in ex.hashseeds:
            got = set(ast_eval(finder.run(WRITTEN, hashseed=seed, timeout_s=30).value))
            found = got if found is None else found & got
    pairs = [(f"w{k // WORDS}", f"w{k % WORDS}") for k in sorted(found)][:keep]
    out = {}
    for a, b in pairs:
        given, other = f"{{{a!r}, {b!r}}}", f"{{{b!r}, {a!r}}}"
        task = _task(code_i, ORDER_PROGRAM, [given], ex)
        azr = ex.run(f"{ORDER_PROGRAM}\n_result = f({other})", hashseed=ex.hashseeds[0])
        out[given] = {"valid": isinstance(task, Task), "output": getattr(task, "outputs", None),
                      "azr_other": azr.value,
                      "checks": _statuses(code_i, task, [f"```input\n{other}\n```",
                                                         f"```input\n ( {{ {a!r} ,{b!r} }} )\n```",
                                                         f"```input\n{given}\n```"], ex)
                      if isinstance(task, Task) else task.reason}
    return out


def ast_eval(text):
    import ast

    return ast.literal_eval(text)


def probe() -> dict:
    from lorapop.executor import ExecutorConfig, SandboxExecutor
    from lorapop.executor.base import DEFAULT_PRELOAD
    from lorapop.tasks import TASK_TYPES, Task
    from lorapop.tasks.code_f import CodeF
    from lorapop.tasks.validity import check_program

    out: dict = {"uid": os.getuid(), "static_ok": {}}
    code_i, code_o = TASK_TYPES["code_i"], TASK_TYPES["code_o"]
    code_f = CodeF(n_inputs=4, n_shown=1)
    for name, prog in {**CODE_I, **CODE_O, **FAKE_F, **RIGHT_F, "clock": CLOCK}.items():
        out["static_ok"][name] = check_program(prog) is None
    import unprivileged

    ex = unprivileged.probe_executor(out, ExecutorConfig(n_workers=1, timeout_s=3.0))  # the trainer's defaults else
    if ex is None:
        return out
    with ex:
        # code_i: a wrong input (3), the gold input (5), another right one written differently (5.0 == 5 by value)
        out["code_i"] = {}
        for name, prog in CODE_I.items():
            task = _task(code_i, prog, ["5"], ex)
            out["code_i"][name] = {"valid": isinstance(task, Task), "output": getattr(task, "outputs", None),
                                   "checks": _statuses(code_i, task, ["```input\n3\n```", "```input\n5\n```",
                                                                      "```input\n5.0\n```"], ex)
                                   if isinstance(task, Task) else getattr(task, "reason", None)}
        # code_o: the right prediction (the stored output) and a wrong one
        out["code_o"] = {}
        for name, prog in CODE_O.items():
            task = _task(code_o, prog, ["5"], ex)
            if isinstance(task, Task):
                right = f"```output\n{task.outputs[0]}\n```"
                checks = [_statuses(code_o, task, [right, "```output\n-1\n```"], ex) for _ in range(3)]
            else:
                checks = task.reason
            out["code_o"][name] = {"valid": isinstance(task, Task), "output": getattr(task, "outputs", None),
                                   "checks": checks}
        out["result_step"] = {name: getattr(_task(code_o, prog, ["5"], ex), "reason", "valid")
                              for name, prog in RESULT_STEP.items()}
        # the clock: validated within one second, checked in the next one
        task = _task(code_o, CLOCK, ["5"], ex)
        if isinstance(task, Task):
            time.sleep(1.05)
            out["clock"] = {"valid": True, "output": task.outputs,
                            "checks": _statuses(code_o, task, [f"```output\n{task.outputs[0]}\n```"], ex)}
        else:
            out["clock"] = {"valid": False, "reason": task.reason}
        # code_f: f(a, b) = a + b over four inputs, one shown; odd-looking outputs must not matter either
        task = _task(code_f, "def f(a, b):\n    return a + b", ["1, 2", "3, 4", "'#', \"'\"", "'\\\\', '\\n]'"], ex)
        out["code_f_task"] = {"valid": isinstance(task, Task), "outputs": getattr(task, "outputs", None)}
        if isinstance(task, Task):
            names = list(FAKE_F) + list(RIGHT_F)
            progs = [FAKE_F.get(n) or RIGHT_F[n] for n in names]
            got = _statuses(code_f, task, [f"```python\n{p}\n```" for p in progs], ex)
            out["code_f"] = dict(zip(names, got))
        out["set_order"] = set_order(code_i, ex)
        # a set of strings prints in hash-seed order: still one value, valid, and any order of it is right
        task = _task(code_o, "def f(s):\n    return set(s.split())", ["'kiwi fig plum pear apple'"], ex)
        out["set_output"] = {"valid": isinstance(task, Task),
                             "checks": _statuses(code_o, task, ["```output\n{'apple', 'fig', 'kiwi', 'pear', 'plum'}"
                                                               "\n```", "```output\n{'apple'}\n```"], ex)
                             if isinstance(task, Task) else task.reason}
    # raw runs, each followed by a look from the next run of the same executor (one worker per seed: the same pool)
    base = shmem_kb()
    out["raw"] = {}
    ctypes_cfg = {"preload": (*DEFAULT_PRELOAD, "ctypes")}
    for codes, extra in ((RAW, {}), (RAW_CTYPES, ctypes_cfg)):
        with SandboxExecutor(ExecutorConfig(n_workers=1, timeout_s=5.0, **extra)) as ex:
            if not extra:
                first = ex.run(LOOK)
                out["look_first"] = [first.status, first.value, first.error]
            for name, code in codes.items():
                r = ex.run(code)
                held, t0 = shmem_kb() - base, time.monotonic()
                while held > 1024 and time.monotonic() - t0 < 2.0:  # the kernel frees a dead namespace's tmpfs
                    time.sleep(0.01)                                 # a few milliseconds after its last process
                    held = shmem_kb() - base
                after = ex.run(LOOK)
                ok = ex.run("def f(x):\n    return sorted(x)\n_result = f([3, 1, 2])")
                out["raw"][name] = {"run": [r.status, r.value, (r.error or "")[:160]],
                                    "look": [after.status, after.value, after.error], "next": [ok.status, ok.value],
                                    "shmem_kb_after_run": held}
    out["shmem_after_kb"] = shmem_kb() - base
    return out


if __name__ == "__main__":
    import unprivileged  # tests/unprivileged.py, beside this script

    unprivileged.print_probe(probe)
