"""Executor throughput on the 256 AZR seed triples, validated as teacher proposals (full validity check,
determinism included), against a fresh interpreter per run doing the same work; and the cost of the isolation.

    python bench/executor.py [SEED_FILE]      (default: the seed file shipped in lorapop/data/seeds/)

Isolation cost: runs/s with today's isolation against the sandbox before it, for root (namespaces + uid
drop + seccomp against the same without seccomp) and for an unprivileged user (user namespace + dropped capabilities
+ seccomp against rlimits and fork per run only, which is all an ordinary user had before). As root, the
unprivileged half runs this script again as uid 65534 (tests/unprivileged.py); as anyone else there is
no root half. Each figure is the median of 5 passes; both sides of a ratio are measured in the same process.

The baseline starts `sys.executable -I -c CODE` per run (isolated mode: the trainer's environment and user site
do not leak in - the least a fresh-process sandbox does), with the same parallelism as the executor. It is also
timed with `-S` (no site import at all) and printed for comparison. Last line: one JSON object.
"""

from __future__ import annotations

import json
import statistics
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # tests/unprivileged.py

import unprivileged  # noqa: E402
from lorapop.executor import ExecutorConfig, SandboxExecutor  # noqa: E402
from lorapop.tasks import TASK_TYPES, Invalid, Proposal, read_seed_file  # noqa: E402
from lorapop.tasks.common import DETERMINISM_SEEDS  # noqa: E402
from lorapop.tasks.validity import call_code, check_call_args, check_literal, check_program  # noqa: E402

SEED_REL = Path("seeds") / "azr_7b_coder_seed_io.jsonl"


def seed_path() -> Path:
    if len(sys.argv) > 1:
        return Path(sys.argv[1])
    from lorapop.data import data_dir

    return data_dir() / SEED_REL


def subprocess_validate(props: list[Proposal], n_par: int, extra: list[str], timeout_s: float) -> int:
    """Same checks as validate_many, one fresh interpreter per run; returns the number of valid tasks."""
    runner = "\nimport sys\nsys.stdout.write(repr(_result))\n"

    def one(p: Proposal) -> bool:
        if check_program(p.program) or check_call_args(p.inputs[0]):
            return False
        outs = []
        for seed in DETERMINISM_SEEDS:
            env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": str(seed)}
            try:
                r = subprocess.run([sys.executable, *extra, "-c", call_code(p.program, p.inputs[0]) + runner],
                                   capture_output=True, timeout=timeout_s, env=env, cwd="/tmp")
            except subprocess.TimeoutExpired:
                return False
            if r.returncode != 0:
                return False
            outs.append(r.stdout.decode("utf-8", "replace"))
        return outs[0] == outs[1] and check_literal(outs[0]) is None

    with ThreadPoolExecutor(n_par) as pool:
        return sum(pool.map(one, props))


NO_ISOLATION = {"isolate_network": False, "isolate_filesystem": False, "isolate_pids": False,
                "drop_privileges": False, "seccomp": False}


def _executor(**overrides) -> SandboxExecutor:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the opt-out's warning: today's sandboxes on purpose
        ex = SandboxExecutor(ExecutorConfig(allow_unisolated=bool(overrides), **overrides))
    for seed in DETERMINISM_SEEDS:  # start the pools (one-off cost, not per task)
        ex.run_many(["_result = 0"] * ex.config.n_workers, hashseed=seed)
    return ex


def isolation_cost(props: list[Proposal]) -> dict:
    """This user's new isolation against what it had before (see the module docstring). Passes alternate between
    the two sandboxes, so load from other processes drifting over the minute hits both alike."""
    new = _executor()
    mechanism = new.protections["mechanism"]
    old = _executor(**({"seccomp": False} if mechanism == "root" else NO_ISOLATION))
    times: dict[str, list[float]] = {"new": [], "old": []}
    try:
        for _ in range(5):
            for name, ex in (("new", new), ("old", old)):
                t0 = time.perf_counter()
                TASK_TYPES["code_o"].validate_many(props, ex)
                times[name].append(time.perf_counter() - t0)
    finally:
        new.close()
        old.close()
    rate = {k: 2 * len(props) / statistics.median(v) for k, v in times.items()}
    return {"mechanism": mechanism, "runs_per_s": round(rate["new"], 1), "before_runs_per_s": round(rate["old"], 1),
            "cost": round(1 - rate["new"] / rate["old"], 3)}


def main() -> None:
    if sys.argv[1:2] == ["--isolation-only"]:  # the unprivileged half, run by the root half
        print(json.dumps(isolation_cost(load_props(Path(sys.argv[2])))))
        return
    path = seed_path()
    props = load_props(path)
    ex = _executor()
    cfg = ex.config
    print(f"seeds: {len(props)} from {path}")
    print(f"protections: {ex.protections}")
    # One pass over the 256 seeds takes under a second, so a single timing swung by 30% on this shared machine:
    # take the median of 5 passes (the fresh-subprocess pass takes seconds and is timed once).
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        results = TASK_TYPES["code_o"].validate_many(props, ex)
        times.append(time.perf_counter() - t0)
    dt = statistics.median(times)
    ex.close()
    n_valid = sum(not isinstance(r, Invalid) for r in results)
    reasons: dict[str, int] = {}
    for r in results:
        if isinstance(r, Invalid):
            reasons[r.reason] = reasons.get(r.reason, 0) + 1
    rate = len(props) / dt
    print(f"executor: {rate:.1f} tasks/s ({2 * rate:.0f} runs/s), valid {n_valid}/{len(props)}, invalid {reasons}")

    t0 = time.perf_counter()
    sub_valid = subprocess_validate(props, cfg.n_workers, ["-I"], cfg.timeout_s)
    sub_rate = len(props) / (time.perf_counter() - t0)
    print(f"fresh subprocess ({Path(sys.executable).name} -I): {sub_rate:.1f} tasks/s, valid {sub_valid}")
    subset = props[:64]
    t0 = time.perf_counter()
    subprocess_validate(subset, cfg.n_workers, ["-I", "-S"], cfg.timeout_s)
    sub_s_rate = len(subset) / (time.perf_counter() - t0)
    print(f"fresh subprocess (-I -S, first 64): {sub_s_rate:.1f} tasks/s; speedup vs it {rate / sub_s_rate:.1f}x")
    print(f"speedup: {rate / sub_rate:.1f}x")
    iso = {}
    if os.geteuid() == 0:
        iso["root"] = isolation_cost(props)
        r = unprivileged.run("bench/executor.py", ["--isolation-only", str(path.relative_to(REPO))
                                                   if path.is_relative_to(REPO) else str(path)], timeout=600)
        if r.returncode != 0:
            raise SystemExit(f"unprivileged half failed: {r.stderr[-2000:]}")
        iso["unprivileged"] = json.loads(r.stdout.strip().splitlines()[-1])
    else:
        iso["unprivileged"] = isolation_cost(props)
    for who, c in iso.items():
        print(f"isolation, {who} ({c['mechanism']}): {c['runs_per_s']} runs/s against {c['before_runs_per_s']} "
              f"before: cost {100 * c['cost']:.1f}%")
    out = {"tasks_per_s": round(rate, 2), "subprocess_tasks_per_s": round(sub_rate, 2),
           "speedup": round(rate / sub_rate, 2), "valid": n_valid, "total": len(props),
           "subprocess_nosite_tasks_per_s": round(sub_s_rate, 2)}
    for who, c in iso.items():
        out.update({f"{who}_{k}": v for k, v in c.items()})
    print(json.dumps(out))


def load_props(path: Path) -> list[Proposal]:
    if not path.is_absolute() and not path.exists():
        path = REPO / path
    return [Proposal("code_o", t.program, t.inputs) for t in read_seed_file(path, "code_o")]


if __name__ == "__main__":
    main()
