"""Wall-clock per self-play step: 4T+4S vs the single agent with identical per-adapter work, and 4T+4S through the
multi-LoRA engine vs the same population run one adapter at a time.

    .venv/bin/python bench/step_overhead.py [--steps 1] [--tasks-per-type 2]
    .venv/bin/python bench/step_overhead.py --report-to tensorboard,wandb,trackio,mlflow [--steps 3]

The runs use the shipped CPU demo config (`cpu_demo`: embedded model, bf16 base, one reference, 160-token proposals,
96-token answers, n_solve 2) with only the population and the amount of work changed, so a step looks like a demo
step. Every generated row is forced to its full length (min_new_tokens = max_new_tokens) so all three runs do the
same token work whatever the model writes; each run does one warm-up step that is not timed. Last line: JSON with `population_over_single` and
`sequential_over_population` (target on a 2-core CPU: sequential_over_population >= 1.3; the paper reports
population/single = 1.31 on 8xH100).

``--report-to LIST`` times instead what experiment trackers add to a step: the single-agent demo step with
``run.report_to`` = LIST against ``[tensorboard]``, in one process, the two runs alternating step by step. The trackers
write under a temporary directory (wandb offline, trackio's and mlflow's local sqlite stores), so nothing goes over
the network. Besides the step time it reports the main thread's time inside ``MetricsLogger.log_step`` (where a
tracker could cost the loop anything: each one logs from its own thread). Last line: JSON with
``trackers_over_tensorboard`` (step time ratio, target ~1.0 within noise) and ``log_step_ms`` per run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lorapop.config import load_config  # noqa: E402
from lorapop.engine.base import SamplingParams, TrainSample  # noqa: E402
from lorapop.train.loop import Trainer  # noqa: E402

DEMO = str(Path(__file__).resolve().parents[1] / "lorapop" / "configs" / "cpu_demo.yaml")


class OneAdapterAtATime:
    """The naive way: every generate/train call is split by adapter and run adapter after adapter."""

    def __init__(self, engine):
        self.inner = engine

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, prompts, adapter_ids, params: SamplingParams, seeds=None):
        out = [None] * len(prompts)
        groups = defaultdict(list)
        for i, a in enumerate(adapter_ids):
            groups[a].append(i)
        for a, idx in groups.items():
            res = self.inner.generate([prompts[i] for i in idx], [a] * len(idx), params,
                                      seeds=[seeds[i] for i in idx] if seeds is not None else None)
            for i, r in zip(idx, res):
                out[i] = r
        return out

    def train_step(self, samples: list[TrainSample]):
        stats = {}
        groups = defaultdict(list)
        for s in samples:
            groups[s.adapter_id].append(s)
        for group in groups.values():
            stats.update(self.inner.train_step(group))
        return stats


def timed_log_step(trainer):
    """Wrap the trainer's log_step so the main thread's time in it is recorded (seconds per call)."""
    spent = []
    inner = trainer.logger.log_step

    def log_step(step, metrics):
        t = time.perf_counter()
        inner(step, metrics)
        spent.append(time.perf_counter() - t)

    trainer.logger.log_step = log_step
    return spent


def tracker_overhead(common, report_to, steps):
    """Two trainers, [tensorboard] and ``report_to``, stepping in turn (so machine load hits both alike)."""
    import os
    import statistics

    with tempfile.TemporaryDirectory() as d:
        for k, v in {"WANDB_MODE": "offline", "WANDB_DIR": d, "WANDB_SILENT": "true",
                     "TRACKIO_DIR": f"{d}/trackio", "MLFLOW_TRACKING_URI": f"sqlite:///{d}/mlflow.db"}.items():
            os.environ[k] = v  # offline and local, whatever the shell says: no network in a bench
        arms = {"tensorboard": ["tensorboard"], "trackers": report_to}
        trainers, spent, times = {}, {}, {k: [] for k in arms}
        try:
            for name, rt in arms.items():
                cfg = load_config(DEMO, common + ["--population.mode=single", f"--run.output_dir={d}",
                                                  f"--run.name={name}", f"--run.report_to=[{','.join(rt)}]"])
                trainers[name] = Trainer(cfg, Path(d) / name)
                spent[name] = timed_log_step(trainers[name])
                trainers[name].train_step(1)  # warm-up: first-call allocations, sandbox start, tracker start
            for name, t in trainers.items():
                if t.logger.trackers is not None:
                    t.logger.trackers.flush(600)  # their runs started (imports, wandb service) before timing
            for s in range(2, steps + 2):
                for name, t in trainers.items():
                    t0 = time.perf_counter()
                    t.train_step(s)
                    times[name].append(time.perf_counter() - t0)
        finally:
            for t in trainers.values():
                t.close()
    res = {"trackers": report_to, "steps": steps,
           "trackers_over_tensorboard": round(statistics.fmean(times["trackers"]) /
                                              statistics.fmean(times["tensorboard"]), 3),
           "s_per_step": {k: round(statistics.fmean(v), 3) for k, v in times.items()},
           "log_step_ms": {k: round(1000 * statistics.fmean(v[1:]), 2) for k, v in spent.items()}}
    print(f"step with {report_to}: {res['s_per_step']['trackers']:.2f} s, with [tensorboard]: "
          f"{res['s_per_step']['tensorboard']:.2f} s ({res['trackers_over_tensorboard']}x); main thread in "
          f"log_step: {res['log_step_ms']['trackers']} ms vs {res['log_step_ms']['tensorboard']} ms")
    print(json.dumps(res))


def time_run(overrides, steps, sequential=False):
    with tempfile.TemporaryDirectory() as d:
        cfg = load_config(DEMO, overrides + [f"--run.output_dir={d}", "--run.name=b"])
        trainer = Trainer(cfg, Path(d) / "b")
        if sequential:
            trainer.engine = OneAdapterAtATime(trainer.engine)
        try:
            trainer.train_step(1)  # warm-up: first-call allocations, sandbox start
            t0 = time.perf_counter()
            for s in range(2, steps + 2):
                m = trainer.train_step(s)
            dt = (time.perf_counter() - t0) / steps
        finally:
            trainer.close()
            trainer.progress.close()
            trainer.logger.close()
        tokens = {k: v for k, v in m.items() if k.endswith("/n_tokens")}
        stages = {k[5:]: round(v, 1) for k, v in m.items() if k.startswith("time/") and v >= 0.05}
        return dt, tokens, stages


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--tasks-per-type", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--report-to", default=None, metavar="LIST",
                    help="time a step with these run.report_to trackers (e.g. tensorboard,wandb,trackio,mlflow) "
                         "against [tensorboard] instead")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    demo = load_config(DEMO)
    common = [
        f"--selfplay.tasks_per_type={a.tasks_per_type}",
        f"--selfplay.propose.min_new_tokens={demo.selfplay.propose.max_new_tokens}",
        f"--selfplay.solve.min_new_tokens={demo.selfplay.solve.max_new_tokens}",
        "--engine.gen_batch_size=128",
        "--evolve.burn_in_period=1000", "--run.save_interval=1000", "--run.report_to=none",
        "--run.progress=none",
    ]
    if a.report_to:
        return tracker_overhead(common, [n for n in a.report_to.split(",") if n], a.steps)
    pop = common + ["--population.n_teachers=4", "--population.n_students=4"]
    single = common + ["--population.mode=single"]
    t_single, tok_single, st = time_run(single, a.steps)
    print(f"single   : {t_single:7.2f} s/step  stages {st}  trained tokens {tok_single}")
    t_pop, tok_pop, st = time_run(pop, a.steps)
    print(f"4T+4S    : {t_pop:7.2f} s/step  stages {st}  trained tokens {tok_pop}")
    t_seq, _, st = time_run(pop, a.steps, sequential=True)
    print(f"4T+4S one adapter at a time: {t_seq:7.2f} s/step  stages {st}")
    res = {"population_over_single": round(t_pop / t_single, 3), "sequential_over_population": round(t_seq / t_pop, 3),
           "single_s_per_step": round(t_single, 2), "population_s_per_step": round(t_pop, 2),
           "sequential_s_per_step": round(t_seq, 2)}
    print(f"population/single = {res['population_over_single']}x (paper: 1.31x on 8xH100); "
          f"sequential/population = {res['sequential_over_population']}x (target >= 1.3x)")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
