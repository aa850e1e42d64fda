"""Lean workers (ExecutorConfig.lean_preload): every run tries a worker that preloads only the common modules, and a
run that imports anything that worker lacks is run again from its start on a full worker, whose run alone counts.
What must hold: the verdict of every program is the full worker's, whichever worker served it."""

from __future__ import annotations

import os

import pytest

from lorapop.executor import ExecutorConfig, SandboxExecutor
from lorapop.executor.handle import escalated, run_result
from lorapop.executor.stored import ESCALATE_EXIT
from lorapop.tasks import TASK_TYPES, Proposal, read_seed_file

ROOT = os.geteuid() == 0
SEEDS = (101, 202, 303)


@pytest.fixture(scope="module")
def pair():
    """The same sandbox with lean workers (the default) and without."""
    kw = dict(timeout_s=2.0, n_workers=1, hashseeds=SEEDS, require_isolation=ROOT)
    lean, full = SandboxExecutor(ExecutorConfig(**kw)), SandboxExecutor(ExecutorConfig(lean_preload=(), **kw))
    yield lean, full
    lean.close()
    full.close()


def _served(ex: SandboxExecutor) -> dict[bool, int]:
    out = {True: 0, False: 0}
    for w in ex._all:
        out[w.lean] += w.served
    return out


# (program, where it runs: "lean"; "full", its text importing what a lean worker lacks; "escalates", a lean run
# ending at an import no text shows, then a full run). Imports a lean worker has, and ones it lacks: a preloaded
# module, a codec's (C and pure Python), a module no worker has (ModuleNotFoundError on the full worker too), caught
# or not; an import after output (the full run's output counts from nothing) and after a long computation; a codec on
# one path only.
PROGRAMS = [
    ("def f(x):\n    return sorted(x)\n_result = f([3, 1, 2])", "lean"),
    ("import collections, typing, copy, heapq\n_result = collections.Counter('abca').most_common(1)", "lean"),
    ("import decimal\n_result = str(decimal.Decimal(1) / 7)", "full"),
    ("from fractions import Fraction\n_result = Fraction(3, 6)", "full"),
    ("_result = 'ab'.encode('gbk') + 'c'.encode('cp1252')", "escalates"),
    ("_result = b'\\xff'.decode('cp437')", "escalates"),
    ("import nosuchmodule\n_result = 1", "full"),
    ("try:\n    import nosuchmodule\nexcept ImportError as e:\n    _result = ('caught', e.name)", "full"),
    ("import dataclasses\n@dataclasses.dataclass\nclass P:\n    x: int\n_result = repr(P(3))", "full"),
    ("print('x' * 6000)\n'a'.encode('cp437')\nprint('y' * 6000)\n_result = 1", "escalates"),
    ("n = sum(range(200000))\nimport json\n_result = (n, json.dumps([1]))", "lean"),
    ("def g(k):\n    return 'a'.encode('cp437') if k else 'lean'\n_result = [g(0)]", "lean"),
    ("def g(k):\n    return 'a'.encode('cp437') if k else 'lean'\n_result = [g(0), g(1)]", "escalates"),
    ("import os\nos._exit(%d)" % ESCALATE_EXIT, "escalates"),  # a program's own exit with that code: a crash
    ("def r(n):\n    return r(n + 1)\n_result = r(0)", "lean"),
    ("x = [0] * (1 << 30)", "lean"),
]


def test_a_lean_workers_verdict_is_the_full_workers(pair):
    """Each program alone: the same status, value and error with lean workers as without them, served where its
    text and its run say."""
    lean, full = pair
    lean.run("_result = 0")  # a lean worker started: its modules known
    for program, where in PROGRAMS:
        before = _served(lean)
        a, b = lean.run(program), full.run(program)
        assert (a.status, a.value, a.error) == (b.status, b.value, b.error), (program, a, b)
        after = _served(lean)
        want = {"lean": (1, 0), "full": (0, 1), "escalates": (1, 1)}[where]
        assert (after[True] - before[True], after[False] - before[False]) == want, (program, where, after)
    assert "decimal" in lean.importable  # the full worker's modules, which the static check takes


def test_validation_of_the_seed_tasks_is_the_same_with_lean_workers(pair):
    """The 256 shipped seed tasks, validated through the trainer's path under the same hash seeds: every verdict
    (valid or not, why, and the outputs) the same with lean workers as without them."""
    from lorapop.data import data_dir

    lean, full = pair
    props = [Proposal("code_o", t.program, t.inputs)
             for t in read_seed_file(data_dir() / "seeds" / "azr_7b_coder_seed_io.jsonl", "code_o")]
    got = [TASK_TYPES["code_o"].validate_many(props, ex) for ex in (lean, full)]

    def key(r):
        return ("valid", r.outputs) if hasattr(r, "outputs") else (r.reason, r.detail.split(" object at ")[0])
    assert [key(r) for r in got[0]] == [key(r) for r in got[1]]
    assert sum(hasattr(r, "outputs") for r in got[0]) >= 200


def test_only_a_lean_workers_exit_code_runs_again():
    """The trainer reads the escalation from the lean run's exit code alone (whatever it wrote); a timed-out run is a
    timeout, and a full worker's run that exits with that code is a crash like any other exit."""
    report = {"wstatus": ESCALATE_EXIT << 8, "timed_out": False, "duration": 0.1}
    assert escalated(report) and not escalated(dict(report, timed_out=True))
    assert not escalated(dict(report, wstatus=(ESCALATE_EXIT + 1) << 8)) and not escalated(dict(report, wstatus=9))
    r = run_result(report, b"", False, 1.0, 400)
    assert (r.status, r.error) == ("crashed", f"exited with code {ESCALATE_EXIT} before returning a result")


def test_a_lean_worker_holds_nothing_the_full_one_lacks():
    """A module named in lean_preload but not in preload stays out of the lean worker too: the program that imports
    it gets the full worker's error, as without lean workers."""
    kw = dict(timeout_s=2.0, n_workers=1, preload=("re", "math"), preload_codecs=False, require_isolation=ROOT)
    with SandboxExecutor(ExecutorConfig(lean_preload=("re", "fractions"), **kw)) as ex:
        got = ex.run("import fractions\n_result = 1")
        assert got.status == "error" and "No module named 'fractions'" in got.error, got
        assert "fractions" not in {m for w in ex._all if w.lean for m in w.info.get("preloaded", ())}


def test_a_run_has_the_same_room_on_either_worker(pair):
    """A run's address-space limit counts its worker's mappings, and a lean worker maps less: it fills its address
    space (not its memory) up to the full worker's, so the largest allocation that succeeds is the same on both
    but for the heap's own steps (a student's unused import had moved a run onto the full worker, 4.8 MB
    shorter, and into a MemoryError)."""
    lean, _ = pair
    room = ("def room():\n    lo, hi = 0, 1 << 31\n    while hi - lo > 4096:\n        mid = (lo + hi) // 2\n"
            "        try:\n            b = bytes(mid)\n            del b\n            lo = mid\n"
            "        except MemoryError:\n            hi = mid\n    return lo\n_result = room()")
    before = _served(lean)
    a, b = lean.run(room), lean.run("import fractions\n" + room)
    assert _served(lean)[False] == before[False] + 1  # the second on the full worker
    # within the heap's own steps (glibc grows it 128 KiB at a time), less than one import costs a script's room
    assert a.ok and b.ok and abs(int(a.value) - int(b.value)) <= 512 << 10, (a, b)


def test_an_escalated_run_is_charged_both_runs_and_a_shown_import_neither(pair):
    """Validation bounds a run's time (too_slow): a lean run ended by an import no text shows (a codec) is charged
    with the full run after it, or a program could spend its clock on the lean worker alone and pass as half as slow
    as it was; a program whose text shows the import goes to a full worker at once, so an honest late import does its
    work once and is charged once."""
    lean, _ = pair
    spin = "import time\nt = time.perf_counter()\nwhile time.perf_counter() - t < 0.3:\n    pass\n"
    unseen = lean.run(spin + "'a'.encode('cp437')\n_result = 1")
    before = _served(lean)
    shown = lean.run(spin + "import decimal\n_result = 1")
    assert _served(lean)[True] == before[True]  # never on the lean worker
    assert unseen.ok and unseen.duration_s >= 0.6, unseen
    assert shown.ok and 0.3 <= shown.duration_s < 0.55, shown
