"""``lorapop compare [CONFIG] [--section.key=value ...]``: the paper's comparison as one command.

It trains a population and the single-agent baseline from the same base model and seed with the same per-adapter
compute, evaluates both with ``lorapop eval`` and writes one report overlaying the two runs, with the evaluation
table in the paper's layout (mean / min / max over members vs the baseline).

**Same per-adapter compute**, precisely (docs/METHOD.md, "The step", Update): the baseline's config *is* the
population's config (the YAML and every override) with ``population.mode`` set to ``single`` and
``selfplay.teacher_reward`` to ``auto`` (AZR's learnability for the agent; a command-line override wins), so base
model, seed, task types, ``tasks_per_type`` (T), ``n_solve``, ``n_references``, sampling lengths and temperatures,
LoRA shape, optimiser and ``run.steps`` are equal. Per step every adapter makes exactly one optimiser update, and
every TRR++ group (member, task type, role) holds exactly T samples: a teacher trains on its T proposals per type
(``n_types x T`` samples), a student on T answers per type (``n_types x T``), and the agent, as AZR does, on both its
T proposals and T answers per type (``2 x n_types x T``: one teacher's plus one student's work, the generation and
the samples of one teacher plus one student). ``member/<id>/n_samples`` and ``member/<id>/n_tokens`` in both runs'
metrics.jsonl show it held.

Outputs, under ``<output_dir>/<name>/``: ``population/`` and ``single/`` (ordinary run directories, each with its
``eval.json``), ``eval.json`` (both runs, as ``lorapop eval --out`` writes it), ``report.html`` (both runs overlaid)
``compare.json`` (the per-step curves the README quotes and the evaluation table) and ``criteria.json`` (the
dynamics criteria of lorapop/criteria.py; runs shorter than its minimum get no verdict). Run again with the same name
and a larger ``--run.steps`` to continue both runs from their checkpoints.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lorapop.configlib import doc

# Per-step curves written to compare.json and printed at the end: the dynamics the paper's claims are about.
CURVES = ("valid_rate", "student/matched_solve_rate", "student/topup_solve_rate", "teacher/zero_adv_group_frac",
          "student/zero_adv_group_frac", "coverage", "complexity/cyclomatic", "complexity/ast_depth",
          "format_error_rate", "evolve/replacements")


@dataclass
class CompareConfig:
    name: str = doc("compare", "name of the comparison: the runs go to <output-dir>/<name>/population and "
                               ".../single")
    output_dir: str = doc("runs", "parent directory of the comparison directory")
    eval_benchmarks: str = doc("mbppplus,gsm8k", "benchmarks for `lorapop eval` (names, 'code', 'math', 'available' "
                                                 "or 'all')")
    eval_limit: int | None = doc(20, "evaluate only the first N problems of each benchmark (none: all of them)", ge=1)
    eval_max_new_tokens: int = doc(384, "generation budget per eval answer", ge=1)
    eval_threads: int | None = doc(None, "torch CPU threads during evaluation (default: torch's choice)", ge=1)
    skip_eval: bool = doc(False, "train and report only")


def compare_configs(config: str | None, overrides: list[str], name: str, output_dir: str):
    """(population config, baseline config): the same config, the baseline with ``population.mode=single``."""
    from lorapop.config import load_config, resolve_config_path
    from lorapop.configlib import ConfigError

    path = resolve_config_path(config) if config else None
    for o in overrides:
        if o.startswith(("--population.mode=", "--run.name=", "--run.output_dir=")):
            raise ConfigError(f"override '{o}': lorapop compare sets population.mode, run.name and run.output_dir "
                              "itself (use --name and --output-dir)")
    where = [f"--run.output_dir={Path(output_dir) / name}"]
    pop = load_config(path, overrides + where + ["--run.name=population"])
    if pop.population.mode != "population":
        raise ConfigError(f"{config}: lorapop compare needs a population config (population.mode: population); the "
                          "baseline is derived from it")
    # The baseline is AZR: its proposer is paid AZR's learnability (teacher_reward auto), whatever reward the
    # population's YAML names, unless the command line asks for one (then both runs get it, and a warning).
    reward = [] if any(o.startswith("--selfplay.teacher_reward=") for o in overrides) else \
        ["--selfplay.teacher_reward=auto"]
    single = load_config(path, overrides + where + ["--run.name=single", "--population.mode=single"] + reward)
    return pop, single


def train(cfg: Any, note: Any = print) -> Path:
    """Train one run to ``cfg.run.steps``, continuing it from its last checkpoint when it exists."""
    from lorapop.records.rundir import RunDir
    from lorapop.commands.train import prepare_run_dir
    from lorapop.train.loop import Trainer

    resumable = RunDir(Path(cfg.run.output_dir) / cfg.run.name).resumable()
    run_dir, resume = prepare_run_dir(cfg, resume=resumable, note=note)
    note(f"compare: training {run_dir} ({cfg.population.mode}, {cfg.run.steps} steps"
         f"{', resumed' if resume else ''})")
    with Trainer(cfg, run_dir, resume=resume) as trainer:
        trainer.run()
    return run_dir


def curves(run_dir: Path) -> dict[str, list[float | None]]:
    from lorapop.records.run_data import load_run

    run = load_run(run_dir)
    out: dict[str, list[float | None]] = {"step": [float(s) for s in run.steps]}
    for key in CURVES:  # every curve, None on steps without it (no valid task: no matched solve rate)
        out[key] = [v for _, v in run.series(key)]
    return out


def run_compare(config: str | None, overrides: list[str], ccfg: CompareConfig, note: Any = print) -> dict:
    """Train both runs, evaluate them, write the report and compare.json; returns compare.json's content."""
    from lorapop.eval.runner import EvalConfig, format_table, run_eval
    from lorapop.report.html import write_report

    pop_cfg, single_cfg = compare_configs(config, overrides, ccfg.name, ccfg.output_dir)
    root = Path(ccfg.output_dir) / ccfg.name
    pop_dir = train(pop_cfg, note)
    single_dir = train(single_cfg, note)
    result: dict[str, Any] = {"population": str(pop_dir), "single": str(single_dir), "steps": pop_cfg.run.steps,
                              "seed": pop_cfg.run.seed, "model": pop_cfg.model.name,
                              "compute_per_adapter": {
                                  "updates_per_step": 1,
                                  "trr_group_size": pop_cfg.selfplay.tasks_per_type,
                                  # a teacher's or a student's; the agent trains on both roles' groups: twice this
                                  "samples_per_update": len(pop_cfg.selfplay.task_types)
                                  * pop_cfg.selfplay.tasks_per_type,
                                  "agent_samples_per_update": 2 * len(pop_cfg.selfplay.task_types)
                                  * pop_cfg.selfplay.tasks_per_type,
                                  "n_solve": pop_cfg.selfplay.n_solve,
                                  "population_adapters": pop_cfg.population.n_members, "single_adapters": 1},
                              "curves": {"population": curves(pop_dir), "single": curves(single_dir)}}
    if not ccfg.skip_eval:
        ecfg = EvalConfig(benchmarks=ccfg.eval_benchmarks, limit=ccfg.eval_limit,
                          max_new_tokens_code=ccfg.eval_max_new_tokens, max_new_tokens_math=ccfg.eval_max_new_tokens,
                          baseline=str(single_dir), out=str(root / "eval.json"), threads=ccfg.eval_threads,
                          device=pop_cfg.engine.device, dtype=pop_cfg.engine.dtype, backend=pop_cfg.engine.backend)
        note(f"compare: evaluating both runs ({ccfg.eval_benchmarks}, limit {ccfg.eval_limit})")
        ev = run_eval([str(pop_dir), str(single_dir)], ecfg)
        result["eval_table"] = format_table(ev)
        result["eval"] = {"benchmarks": ev["benchmarks"], "n_problems": ev["n_problems"],
                          "base": ev["base"]["scores"], "errors": ev["errors"],
                          "runs": {Path(r["run_dir"]).name: r["population"] for r in ev["runs"]}}
    result["report"] = str(write_report([pop_dir, single_dir], root / "report.html"))
    (root / "compare.json").write_text(json.dumps(result, indent=1))
    # the pre-registered dynamics criteria (docs/RESULTS.md), so any run pair is judged by the same code
    from lorapop.criteria import criteria

    (root / "criteria.json").write_text(json.dumps(criteria(pop_dir, single_dir), indent=1))
    return result


def summary_lines(result: dict) -> list[str]:
    """What the terminal shows at the end: per run, each curve's first and last value, then the eval table."""
    lines = []
    for run, cs in result["curves"].items():
        for key, vals in cs.items():
            if key == "step" or all(v is None for v in vals):
                continue
            shown = ", ".join("-" if v is None else f"{v:.3g}" for v in vals)
            lines.append(f"{run:<10} {key:<30} {shown}")
    if result.get("eval_table"):
        lines += ["", result["eval_table"]]
    lines += ["", f"report: {result['report']}"]
    return lines


def add_arguments(p: argparse.ArgumentParser) -> None:
    from lorapop.configlib import add_arguments as add_flags

    p.add_argument("config", nargs="?", default="cpu_demo",
                   help="population config: YAML file or shipped name (default cpu_demo); the baseline is the same "
                        "config with population.mode=single")
    add_flags(p, CompareConfig)


def run(args: argparse.Namespace) -> int:
    from lorapop.configlib import ConfigError, from_args

    try:
        ccfg = from_args(CompareConfig, args)
        result = run_compare(args.config, list(args.overrides), ccfg)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"lorapop compare: {e}", file=sys.stderr)
        return 2
    print("\n".join(summary_lines(result)))
    return 0
