"""The Ray cluster lorapop's replicated engine and Ray executor run on: join one (``engine.ray_address``) or start a
private local one, shared by every part that needs it and stopped when the last of them lets go.

Only imported where Ray is wanted (``engine.replicas > 1`` or ``executor.ray``); importing this module does not
import Ray either, so a missing optional extra surfaces as one clear error at the first :func:`acquire`.
"""

from __future__ import annotations

import os
import threading
from typing import Any

_lock = threading.Lock()
_users = 0  # parts holding the cluster (acquire() without release())
_started_here = False  # whether lorapop started the running Ray (then it also stops it)


class RayUnavailableError(RuntimeError):
    """Ray is wanted (engine.replicas > 1 or executor.ray) but not installed."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise RayUnavailableError(
            "engine.replicas > 1 and executor.ray run on Ray, which is not installed: .venv/bin/pip install -e '.[ray]' "
            "(or set engine.replicas: 1 and executor.ray: false)") from e
    return ray


def acquire(address: str | None, num_cpus: float = 0) -> Any:
    """Connect to ``address`` (or start a local Ray with at least ``num_cpus`` logical CPUs) unless Ray is already
    up in this process; returns the ``ray`` module. Pair every call with :func:`release`.

    A local Ray gets no dashboard, keeps its workers' output (progress lines of every replica) out of the
    trainer's terminal, and has as many logical CPUs as the parts asked for: the CPU replicas' threads already
    split the real cores, and Ray must not hold an actor back because a sandbox actor also counts one."""
    global _users, _started_here
    ray = import_ray()
    with _lock:
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=max(os.cpu_count() or 1, int(-(-num_cpus // 1))), include_dashboard=False,
                         log_to_driver=False, object_store_memory=_local_object_store_bytes())
                _started_here = True
        _users += 1
    return ray


def release() -> None:
    """Let go of the cluster; the last user of a Ray this module started stops it."""
    global _users, _started_here
    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _started_here:
            import ray

            ray.shutdown()
            _started_here = False


class RayHold:
    """``acquire`` now, ``release`` at ``close()``: a Trainer holds the cluster for all the parts it builds."""

    def __init__(self, address: str | None, num_cpus: float) -> None:
        acquire(address, num_cpus)
        self._held = True

    def close(self) -> None:
        if self._held:
            self._held = False
            release()


def _local_object_store_bytes() -> int:
    # Ray's default is 30% of RAM. What moves through the store is rows and completions, adapters (PBT) and, at a
    # checkpoint, every adapter with its AdamW moments from replica 0 (8 rank-16 adapters of a 7B model: ~3.9 GB).
    # A quarter of RAM, at most 16 GiB, holds that; the store's shared memory is only taken when written.
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        ram = 8 * 2**30
    return int(min(16 * 2**30, ram // 4))
