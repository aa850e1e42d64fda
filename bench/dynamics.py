"""The dynamics experiment (docs/RESULTS.md, "Dynamics: pre-registration"), every seed in one command:

    PYTHONPATH=. .venv/bin/python bench/dynamics.py [--seeds 0,1,2] [--out runs/dynamics] [--config cpu_dynamics]
                                                    [--report-only] [--section.key=value ...]

Per seed it runs ``lorapop compare CONFIG --run.seed=N --skip-eval`` into ``<out>/seed<N>/`` (the population and its
compute-matched single agent; killed, the same command continues both from their checkpoints), then judges the pair
with lorapop/criteria.py (``criteria.json`` beside ``compare.json``). At the end, over the seeds that finished:
``<out>/dynamics.json`` (each seed's criteria and the experiment's verdict: a criterion holds when it holds in at
least 2 of 3 seeds), ``<out>/dynamics.svg`` (per seed, the two runs' matched solve rate, program AST depth and
coverage overlaid: the project's own plotting, lorapop/report/svg.py), a markdown table for docs/RESULTS.md, and one
line of JSON. ``--report-only`` skips training and reports on what is there.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lorapop.commands.compare import CompareConfig, run_compare  # noqa: E402
from lorapop.criteria import across_seeds, criteria  # noqa: E402
from lorapop.records.run_data import load_run  # noqa: E402
from lorapop.report.svg import PALETTE, Series, figure_svg, plot_svg  # noqa: E402

PANELS = (("student/matched_solve_rate", "matched solve rate", (0.0, 1.0)),
          ("complexity/ast_depth", "AST depth of valid proposals", None),
          ("coverage", "coverage", None))
RUNS = (("population", PALETTE[1], ""), ("single", PALETTE[0], "6 3"))


def fmt(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k} {fmt(x)}" for k, x in v.items())
    if isinstance(v, float):
        return f"{v:.3g}"
    return "-" if v is None else str(v)


def floor_note(floor: dict[str, Any] | None) -> str:
    """A probe verdict's noise floor (lorapop/train/probe.py), printed beside it: each run's step-0 spread."""
    if not floor:
        return ""
    spread = {run: (nf or {}).get("spread") for run, nf in floor.items()}
    return "; noise floor (step-0 spread): " + ", ".join(f"{run} {fmt(v)}" for run, v in spread.items())


def table(per_seed: dict[int, dict[str, Any]], verdict: dict[str, dict[str, Any]]) -> str:
    seeds = sorted(per_seed)
    head = "| criterion | " + " | ".join(f"seed {s}" for s in seeds) + " | holds (>= 2 of 3) |"
    lines = [head, "|" + " --- |" * (len(seeds) + 2)]
    for k, v in verdict.items():
        cells = []
        for s in seeds:
            c = per_seed[s][k]
            mark = {True: "held", False: "failed", None: "not judged"}[c["held"]]
            cells.append(f"{mark}: {fmt(c['value'])}" + (f" ({c['why']})" if c.get("why") else "")
                         + floor_note(c.get("noise_floor")))
        lines.append(f"| `{k}` | " + " | ".join(cells) + f" | {'**yes**' if v['holds'] else 'no'} |")
    return "\n".join(lines)


def figure(root: Path, seeds: list[int]) -> str:
    plots = []
    for s in seeds:
        runs = {name: load_run(root / f"seed{s}" / name) for name, _, _ in RUNS}
        for key, label, y_range in PANELS:
            series = [Series(name, runs[name].series(key), color=c, dash=d) for name, c, d in RUNS]
            plots.append((f"seed {s}: {label}", plot_svg(series, f"seed {s}: {label}", y_range=y_range)))
    return figure_svg(plots, cols=len(PANELS), title="cpu_dynamics: population (2T+2S) vs single agent (AZR)",
                      legend=[Series(f"{name}", [], color=c, dash=d) for name, c, d in RUNS])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", default="runs/dynamics")
    ap.add_argument("--config", default="cpu_dynamics")
    ap.add_argument("--report-only", action="store_true")
    args, overrides = ap.parse_known_args(argv)
    root, seeds = Path(args.out), [int(s) for s in args.seeds.split(",")]
    times: dict[int, float] = {}
    for s in seeds if not args.report_only else []:
        t0 = time.perf_counter()
        run_compare(args.config, overrides + [f"--run.seed={s}"],
                    CompareConfig(name=f"seed{s}", output_dir=str(root), skip_eval=True))
        times[s] = time.perf_counter() - t0
        print(f"seed {s}: both runs done in {times[s] / 60:.1f} min", flush=True)
    per_seed = {s: criteria(root / f"seed{s}" / "population", root / f"seed{s}" / "single")
                for s in seeds if (root / f"seed{s}" / "compare.json").is_file()}
    for s, c in per_seed.items():
        (root / f"seed{s}" / "criteria.json").write_text(json.dumps(c, indent=1))
    verdict = across_seeds(list(per_seed.values())) if per_seed else {}
    out = {"seeds": sorted(per_seed), "per_seed": per_seed, "verdict": verdict, "minutes": {
        s: round(t / 60, 1) for s, t in times.items()}}
    root.mkdir(parents=True, exist_ok=True)
    (root / "dynamics.json").write_text(json.dumps(out, indent=1))
    if per_seed:
        (root / "dynamics.svg").write_text(figure(root, sorted(per_seed)))
        print(table(per_seed, verdict))
    print(json.dumps({"seeds": sorted(per_seed), "holds": {k: v["holds"] for k, v in verdict.items()},
                      "minutes": out["minutes"]}))
    return out


if __name__ == "__main__":
    main()
