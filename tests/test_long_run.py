"""What keeps a long run's memory flat: bounded task buffers, forgotten replaced members, the C heap's free
pages handed back (lorapop/hostmem.py)."""

from __future__ import annotations

import pytest

from lorapop import hostmem
from lorapop.config import load_config
from lorapop.configlib import ConfigError
from lorapop.diagnostics.coverage import CoverageTracker
from lorapop.tasks.base import Task
from lorapop.tasks.buffer import TaskBuffer
from lorapop.train.rating import MatchResult, Ratings


def _task(i: int, proposer: str = "t0") -> Task:
    return Task(type="code_o", program=f"def f(a):\n    return a + {i}", inputs=["1"], outputs=[str(1 + i)],
                proposer=proposer, step=i)


def test_a_bounded_buffer_drops_its_oldest_proposed_task_and_keeps_the_seeds():
    b = TaskBuffer("code_o", max_tasks=4)  # the identity seed + 3
    for i in range(6):
        assert b.add(_task(i))
    assert len(b) == 4
    assert [t.proposer for t in b][0] == "seed" and [t.step for t in b.tasks[1:]] == [3, 4, 5]
    assert b.add(_task(0))  # dropped tasks leave the dedup set too: proposed again, it is new
    assert not b.add(_task(5))  # one still held is a duplicate
    restored = TaskBuffer("code_o", seed_identity=False, max_tasks=4)
    restored.load_state_dict(b.state_dict())
    assert [t.to_dict() for t in restored] == [t.to_dict() for t in b]
    unbounded = TaskBuffer("code_o")
    for i in range(50):
        unbounded.add(_task(i))
    assert len(unbounded) == 51


def test_a_buffer_of_seeds_alone_drops_its_oldest_seed():
    b = TaskBuffer("code_o", max_tasks=2)
    for i in range(3):
        b.add(_task(i, proposer="seed"))
    assert len(b) == 2 and [t.step for t in b] == [1, 2]


def test_buffer_max_tasks_is_checked_at_load():
    assert load_config(None, []).selfplay.buffer_max_tasks == 100_000
    with pytest.raises(ConfigError, match="selfplay.buffer_max_tasks"):
        load_config(None, ["--selfplay.buffer_max_tasks=-1"])


def test_ratings_and_coverage_forget_replaced_members():
    r = Ratings()
    for m in ("t0", "t1", "s0"):
        r.add(m)
    r.record(MatchResult("t0", "s0", student_won=False))
    mu = r.mu("t0")
    r.forget({"t0", "s0"})
    assert set(r.ratings) == set(r.n_matches) == {"t0", "s0"} and r.mu("t0") == mu and r.matches("t0") == 1
    c = CoverageTracker()
    for i, who in enumerate(("t0", "t1")):
        c.add({"ast_depth": 3 + i, "cyclomatic": 1, "loc": 2, "n_node_types": 5, "input_size": 1}, who, "s0")
    filled = set(c.filled)
    c.forget({"t0", "s0"})
    assert set(c.by_teacher) == {"t0"} and set(c.by_student) == {"s0"} and c.filled == filled


TRIM_SCRIPT = """
import ctypes
from lorapop import hostmem

libc = hostmem._libc()
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD: these 256 KiB blocks come from the heap, as torch's do after a while
size, n = 256 << 10, 800  # 200 MiB
blocks = [libc.malloc(size) for _ in range(n)]
for p in blocks:
    ctypes.memset(p, 1, size)  # make the pages resident
for p in blocks[::2]:
    libc.free(p)
before = hostmem.process_memory()["perf/cpu_memory_used_gb"]
ok = hostmem.release_free_memory()
after = hostmem.process_memory()["perf/cpu_memory_used_gb"]
print(ok, before, after, (n // 2) * size / 2**30)
"""


@pytest.mark.skipif(hostmem._libc() is None, reason="not glibc: malloc_trim does not exist here")
def test_malloc_trim_hands_back_freed_heap_pages():
    """Many mid-sized buffers, every other one freed: glibc keeps the holes resident until trimmed. In a child
    process: fixing the mmap threshold there must not change how this process allocates for later tests."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", TRIM_SCRIPT], capture_output=True, text=True, timeout=120)
    ok, before, after, freed = out.stdout.split()
    assert ok == "True", out.stderr
    assert float(before) - float(after) > 0.5 * float(freed), out.stdout  # most of the 100 MiB freed
    stats = hostmem.heap_stats()
    assert stats is None or set(stats) == {"heap_in_use_mb", "heap_free_mb", "mmap_mb"}


def test_process_memory_reports_resident_and_peak():
    m = hostmem.process_memory()
    assert 0 < m["perf/cpu_memory_used_gb"] <= m["perf/cpu_memory_peak_gb"]
