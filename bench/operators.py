"""Time one child per operator on a Qwen2.5-7B-shaped adapter (docs/METHOD.md, Operators), ours against `populora`.

    .venv/bin/python bench/operators.py [--ranks 16 64] [--reps 5] [--threads 2] [--no-peer]

Adapter: 28 layers x {q, o: 3584->3584; k, v: 3584->512; gate, up: 3584->18944; down: 18944->3584}, float32,
random factors (B non-zero, so the dW-space operators see a real spectrum). Each operator makes one child per
repetition; the median of ``--reps`` is reported. The third-party ``populora`` package (lucidrains), when
installed, is timed in the same run on the same shapes for every operator both implement: its functions mutate a
population tensor (individual x d x r) in place, so it gets a minimal population object holding exactly the
individuals the call needs (parents + child slot). It is an optional benchmark dependency only.

The last line printed is one JSON object::

    {"rank16": {op: s}, "rank64": {op: s}, "peer_rank16": {op: s}, "peer_rank64": {op: s},
     "max_seconds_rank16": x, "slower_than_peer": [ops at rank 16], "slower_than_peer_rank64": [...]}
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lorapop.evolve.operators import OPERATORS, make_child  # noqa: E402

HIDDEN, KV, FFN, LAYERS = 3584, 512, 18944, 28
SHAPES = {"self_attn.q_proj": (HIDDEN, HIDDEN), "self_attn.k_proj": (HIDDEN, KV), "self_attn.v_proj": (HIDDEN, KV),
          "self_attn.o_proj": (HIDDEN, HIDDEN), "mlp.gate_proj": (HIDDEN, FFN), "mlp.up_proj": (HIDDEN, FFN),
          "mlp.down_proj": (FFN, HIDDEN)}

# operator -> peer registry name (same names; populora has no svd_merge)
PEER_MUTATIONS = ["svd_structured", "layer_selective_gaussian", "component_masking", "full_gaussian", "neftune_style"]
PEER_CROSSOVERS = ["dare", "layer_wise", "svd_subspace", "extrapolative", "xes", "average", "clone"]


def make_adapter(rank: int, seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for layer in range(LAYERS):
        for mod, (d_in, d_out) in SHAPES.items():
            A = torch.randn(rank, d_in, generator=g).mul_(d_in ** -0.5)
            B = torch.randn(d_out, rank, generator=g).mul_(0.01)
            out[f"model.layers.{layer}.{mod}"] = (A, B)
    return out


def n_parents(op: str) -> int:
    return 1 if OPERATORS[op].n_parents == 1 else 2


def median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        del out
        gc.collect()
    return statistics.median(times)


def time_ours(parents, reps: int) -> dict[str, float]:
    res = {}
    for op in OPERATORS:
        ps = parents[:n_parents(op)]
        g = torch.Generator().manual_seed(0)
        res[op] = median_time(lambda: make_child(op, ps, generator=g, scaling=2.0, fitness=[1.0, 0.0][:len(ps)]),
                              reps)
        print(f"  ours  {op:26s} {res[op]:8.3f} s", flush=True)
    return res


def peer_population(parents, slots: int):
    """populora's layout: weight_down (individual, d_in, r) = A^T, weight_up (individual, d_out, r) = B."""
    down, up = {}, {}
    for name in parents[0]:
        key = name.replace(".", "_")
        down[key] = torch.stack([parents[i % len(parents)][name][0].mT for i in range(slots)])
        up[key] = torch.stack([parents[i % len(parents)][name][1] for i in range(slots)])
    return SimpleNamespace(weight_down=down, weight_up=up, device=torch.device("cpu"))


def time_peer(parents, reps: int) -> dict[str, float]:
    from populora import operators as P

    res = {}
    pop = peer_population(parents, 3)  # parent 0, parent 1, child slot
    fitness = torch.tensor([1.0, 0.0, -1.0])
    for op in PEER_MUTATIONS:
        fn = P.MUTATION_REGISTRY[op]
        torch.manual_seed(0)
        res[op] = median_time(lambda: fn(pop, torch.tensor([2])), reps)
        print(f"  peer  {op:26s} {res[op]:8.3f} s", flush=True)
    for op in PEER_CROSSOVERS:
        fn = P.CROSSOVER_REGISTRY[op]
        torch.manual_seed(0)
        if op == "clone":
            parents_idx = torch.tensor([[0]])
        elif op == "xes":  # 1 good parent given, 1 bad one picked by populora's tournament (as ours: 1 good, 1 bad)
            parents_idx = torch.tensor([[0]])
        else:
            parents_idx = torch.tensor([[0, 1]])
        kw = {"fitnesses": fitness, "num_bad_parents": 1} if op == "xes" else {"fitnesses": fitness}
        res[op] = median_time(lambda: fn(pop, parents_idx, torch.tensor([2]), **kw), reps)
        print(f"  peer  {op:26s} {res[op]:8.3f} s", flush=True)
    del pop
    gc.collect()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-peer", action="store_true", help="skip the populora comparison")
    ap.add_argument("--peer-ranks", type=int, nargs="*", default=None,
                    help="ranks at which to time the peer (default: all of --ranks)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    peer_ok = not args.no_peer
    if peer_ok:
        try:
            import populora.operators  # noqa: F401
        except Exception as e:  # optional dependency: any import failure just skips the comparison
            print(f"note: populora not importable ({type(e).__name__}: {e}); peer comparison skipped")
            peer_ok = False
    peer_ranks = args.ranks if args.peer_ranks is None else args.peer_ranks

    summary: dict[str, object] = {}
    for rank in args.ranks:
        parents = [make_adapter(rank, 1), make_adapter(rank, 2)]
        n_el = sum(A.numel() + B.numel() for A, B in parents[0].values())
        print(f"rank {rank}: {len(parents[0])} modules, {n_el / 1e6:.1f}M parameters, "
              f"{n_el * 4 / 2**20:.0f} MiB per adapter", flush=True)
        summary[f"rank{rank}"] = time_ours(parents, args.reps)
        if peer_ok and rank in peer_ranks:
            summary[f"peer_rank{rank}"] = time_peer(parents, args.reps)
        del parents
        gc.collect()

    print()
    for rank in args.ranks:
        ours = summary[f"rank{rank}"]
        peer = summary.get(f"peer_rank{rank}", {})
        print(f"rank {rank}  {'operator':26s} {'ours s':>9s} {'peer s':>9s} {'ours/peer':>10s}")
        for op, t in ours.items():
            p = peer.get(op)
            extra = f"{p:9.3f} {t / p:10.2f}" if p else f"{'-':>9s} {'-':>10s}"
            print(f"{'':8s}{op:26s} {t:9.3f} {extra}")
    out = {k: {op: round(t, 4) for op, t in v.items()} for k, v in summary.items()}
    if "rank16" in summary:
        out["max_seconds_rank16"] = round(max(summary["rank16"].values()), 4)
    for rank in args.ranks:
        key = "slower_than_peer" if rank == 16 else f"slower_than_peer_rank{rank}"
        peer = summary.get(f"peer_rank{rank}", {})
        out[key] = [op for op, t in summary[f"rank{rank}"].items() if op in peer and t > peer[op]]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
