"""The C heap of this process: what glibc's malloc holds, and handing its free pages back (issue 39).

On CPU, torch's activations, gradients and log-prob chunks come from the C allocator. Their sizes change from step to
step (prompt and reply lengths vary), and glibc keeps what is freed for reuse: its mmap threshold rises to the
largest buffer freed (up to 32 MiB), after which such buffers come from the heap arenas, and a freed chunk that is
not at an arena's top stays resident. Measured on ``cpu_dynamics`` (docs/RESULTS.md, "Long-run memory"), resident
memory climbed about 2.6 GB -> 7.3 GB over 15 steps of free-but-kept heap before glibc happened to trim it.
``malloc_trim(0)`` after each step gives every free page back (glibc >= 2.8 also ``madvise``s free chunks inside the
arenas, not only the top), so resident memory between steps is what is live. Elsewhere (musl, macOS, Windows) both
functions here report that they cannot, and nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any


@functools.lru_cache(maxsize=1)
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None  # glibc only; probed, never assumed


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_stats() -> dict[str, float] | None:
    """glibc's ``mallinfo2`` in MB: ``heap_in_use_mb`` (live chunks in the arenas), ``heap_free_mb`` (freed chunks
    the arenas keep), ``mmap_mb`` (buffers mapped one by one); None where glibc < 2.33 or not glibc."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _MallInfo2
    mi = libc.mallinfo2()
    mb = 1 / 2**20
    return {"heap_in_use_mb": round(mi.uordblks * mb, 1), "heap_free_mb": round(mi.fordblks * mb, 1),
            "mmap_mb": round(mi.hblkhd * mb, 1)}


def release_free_memory() -> bool:
    """Return the C heap's free pages to the OS (``malloc_trim(0)``); False where that is not available."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim(0)
    return True


def proc_status_kb(field: str, pid: int | str = "self") -> int | None:
    """A kB field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``...); None off Linux or for a process gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def process_memory() -> dict[str, float]:
    """Resident and peak resident memory of this process in GB (Linux ``/proc``; elsewhere the peak from
    ``getrusage``), under verl's metric names ``perf/cpu_memory_used_gb`` and ``perf/cpu_memory_peak_gb``."""
    rss, hwm = proc_status_kb("VmRSS"), proc_status_kb("VmHWM")
    if hwm is None:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux, bytes on macOS
        hwm = peak // 1024 if sys.platform == "darwin" else peak
    out = {"perf/cpu_memory_peak_gb": round(hwm / 2**20, 3)}
    if rss is not None:
        out["perf/cpu_memory_used_gb"] = round(rss / 2**20, 3)
    return out
