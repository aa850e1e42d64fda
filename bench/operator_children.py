"""What each operator's child of two trained parents computes, and how it scores before any training
(docs/METHOD.md, "Operators: what a child computes"): the figure the default operator mix follows from.

    PYTHONPATH=. .venv/bin/python bench/operator_children.py RUN_DIR --second-parent SOURCE
        [--operators ...] [--score-operators ...] [--answers 2] [--draws 8] [--replicates 2] [--seed 0]
        [--samples FILE]

Parent 1 is the best student of ``RUN_DIR``'s last checkpoint (single mode's agent), parent 2 ``--second-parent``
(a PEFT directory, ``RUN_DIR:best``, ``RUN_DIR:<id>``), with their TrueSkill expose as fitness, as ``lorapop
retention`` takes them (equal exposes, e.g. two single-mode agents, which have no rating: fitness 1 and 0, parent 1
first, as PBT orders a crossover's parents). Per operator (every registered one by default), with ``dW = scaling B A`` summed over all
modules (dense, float64):

- ``d_p1``, ``d_p2``, ``d_mean``: ``||dW_child - dW_x|| / ||dW_x||`` for parent 1, parent 2 and the parents' mean
  ``(dW_1 + dW_2) / 2``, the mean over ``--draws`` children (seeded; an operator whose second draw equals its first counts one);
  a mutation has one parent, parent 1;
- ``d_self``: for a crossover, ``||dW_child - dW_1|| / ||dW_1||`` of the child of parent 1 and parent 1
  re-factored (``B G, G^-1 A``, G a random invertible r x r of condition number <= 4): 0 for an operator that keeps
  what its parents compute (DARE: one draw, so not 0);
- ``score``: the run's capability probe (its held-out family, its sampling, ``--answers`` answers a task) of the
  first draw's child, right after the operator (step 0), for the ``--score-operators``, beside the parents' own
  scores (``--replicates`` scorings of parent 1, each with its own sampling seeds, whose spread is the floor a score
  difference must exceed). All scorings run in one probe call, each in its own engine slot.

The table is printed, then one JSON line: ``{"parents": {...}, "operators": {op: {d_p1, d_p2, d_mean, d_self,
score}}, "floor": spread, "seconds": s}``. ``--samples`` writes every scoring's per-task scores and replies (JSONL).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def dense(adapter: dict, scaling: float) -> dict[str, torch.Tensor]:
    return {n: scaling * B.double() @ A.double() for n, (A, B) in adapter.items()}


def size(a: dict[str, torch.Tensor]) -> float:
    return sum(float(torch.linalg.norm(v)) ** 2 for v in a.values()) ** 0.5


def rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """``||a - b|| / ||b||`` over all modules together (Frobenius)."""
    num = sum(float(torch.linalg.norm(a[n] - b[n])) ** 2 for n in b)
    den = sum(float(torch.linalg.norm(b[n])) ** 2 for n in b)
    return (num / den) ** 0.5 if den > 0 else float("nan")


def refactored(adapter: dict, seed: int) -> dict:
    """The same function in another factorisation: ``(B G, G^-1 A)``, G orthogonal x diag(0.5..2) x orthogonal."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, (A, B) in adapter.items():
        r = A.shape[0]
        q1 = torch.linalg.qr(torch.randn(r, r, generator=g, dtype=torch.float64))[0]
        q2 = torch.linalg.qr(torch.randn(r, r, generator=g, dtype=torch.float64))[0]
        s = 2.0 ** (2 * torch.rand(r, generator=g, dtype=torch.float64) - 1)
        G, Ginv = q1 @ torch.diag(s) @ q2, q2.mT @ torch.diag(1 / s) @ q1.mT
        out[n] = ((Ginv @ A.double()).to(A.dtype), (B.double() @ G).to(B.dtype))
    return out


def main(argv: list[str] | None = None) -> int:
    from lorapop.retention.study import RetentionConfig, plan_study, study_engine
    from lorapop.eval.harness import make_executor
    from lorapop.evolve.operators import OPERATORS, make_child
    from lorapop.records.members import Member
    from lorapop.train.probe import run_probe
    from lorapop.train.stages import sampling_params

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--second-parent", required=True)
    ap.add_argument("--operators", nargs="+", default=list(OPERATORS))
    ap.add_argument("--answers", type=int, default=2, help="answers per probe task (the run's probe_samples: 2)")
    ap.add_argument("--draws", type=int, default=8)
    ap.add_argument("--replicates", type=int, default=2, help="scorings of parent 1 (the floor: their spread)")
    ap.add_argument("--probe-per-level", type=int, default=None,
                    help="probe tasks per level (default: the run's run.probe_per_level); fewer for a quick check")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-parent-steps", type=int, default=1)
    ap.add_argument("--score-operators", nargs="*", default=None,
                    help="operators whose child is scored by the probe (default: all of --operators; none: distances "
                         "only)")
    ap.add_argument("--samples", help="write every scoring's per-task scores and replies here (JSONL)")
    args = ap.parse_args(argv)
    if args.score_operators is None:
        args.score_operators = list(args.operators)

    t0 = time.perf_counter()
    n_scored = len([o for o in args.operators if o in args.score_operators])
    cfg = RetentionConfig(operators=list(args.operators), second_parent=args.second_parent, steps=1,
                          answers=args.answers, min_parent_steps=args.min_parent_steps, group_size=2 + n_scored,
                          probe_per_level=args.probe_per_level)
    study = plan_study(args.run_dir, cfg, {"seed": args.seed}, lambda m: print(m, file=sys.stderr))
    if study.second is None:
        raise SystemExit("no second parent")
    engine = study_engine(study, cfg)
    engine.load_adapter(0, study.parent.adapter_dir)
    engine.load_adapter(1, study.second[1])
    p1, p2 = engine.get_adapter(0), engine.get_adapter(1)
    scaling = engine.scaling
    fit = [study.p_fit, study.second[2]]
    if fit[0] == fit[1]:
        # PBT hands a crossover its parents best first; parents that ratings do not tell apart (single mode's agent
        # has no rating) get parent 1 ranked first, as given
        fit = [1.0, 0.0]
    d1, d2 = dense(p1, scaling), dense(p2, scaling)
    mean = {n: (d1[n] + d2[n]) / 2 for n in d1}
    p1_again = refactored(p1, 1000 + args.seed)

    def child_of(op: str, draw: int, parents: list) -> dict:
        spec = OPERATORS[op]
        gen = torch.Generator().manual_seed(zlib.crc32(f"{args.seed}:{op}:{draw}".encode()))
        ps = parents if spec.kind == "crossover" else parents[:1]
        c, _ = make_child(op, ps, generator=gen, scaling=scaling, fitness=fit[:len(ps)])
        return c

    rows: dict[str, dict] = {}
    firsts: dict[str, dict] = {}
    for op in study.ops:
        cross = OPERATORS[op].kind == "crossover"
        ds = []
        for k in range(args.draws):
            c = child_of(op, k, [p1, p2])
            if k == 0:
                firsts[op] = c
            elif all(torch.equal(c[n][0], firsts[op][n][0]) and torch.equal(c[n][1], firsts[op][n][1]) for n in c):
                break  # a deterministic operator: every draw is the first
            dc = dense(c, scaling)
            ds.append((rel(dc, d1), rel(dc, d2) if cross else None, rel(dc, mean) if cross else None))
        row = {"d_p1": statistics.fmean(d[0] for d in ds),
               "d_p2": statistics.fmean(d[1] for d in ds) if cross else None,
               "d_mean": statistics.fmean(d[2] for d in ds) if cross else None,
               "d_self": rel(dense(child_of(op, 0, [p1, p1_again]), scaling), d1) if cross else None}
        rows[op] = row
        print(f"{op}: {row}", file=sys.stderr)

    scores: dict[str, float] = {}
    floor = None
    samples = []
    if args.score_operators:
        # one probe call for every scoring: parent 1's replicates (its slot, scored again with other seeds), parent
        # 2, and each operator's first child in a slot of its own, so the engine fills its batches across them
        executor = make_executor()
        arms = [(f"parent1#{i}", 0) for i in range(args.replicates)] + [("parent2", 1)]
        for k, op in enumerate(o for o in study.ops if o in args.score_operators):
            engine.set_adapter(2 + k, firsts[op])
            arms.append((op, 2 + k))
        try:
            rng = random.Random(f"{args.seed}:children-probe")
            got = run_probe(engine, executor, [Member(name, slot, "student") for name, slot in arms], 0,
                            sampling_params(study.solve), args.answers, study.prefill, rng,
                            per_level=study.per_level, style=study.style, answers=True)
        finally:
            executor.close()
        by: dict[str, list[float]] = {}
        for r in got:
            by.setdefault(r["member"], []).append(r["score"])
            samples.append({"arm": r["member"], "task": r["task"], "score": r["score"], "answers": r["answers"],
                            "statuses": r["statuses"]})
        reps = [statistics.fmean(by[f"parent1#{i}"]) for i in range(args.replicates)]
        scores["parent1"], scores["parent2"] = statistics.fmean(reps), statistics.fmean(by["parent2"])
        floor = max(reps) - min(reps) if len(reps) > 1 else None
        for name, _ in arms[args.replicates + 1:]:
            rows[name]["score"] = scores[name] = statistics.fmean(by[name])
    engine.close()

    d12 = rel(d2, d1)
    norms = {"dW_1": size(d1), "dW_2": size(d2), "dW_mean": size(mean)}
    print(f"parents: {study.parent.id} of {study.rd.path} (fitness {fit[0]:.2f}) and {study.second[0]} (fitness "
          f"{fit[1]:.2f}); ||dW_2 - dW_1|| / ||dW_1|| = {d12:.3f}; ||dW_1||, ||dW_2||, ||dW_mean|| = "
          + ", ".join(f"{v:.4g}" for v in norms.values()))
    if scores:
        print(f"probe at step 0 ({len(study.held)} tasks x {args.answers} answers): parent 1 {scores['parent1']:.3f} "
              f"(mean of {args.replicates} scorings, spread {floor if floor is not None else float('nan'):.3f}), "
              f"parent 2 {scores['parent2']:.3f}")
    print("| operator | kind | d(child, parent 1) | d(child, parent 2) | d(child, mean dW) | d(P x P re-factored, P) "
          "| probe at step 0 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")

    def f(v):
        return "-" if v is None else f"{v:.3f}"

    for op, row in rows.items():
        print(f"| `{op}` | {OPERATORS[op].kind} | {f(row['d_p1'])} | {f(row['d_p2'])} | {f(row['d_mean'])} | "
              f"{f(row['d_self'])} | {f(row.get('score'))} |")
    if args.samples:
        Path(args.samples).write_text("".join(json.dumps(s) + "\n" for s in samples))
    print(json.dumps({"parents": {"run": str(study.rd.path), "parent1": study.parent.id, "parent2": study.second[0],
                                  "fitness": fit, "d_p2_p1": round(d12, 4),
                                  "norms": {k: round(v, 6) for k, v in norms.items()},
                                  "score_parent1": scores.get("parent1"), "score_parent2": scores.get("parent2")},
                      "operators": {op: {k: (None if v is None else round(v, 4)) for k, v in r.items()}
                                    for op, r in rows.items()},
                      "floor": floor, "answers": args.answers, "draws": args.draws,
                      "seconds": round(time.perf_counter() - t0, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
