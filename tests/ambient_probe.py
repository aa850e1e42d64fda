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

    code_o = TASK_TYPES["code_o"]
    out = {"uid": os.getuid(), "host": host_strings(), "facts": {}}
    ex = probe_executor(out, ExecutorConfig(n_workers=2))
    if ex is None:
        return out
    with ex:
        props = [code_o.parse_proposal(f"```python\n{program(e)}\n```\n```input\n5\n```") for e in FACTS.values()]
        for name, got in zip(FACTS, code_o.validate_many(props, ex)):
            out["facts"][name] = ({"valid": True, "output": got.outputs[0]} if isinstance(got, Task)
                                  else {"valid": False, "reason": got.reason, "detail": got.detail[:120]})
    return out


if __name__ == "__main__":
    import unprivileged  # tests/unprivileged.py, beside this script

    unprivileged.print_probe(probe)
