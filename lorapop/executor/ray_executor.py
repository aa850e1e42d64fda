"""RayExecutor (``executor.ray: true``): the sandbox's jobs on Ray actors, on any node of the cluster.

Each actor wraps its own :class:`~lorapop.executor.sandbox.SandboxExecutor` built from the same ExecutorConfig, so
every protection of the local sandbox (namespaces, chroot, privilege drop, seccomp, rlimits, fork per run, the
trainer-side deadline) holds on the node that runs the code; only the code strings and the ExecResults travel. A batch
(``run_many``) is cut into one contiguous share per actor, balanced by code length, and each actor runs its share
on its ``n_workers`` sandbox workers, so a CPU-heavy validation stage uses the cluster's cores, not the trainer's.

Sandbox runs have no side effects outside the sandbox, so a call lost with its actor (node gone) is retried once on
a restarted actor (Ray's ``max_restarts`` / ``max_task_retries``); a second loss raises an error naming the actor.
"""

from __future__ import annotations

import dataclasses
import itertools

from lorapop import raycluster

from .base import ExecResult, ExecutorConfig, resolve_hashseeds


class _SandboxActor:
    """One SandboxExecutor inside a Ray actor (wrapped with ``ray.remote`` by RayExecutor)."""

    def __init__(self, cfg: ExecutorConfig) -> None:
        import os

        from .sandbox import SandboxExecutor

        os.environ["LORAPOP_PROGRESS"] = "off"
        self.ex = SandboxExecutor(cfg)

    def protections(self) -> dict:
        return self.ex.protections

    def importable(self) -> frozenset[str] | None:
        return self.ex.importable

    def run_many(self, codes: list[str], timeout_s: float | None, hashseed: int | None,
                 max_result_chars: int | None = None) -> list[ExecResult]:
        return self.ex.run_many(codes, timeout_s=timeout_s, hashseed=hashseed, max_result_chars=max_result_chars)

    def close(self) -> None:
        self.ex.close()


def cut(weights: list[int], n: int) -> list[tuple[int, int]]:
    """``n`` contiguous ``[lo, hi)`` ranges over ``weights`` with near-equal sums (some may be empty)."""
    total = sum(weights) or 1
    bounds, acc, k = [0], 0, 1
    for i, w in enumerate(weights):
        acc += w
        while k < n and acc >= total * k / n:
            bounds.append(i + 1)
            k += 1
    bounds += [len(weights)] * (n + 1 - len(bounds))
    return list(zip(bounds[:-1], bounds[1:]))


class RayExecutor:
    """The Executor protocol over ``cfg.ray_actors`` sandbox actors on Ray (see the module docstring)."""

    def __init__(self, cfg: ExecutorConfig | None = None, address: str | None = None) -> None:
        self.config = cfg = dataclasses.replace(cfg) if cfg is not None else ExecutorConfig(ray=True)
        cfg.validate()
        self.actors: list = []
        self._closed = False
        self._turn = itertools.count()
        ray = self._ray = raycluster.acquire(address, num_cpus=cfg.ray_actors * cfg.ray_num_cpus)
        try:
            actor = ray.remote(num_cpus=cfg.ray_num_cpus, max_restarts=1, max_task_retries=1)(_SandboxActor)
            # one set of seeds for every actor: a check's three rounds are three seeds wherever they run
            self.hashseeds = resolve_hashseeds(cfg)
            inner = dataclasses.replace(cfg, ray=False, hashseeds=self.hashseeds)
            self.actors = [actor.remote(inner) for _ in range(cfg.ray_actors)]
            # every actor's sandbox reports what is in force on its node; the weakest is what the run has
            reports = self._get([a.protections.remote() for a in self.actors])
            found = self._get([a.importable.remote() for a in self.actors])  # None: an actor without a chroot
            self.importable = None if None in found else frozenset.intersection(*found)
        except BaseException:
            self.close()
            raise
        self.protections = {k: all(r[k] for r in reports) if isinstance(v, bool) else
                            v if all(r[k] == v for r in reports) else "mixed" for k, v in reports[0].items()}

    def _get(self, refs: list) -> list:
        ray = self._ray
        try:
            return ray.get(refs)
        except ray.exceptions.RayTaskError as e:
            raise e.as_instanceof_cause() from None
        except ray.exceptions.RayError as e:  # died (node lost, OOM-killed) even after its one retry
            raise RuntimeError(f"a Ray sandbox actor was lost twice in a row ({str(e).splitlines()[0][:200]}); "
                               "check the cluster's nodes") from e

    def run(self, code: str, *, timeout_s: float | None = None, hashseed: int | None = None,
            max_result_chars: int | None = None) -> ExecResult:
        """One run, on the actors in turn: single runs made from several threads at once (the checks' rounds,
        lorapop/tasks/common.py) spread over the actors instead of queueing on the first."""
        if self._closed:
            raise RuntimeError("executor is closed")
        actor = self.actors[next(self._turn) % len(self.actors)]
        return self._get([actor.run_many.remote([code], timeout_s, hashseed, max_result_chars)])[0][0]

    def run_many(self, codes: list[str], *, timeout_s: float | None = None, hashseed: int | None = None,
                 max_result_chars: int | None = None) -> list[ExecResult]:
        if self._closed:
            raise RuntimeError("executor is closed")
        codes = list(codes)
        if not codes:
            return []
        ranges = [(lo, hi) for lo, hi in cut([len(c) + 200 for c in codes], len(self.actors)) if hi > lo]
        refs = [a.run_many.remote(codes[lo:hi], timeout_s, hashseed, max_result_chars)
                for a, (lo, hi) in zip(self.actors, ranges)]
        return [r for part in self._get(refs) for r in part]

    def close(self) -> None:
        """Close every actor's sandbox workers, end the actors, let go of Ray. Idempotent."""
        if self._closed:
            return
        self._closed = True
        ray, actors, self.actors = self._ray, self.actors, []
        try:
            ray.get([a.close.remote() for a in actors], timeout=30)
        except Exception:  # a dead actor has no workers left to close
            pass
        for a in actors:
            try:
                ray.kill(a)
            except Exception:
                pass
        raycluster.release()

    def __enter__(self) -> "RayExecutor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
