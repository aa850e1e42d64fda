"""Facts of the machine a run could read without a banned name (its CPU count, memory, kernel release, the
interpreter's install path, the worker's argument list), each as a code_o teacher's program through the trainer's
path (parse_proposal, validate_many): a task keyed on one must be refused, or its output must be the same on every
machine, and no output may hold a path or a number of the host. Run by tests/test_ambient.py in the test process (the
root path) and, as a script, by an unprivileged user (the user-namespace path). Standard library + lorapop only.

    python -S tests/ambient_probe.py      (prints one JSON object)
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

# Each reaches sys, os and getattr through a preloaded module's plain attribute and strings, as a teacher would: the
# static check passes them all (it is a filter, not the wall; docs/METHOD.md)
HEAD = ("import fractions\ndef f(x):\n    sys = fractions.sys\n    os = sys.modules['os']\n"
        "    ga = sys.modules['builtins'].getattr\n    vs = sys.modules['builtins'].vars\n")
FACTS = {
    "cpu_count": "os.cpu_count()",
    "cpu_set": "len(os.sched_getaffinity(0))",
    "kernel": "os.uname().release",
    "memory": "os.sysconf('SC_PHYS_PAGES')",
    "free_memory": "os.sysconf('SC_AVPHYS_PAGES')",
    "ticks_since_boot": "os.times().elapsed",
    "argv": "sys.argv",
    "orig_argv": "sys.orig_argv",
    "executable": "[sys.executable, sys._base_executable]",
    "prefixes": "[sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]",
    "path": "[sys.path, sorted(sys.path_importer_cache)]",
    # (the paths that hold a directory, at most three: an output is at most 400 characters)
    "module_files": "[p for p in sorted({str(ga(m, '_' '_file__', '')) + ' ' + str(ga(ga(m, '_' '_spec__', None), "
                    "'origin', '')) for m in list(sys.modules.values())}) if '/' in p][:3]",
    "package_paths": "sorted({str(ga(m, '_' '_path__', '')) for m in list(sys.modules.values())})",
    "code_files": "[p for p in sorted({ga(v, '_' '_code__').co_filename for m in list(sys.modules.values()) for v in "
                  "list(ga(m, '_' '_dict__', {}).values()) if ga(type(v), '_' '_name__') == 'function'}) if '/' in p][:3]",
    "frame_files": "[sys._getframe(i).f_code.co_filename for i in range(1, 6)]",
    "main_names": "sorted(vs(sys.modules['_' '_main__']))",
    "stdlib_dir": "sys._stdlib_dir",
    # what a process inherits across exec: the trainer's umask and ignored signals (probe() sets 027 and ignores
    # SIGHUP and SIGTERM before the executor starts, as a cautious or nohup'd trainer would)
    "umask": "os.umask(18)",
    "signals": "[int(sys.modules['signal'].getsignal(s)) for s in (1, 13, 15)]",
    "frozen_files": "[p for p in sorted({str(ga(ga(ga(m, '_' '_spec__', None), 'loader_state', None), 'filename', '')) "
                    "for m in list(sys.modules.values())}) if '/' in p][:3]",
    # whether the trainer runs as root or as an ordinary user (the run uid, or 0 of the user namespace)
    "ids": "[os.getuid(), os.geteuid(), os.getgid(), os.getegid()]",
    # glibc's _SC_LEVEL1_DCACHE_SIZE, _SC_LEVEL2_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE: from cpuid, no system call
    "cpu_caches": "[os.sysconf(n) for n in (188, 191, 194)]",
    # every live object, the frozen ones too (a run can unfreeze them): no dict of the worker's run config, no module
    # namespace (ctypes' is kept alive by its types after the worker drops it) with a file name holding a directory
    "gc_config": "[list(o)[:4] for o in (sys.modules['gc'].unfreeze() or sys.modules['gc'].get_objects()) "
                 "if type(o) is dict and ('max_output_chars' in o or 'ctypes_path' in o)]",
    "gc_module_files": "[o.get('_' '_file__') for o in (sys.modules['gc'].unfreeze() or sys.modules['gc'].get_objects())"
                       " if type(o) is dict and '/' in str(o.get('_' '_file__', ''))][:3]",
    # native code (ctypes, found alive through gc): the environment strings on the initial stack, between argv[0]
    # and the executable's name (AT_EXECFN) at its top; the shell's PWD would name the trainer's directory (the
    # hash seed differs between validation's two runs: left out)
    "stack_env": "[e for e in next(ga(o['string_at'](a, o['CFUNCTYPE'](o['c_void_p'], o['c_ulong'])(('getauxval', "
                 "o['CDLL'](None)))(31) - a), 'split')(b'\\0') for o in (sys.modules['gc'].unfreeze() or "
                 "sys.modules['gc'].get_objects()) if type(o) is dict and o.get('_' '_name__') == 'ctypes' for a in "
                 "[o['c_void_p'].in_dll(o['pythonapi'], 'program_invocation_name').value]) if b'=' in e and "
                 "not e.startswith(b'PYTHONHASHSEED=')]",
    # and every page holding a live object: freed blocks keep their bytes (the worker's scratch path, whose name
    # holds the trainer's pid, was found among them); whether many pages were read, and where the prefix was found
    "freed_memory": "next([len(pages) > 100, [m.start() for p in pages for m in [sys.modules['re'].search("
                    "b'lorapop-sbx-[0-9]', o['string_at'](p, 4096))] if m][:3]] for o in (sys.modules['gc'].unfreeze() or "
                    "sys.modules['gc'].get_objects()) if type(o) is dict and o.get('_' '_name__') == 'ctypes' for pages "
                    "in [sorted({id(v) & ~4095 for v in sys.modules['gc'].get_objects()})])",
}


def program(expr: str) -> str:
    return HEAD + f"    return [x, {expr}]"


def host_strings() -> list[str]:
    """What of this machine no output may hold: the interpreter's and the checkout's paths, the home directory, the
    sandbox's scratch prefix and this process's pid as it appears in it."""
    repo = str(Path(__file__).resolve().parents[1])
    out = {sys.prefix, sys.base_prefix, os.path.dirname(sys.executable), repo, "lorapop-sbx-",
           os.path.join(tempfile.gettempdir(), "lorapop"), f"-{os.getpid()}-"}
    home = os.path.expanduser("~")
    if home not in ("/", ""):
        out.add(home)
    return sorted(s for s in out if s and s != "/")


def probe() -> dict:
    from lorapop.executor import ExecutorConfig
    from lorapop.tasks import TASK_TYPES, Task
    from unprivileged import probe_executor

    import signal

    code_o = TASK_TYPES["code_o"]
    out = {"uid": os.getuid(), "host": host_strings(), "facts": {}}
    mask, hup, term = os.umask(0o027), signal.signal(signal.SIGHUP, signal.SIG_IGN), signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:  # every worker (they start as validation needs them) inherits it
        ex = probe_executor(out, ExecutorConfig(n_workers=2))
        if ex is None:
            return out
        with ex:
            props = [code_o.parse_proposal(f"```python\n{program(e)}\n```\n```input\n5\n```")
                     for e in FACTS.values()]
            for name, got in zip(FACTS, code_o.validate_many(props, ex)):
                out["facts"][name] = ({"valid": True, "output": got.outputs[0]} if isinstance(got, Task)
                                      else {"valid": False, "reason": got.reason, "detail": got.detail[:120]})
    finally:
        os.umask(mask), signal.signal(signal.SIGHUP, hup), signal.signal(signal.SIGTERM, term)
    return out


if __name__ == "__main__":
    import unprivileged  # tests/unprivileged.py, beside this script

    unprivileged.print_probe(probe)
