"""Long-run memory soak: one run's resident memory and in-memory structures after every step.

    PYTHONPATH=. .venv/bin/python bench/soak.py [--config cpu_demo] [--steps 100] [--out runs/soak] [--resume]
                                                 [--section.key=value ...]

    PYTHONPATH=. .venv/bin/python bench/soak.py --steps 40 --kills 2 --out runs/soak-kills   # resume exactness

Trains CONFIG (default: ``cpu_demo`` at a soak shape, SOAK below: PBT every 4 steps, short replies, so 100 steps
fit in under an hour on 2 cores) in this process, step by step, and after every step appends to
``<out>/soak.jsonl``: resident memory of this process and of its children (the sandbox workers), on CUDA
``memory_allocated`` / ``max_memory_reserved``, the sizes of the run's own in-memory structures (task buffers,
coverage archive, ratings, lineage, live Python objects, compiled graphs, the engine's KV cache allocations) and the
run directory's bytes. Killed, ``--resume`` continues the run from its last checkpoint and appends.

At the end it prints the growth per step over the second half of the steps (ordinary least squares slope of RSS in
MB per step with its 95% interval; the first half holds warm-up: allocator arenas, caches filling) and one line of
JSON: ``rss_mb_per_step``, its interval, the same for each step's own peak resident memory (``peak_mb_per_step``:
VmHWM reset before every step), ``rss_start_mb``, ``rss_end_mb``, ``dir_mb_per_step`` and the last step's
structure sizes.

``--runs N``: N runs of ``--steps`` in one process, resident memory after each (8.9 GB once grew in a
bench/dynamics.py process that ran several).

``--kills K``: after the uninterrupted run, the same run again in child processes, each SIGKILLed (with its
sandbox workers) at a random moment (seeded by ``--kill-seed``) and continued with ``--resume``, K times, then to the
end. Its ``metrics.jsonl`` must equal the uninterrupted run's line for line, wall-clock fields aside
(``resume_equal``, with the first differing step and keys), and its checkpoint directory must hold no more than
``run.keep_checkpoints`` checkpoints (``checkpoints_kept``).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SOAK = ["--selfplay.task_types=[code_o,code_i]", "--selfplay.tasks_per_type=2",
        "--selfplay.propose.max_new_tokens=64", "--selfplay.solve.max_new_tokens=32",
        "--evolve.perturbation_interval=4", "--evolve.burn_in_period=2", "--evolve.min_rated_matches=0",
        "--run.save_interval=5", "--run.keep_checkpoints=2", "--run.progress=plain"]


def _kb(field: str, pid: int | str = "self") -> int:
    from lorapop.hostmem import proc_status_kb

    return proc_status_kb(field, pid) or 0


def children_rss_mb() -> float:
    """Resident MB of this process's descendants (the sandbox's workers and their forks)."""
    me, total = os.getpid(), 0
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    for pid in parents:
        p, seen = pid, 0
        while p in parents and p != me and seen < 64:
            p, seen = parents[p], seen + 1
        if p == me and pid != me:
            total += _kb("VmRSS", pid)
    return total / 1024


def reset_peak() -> bool:
    """Start VmHWM again from the current resident size (Linux >= 4.0: ``5`` to /proc/self/clear_refs), so the peak
    read after a step is that step's own; False where the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def structures(tr) -> dict:
    """Sizes of what the run keeps in memory and could grow with steps."""
    import torch

    out = {
        "buffer_tasks": sum(len(b) for b in tr.buffers.values()),
        "buffer_json_kb": round(sum(len(json.dumps(b.state_dict())) for b in tr.buffers.values()) / 1024, 1),
        "coverage_filled": len(tr.coverage.filled),
        "coverage_member_keys": len(tr.coverage.by_teacher) + len(tr.coverage.by_student),
        "ratings": len(tr.ratings.ratings),
        "lineage": len(tr.population.lineage),
        "members": len(tr.population.members),
        "py_objects": len(gc.get_objects()),
        "kv_cache_allocations": getattr(getattr(getattr(tr.engine, "trainer", tr.engine), "kv", None), "allocations",
                                        0),
    }
    try:
        from torch._dynamo.utils import counters

        out["compiled_graphs"] = int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - a private counter; absent is fine
        pass
    if torch.cuda.is_available():
        out["cuda_allocated_mb"] = round(torch.cuda.memory_allocated() / 2**20, 1)
        out["cuda_max_reserved_mb"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
    return out


def slope(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """OLS slope and its 95% interval (t quantile, n - 2 degrees of freedom)."""
    n = len(xs)
    if n < 3:
        return float("nan"), float("nan"), float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    resid = [y - (my + b * (x - mx)) for x, y in zip(xs, ys)]
    se = math.sqrt(sum(r * r for r in resid) / (n - 2) / sxx)
    from scipy.stats import t  # scipy comes with pyribs

    h = float(t.ppf(0.975, n - 2)) * se
    return b, b - h, b + h


WALL_CLOCK = ("time", "engine/sync_s")


def _comparable(line: dict) -> dict:
    """A metrics line without what a kill changes: wall clock and the process's memory (``perf/``)."""
    return {k: v for k, v in line.items() if k not in WALL_CLOCK and not k.startswith(("time/", "perf/"))}


class TrimMeter:
    """Times the trainer's ``malloc_trim`` calls (lorapop/hostmem.py) and measures what each handed back: resident
    memory and glibc's free heap just before, resident memory just after. Instrumentation only: the trim runs."""

    def __init__(self):
        from lorapop.train import loop

        self.loop, self.real = loop, loop.release_free_memory
        loop.release_free_memory = self
        self.reset()

    def reset(self) -> None:
        self.calls, self.seconds, self.released_mb, self.free_before_mb = 0, 0.0, 0.0, 0.0

    def __call__(self) -> bool:
        from lorapop.hostmem import heap_stats

        before, heap = _kb("VmRSS"), heap_stats() or {}
        t = time.perf_counter()
        ok = self.real()
        self.seconds += time.perf_counter() - t
        self.calls += 1
        self.released_mb += (before - _kb("VmRSS")) / 1024
        self.free_before_mb = max(self.free_before_mb, heap.get("heap_free_mb", 0.0))
        return ok

    def take(self) -> dict:
        out = {"trims": self.calls, "trim_s": round(self.seconds, 3), "trim_released_mb": round(self.released_mb, 1),
               "heap_free_before_trim_mb": self.free_before_mb}
        self.reset()
        return out


def killed_and_resumed(args, overrides: list[str], duration_s: float) -> dict:
    """The run of ``args.out`` again under ``<out>/killed``, SIGKILLed ``args.kills`` times at random moments."""
    import random
    import signal
    import subprocess

    rng = random.Random(args.kill_seed)
    out = Path(args.out) / "killed"
    base = [sys.executable, __file__, "--config", args.config, "--steps", str(args.steps), "--out", str(out)]
    kills, first = [], True
    for _ in range(args.kills):
        # each life gets a random share of one K-th of the run, so all K kills land before it could finish
        at = rng.uniform(0.2, 0.8) * duration_s / args.kills
        cmd = base + overrides if first else base + ["--resume"]
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            p.wait(timeout=at)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            kills.append(round(at, 1))
        first = False
    subprocess.run(base + ["--resume"], check=True, stdout=subprocess.DEVNULL)
    want = [_comparable(json.loads(x)) for x in (Path(args.out) / "run" / "metrics.jsonl").read_text().splitlines()]
    got = [_comparable(json.loads(x)) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    diff = next(((w.get("step"), sorted(k for k in set(w) | set(g) if w.get(k) != g.get(k)))
                 for w, g in zip(want, got) if w != g), None)
    from lorapop.records.rundir import RunDir

    kept = len(RunDir(out / "run").list_checkpoints())
    where = "" if diff is None else f"; first at step {diff[0]}: {diff[1][:8]}"
    print(f"killed at {kills} s and resumed: metrics {'equal' if want == got else 'DIFFER'} to the uninterrupted "
          f"run's ({len(got)} vs {len(want)} steps{where}); {kept} checkpoints kept")
    return {"resume_equal": want == got, "kills_at_s": kills, "first_difference": diff, "checkpoints_kept": kept}


def soak_config(args, overrides: list[str], name: str):
    """CONFIG at the soak shape (or, with ``--config-shape``, its own shapes with SOAK's run settings), the command
    line's overrides, ``--steps`` and the run directory ``<out>/<name>``."""
    from lorapop.config import load_config, resolve_config_path

    shape = [o for o in SOAK if o.startswith("--run.")] if args.config_shape else SOAK
    return load_config(resolve_config_path(args.config), shape + overrides + [
        f"--run.steps={args.steps}", f"--run.output_dir={args.out}", f"--run.name={name}"])


def runs_in_one_process(args, overrides: list[str]) -> dict:
    """``--runs N``: CONFIG trained N times one after another in this process, as bench/dynamics.py and ``lorapop
    compare`` do; resident memory after each run is closed (its engine freed), before and after a ``malloc_trim``."""
    from lorapop.hostmem import release_free_memory
    from lorapop.commands.train import prepare_run_dir
    from lorapop.train.loop import Trainer

    after, trimmed = [], []
    for i in range(args.runs):
        cfg = soak_config(args, overrides, f"run{i}")
        run_dir, resume = prepare_run_dir(cfg, resume=False)
        with Trainer(cfg, run_dir, resume=resume) as tr:
            tr.run()
        del tr
        gc.collect()
        after.append(round(_kb("VmRSS") / 1024, 1))
        release_free_memory()
        trimmed.append(round(_kb("VmRSS") / 1024, 1))
        print(f"run {i + 1}/{args.runs} closed: resident {after[-1]:.0f} MB, {trimmed[-1]:.0f} MB after malloc_trim")
    return {"runs": args.runs, "rss_after_run_mb": after, "rss_after_run_trimmed_mb": trimmed,
            "hwm_mb": round(_kb("VmHWM") / 1024, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="cpu_demo")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--out", default="runs/soak")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--kills", type=int, default=0, help="then the same run again, SIGKILLed and resumed K times")
    ap.add_argument("--kill-seed", type=int, default=0)
    ap.add_argument("--config-shape", action="store_true",
                    help="keep CONFIG's own shapes (only SOAK's checkpoint and progress settings apply)")
    ap.add_argument("--runs", type=int, default=1,
                    help="N runs of --steps one after another in this process (what bench/dynamics.py does)")
    args, overrides = ap.parse_known_args()
    if args.runs > 1:
        print(json.dumps(runs_in_one_process(args, overrides)))
        return

    from lorapop.hostmem import heap_stats
    from lorapop.commands.train import load_run_config, prepare_run_dir
    from lorapop.train.loop import Trainer

    out = Path(args.out)
    run = out / "run"
    log = out / "soak.jsonl"
    if args.resume:
        cfg = load_run_config(run, [f"--run.steps={args.steps}"])
    else:
        if run.exists():
            raise SystemExit(f"{run} exists: --resume continues it, or choose another --out")
        out.mkdir(parents=True, exist_ok=True)
        log.unlink(missing_ok=True)
        cfg = soak_config(args, overrides, "run")
    run_dir, resume = prepare_run_dir(cfg, resume=args.resume)
    t0, trims = time.time(), TrimMeter()
    last_hwm = json.loads(log.read_text().splitlines()[-1])["hwm_mb"] if log.is_file() and log.stat().st_size else 0.0
    with Trainer(cfg, run_dir, resume=resume) as tr, log.open("a") as f:
        if tr.step == 0:
            tr.probe(0)
        while tr.step < cfg.run.steps:
            per_step = reset_peak()
            tr.train_step(tr.step + 1)
            peak = round(_kb("VmHWM") / 1024, 1)
            row = {"step": tr.step, "time": round(time.time() - t0, 1), "rss_mb": round(_kb("VmRSS") / 1024, 1),
                   "hwm_mb": max(peak, last_hwm), "step_peak_mb": peak if per_step else None,
                   "children_rss_mb": round(children_rss_mb(), 1),
                   "dir_mb": round(dir_bytes(run_dir) / 2**20, 2), **(heap_stats() or {}), **trims.take(),
                   **structures(tr)}
            last_hwm = row["hwm_mb"]
            f.write(json.dumps(row) + "\n")
            f.flush()
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    half = rows[len(rows) // 2:]
    b, lo, hi = slope([r["step"] for r in half], [r["rss_mb"] for r in half])
    # the trend of each step's own peak where the kernel resets it (else of the running peak, which never falls)
    peak_key = "step_peak_mb" if all(r.get("step_peak_mb") for r in half) else "hwm_mb"
    hb, hlo, hhi = slope([r["step"] for r in half], [r[peak_key] for r in half])
    db, _, _ = slope([r["step"] for r in half], [r["dir_mb"] for r in half])
    print(f"RSS {rows[0]['rss_mb']:.0f} MB after step {rows[0]['step']} -> {rows[-1]['rss_mb']:.0f} MB after step "
          f"{rows[-1]['step']}; second half: {b:+.2f} MB/step (95% interval {lo:+.2f} to {hi:+.2f}); run directory "
          f"{db:+.3f} MB/step; peak resident {rows[-1]['hwm_mb']:.0f} MB, {peak_key} second half {hb:+.2f} MB/step "
          f"({hlo:+.2f} to {hhi:+.2f})")
    res = {"rss_mb_per_step": round(b, 3), "rss_mb_per_step_ci95": [round(lo, 3), round(hi, 3)],
           "peak_mb_per_step": round(hb, 3), "peak_series": peak_key,
           "peak_mb_per_step_ci95": [round(hlo, 3), round(hhi, 3)], "rss_start_mb": rows[0]["rss_mb"],
           "rss_end_mb": rows[-1]["rss_mb"], "dir_mb_per_step": round(db, 4),
           "steps": len(rows), **{k: v for k, v in rows[-1].items() if k not in ("step", "time", "rss_mb")}}
    if args.kills and not args.resume:
        res.update(killed_and_resumed(args, overrides, rows[-1]["time"]))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
