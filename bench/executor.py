"""Executor throughput on the 256 AZR seed triples, validated as teacher proposals (full validity check,
determinism included), against a fresh interpreter per run doing the same work; and the cost of the isolation.

    python bench/executor.py [SEED_FILE] [--before GIT_REF] [--rounds N]
                                     (default seeds: the file shipped in lorapop/data/seeds/)

Rates and ratios come from interleaved rounds (``--rounds``, 7 by default): each round validates the seeds once in this
tree, once in the tree at ``--before GIT_REF`` when given (its lorapop unpacked from git, run by the same interpreter),
and runs a fresh interpreter per run over ``--subprocess-seeds`` of them, the arms in an order that rotates from round
to round. Each rate is the median over the rounds, and each ratio the median of the per-round ratios, so the two arms
of a ratio are always measured moments apart: a fresh interpreter's rate alone swung 2x between runs of this script
on a shared machine, the per-round ratio far less.

    python bench/executor.py --before 74c1da6      (this tree against that commit, in one run)

Isolation cost: runs/s with today's isolation against the sandbox before it, for root (namespaces + uid
drop + seccomp against the same without seccomp) and for an unprivileged user (user namespace + dropped capabilities
+ seccomp against rlimits and fork per run only, which is all an ordinary user had before). As root, the
unprivileged half runs this script again as uid 65534 (tests/unprivileged.py); as anyone else there is
no root half. Each figure is the median of 5 passes; both sides of a ratio are measured in the same process.

The baseline starts `sys.executable -I -c CODE` per run (isolated mode: the trainer's environment and user site
do not leak in - the least a fresh-process sandbox does), with the same parallelism as the executor (2 workers).
Last line: one JSON object (``tasks_per_s``, ``speedup``, ``faults_per_task``: the sandbox's page faults per task, in
its workers and in their runs; with ``--before`` ``now_over_before``). Page faults are what a run costs most here
(copy-on-write after each fork), and their count barely moves between runs of the script while times do.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
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
        for seed in DETERMINISM_SEEDS[:2]:  # validation's two
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
    for seed in ex.hashseeds[:2]:  # start validation's pools (one-off cost, not per task)
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
                ex.compiler.clear()  # each pass meets its programs new, as training does
                t0 = time.perf_counter()
                TASK_TYPES["code_o"].validate_many(props, ex)
                times[name].append(time.perf_counter() - t0)
    finally:
        new.close()
        old.close()
    rate = {k: 2 * len(props) / statistics.median(v) for k, v in times.items()}
    return {"mechanism": mechanism, "runs_per_s": round(rate["new"], 1), "before_runs_per_s": round(rate["old"], 1),
            "cost": round(1 - rate["new"] / rate["old"], 3)}


# One side of an interleaved comparison: a process that imports the lorapop of its PYTHONPATH (this tree, or an older
# one unpacked by --before), starts the default executor, then validates the seeds once per line read on stdin and
# prints how long that took. Written against the API every tree since the sandbox has, so any of them can serve.
SERVER = """
import json, os, resource, sys, time
from lorapop.executor import ExecutorConfig, SandboxExecutor
from lorapop.tasks import TASK_TYPES, Proposal, read_seed_file
props = [Proposal("code_o", t.program, t.inputs) for t in read_seed_file(sys.argv[1], "code_o")]
ex = SandboxExecutor(ExecutorConfig())
for seed in getattr(ex, 'hashseeds', (1, 2))[:2]:  # validation's pools (a tree with lean workers: both kinds)
    ex.run_many(["_result = 0"] * ex.config.n_workers, hashseed=seed)
    ex.run_many(["import fractions\\n_result = 0"] * ex.config.n_workers, hashseed=seed)
tick = os.sysconf("SC_CLK_TCK")
def cpu():
    # this process, and each worker with the runs it reaped (utime, stime, cutime, cstime of /proc/PID/stat); a
    # worker is the child of its `unshare` process. Also the sandbox's page faults (the workers' own, and their
    # reaped runs'), which move far less than time from run to run on a shared machine
    r = resource.getrusage(resource.RUSAGE_SELF)
    total, faults, pids = r.ru_utime + r.ru_stime, [0, 0], set()
    for w in ex._all:
        try:
            top = w.proc.pid
            kids = open(f"/proc/{top}/task/{top}/children").read().split() or [str(top)]
            for pid in kids:
                pids.add(pid)
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                total += sum(int(x) for x in fields[11:15]) / tick
                faults[0] += int(fields[7])
                faults[1] += int(fields[8])
        except (OSError, AttributeError, IndexError, ValueError):
            pass
    helper = getattr(getattr(getattr(ex, "compiler", None), "_proc", None), "pid", None)
    if helper is not None:  # the process that compiles programs for their runs (compiler.py): its CPU is theirs
        try:
            fields = open(f"/proc/{helper}/stat").read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:13]) / tick
            pids.add(f"compiler {helper}")
        except (OSError, IndexError, ValueError):
            pass
    return total, faults, pids
print(json.dumps({"ready": True}), flush=True)
fresh = getattr(getattr(ex, "compiler", None), "clear", lambda: None)
for line in sys.stdin:
    fresh()  # programs compiled for their runs are kept for their next runs: each pass meets them new, as training does
    t0, (c0, f0, p0) = time.perf_counter(), cpu()
    res = TASK_TYPES["code_o"].validate_many(props, ex)
    c1, f1, p1 = cpu()
    same = p0 == p1  # a worker replaced during the pass (worker_max_runs) takes its counts with it: no reading
    print(json.dumps({"s": time.perf_counter() - t0, "cpu": c1 - c0 if same else None,
                      "faults": [(b - a) / len(props) for a, b in zip(f0, f1)] if same else None,
                      "valid": sum(hasattr(r, "outputs") for r in res)}), flush=True)
ex.close()
"""


class Side:
    """A SERVER process for one tree."""

    def __init__(self, tree: Path, seeds: Path):
        env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(seeds)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=str(tree))
        self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"bench server ended: {self.proc.wait()}")
        return json.loads(line)

    def one_pass(self) -> dict:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def unpack(ref: str) -> Path:
    """The lorapop package of git ``ref`` of this repository, in a temporary directory."""
    import tempfile

    out = Path(tempfile.mkdtemp(prefix="lorapop-bench-before-"))
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "lorapop"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


def interleaved(path: Path, props: list[Proposal], rounds: int, before: str | None, sub_n: int) -> dict:
    """``rounds`` rounds, each: one validation pass of this tree, one of the tree at ``before`` (if given), and one
    fresh-interpreter pass over ``sub_n`` of the seeds, in an order that rotates from round to round so that load
    drifting over the minutes hits every arm alike. Rates are medians over the rounds, and each ratio is the median
    of the per-round ratios (both arms of a ratio measured moments apart)."""
    import shutil

    sides = {"now": Side(REPO, path)}
    tmp = None
    if before:
        tmp = unpack(before)
        sides["before"] = Side(tmp, path)
    per: dict[str, list[float]] = {k: [] for k in (*sides, "subprocess")}
    cpu: dict[str, list[float | None]] = {k: [] for k in (*sides, "subprocess")}  # tasks per CPU second
    faults: dict[str, list[list[float] | None]] = {k: [] for k in sides}  # per task: the workers', their runs'
    valid: dict[str, int] = {}
    subset = props[:sub_n]
    arms = [*sides, "subprocess"]
    try:
        for r in range(rounds):
            for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
                if arm == "subprocess":
                    t0, c0 = time.perf_counter(), _children_cpu()
                    subprocess_validate(subset, 2, ["-I"], 5.0)
                    per[arm].append(len(subset) / (time.perf_counter() - t0))
                    used = _children_cpu() - c0
                    cpu[arm].append(len(subset) / used if used > 0 else None)
                else:
                    got = sides[arm].one_pass()
                    per[arm].append(len(props) / got["s"])
                    cpu[arm].append(len(props) / got["cpu"] if got["cpu"] else None)
                    faults[arm].append(got["faults"])
                    valid[arm] = got["valid"]
    finally:
        for side in sides.values():
            side.close()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in per.items()}

    def ratios(a: str, b: str) -> list[float]:  # per round, where both arms have a CPU reading
        return [x / y for x, y in zip(cpu[a], cpu[b]) if x and y]

    def fault_median(arm: str) -> list[float]:
        rounds = [f for f in faults[arm] if f]
        return [round(statistics.median(f[i] for f in rounds), 1) for i in (0, 1)] if rounds else [0.0, 0.0]
    out = {"tasks_per_s": med["now"], "subprocess_tasks_per_s": med["subprocess"],
           "speedup": statistics.median(a / b for a, b in zip(per["now"], per["subprocess"])),
           "speedup_rounds": [round(a / b, 2) for a, b in zip(per["now"], per["subprocess"])],
           "valid": valid["now"], "rounds": rounds,
           # the same ratio in CPU time (the trainer's, its compile helper's and every sandbox process's; the fresh
           # interpreters'): what a task costs, whatever else the machine (or the hypervisor) does meanwhile
           "speedup_cpu": statistics.median(ratios("now", "subprocess")),
           "speedup_cpu_rounds": [round(r, 2) for r in ratios("now", "subprocess")],
           # page faults per validated task, medians over the rounds: [in the workers, in their runs]
           "faults_per_task": fault_median("now")}
    if before:
        out.update({"before_tasks_per_s": med["before"], "before_valid": valid["before"],
                    "now_over_before": statistics.median(a / b for a, b in zip(per["now"], per["before"])),
                    "now_over_before_rounds": [round(a / b, 3) for a, b in zip(per["now"], per["before"])],
                    "before_speedup": statistics.median(a / b for a, b in zip(per["before"], per["subprocess"])),
                    "now_over_before_cpu": statistics.median(ratios("now", "before")),
                    "before_speedup_cpu": statistics.median(ratios("before", "subprocess")),
                    "before_faults_per_task": fault_median("before")})
    return out


def main() -> None:
    import argparse

    if sys.argv[1:2] == ["--isolation-only"]:  # the unprivileged half, run by the root half
        print(json.dumps(isolation_cost(load_props(Path(sys.argv[2])))))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("seed_file", nargs="?", help="default: the seed file shipped in lorapop/data/seeds/")
    ap.add_argument("--before", metavar="GIT_REF", help="also time the lorapop of this commit, interleaved")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (medians over them)")
    ap.add_argument("--subprocess-seeds", type=int, default=48,
                    help="seeds the fresh-interpreter arm validates per round")
    ap.add_argument("--no-isolation-cost", action="store_true", help="leave out the isolation's cost")
    args = ap.parse_args()
    sys.argv[1:] = [args.seed_file] if args.seed_file else []
    path = seed_path()
    props = load_props(path)
    print(f"seeds: {len(props)} from {path}")
    res = interleaved(path, props, args.rounds, args.before, args.subprocess_seeds)
    print(f"executor: {res['tasks_per_s']:.1f} tasks/s, valid {res['valid']}/{len(props)}; a fresh "
          f"{Path(sys.executable).name} -I per run: {res['subprocess_tasks_per_s']:.1f} tasks/s; speedup "
          f"{res['speedup']:.1f}x (median of {args.rounds} rounds: {res['speedup_rounds']}); in CPU time "
          f"{res['speedup_cpu']:.1f}x (rounds: {res['speedup_cpu_rounds']}); page faults per task: workers "
          f"{res['faults_per_task'][0]:.0f}, their runs {res['faults_per_task'][1]:.0f}")
    if args.before:
        print(f"before ({args.before}): {res['before_tasks_per_s']:.1f} tasks/s, valid {res['before_valid']}; "
              f"now / before {res['now_over_before']:.3f} (rounds: {res['now_over_before_rounds']}); its speedup "
              f"{res['before_speedup']:.1f}x; in CPU time now / before {res['now_over_before_cpu']:.3f}, its speedup "
              f"{res['before_speedup_cpu']:.1f}x; page faults per task: workers {res['before_faults_per_task'][0]:.0f}, "
              f"their runs {res['before_faults_per_task'][1]:.0f}")
    iso = {}
    if not args.no_isolation_cost:
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
    out = {k: round(v, 3) if isinstance(v, float) else v for k, v in res.items()}
    out["total"] = len(props)
    for who, c in iso.items():
        out.update({f"{who}_{k}": v for k, v in c.items()})
    print(json.dumps(out))


def load_props(path: Path) -> list[Proposal]:
    if not path.is_absolute() and not path.exists():
        path = REPO / path
    return [Proposal("code_o", t.program, t.inputs) for t in read_seed_file(path, "code_o")]


if __name__ == "__main__":
    main()
