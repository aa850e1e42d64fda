"""The C heap of this process: what glibc's malloc holds, and handing its free pages back.

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
import weakref
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


def lazy_zeros(shape: tuple[int, ...], dtype: Any) -> Any:
    """A zero-filled CPU tensor whose pages become resident only when touched: an anonymous memory map, which the OS
    fills with zeros page by page on first access, where ``torch.zeros`` writes (so makes resident) every byte at
    once. For buffers sized for the worst case and touched only as far as they are used (the KV cache: its rows'
    real lengths, not its capacity). Transparent huge pages are declined where the OS allows it, so a touch costs
    one small page, not 2 MB of them. Unmapped when the last tensor viewing it is freed: its pages go straight back
    to the OS, without malloc_trim; :func:`drop_pages` hands them back while keeping the tensor."""
    import math
    import mmap

    import torch

    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if n == 0:
        return torch.zeros(shape, dtype=dtype)
    private = getattr(mmap, "MAP_PRIVATE", None), getattr(mmap, "MAP_ANONYMOUS", None)
    # private: Python's default anonymous map is shared memory, whose pages MADV_DONTNEED would not free
    buf = mmap.mmap(-1, n, flags=private[0] | private[1]) if None not in private else mmap.mmap(-1, n)
    if hasattr(buf, "madvise") and hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    t = torch.frombuffer(buf, dtype=dtype).view(shape)  # the tensor holds a reference to the map
    key = t.data_ptr()
    _maps[key] = buf
    weakref.finalize(t, _maps.pop, key, None)
    return t


_maps: dict[int, Any] = {}  # data_ptr -> the memory map of each live lazy_zeros tensor


def drop_pages(t: Any) -> bool:
    """Hand a :func:`lazy_zeros` tensor's pages back to the OS and make it all zeros again (``MADV_DONTNEED`` on
    its map: the next touch of a page gets a fresh zero page), keeping the tensor and its address. False where it
    cannot (not such a tensor, or no ``madvise``): the caller drops the tensor instead."""
    import mmap

    buf = _maps.get(t.data_ptr())
    if buf is None or not hasattr(buf, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    buf.madvise(mmap.MADV_DONTNEED)
    return True


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MAP_LARGE_BYTES = 2**20


def map_large_allocations(threshold: int = MAP_LARGE_BYTES) -> bool:
    """Serve every allocation of ``threshold`` bytes or more by its own memory map, returned to the OS when freed
    (glibc ``mallopt(M_MMAP_THRESHOLD)``). glibc's default raises that threshold to the largest block freed, up to
    32 MiB, after which activations below it come from the heap, where freed blocks of one size rarely fit the
    next's: one update of 8 rows x 1060 tokens with checkpointing (float32, embedded model) held 0.98 GB live at
    its peak and grew resident memory by 5.7 GB that way, 1.5 GB with a 1 MiB threshold (docs/RESULTS.md, "The CPU
    demo's memory"). False (nothing changes) where the C library is not glibc."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold)))


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


_peak_before_reset_kb = 0  # the largest VmHWM seen before a reset_peak(): the process's peak survives resets


def peak_kb() -> int:
    """Peak resident memory of this process in kB since it started (across :func:`reset_peak` calls): ``VmHWM`` on
    Linux, elsewhere ``getrusage``'s maximum."""
    hwm = proc_status_kb("VmHWM")
    if hwm is None:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux, bytes on macOS
        hwm = peak // 1024 if sys.platform == "darwin" else peak
    return max(hwm, _peak_before_reset_kb)


_open_windows: "weakref.WeakSet[PeakWindow]" = weakref.WeakSet()


def reset_peak() -> bool:
    """Linux's ``VmHWM`` drops to the current resident size (``5`` written to ``/proc/self/clear_refs``), so the
    next reading is the peak since now; :func:`peak_kb` keeps the process's, and every open :class:`PeakWindow`
    keeps its own. False where the kernel does not allow it (off Linux, some sandboxes): VmHWM then only grows."""
    global _peak_before_reset_kb
    hwm = proc_status_kb("VmHWM")
    if hwm is None:
        return False
    _peak_before_reset_kb = max(_peak_before_reset_kb, hwm)
    for w in list(_open_windows):
        w.fold(hwm)
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    return True


class PeakWindow:
    """The peak resident memory of this process from the window's opening until it is read, exact however many other
    windows open inside it (each opening resets VmHWM, see :func:`reset_peak`, after every open window has taken the
    peak so far). ``exact`` False: the kernel cannot reset VmHWM, and :meth:`peak_kb` is the process's peak so far,
    which is this window's only where the process's peak rose inside it (:meth:`raised`)."""

    def __init__(self, reset: bool = True) -> None:
        """``reset`` False: the window starts at the last reset (or the process's start) instead of now."""
        self._kb = 0
        self._before = peak_kb() if reset else 0
        # reset before joining the open windows: the peak before the reset is theirs to keep, not this window's
        self.exact = reset_peak() if reset else proc_status_kb("VmHWM") is not None
        _open_windows.add(self)

    def fold(self, hwm_kb: int) -> None:
        self._kb = max(self._kb, hwm_kb)

    def peak_kb(self) -> int:
        return max(self._kb, proc_status_kb("VmHWM") or 0) if self.exact else peak_kb()

    def raised(self) -> bool:
        """Whether this window holds a true figure: always when exact, else when the process's peak rose in it."""
        return self.exact or peak_kb() > self._before

    def close(self) -> int:
        kb = self.peak_kb()
        _open_windows.discard(self)
        return kb


class StagePeaks:
    """Peak resident memory per named stage: :meth:`begin` closes the open stage and opens the next; :meth:`take`
    returns the peaks (GB) recorded since the last take, in the order the stages ran, the open stage's so far
    included (what it does after that counts in the process's peak only). The first stage, ``first``, runs from the
    last VmHWM reset (the process's start in a fresh process). A stage's figure includes what was still resident
    when it began. Where VmHWM cannot be reset, a stage is recorded only where the process's peak rose in it."""

    def __init__(self, first: str = "start") -> None:
        self.peaks: dict[str, float] = {}
        self._name: str | None = first
        self._win: PeakWindow | None = PeakWindow(reset=False)

    def begin(self, name: str) -> None:
        self._close()
        self._name, self._win = name, PeakWindow()

    def _close(self) -> None:
        if self._win is None or self._name is None:
            return
        kb = self._win.close()
        if self._win.raised():
            self.peaks[self._name] = max(self.peaks.get(self._name, 0.0), round(kb / 2**20, 3))
        self._win = None

    def take(self) -> dict[str, float]:
        self._close()
        out, self.peaks = self.peaks, {}
        self._name, self._win = None, PeakWindow()  # the rest of the open stage counts in no stage's figure
        return out


def process_memory() -> dict[str, float]:
    """Resident and peak resident memory of this process in GB (Linux ``/proc``; elsewhere the peak from
    ``getrusage``), under verl's metric names ``perf/cpu_memory_used_gb`` and ``perf/cpu_memory_peak_gb``."""
    rss = proc_status_kb("VmRSS")
    out = {"perf/cpu_memory_peak_gb": round(peak_kb() / 2**20, 3)}
    if rss is not None:
        out["perf/cpu_memory_used_gb"] = round(rss / 2**20, 3)
    return out
