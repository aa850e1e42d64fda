"""Shared plumbing for the operators: adapter checks, shape groups, seeded noise.

An adapter is ``dict[str, tuple[A, B]]`` with A: (r, d_in), B: (d_out, r), the engine's layout. Modules are always
visited in the first parent's key order, so a seeded generator gives the same child for the same input.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

Adapter = dict[str, tuple[Tensor, Tensor]]

# std below this counts as "no spread" (a PEFT-fresh B is exactly 0); then noise falls back to 1/sqrt(last dim).
STD_FLOOR = 1e-12


_POOL: ThreadPoolExecutor | None = None


def pmap(fn: Callable, items: Sequence) -> list:
    """``[fn(x) for x in items]`` on ``torch.get_num_threads()`` Python threads (serial with 1 thread).

    For the per-module LAPACK/BLAS calls (thin QRs, rebuild matmuls): each is too small to gain from torch's
    intra-op threads, so the modules are spread over Python threads instead (torch releases the GIL inside these
    ops), each worker running its ops single-threaded. Order and results are the same as the serial loop; no
    randomness is drawn here.
    """
    global _POOL
    caller = torch.get_num_threads()
    workers = min(caller, 8)
    if workers <= 1 or len(items) <= 1 or _on_cuda(items[0]):
        # CUDA ops are asynchronous launches: Python threads gain nothing there, and serial keeps every launch on
        # the caller's current stream.
        return [fn(x) for x in items]
    _init_cuda_linalg()
    if _POOL is None or _POOL._max_workers != workers:
        if _POOL is not None:
            _POOL.shutdown(wait=False)
        _POOL = _single_threaded_pool(workers, caller)
    try:
        return list(_POOL.map(fn, items))
    finally:
        # torch.set_num_threads also stores a process-wide count that every thread not yet initialised adopts at
        # its first torch call: the workers' 1 must not become the caller's, or a later thread's.
        if torch.get_num_threads() != caller:
            torch.set_num_threads(caller)


def _pin_one_thread(barrier: threading.Barrier) -> None:
    # get first: a thread whose first torch call is set_num_threads re-initialises from the process-wide count at
    # its next call (measured on torch 2.13), which would undo the 1 once the caller restores its own count.
    torch.get_num_threads()
    torch.set_num_threads(1)
    barrier.wait()


def _single_threaded_pool(workers: int, caller: int) -> ThreadPoolExecutor:
    """A pool whose every worker runs its torch ops on one intra-op thread, all started before it is returned.

    Left at the default, every LAPACK/BLAS call in every worker starts its own OpenMP team, and workers x teams
    threads on this many cores spin against each other (measured on 2 cores: M1 at rank 64 took 8.2 s this way,
    1.1 s with one thread per worker, 2.0 s serially on one thread). The barrier holds each pinning task until all
    are running, so each lands on its own worker and every worker is pinned before the process-wide count is set
    back to ``caller``'s.
    """
    pool = ThreadPoolExecutor(workers, thread_name_prefix="lorapop-evolve")
    barrier = threading.Barrier(workers)
    for f in [pool.submit(_pin_one_thread, barrier) for _ in range(workers)]:
        f.result()
    torch.set_num_threads(caller)
    return pool


_CUDA_LINALG_READY = False


def _init_cuda_linalg() -> None:
    """Load torch's CUDA linear-algebra library on the calling thread before any worker can touch it.

    torch builds for CUDA load ``libtorch_cuda_linalg`` lazily on the first ``torch.linalg`` call, and that lazy
    wrapper is not thread-safe: two workers making the first call at once die with "lazy wrapper should be called
    at most once" (pytorch/pytorch#90613; seen at the first PBT replacement on an H100). Items given as module
    names can still reach CUDA tensors inside ``fn``, so this runs whenever CUDA is initialised in the process."""
    global _CUDA_LINALG_READY
    if _CUDA_LINALG_READY or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    x = torch.eye(2, device="cuda")
    torch.linalg.qr(x)
    torch.linalg.svd(x)
    _CUDA_LINALG_READY = True


def _on_cuda(item) -> bool:
    """Whether ``item`` (a tensor, or a tuple/list holding tensors) has a tensor on a CUDA device."""
    if isinstance(item, Tensor):
        return item.is_cuda
    if isinstance(item, (tuple, list)):
        return any(_on_cuda(x) for x in item)
    return False


def check_adapters(parents: Sequence[Adapter]) -> None:
    """Same module keys, shapes and dtype in every parent; A (r, d_in) and B (d_out, r) agree on r."""
    if not parents:
        raise ValueError("no parents given")
    first = parents[0]
    if not isinstance(first, dict) or not first:
        raise ValueError("an adapter is a non-empty dict[str, (A, B)]")
    for name, (A, B) in first.items():
        if A.ndim != 2 or B.ndim != 2 or A.shape[0] != B.shape[1]:
            raise ValueError(f"module {name}: expected A (r, d_in) and B (d_out, r), got {tuple(A.shape)} and "
                             f"{tuple(B.shape)}")
        if A.dtype != B.dtype or not A.dtype.is_floating_point:
            raise ValueError(f"module {name}: A and B must share one floating dtype, got {A.dtype} and {B.dtype}")
    for i, p in enumerate(parents[1:], start=1):
        if p.keys() != first.keys():
            raise ValueError(f"parent {i} has different modules from parent 0")
        for name, (A, B) in p.items():
            A0, B0 = first[name]
            if A.shape != A0.shape or B.shape != B0.shape or A.dtype != A0.dtype:
                raise ValueError(f"parent {i}, module {name}: shape/dtype {tuple(A.shape)}, {tuple(B.shape)}, "
                                 f"{A.dtype} differs from parent 0's {tuple(A0.shape)}, {tuple(B0.shape)}, {A0.dtype}")


def dtype_of(adapter: Adapter) -> torch.dtype:
    return next(iter(adapter.values()))[0].dtype


def shape_groups(adapter: Adapter) -> list[list[str]]:
    """Module names grouped by (A shape, B shape), in first-appearance order: the unit of batched linear algebra."""
    groups: dict[tuple, list[str]] = {}
    for name, (A, B) in adapter.items():
        groups.setdefault((tuple(A.shape), tuple(B.shape)), []).append(name)
    return list(groups.values())


def in_order(child: Adapter, like: Adapter) -> Adapter:
    """``child`` with ``like``'s key order (the grouped operators fill modules group by group)."""
    return {n: child[n] for n in like}


def copy_adapter(adapter: Adapter) -> Adapter:
    return {n: (A.clone(), B.clone()) for n, (A, B) in adapter.items()}


def randn(shape, generator: torch.Generator, device: torch.device) -> Tensor:
    """Standard normal float32 noise from ``generator`` (drawn on the generator's device, moved if needed)."""
    x = torch.randn(shape, generator=generator, device=generator.device, dtype=torch.float32)
    return x if x.device == device else x.to(device)


def rand(shape, generator: torch.Generator, device: torch.device) -> Tensor:
    x = torch.rand(shape, generator=generator, device=generator.device, dtype=torch.float32)
    return x if x.device == device else x.to(device)


def randint(high: int, shape, generator: torch.Generator) -> Tensor:
    return torch.randint(high, shape, generator=generator, device=generator.device).cpu()


def uniform_scalar(low: float, high: float, generator: torch.Generator) -> float:
    return low + (high - low) * float(torch.rand((), generator=generator, device=generator.device))


def gaussian_perturb(F: Tensor, eps: float, generator: torch.Generator) -> Tensor:
    """``F + eps * std(F) * N(0, 1)`` in float32, cast back; std 0 (a fresh B) falls back to ``1/sqrt(last dim)``.

    For B (d_out, r) the last dim is r, for A (r, d_in) it is d_in: the fallback is the scale of a unit-variance
    input mapped through that factor, so a zero B becomes a small non-zero B and ``dW = s B A`` really moves.
    """
    std = float(F.float().std()) if F.numel() > 1 else 0.0
    if not math.isfinite(std) or std <= STD_FLOOR:
        std = 1.0 / math.sqrt(F.shape[-1])
    noise = randn(F.shape, generator, F.device)
    # One fused pass: noise * (eps * std) + F, written into the noise buffer (float32 even for bf16 F).
    out = torch.add(F, noise, alpha=eps * std, out=noise) if F.dtype == torch.float32 else noise.mul_(eps * std).add_(F)
    return out.to(F.dtype)


def keep_mask(shape, p: float, generator: torch.Generator, device: torch.device) -> Tensor:
    """Bernoulli(1 - p) keep-mask from 16-bit random integers (4 per 64-bit draw).

    Drawing 64-bit integers and reading them as four int16 costs about a quarter of drawing one float per
    element, and DARE draws a mask for every factor element of every parent. The drop probability is quantised to
    1/65536 (recorded value is the exact one used: ``round(p * 65536) / 65536``).
    """
    n = math.prod(shape)
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=generator.device)
    # Full signed 64-bit range: the default random_() range leaves the top bit 0, which would bias one int16 lane.
    words.random_(-(2**63), None, generator=generator)
    lanes = words.view(torch.int16)[:n].view(shape)
    threshold = -32768 + round(p * 65536)
    mask = lanes >= threshold
    return mask if mask.device == device else mask.to(device)


def quantised_p(p: float) -> float:
    return round(p * 65536) / 65536
