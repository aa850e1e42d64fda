"""No task can be keyed on a fact of the machine, and no run sees where the host keeps anything, as root and as an
ordinary user (user namespaces). The programs are in tests/ambient_probe.py and go through the trainer's path
(parse_proposal, validate_many); the root path runs the probe in this process (CI runs as root), the unprivileged
path as uid 65534 with every capability gone (tests/unprivileged.py). What stays observable, and why that is bounded:
docs/METHOD.md, "Facts of the machine".
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest

import unprivileged  # tests/unprivileged.py: a script as uid 65534

sys.path.insert(0, str(Path(__file__).parent))
import ambient_probe  # noqa: E402

ROOT = os.geteuid() == 0
# refused by the filter (uname, sched_getaffinity): an error run, so the task is invalid
REFUSED = {"kernel", "cpu_set"}
# what the interpreter's own record of itself reads in every worker, on every machine
BLANK = {"argv": [""], "orig_argv": [], "executable": ["", ""], "prefixes": ["/"] * 4, "path": [[], []],
         "package_paths": None, "frame_files": ["<program>", "<program>", "worker.py", "worker.py", "<string>"]}


def check(out: dict) -> None:
    assert "refused" not in out, out["refused"]
    assert set(out["facts"]) == set(ambient_probe.FACTS)
    seccomp = bool(out["protections"]["seccomp"])
    for name, got in out["facts"].items():
        # nothing of the host in any output
        assert not any(s in str(got) for s in out["host"]), (name, got, out["host"])
        if name in REFUSED and seccomp:
            assert not got["valid"] and got["reason"] == "runtime_error", (name, got)
        if not got["valid"]:
            continue
        value = ast.literal_eval(got["output"])[1]
        if name in BLANK and BLANK[name] is not None:
            assert value == BLANK[name], (name, value)
        if name == "package_paths":
            assert set(value) <= {"", "[]"}, value
        if name in ("module_files", "code_files"):
            assert value == [], (name, value)
        if name == "main_names":
            assert set(value) <= {"__name__", "__doc__", "__package__", "__loader__", "__spec__", "__annotations__",
                                  "__builtins__", "__warningregistry__", "sys"}, value
    def value(name):
        got = out["facts"][name]
        assert got["valid"], (name, got)
        return ast.literal_eval(got["output"])[1]

    assert value("stdlib_dir") is None and value("frozen_files") == []
    assert value("umask") == 0o022 and value("signals") == [0, 1, 0]  # SIG_DFL, SIGPIPE ignored (Python's), SIG_DFL
    # the run config and the module namespaces the worker dropped: not among the live objects, or without paths
    assert value("gc_config") == [] and value("gc_module_files") == []
    # native code reading the process: the environment on its stack says nothing of the trainer's directory, and no
    # page holding a live object holds the scratch path's name (with the trainer's pid)
    env = value("stack_env")
    assert env and not [e for e in env if e.startswith((b"PWD=", b"OLDPWD="))], env
    assert value("freed_memory") == [True, []]
    got = out["facts"]["cpu_caches"]  # fenced off os.sysconf (a fresh posix module still reads them: METHOD)
    assert not got["valid"] and got["reason"] == "runtime_error" and "unrecognized" in got["detail"], got
    if seccomp:  # refused: every run reads -1, root or not
        assert value("ids") == [-1] * 4
    # host memory, free memory and ticks since boot: the filter refuses sysinfo and times, and glibc then reads
    # what its stack held (addresses, different in every worker): refused as nondeterministic, or an error run
    if seccomp:
        for name in ("memory", "free_memory", "ticks_since_boot"):
            got = out["facts"][name]
            assert not got["valid"] or name == "ticks_since_boot" and ast.literal_eval(got["output"])[1] == 0.0, got
        # os.cpu_count with /sys and /proc gone and the CPU set refused: glibc's constant, not the host's count
        got = out["facts"]["cpu_count"]
        assert got["valid"] and ast.literal_eval(got["output"])[1] in (None, 1, 2), got


@pytest.mark.skipif(not ROOT, reason="the root path needs root (CI runs as root)")
def test_no_fact_of_the_machine_reaches_a_run_as_root():
    check(ambient_probe.probe())


def test_no_fact_of_the_machine_reaches_a_run_as_an_ordinary_user():
    check(unprivileged.probe_output("tests/ambient_probe.py", timeout=300))
