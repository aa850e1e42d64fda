"""ReplicatedEngine: ``engine.replicas`` data-parallel copies of the whole multi-LoRA engine as Ray actors, behind
the one :class:`~lorapop.engine.base.Engine` the trainer sees.

A population is parallel in rows: every replica holds the frozen base and *every* adapter (rank-16 adapters of a
7B model are ~40 MB each), so any row can go to any replica.

* **generate**: rows are grouped by ``(adapter, prompt)`` (the n_solve answers to one task share their prefill
  through prefix sharing, so a group never splits) and the groups are dealt to replicas by token count (prompt once
  plus ``max_new_tokens`` per row), largest first to the least loaded. Seeds are fixed per row before the split,
  and a TorchEngine row depends only on its prompt, adapter and seed, so the result equals one engine's.
* **train_step**: samples are dealt the same way; each replica computes gradients on its share, normalised by the
  *whole step's* token count per adapter, the replicas sum them with one all-reduce of a flat buffer
  (``torch.distributed``: gloo on CPU, NCCL on GPU, rendezvous handed out by the driver), then each takes the same
  clipped AdamW step, so the replicas never drift (``replica_digests`` checks that).
* set_adapter / reset_optimizer / load_adapter / load_state_dict go to every replica; reads come from replica 0.

A replica that dies (node lost, OOM kill) fails the call with :class:`ReplicaError`, and the engine closes itself:
the surviving replicas may be waiting in the all-reduce, and the step cannot be finished. The trainer's run then
resumes from its last checkpoint (``lorapop train --resume RUN_DIR``), with any number of replicas.

Each replica on CPU gets ``cores // replicas`` torch threads (two replicas on a 2-core machine: one thread each); on
CUDA one GPU each (Ray's ``num_gpus=1``). Ray is imported only here (and in lorapop/raycluster.py).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from lorapop import raycluster
from lorapop.progress import progress

from .base import Completion, EngineConfig, SamplingParams, TrainSample, chat_prompt_ids, check_rows, \
    check_samples, check_slot


# Seconds the replicas may take to be placed and load the base model (a 7B model from a network disk takes minutes).
START_TIMEOUT_S = 1200.0


# Per-adapter train statistics of a replica's own share of the samples: the loss (already divided by the step's
# token totals) adds up over replicas; the means are weighted by their token counts (merge_stats).
SHARE_STATS = ("loss", "entropy", "logprob_mismatch", "is_capped_frac", "is_ratio_mean", "n_scored", "n_compared")
_MEANS = {"entropy": "n_scored", "logprob_mismatch": "n_compared", "is_capped_frac": "n_compared",
          "is_ratio_mean": "n_compared"}
_COUNTS = tuple(dict.fromkeys(_MEANS.values()))  # each count once: it is summed once, however many means it weighs
# A mean over no token: what accumulate_gradients reports for it (the importance ratio of an uncompared token is 1).
_EMPTY_MEAN = {"is_ratio_mean": 1.0}


def share_stats(local: dict[int, dict[str, float]], totals: dict[int, dict[str, int]]
                ) -> dict[int, dict[str, float]]:
    """A replica's statistics for every adapter of the step: its share's (accumulate_gradients; zeros for an
    adapter it had no sample of) and the step's token and sample totals."""
    return {a: {"grad_norm": 0.0, **{k: local.get(a, {}).get(k, 0.0) for k in SHARE_STATS},
                "n_tokens": t["n_tokens"], "n_samples": t["n_samples"]} for a, t in totals.items()}


def merge_stats(parts: list[dict[int, dict[str, float]]]) -> dict[int, dict[str, float]]:
    """One engine's train_step statistics from the replicas' (grad_norm, n_tokens, n_samples: equal everywhere)."""
    out = {a: dict(st) for a, st in parts[0].items()}
    for a, st in out.items():
        for mean, count in _MEANS.items():
            st[mean] *= st[count]
        for part in parts[1:]:
            for k in ("loss", *_COUNTS):
                st[k] += part[a][k]
            for mean, count in _MEANS.items():
                st[mean] += part[a][mean] * part[a][count]
        for mean, count in _MEANS.items():
            st[mean] = st[mean] / st[count] if st[count] else _EMPTY_MEAN.get(mean, 0.0)
    return out


class ReplicaError(RuntimeError):
    """A replica died or failed mid-call; the engine is closed and the run must resume from its last checkpoint."""


def deal(costs: list[float], n: int) -> list[list[int]]:
    """Indices of ``costs`` dealt to ``n`` bins: largest first to the least loaded bin (ties: the lower bin), each
    bin's indices in ascending order. Deterministic, so every run splits a step the same way."""
    bins: list[list[int]] = [[] for _ in range(n)]
    load = [0.0] * n
    for i in sorted(range(len(costs)), key=lambda k: (-costs[k], k)):
        b = min(range(n), key=lambda j: (load[j], j))
        bins[b].append(i)
        load[b] += costs[i]
    return [sorted(b) for b in bins]


def split_rows(prompts: list[list[int]], adapter_ids: list[int], max_new_tokens: int, n: int) -> list[list[int]]:
    """Row indices per replica for a generate call: rows sharing ``(adapter, prompt)`` stay together (their prefill
    is shared), groups balanced by tokens (prompt once + ``max_new_tokens`` per row)."""
    groups: dict[tuple, list[int]] = {}
    for k, (p, a) in enumerate(zip(prompts, adapter_ids)):
        groups.setdefault((int(a), tuple(p)), []).append(k)
    keys = list(groups)
    costs = [len(key[1]) + len(groups[key]) * max_new_tokens for key in keys]
    return [sorted(k for g in share for k in groups[keys[g]]) for share in deal(costs, n)]


def split_samples(samples: list[TrainSample], n: int) -> list[list[int]]:
    """Sample indices per replica for a train step, balanced by row tokens (prompt + completion)."""
    return deal([len(s.prompt_ids) + len(s.completion_ids) for s in samples], n)


class _Replica:
    """One engine replica inside a Ray actor (wrapped with ``ray.remote`` by ReplicatedEngine)."""

    def __init__(self, rank: int, world: int, model_name: str, n_adapters: int, cfg: EngineConfig, seed: int,
                 threads: int) -> None:
        os.environ["LORAPOP_PROGRESS"] = "off"  # the driver shows progress; replicas' lines would only interleave
        import torch

        from .torch_engine import TorchEngine

        if threads > 0:
            torch.set_num_threads(threads)
        self.rank, self.world = rank, world
        self.engine = TorchEngine.from_config(model_name, n_adapters, cfg, seed=seed)

    def info(self) -> dict[str, Any]:
        import torch

        e = self.engine
        return {"tokenizer": e.tokenizer, "dtype": e.cfg.dtype, "device": str(e.device), "pid": os.getpid(),
                "base_model_name": e.base_model_name, "threads": torch.get_num_threads()}

    def rendezvous(self) -> str:
        """A ``tcp://`` address on this node for the process group (rank 0 listens there)."""
        import socket

        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{ip}:{port}"

    def init_collective(self, init_method: str, timeout_s: float) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        backend = "nccl" if self.engine.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=init_method, rank=self.rank, world_size=self.world,
                                timeout=timedelta(seconds=timeout_s))

    def generate(self, prompts, adapter_ids, params, seeds) -> list[Completion]:
        return self.engine.generate(prompts, adapter_ids, params, seeds=seeds)

    def train_step(self, samples: list[TrainSample], totals: dict[int, dict[str, int]], reduce: bool
                   ) -> dict[int, dict[str, float]]:
        """Gradients of this replica's share (normalised by the step's totals), summed over replicas, then the
        optimizer step. Returns per adapter this share's loss and the (identical everywhere) grad norm."""
        import torch
        import torch.distributed as dist

        e = self.engine
        e.optimizer.zero_grad()  # the KV cache stays, as in TorchEngine.train_step
        local = e.accumulate_gradients(samples, {a: t["n_tokens"] for a, t in totals.items()}) if samples else {}
        if reduce:  # every replica joins, with zeros when its share moved no gradient
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in e._params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            off = 0
            for p in e._params:
                p.grad = flat[off:off + p.numel()].view_as(p)
                off += p.numel()
        return e.apply_step(share_stats(local, totals))

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.engine, method)(*args)

    def digest(self) -> str:
        """SHA-256 of this replica's adapters and optimizer state (equal on every replica when in sync)."""
        import hashlib

        st = self.engine.state_dict()
        h = hashlib.sha256()
        opt = st["optimizer"]
        for t in [*st["lora_A"], *st["lora_B"], *opt["exp_avg"], *opt["exp_avg_sq"], opt["step"], opt["lr"]]:
            h.update(t.contiguous().numpy().tobytes())
        return h.hexdigest()


class ReplicatedEngine:
    """``cfg.replicas`` TorchEngine replicas on Ray (see the module docstring). Closing it kills the actors and,
    when it started a local Ray, stops it."""

    def __init__(self, model_name: str = "embedded", n_adapters: int = 1, cfg: EngineConfig | None = None,
                 seed: int = 0) -> None:
        cfg = dataclasses.replace(cfg) if cfg is not None else EngineConfig()
        cfg.validate()
        self.cfg, self.n_adapters = cfg, n_adapters
        self.scaling = cfg.lora_alpha / cfg.rank
        self.actors: list[Any] = []
        self._closed, self._ray = False, None
        n = self.n_replicas = cfg.replicas
        gpu = cfg.device.startswith("cuda")
        threads = 0 if gpu else max(1, (os.cpu_count() or 1) // n)
        ray = self._ray = raycluster.acquire(cfg.ray_address, num_cpus=n * max(threads, 1))
        try:
            gpus = ray.cluster_resources().get("GPU", 0)
            if cfg.device == "auto":  # the cluster's devices decide, not the driver's (a head node may have none)
                gpu = gpus > 0
                threads = 0 if gpu else threads
            if gpu and gpus < n:
                raise ValueError(f"engine.replicas={n} puts each replica on its own GPU, but the Ray cluster has "
                                 f"{gpus:g}: lower engine.replicas or add GPU nodes (ray start --address=...)")
            inner = dataclasses.replace(cfg, replicas=1, ray_address=None, device="cuda" if gpu else "cpu")
            actor = ray.remote(num_cpus=1 if gpu else threads, num_gpus=1 if gpu else 0, max_restarts=0)(_Replica)
            self.actors = [actor.remote(r, n, model_name, n_adapters, inner, seed, threads) for r in range(n)]
            infos = self._all("start", [a.info.remote() for a in self.actors], timeout_s=START_TIMEOUT_S)
            if n > 1:
                addr = self._all("start", [self.actors[0].rendezvous.remote()])[0]
                self._all("start", [a.init_collective.remote(addr, cfg.collective_timeout_s) for a in self.actors])
        except BaseException:
            self.close()
            raise
        self.tokenizer = infos[0]["tokenizer"]
        self.cfg.dtype, self.device = infos[0]["dtype"], infos[0]["device"]
        self.base_model_name = infos[0]["base_model_name"]
        self.replica_info = [{k: v for k, v in i.items() if k != "tokenizer"} for i in infos]

    # ------------------------------------------------------------------ calls
    def _all(self, what: str, refs: list[Any], timeout_s: float | None = None) -> list[Any]:
        """Results of ``refs`` (one per replica, in replica order) as they come; the first failure closes the
        engine (a replica left in the all-reduce would wait for the dead one) and raises ReplicaError."""
        ray, n = self._ray, self.n_replicas
        out: list[Any] = [None] * len(refs)
        index = {r: k for k, r in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=timeout_s)
            if not done:
                self.close()
                raise ReplicaError(f"{len(pending)} of {n} engine replicas did not start within {timeout_s:.0f} s: "
                                   f"the cluster may lack the resources (each needs "
                                   f"{'a GPU' if self.cfg.device.startswith('cuda') else 'its CPU share'}; "
                                   f"cluster has {ray.cluster_resources()})")
            k = index[done[0]]
            try:
                out[k] = ray.get(done[0])
            except ray.exceptions.RayTaskError as e:
                if what not in ("train_step", "start"):  # nothing shared is half-done: the caller's error as is
                    raise e.as_instanceof_cause() from None
                # In a collective a peer's death shows first as an error in the survivors' all-reduce; name the
                # dead replica when there is one, it is the cause.
                late, _ = ray.wait(pending, num_returns=len(pending), timeout=10) if pending else ([], [])
                for r in late:
                    try:
                        ray.get(r)
                    except ray.exceptions.RayTaskError:
                        pass
                    except ray.exceptions.RayError as dead:
                        self._fail(what, index[r], dead)
                self._fail(what, k, e)
            except ray.exceptions.RayError as e:  # the replica is gone: died, killed (OOM monitor), node lost
                self._fail(what, k, e)
        return out

    def _fail(self, what: str, k: int, e: Exception) -> None:
        """Close the engine and raise ReplicaError for replica ``k``'s failure ``e`` during ``what``."""
        self.close()
        head = f"engine replica {k} of {self.n_replicas}"
        if what == "start":
            raise ReplicaError(f"{head} could not start ({_detail(e)})") from e
        died = not isinstance(e, self._ray.exceptions.RayTaskError)
        raise ReplicaError(f"{head} {'died' if died else 'failed'} during {what} ({_detail(e)}); the engine is "
                           "closed: resume the run from its last checkpoint (lorapop train --resume RUN_DIR)") from e

    def _check_open(self) -> None:
        if self._closed:
            raise ReplicaError("the replicated engine is closed (a replica failed or close() was called)")

    def _broadcast(self, method: str, *args: Any) -> None:
        self._check_open()
        refs = [self._ray.put(a) for a in args]  # serialised once, not once per replica
        self._all(method, [a.call.remote(method, *refs) for a in self.actors])

    def _first(self, method: str, *args: Any) -> Any:
        self._check_open()
        return self._all(method, [self.actors[0].call.remote(method, *args)])[0]

    # ------------------------------------------------------------------ the Engine protocol
    def chat_prompt(self, user_message: str, system: str | None = None) -> list[int]:
        return chat_prompt_ids(self.tokenizer, user_message, system)

    def generate(self, prompts: list[list[int]], adapter_ids: list[int], params: SamplingParams | None = None,
                 seeds: list[int] | None = None) -> list[Completion]:
        self._check_open()
        params = params if params is not None else SamplingParams()
        check_rows(prompts, adapter_ids, self.n_adapters)
        seeds = list(range(len(prompts))) if seeds is None else list(seeds)  # TorchEngine's default, fixed per row
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        shares = [s for s in split_rows(prompts, adapter_ids, params.max_new_tokens, len(self.actors)) if s]
        refs = [self.actors[r].generate.remote([list(prompts[k]) for k in share], [int(adapter_ids[k]) for k in share],
                                               params, [int(seeds[k]) for k in share])
                for r, share in enumerate(shares)]
        out: list[Completion | None] = [None] * len(prompts)
        with progress("generate", total=len(prompts), unit="rows") as bar:
            for share, comps in zip(shares, self._all("generate", refs)):
                for k, c in zip(share, comps):
                    out[k] = c
                bar.advance(len(share))
        return out  # type: ignore[return-value]

    def train_step(self, samples: list[TrainSample]) -> dict[int, dict[str, float]]:
        self._check_open()
        check_samples(samples, self.n_adapters)  # before dispatch: one replica must not fail while others wait
        totals: dict[int, dict[str, int]] = {}
        for s in samples:
            t = totals.setdefault(int(s.adapter_id), {"n_tokens": 0, "n_samples": 0})
            t["n_tokens"] += len(s.completion_ids)
            t["n_samples"] += 1
        # Without a row that moves a gradient one engine leaves every .grad unset (no update): so do the replicas.
        reduce = len(self.actors) > 1 and any(s.completion_ids and (float(s.advantage) != 0.0 or
                                                                    self.cfg.entropy_coeff > 0) for s in samples)
        shares = split_samples(samples, len(self.actors))
        parts = self._all("train_step", [a.train_step.remote([samples[k] for k in share], totals, reduce)
                                         for a, share in zip(self.actors, shares)])
        return merge_stats(parts)

    def get_adapter(self, i: int) -> dict[str, tuple[Any, Any]]:
        check_slot(i, self.n_adapters)
        return self._first("get_adapter", i)

    def set_adapter(self, i: int, weights: dict[str, tuple[Any, Any]]) -> None:
        check_slot(i, self.n_adapters)
        self._broadcast("set_adapter", i, weights)

    def reset_adapter(self, i: int, seed: int) -> None:
        check_slot(i, self.n_adapters)
        self._broadcast("reset_adapter", i, seed)

    def reset_optimizer(self, i: int) -> None:
        check_slot(i, self.n_adapters)
        self._broadcast("reset_optimizer", i)

    def save_adapter(self, i: int, path: str | os.PathLike) -> Path:
        from .peft_io import save_peft_adapter

        # written by the driver: the run directory is on this machine, not necessarily on the replicas' nodes
        return save_peft_adapter(self.get_adapter(i), path, rank=self.cfg.rank, lora_alpha=self.cfg.lora_alpha,
                                 target_modules=list(self.cfg.target_modules),
                                 base_model_name_or_path=self.base_model_name)

    def load_adapter(self, i: int, path: str | os.PathLike) -> None:
        from .peft_io import load_peft_adapter

        check_slot(i, self.n_adapters)
        weights, pcfg = load_peft_adapter(path)
        self._broadcast("load_adapter_weights", i, weights, pcfg, str(path))

    def state_dict(self) -> dict[str, Any]:
        return self._first("state_dict")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._broadcast("load_state_dict", state)

    def replica_digests(self) -> list[str]:
        """Each replica's SHA-256 of its adapters and optimizer state; all equal unless the replicas drifted."""
        self._check_open()
        return self._all("digest", [a.digest.remote() for a in self.actors])

    def pop_metrics(self) -> dict[str, float]:
        """Each replica's engine metrics (``perf/compile_s``, ``perf/graphs``, ...), the largest over replicas: they
        run the same calls side by side, so the slowest compile is the one the step waited for, and a replica that
        compiled more graphs than the others is seen. (No sync to time: the replicas generate with the weights they
        train.)"""
        self._check_open()
        parts = self._all("pop_metrics", [a.call.remote("pop_metrics") for a in self.actors])
        return {k: max(p.get(k, 0) for p in parts) for k in dict.fromkeys(k for p in parts for k in p)}

    def close(self) -> None:
        """Kill the replicas and let go of Ray (stopping it when this engine started it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        ray, actors, self.actors = self._ray, self.actors, []
        for a in actors:
            try:
                ray.kill(a)
            except Exception:  # already dead: nothing to kill
                pass
        if ray is not None:
            raycluster.release()

    def __enter__(self) -> "ReplicatedEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _detail(e: BaseException) -> str:
    """One line saying what went wrong in a replica: the original exception of a failed call or constructor (Ray
    puts it at the end of a long message), else the first line of Ray's own error."""
    import re

    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {_detail(cause)}"
    lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", str(e)).splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    return (lines[-1] if getattr(e, "actor_init_failed", False) else lines[0])[:300]
