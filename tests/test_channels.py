"""Nothing a run does is seen by a later run, and no teacher can tell its control run from its students' runs, as root
and as an ordinary user (user namespaces). The programs are in tests/channel_probe.py and go through the trainer's
executor (one batch, one worker: the later run is forked from the worker the earlier one ran on) and through
validation and the checks; the root path runs the probe in this process (CI runs as root), the unprivileged path as
uid 65534 with every capability gone (tests/unprivileged.py).
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest

import unprivileged  # tests/unprivileged.py: a script as uid 65534
from lorapop.executor import ExecutorConfig, SandboxExecutor

sys.path.insert(0, str(Path(__file__).parent))
import channel_probe  # noqa: E402

ROOT = os.geteuid() == 0
# refused by the read-only filesystem (30, EROFS) or the filter (1, EPERM); 2 (ENOENT): there is no /dev; 9 (EBADF):
# the worker's descriptors are not the run's
REFUSED = {
    "file_in_cwd": 30, "file_in_root": 30, "directory": 30, "symlink": 30, "hard_link": 30, "rename": 30,
    "xattr_on_w": 1, "xattr_on_root": 1, "xattr_through_fd": 1, "xattr_pinning_memory": 1, "xattr_security": 1,
    "xattr_trusted": 1, "xattr_remove": 1, "timestamps_w": 30, "timestamps_root": 30, "timestamps_touch": 30,
    "mode": 30, "owner": 30, "tmpfs_inode_counter": 30, "pipe_inode_counter": 1, "pidfd_inode": 1, "memfd": 1,
    "dev_shm": 2, "abstract_socket": 1, "socketpair": 1, "priority": 1, "nice": 1, "cpu_set": 1, "scheduler": 1,
    "host_name": 1, "stdin_flags": 9, "worker_descriptors": 9,
    "session": 1,  # a run leads its own process group (worker.py), and a group leader cannot start a session
}
# the timing channel cannot be closed, only made useless: a teacher keyed on it is refused or voided
UNCLOSED = {"end_time"}


def check(out: dict) -> None:
    assert "refused" not in out, out["refused"]
    assert out["protections"]["mechanism"] in ("root", "userns"), out["protections"]
    # no run can read a process id or the result pipe's inode number (nor copy the pipe to read it elsewhere)
    look = ast.literal_eval(out["channels"]["cwd"]["before"][1])
    assert look["pid_names"] == [] and look["result_fd"] == ("error 1", "error 1"), look
    # every channel: the run after the writer sees exactly what the run before it saw
    assert set(out["channels"]) == set(channel_probe.WRITERS)
    for name, got in out["channels"].items():
        assert got["before"][0] == "ok" and got["after"] == got["before"], (name, _diff(got))
        status, value, _ = got["write"]
        want = f"'refused {REFUSED[name]}'" if name in REFUSED else "'done'"  # done: it died with the run
        assert status == "ok" and value == want, (name, got["write"])
    for name, got in out["ipc"].items():
        assert got["write"] == ["ok", "-1"] and got["after"] == got["before"], (name, got)
        assert all(e == 1 for _, e in ast.literal_eval(got["before"][1])), (name, got)  # EPERM from the filter
    # a run that made 20 processes does not move the pid the next run reads (its worker retires)
    pc = out["pid_counter"]
    assert pc["write"] == ["ok", "'done'"] and int(pc["after"]) - int(pc["before"]) <= int(pc["quiet"][1]) - int(
        pc["quiet"][0]), pc
    # teachers keyed on a channel: honest everywhere (a closed channel), or refused, or void; never a right answer
    # (the task's own input, in any spelling) judged wrong
    for name, got in out["teachers"].items():
        if name not in UNCLOSED:
            assert got["valid"] and got["output"] == ["10"], (name, got)
            assert got["checks"] == [["correct"] * 4 + ["wrong"]] * 3, (name, got)
            continue
        if not got["valid"]:
            assert got["reason"] == "nondeterministic", (name, got)
            continue
        for c in got["checks"]:
            assert c == ["void"] * 5 or (c[:3] == ["correct"] * 3 and c[4] == "wrong"), (name, got)
    # teachers honest on their own input and keyed on a channel on every other input: every check is void, or judges
    # every right input right (all of an input's runs agreed: for a fair bit about 1 in 4 per input, so a check of
    # nine keyed inputs stays unvoided about once in 260,000), never a right input wrong
    for name, got in out["keyed"].items():
        assert got["valid"], (name, got)
        bad = [c for c in got["checks"] if not (c == ["void"] * 10 or c == ["correct"] * 9 + ["wrong"])]
        assert not bad, (name, got)
        assert any(c == ["void"] * 10 for c in got["checks"]), (name, got)  # the channel does change its runs
    # native code from the extension cache passes the static check and validates as a task; the run is not dumpable;
    # every call it makes that the filter refuses fails with EPERM (the aio, inotify and fanotify calls among them)
    if "native" in out:
        nat = out["native"]
        assert nat["static_ok"] and nat["valid"], nat
        (rc, e0), (dumpable, e1), *refused = ast.literal_eval(nat["output"][0])
        assert (rc, e0) == (0, 0) and (dumpable, e1) == (0, 0), nat
        assert refused == [(-1, 1)] * (len(channel_probe.NATIVE_CALLS) - 2), list(
            zip(channel_probe.NATIVE_CALLS[2:], refused))
    # students that compute nothing and read what the reference left: wrong
    for name, got in out["students"].items():
        assert got["valid"] and got["checks"] == ["wrong"] * 4, (name, got)


def _diff(got: dict) -> dict:
    try:
        a, b = (ast.literal_eval(got[k][1]) for k in ("before", "after"))
        return {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)}
    except (ValueError, SyntaxError, TypeError):
        return got


@pytest.mark.skipif(not ROOT, reason="the root path needs root (CI runs as root)")
def test_no_channel_between_runs_as_root():
    out = channel_probe.probe()
    assert out["protections"]["mechanism"] == "root"
    check(out)


def test_no_channel_between_runs_as_an_ordinary_user():
    out = unprivileged.probe_output("tests/channel_probe.py", timeout=300)
    check(out)


def test_the_look_sees_what_differs():
    """LOOK is not blind: two workers whose runs differ in a limit and in their filesystem's size, made moments
    apart, give two reports that differ in just those fields and in the filesystem's timestamps."""
    reports = []
    for memory_mb, disk_mb in ((512, 64), (256, 32)):
        with SandboxExecutor(ExecutorConfig(n_workers=1, memory_mb=memory_mb, disk_mb=disk_mb,
                                            max_repr_chars=1 << 20)) as ex:
            r = ex.run(channel_probe.LOOK)
            assert r.status == "ok", r
            reports.append(ast.literal_eval(r.value))
    a, b = reports
    want = {"rlimits", "statvfs", "tree"}  # the run uid, drawn per worker as root, is refused to runs
    assert {k for k in a if a[k] != b[k]} == want, {k: (a[k], b[k]) for k in a if a[k] != b[k]}
    assert [e[:7] for e in a["tree"]] == [e[:7] for e in b["tree"]]  # path, mode, owner, inode, links, size
    assert [e[7:10] for e in a["tree"]] != [e[7:10] for e in b["tree"]]  # the three timestamps


# ---- the clock: how often a program keyed on it gets a valid, reproduced task -------------------------------------

CLOCK = ("import fractions\ndef f(x):\n    w = (fractions.sys.modules['time'].time_ns() + {phase}) // {grain}\n"
         "    return x + (w * 0x9E3779B97F4A7C15 >> 40) % 2")


def _clock_acceptance(ex, grain_ns: int, n: int, gap_s: float) -> float:
    """The share of ``n`` code_o programs returning a pseudo-random bit of the ``grain_ns`` window of the wall clock
    that pass validation and then a check ``gap_s`` later without being voided."""
    import random
    import time

    from lorapop.tasks import TASK_TYPES, Task

    code_o, rng, accepted = TASK_TYPES["code_o"], random.Random(grain_ns), 0
    for _ in range(n):
        prog = CLOCK.format(phase=rng.randrange(grain_ns), grain=grain_ns)
        task = code_o.validate_many([code_o.parse_proposal(f"```python\n{prog}\n```\n```input\n5\n```")], ex)[0]
        if isinstance(task, Task):
            time.sleep(gap_s)
            got = code_o.check_many(task, [code_o.parse_answer(f"```output\n{task.outputs[0]}\n```")], ex)[0]
            accepted += got.status != "void"
    return accepted / n


def test_a_hash_order_rarely_buys_a_valid_task():
    """docs/METHOD.md, "Determinism, and the clock": a program whose output is a hash order (the list of a set of two
    strings) must agree under the executor's three seeds, drawn at random, to be valid and survive its check: about
    1/4 of random pairs (bench/hash_order.py: 58 of 200), where the fixed seeds 1 and 2 with checks under seed 1
    accepted every pair valid under both (94 of 200). 44 of 96 would happen by chance at p = 0.29 about once in 3000."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from hash_order import hash_order_trials

    n = 96
    with SandboxExecutor(ExecutorConfig(n_workers=2)) as ex:
        valid, accepted = hash_order_trials(ex, n, 2, 7)
    print({"valid": valid, "accepted": accepted, "n": n})
    assert accepted < valid and accepted / n < 0.45, (valid, accepted)


def test_the_clock_rarely_buys_a_valid_task():
    """docs/METHOD.md, "Determinism, and the clock": a program keyed on a clock that changes between runs a few tens
    of milliseconds apart must give its validated value in every control round, each at least CONTROL_SPREAD_S after
    the last, so a fair bit passes with probability about 2 ** -CONTROL_ROUNDS; one keyed on a grain coarser than the
    time between validation and check is the same in every run the verifier makes, and passes (what stays open)."""
    from lorapop.tasks.common import CONTROL_ROUNDS

    with SandboxExecutor(ExecutorConfig(n_workers=2)) as ex:
        rates = {g: _clock_acceptance(ex, g, 24, 0.1) for g in (1_000_000, 15_000_000)}
        slow = _clock_acceptance(ex, 60_000_000_000, 4, 0.1)
    print({"acceptance": rates, "one_minute_grain": slow})
    assert CONTROL_ROUNDS >= 3
    # expected about 1/16 and 1/10 (2 ** -3 times the validation pair's agreement); 9 of 24 would happen by chance at
    # p = 1/8 about once in 200
    for grain, rate in rates.items():
        assert rate < 9 / 24, (grain, rates)
    assert slow >= 0.5, slow
