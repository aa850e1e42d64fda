"""``engine.dtype: auto``: the base model's dtype chosen for the device the run is on.

On CUDA, bfloat16 where the GPU supports it, else float32. On CPU the answer depends on the processor: with native
bfloat16 (AVX512-BF16 or AMX) oneDNN's bf16 GEMMs beat float32, without it torch falls back to a scalar bf16 GEMM
that was measured 38x slower than float32 on an AVX2-only EPYC ([512, 576] x [576, 1536]: 0.97 s vs 0.025 s). So
bfloat16 is picked only when the CPU's flags allow it *and* a quick probe (forward- and backward-shaped matmuls at
the embedded model's sizes, about half a second) shows bf16 at least as fast as float32. The decision is
printed once per process; the trainer saves the resolved name in the run's ``config.yaml``, so a resumed run keeps
the numerics it started with even on another machine.
"""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path
from typing import Callable

# float64 is for numerical references (tests of identities that float32 rounding would bury); never picked by auto.
DTYPES = ("float32", "bfloat16", "float16", "float64")
# CPU flags (as /proc/cpuinfo spells them) that give native bf16 dot products.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The ``flags`` of the first processor in ``/proc/cpuinfo`` (empty where there is none, e.g. macOS)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags") and ":" in line:
            return set(line.split(":", 1)[1].split())
    return set()


def bf16_matmul_ratio(reps: int = 3) -> float:
    """Time of bf16 over float32 matmuls on this CPU (< 1: bf16 is faster), worst of the probed shapes.

    The shapes are a decode-sized, a prefill-sized and a transposed (backward) product at hidden size 576 and MLP
    size 1536; the backward shapes were the slowest bf16 cases on the AVX2 machine. Each shape takes the best of
    ``reps`` alternating runs, so a busy neighbour on a shared machine does not decide the dtype."""
    import torch

    shapes = [((32, 576), (576, 1536), False), ((512, 576), (576, 1536), False), ((1536, 512), (512, 576), True)]
    worst = 0.0
    for (m, k), (k2, n), transposed in shapes:
        a32 = torch.randn(k, m).t() if transposed else torch.randn(m, k)  # transposed: a gradient-shaped read
        b32 = torch.randn(k2, n)
        args = {torch.float32: (a32, b32), torch.bfloat16: (a32.to(torch.bfloat16), b32.to(torch.bfloat16))}
        best = {dt: float("inf") for dt in args}
        for dt, (a, b) in args.items():
            torch.mm(a, b)  # warm-up: oneDNN builds its primitive on the first call
        for _ in range(reps):
            for dt, (a, b) in args.items():
                t0 = time.perf_counter()
                torch.mm(a, b)
                best[dt] = min(best[dt], time.perf_counter() - t0)
        worst = max(worst, best[torch.bfloat16] / max(best[torch.float32], 1e-9))
    return worst


def choose_cpu_dtype(flags: set[str], probe: Callable[[], float]) -> tuple[str, str]:
    """(dtype, reason): bfloat16 only with a native bf16 flag and a probe ratio <= 1; the probe runs only then."""
    native = [f for f in BF16_FLAGS if f in flags]
    if not native:
        return "float32", "no native bfloat16 on this CPU (no AVX512-BF16/AMX)"
    ratio = probe()
    if ratio <= 1.0:
        return "bfloat16", f"{'/'.join(native)} present and bf16 matmuls {1 / max(ratio, 1e-9):.1f}x float32's speed"
    return "float32", f"{'/'.join(native)} present but bf16 matmuls {ratio:.1f}x slower than float32 here"


def check_dtype_name(name: str) -> str:
    if name != "auto" and name not in DTYPES:
        raise ValueError(f"engine.dtype: {name!r} is not one of auto, {', '.join(DTYPES)}")
    return name


@functools.lru_cache(maxsize=None)
def _resolve(name: str, device_type: str, cuda_bf16: bool) -> str:
    if name != "auto":
        return name
    if device_type == "cuda":
        dtype, reason = ("bfloat16", "the GPU supports bfloat16") if cuda_bf16 else \
            ("float32", "the GPU has no bfloat16 support")
    elif device_type == "cpu":
        dtype, reason = choose_cpu_dtype(cpu_flags(), bf16_matmul_ratio)
    else:
        dtype, reason = "float32", f"no probe for device type {device_type!r}"
    print(f"engine.dtype=auto -> {dtype} on {device_type} ({reason})", file=sys.stderr, flush=True)
    return dtype


def resolve_dtype(name: str, device: object = "cpu") -> str:
    """``name`` itself unless it is ``auto``; then the dtype for ``device`` (a torch.device or its string)."""
    check_dtype_name(name)
    if name != "auto":
        return name
    import torch

    dev = torch.device("cuda" if str(device) == "auto" and torch.cuda.is_available() else
                       "cpu" if str(device) == "auto" else device)
    cuda_bf16 = dev.type == "cuda" and torch.cuda.is_bf16_supported()
    return _resolve(name, dev.type, cuda_bf16)


def resolve_lora_compute_dtype(name: str, base_dtype: str) -> str:
    """``engine.lora_compute_dtype``: ``auto`` is the base model's dtype (bf16 LoRA matmuls on a bf16 base, float32
    on a float32 base); any other name is kept."""
    if name != "auto" and name not in DTYPES:
        raise ValueError(f"engine.lora_compute_dtype: {name!r} is not one of auto, {', '.join(DTYPES)}")
    return base_dtype if name == "auto" else name
