"""``engine.compile``: the decode step compiled once, over a declared set of shapes, before the first decode step.

A run meets new decode shapes in its first steps: the number of rows changes with the valid tasks, the lengths with
EOS, the sampling settings with the role. Compiling each on first meeting (one graph per batch bucket)
scattered tens of seconds of inductor per bucket at 7B over the first steps. Here the engine declares,
from its cache, every shape the step can meet and makes it ready at once, as vLLM does before it serves:

- the batch size and the number of (row, chunk) pairs a step reads (:mod:`.splitkv`) are *symbolic*
  (``maybe_mark_dynamic``), so dynamo and inductor compile one graph for all of them; the batch buckets start at 2,
  since torch specialises a size of 1;
- the only compile-time switch is the sampling branch (nucleus cut or not: a ``[b, V]`` sort per token that a run
  without ``top_p < 1`` should not pay). Training samples at ``top_p`` 1 (config load refuses less), so the declared
  set is one graph; ``engine.compile_nucleus`` adds the nucleus branch's (two in all), and without it
  a call that cuts a nucleus decodes eagerly rather than compile after the warm-up;
- on CUDA (``mode='reduce-overhead'``) a CUDA graph is recorded per concrete (branch, batch bucket, pair bucket);
  the pair counts are bucketed to powers of two there (one graph per doubling, not per count), only those a batch
  bucket can reach (``nb`` rows read at most ``nb`` rows of chunks), and every one is recorded at warm-up;
- off CUDA the pair count needs no bucket beyond multiples of 16 (no graph is recorded per count);
- the cache's pool and capacity are symbolic as well, so a cache of another shape compiles nothing; on CUDA its
  graphs would be recorded again, in a warm-up of its own. A run never meets one: the engine allocates its cache
  once, from ``engine.max_model_len``, and keeps it through every update (a row over the length is refused), so
  the warm-up runs in the first generate and never again (``perf/warmups`` stays 1, ``perf/cuda_graphs`` stays at
  the declared set's count).

:class:`CompileStats` counts what torch compiled and recorded (through dynamo's compile callbacks), so the engine
reports ``perf/compile_s`` and ``perf/graphs`` every step and warns, naming ``engine.compile``, about any compile
after its warm-up and if torch's recompile limit is ever reached.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .buckets import pow2_at_least, size_buckets
from .splitkv import pair_buckets

def batch_bucket(n: int, n_slots: int, compiled: bool = True) -> int:
    """The rows a step decodes when slots ``0..n-1`` hold its live rows: a power of two, at most the cache's
    ``n_slots``; compiled, at least 2 (torch specialises a size of 1, which would cost a graph of its own)."""
    return min(pow2_at_least(n, 2 if compiled else 1), n_slots)


def batch_buckets(n_slots: int) -> list[int]:
    return sorted({batch_bucket(n, n_slots) for n in range(1, n_slots + 1)})


@dataclass(frozen=True)
class DecodeShapes:
    """The declared set: every (nucleus, batch bucket, pair bucket) the compiled step can meet over a cache of
    ``n_slots`` x ``max_len`` (the pairs are the (row, chunk) pairs a step reads, :mod:`.splitkv`), the nucleus
    branch only with ``nucleus`` (engine.compile_nucleus). Only shapes that can occur: a batch of ``nb`` rows reads
    at most ``nb`` rows of chunks at the capacity. ``graphs``: what dynamo compiles for it; ``recorded``: what CUDA
    records."""
    n_slots: int
    max_len: int
    cuda_graphs: bool
    nucleus: bool = False

    @property
    def branches(self) -> tuple[bool, ...]:
        return (False, True) if self.nucleus else (False,)

    @property
    def shapes(self) -> list[tuple[bool, int, int]]:
        return [(nucleus, nb, n) for nucleus in self.branches for nb in batch_buckets(self.n_slots)
                for n in pair_buckets(self.n_slots, self.max_len, self.cuda_graphs, rows=nb)]

    @property
    def graphs(self) -> int:
        return len(self.branches)

    @property
    def recorded(self) -> int:
        return len(self.shapes) if self.cuda_graphs else 0


class CompileStats:
    """Process-wide counts of torch's compiles (dynamo frames, each through inductor) and CUDA-graph recordings, and
    the seconds they took, from dynamo's compile callbacks; one instance (:func:`compile_stats`)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.compiles = 0
        self.recordings = 0
        self.limit_hits = 0
        self._t0: float | None = None
        self._lock = threading.Lock()
        self.register()
        logging.getLogger("torch._dynamo.convert_frame").addFilter(self._limit_filter)

    def register(self) -> None:
        """(Re)attach the callbacks: ``torch._dynamo.reset()`` clears every registered callback (callback_handler.
        clear()), and a user or a library may call it at any time; without this every later compile went uncounted."""
        from torch._dynamo.callback import callback_handler

        if self._start not in callback_handler.start_callbacks:
            callback_handler.register_start_callback(self._start)
        if self._end not in callback_handler.end_callbacks:
            callback_handler.register_end_callback(self._end)

    def _start(self, *args) -> None:  # torch < 2.7 passes no CallbackArgs
        self._t0 = time.perf_counter()

    def _end(self, *args) -> None:
        trigger = getattr(getattr(args[0] if args else None, "callback_trigger", None), "name", "DYNAMO")
        with self._lock:
            if self._t0 is not None:
                self.seconds += time.perf_counter() - self._t0
                self._t0 = None
            if trigger == "CUDAGRAPH_RECORDING":
                self.recordings += 1
            elif trigger == "DYNAMO":
                self.compiles += 1

    def _limit_filter(self, record: logging.LogRecord) -> bool:
        if "hit config." in str(record.msg):
            self.limit_hits += 1
            warnings.warn("engine.compile: torch's recompile limit was reached, so the decode step now runs "
                          "uncompiled (a shape outside the declared set: please report it with "
                          "TORCH_LOGS=recompiles)", RuntimeWarning,
                          stacklevel=2)
        return True

    def snapshot(self) -> tuple[float, int, int]:
        """(seconds, compiles, CUDA-graph recordings) so far."""
        with self._lock:
            return self.seconds, self.compiles, self.recordings


_STATS: CompileStats | None = None


def compile_stats() -> CompileStats:
    global _STATS
    if _STATS is None:
        _STATS = CompileStats()
    else:
        _STATS.register()
    return _STATS


def compile_decode_step(fn, device: torch.device):
    """``torch.compile`` of the decode step: static shapes but the ones the model runner marks symbolic (batch, pair
    count), CUDA graphs on CUDA. The recompile limit leaves room for caches that grow (each a new shape)."""
    import torch._dynamo

    compile_stats()
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(16, getattr(torch._dynamo.config, name)))
    if device.type == "cuda":
        triton = torch._inductor.config.triton
        if hasattr(triton, "cudagraph_dynamic_shape_warn_limit"):  # a graph per declared shape is the design
            triton.cudagraph_dynamic_shape_warn_limit = None
    else:
        use_inductor_cache_per_capability()
    return torch.compile(fn, mode="reduce-overhead" if device.type == "cuda" else None, dynamic=False)


class CompiledDecode:
    """One engine's compiled decode step, the declared set it was last made ready for, and its cumulative figures:
    ``compile_s`` (compiling and recording), ``graphs`` (compiles), ``cuda_graphs`` (recordings), ``warm_up_s``
    (wall clock of the warm-ups) and ``after_warmup`` (compiles and recordings outside one: the aim is 0)."""

    def __init__(self, fn, device: torch.device, nucleus: bool = False) -> None:
        self.device, self.nucleus = device, nucleus
        self.step = compile_decode_step(fn, device)
        self.warm: tuple[DecodeShapes, int] | None = None  # (declared set, cache allocation) last warmed
        self.compile_s, self.graphs, self.cuda_graphs, self.warm_up_s, self.after_warmup = 0.0, 0, 0, 0.0, 0
        self.warm_ups = 0  # warm-ups run: one per run, since the run keeps one cache (kvcache.KVCacheKeeper)

    @contextmanager
    def call(self, runner, cache, allocation: int):
        """Around one generate: the warm-up over ``cache``'s declared set when it is new (on CUDA also when the
        cache was allocated again: its graphs read it at its address), then the call, counting any compile."""
        before = compile_stats().snapshot()
        try:
            shapes = DecodeShapes(cache.n_slots, cache.max_len, self.device.type == "cuda", self.nucleus)
            if self.warm != (shapes, allocation if shapes.cuda_graphs else 0):
                before = self._warm_up(runner, shapes, before)
                self.warm = (shapes, allocation if shapes.cuda_graphs else 0)
            yield
        finally:
            self._count(before, warm_up=False)

    def _warm_up(self, runner, shapes: DecodeShapes, before):
        t0 = time.perf_counter()
        self.warm_ups += 1
        runner.warm_up(shapes.shapes, calls=3 if shapes.cuda_graphs else 1)  # CUDA graph trees: warm, record, replay
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - t0
        self.warm_up_s += seconds
        after = compile_stats().snapshot()
        report_warm_up(shapes, seconds, *self._count(before, warm_up=True))
        return after

    def _count(self, before, *, warm_up: bool) -> tuple[int, int]:
        seconds, compiles, recordings = (a - b for a, b in zip(compile_stats().snapshot(), before))
        self.compile_s += seconds
        self.graphs += compiles
        self.cuda_graphs += recordings
        if not warm_up and compiles + recordings:
            self.after_warmup += compiles + recordings
            warnings.warn(f"engine.compile: the decode step compiled {compiles} graphs and recorded {recordings} CUDA "
                          f"graphs after its warm-up ({seconds:.1f}s): a shape outside its declared set (rerun "
                          "with TORCH_LOGS=recompiles to see which)", RuntimeWarning,
                          stacklevel=4)
        return compiles, recordings


def report_warm_up(shapes: DecodeShapes, seconds: float, compiles: int, recordings: int) -> None:
    rec = f" and {recordings} CUDA graphs" if shapes.cuda_graphs else ""
    print(f"engine.compile: decode step ready for {len(shapes.shapes)} shapes (batch 1..{shapes.n_slots}, "
          f"rows of up to {shapes.max_len} positions, {'with and without' if shapes.nucleus else 'no'} top_p cut, any "
          f"adapters): {compiles} compiled graphs{rec} "
          f"in {seconds:.1f}s", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- inductor's cache
def use_inductor_cache_per_capability() -> None:
    """Point inductor at :func:`inductor_cache_dir` unless the user chose a directory. Inductor writes its default
    into ``TORCHINDUCTOR_CACHE_DIR`` the first time it looks, so that value counts as not chosen."""
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not chosen or os.path.abspath(chosen) == os.path.abspath(_inductor_default_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache_dir()


def _inductor_default_dir() -> str:
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        return default_cache_dir()
    except ImportError:  # a private module: fall back to where torch puts it
        import tempfile

        return os.path.join(tempfile.gettempdir(), "torchinductor_" + os.environ.get("USER", "user"))


def inductor_cache_dir(capability: str | None = None) -> str:
    """Where CPU compiles keep inductor's on-disk cache unless ``TORCHINDUCTOR_CACHE_DIR`` says otherwise: one
    directory per CPU capability (torch's probe, which ``ATEN_CPU_CAPABILITY`` can lower). Inductor's cache key
    leaves the capability out: under ``ATEN_CPU_CAPABILITY=avx2`` kernels cached by an AVX-512 run of the same graph
    were reused and the compiled decode produced token 0 everywhere (torch 2.13, docs/RESULTS.md, "Green on every
    CPU"); a cache shared by machines with different ISAs would do the same."""
    cap = (capability or torch.backends.cpu.get_cpu_capability()).lower()
    return os.path.join(_inductor_default_dir(), f"cpu-{cap}")
