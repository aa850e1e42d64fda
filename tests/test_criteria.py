"""The pre-registered dynamics criteria (lorapop/criteria.py) on run directories written here: a run shaped like the
paper's single agent holds self-calibration, one shaped like its population holds the arms race, and the same code
says no to the opposite shapes."""

from __future__ import annotations

import json
import math
from pathlib import Path

from lorapop import criteria as C


def _write(run: Path, metrics: list[dict], tasks: list[dict] = (), probe: list[dict] = ()) -> Path:
    run.mkdir(parents=True)
    for name, rows in (("metrics.jsonl", metrics), ("tasks.jsonl", tasks), ("probe.jsonl", probe)):
        (run / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def _task(step: int, program: str, inputs: list[str], outputs: list[str], type_: str = "code_o") -> dict:
    return {"step": step, "type": type_, "program": program, "inputs": inputs, "outputs": outputs}


def calibrating(run: Path, n: int = 60) -> Path:
    metrics = [{"step": s, "student/matched_solve_rate": min(1.0, 0.2 + 0.8 * s / n),
                "complexity/ast_depth": 9 - 4 * s / n, "coverage": 0.1 + 0.001 * min(s, 10),
                "student/zero_adv_group_frac": 0.9} for s in range(1, n + 1)]
    tasks = [_task(s, "def f(x):\n    return 7", ["3"], ["7"]) for s in range(n - 9, n + 1)]
    return _write(run, metrics, tasks)


def racing(run: Path, n: int = 60) -> Path:
    metrics = [{"step": s, "student/matched_solve_rate": 0.45 + 0.25 * math.sin(s / 3),
                "complexity/ast_depth": 5 + s / 10 + 0.3 * math.sin(s), "coverage": 0.05 + 0.004 * s,
                "student/zero_adv_group_frac": 0.3} for s in range(1, n + 1)]
    tasks = [_task(s, "def f(x):\n    return x * 3 + 1", ["4"], ["13"]) for s in range(1, n + 1)]
    return _write(run, metrics, tasks)


def test_trivial_tasks():
    assert C.is_trivial(_task(1, "def f(x):\n    return 5", ["3"], ["5"]))  # ignores its input
    assert C.is_trivial(_task(1, "def f(x):\n    return x", ["3"], ["3"]))  # the output is the input
    assert C.is_trivial(_task(1, "def f(x):\n    return max(x, 9)", ["3"], ["9"]))  # a constant of the program
    assert not C.is_trivial(_task(1, "def f(x):\n    return x * 3", ["3"], ["9"]))
    assert not C.is_trivial(_task(1, "def f(x):\n    return x + 1", ["5"], ["6"], "code_i"))
    assert C.is_trivial(_task(1, "def f(x):\n    return x % 4", ["4"], ["0"], "code_i"))  # the input 4 is a constant
    assert not C.is_trivial(_task(1, "def f(", ["1"], ["1"]))


def test_reversals_and_moving_average():
    assert C.reversals([0, 1, 2, 1, 0, 1]) == 2
    assert C.reversals([0, 1, 1, 1, 2]) == 0  # a plateau inside a rise is no reversal
    assert C.reversals([1, 1, 1]) == 0
    assert C.moving_average([1, 2, 3, 4, 5], 5) == [3.0]


def test_paper_shapes_hold_and_opposites_do_not(tmp_path):
    single, pop = calibrating(tmp_path / "single"), racing(tmp_path / "pop")
    got = C.criteria(pop, single)
    for k in ("self_calibration.solve", "self_calibration.trivial", "self_calibration.simpler",
              "arms_race.band", "arms_race.reversals", "arms_race.complexity", "arms_race.coverage",
              "arms_race.not_tied"):
        assert got[k]["held"] is True, (k, got[k])
    assert got["capability"]["held"] is None  # no probe written
    # swapped: the racing run is no self-calibrating agent and the calibrating one is no arms race
    swapped = C.criteria(single, pop)
    for k in ("self_calibration.solve", "self_calibration.trivial", "self_calibration.simpler",
              "arms_race.band", "arms_race.reversals", "arms_race.complexity", "arms_race.coverage",
              "arms_race.not_tied"):
        assert swapped[k]["held"] is False, (k, swapped[k])


def test_short_run_is_not_judged(tmp_path):
    single, pop = calibrating(tmp_path / "single", n=8), racing(tmp_path / "pop", n=8)
    got = C.criteria(pop, single)
    assert all(v["held"] is None for k, v in got.items() if isinstance(v, dict))
    assert "at least" in got["arms_race.band"]["why"]


def test_capability_from_probe(tmp_path):
    tasks = [f"t{i}" for i in range(30)]
    pop_probe = [{"step": 10, "member": m, "role": "student", "task": t, "level": 1, "score": 0.5 + 0.5 * (i % 2)}
                 for m in ("s0", "s1") for i, t in enumerate(tasks)]
    single_probe = [{"step": 10, "member": "a0", "role": "agent", "task": t, "level": 1, "score": 0.5 * (i % 2)}
                    for i, t in enumerate(tasks)]
    single = _write(tmp_path / "single", [], probe=single_probe)
    pop = _write(tmp_path / "pop", [], probe=pop_probe)
    cap = C.capability(pop, single)
    assert cap["held"] is True and abs(cap["value"]["diff"] - 0.5) < 1e-12
    weak = _write(tmp_path / "weak", [], probe=[dict(r, score=0.0) for r in pop_probe])
    assert C.capability(weak, single)["held"] is False  # students below the agent


def test_capability_leaves_out_young_children_and_carries_the_noise_floor(tmp_path):
    """A child younger than run.probe_min_age (counted: false) moves no probe figure, even where it is the only
    student of a step; criteria.json's capability verdict carries each run's step-0 noise floor."""
    from lorapop.train.probe import noise_floor

    tasks = [f"t{i}" for i in range(30)]

    def rows(step, member, role, score, counted=True):
        return [{"step": step, "member": member, "role": role, "task": t, "level": 1, "score": score(i),
                 "age": 0, "counted": counted} for i, t in enumerate(tasks)]

    pop_probe = rows(0, "s0", "student", lambda i: 0.0) + rows(0, "s1", "student", lambda i: 0.5 * (i % 2))
    pop_probe.append(noise_floor([(m, [r for r in pop_probe if r["member"] == m]) for m in ("s0", "s1")], True, 2))
    pop_probe += rows(10, "s0", "student", lambda i: 0.5) + rows(10, "s2", "student", lambda i: 1.0, counted=False)
    pop_probe += rows(20, "s3", "student", lambda i: 1.0, counted=False)  # every student of step 20 too young
    a0 = [rows(0, "a0", "agent", lambda i: 0.25), rows(0, "a0", "agent", lambda i: 0.5 * (i % 3 == 0))]
    single_probe = a0[0] + [noise_floor([("a0", a0[0]), ("a0", a0[1])], True, 2)]
    single_probe += rows(10, "a0", "agent", lambda i: 0.5 * (i % 2)) + rows(20, "a0", "agent", lambda i: 0.0)
    pop, single = _write(tmp_path / "pop", [], probe=pop_probe), _write(tmp_path / "single", [], probe=single_probe)

    cap = C.criteria(pop, single)["capability"]
    assert cap["value"]["step"] == 10  # not 20, where only a too-young child was probed
    assert abs(cap["value"]["diff"] - 0.25) < 1e-12  # s0's 0.5 against the agent's 0.25; s2's 1.0 left out
    floor = cap["noise_floor"]
    assert floor["population"]["n"] == 2 and abs(floor["population"]["spread"] - 0.25) < 1e-12
    assert [r["member"] for r in floor["single"]["replicates"]] == ["a0", "a0"]
    assert abs(floor["single"]["spread"] - (0.25 - 0.5 * 10 / 30)) < 1e-12
    assert C.capability(pop, tmp_path / "none")["noise_floor"]["single"] is None  # shown even when not judged


def test_across_seeds_needs_two_of_three():
    seeds = [{"x": {"held": True}}, {"x": {"held": False}}, {"x": {"held": True}}]
    assert C.across_seeds(seeds)["x"] == {"held_in": 2, "failed_in": 1, "unjudged": 0, "holds": True}
    seeds[2]["x"]["held"] = None
    assert C.across_seeds(seeds)["x"]["holds"] is False


def test_probe_tasks_are_fixed_held_out_and_three_levels():
    from lorapop.tasks.expression_family import LEVELS, program
    from lorapop.train.probe import probe_tasks

    tasks = probe_tasks()
    assert [t.program for _, t in tasks] == [t.program for _, t in probe_tasks()]  # the same in every run
    assert {lvl: sum(1 for l, _ in tasks if l == lvl) for lvl in (1, 2, 3)} == {1: 30, 2: 30, 3: 30}
    refs = {program(e) for exprs in LEVELS.values() for e in exprs}
    assert not refs & {t.program for _, t in tasks}  # no reference task of the expression seed file
    for _, t in tasks:
        ns: dict = {}
        exec(t.program, ns)
        assert repr(ns["f"](int(t.inputs[0]))) == t.outputs[0]


def test_bench_dynamics_reports_seeds_table_and_figure(tmp_path):
    """bench/dynamics.py --report-only over finished seed directories: criteria per seed, the 2-of-3 verdict, and
    one standalone SVG with the three panels per seed."""
    import importlib.util
    import xml.etree.ElementTree as ET

    spec = importlib.util.spec_from_file_location("bench_dynamics", Path(__file__).parents[1] / "bench" / "dynamics.py")
    dyn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dyn)
    for s in (0, 1, 2):
        racing(tmp_path / f"seed{s}" / "population")
        calibrating(tmp_path / f"seed{s}" / "single")
        (tmp_path / f"seed{s}" / "compare.json").write_text("{}")
    racing(tmp_path / "seed3" / "population")  # no compare.json: not finished, left out
    out = dyn.main(["--report-only", "--seeds=0,1,2,3", f"--out={tmp_path}"])
    assert out["seeds"] == [0, 1, 2]
    assert out["verdict"]["arms_race.band"]["holds"] and out["verdict"]["self_calibration.solve"]["holds"]
    assert not out["verdict"]["capability"]["holds"]  # no probe written: not judged in any seed
    saved = json.loads((tmp_path / "dynamics.json").read_text())
    assert saved["verdict"] == out["verdict"]
    svg = ET.parse(tmp_path / "dynamics.svg").getroot()
    plots = [e for e in svg if e.tag.endswith("svg")]
    assert len(plots) == 3 * 3  # 3 seeds x (solve rate, AST depth, coverage)
    assert all(len([p for p in e.iter() if p.tag.endswith("path")]) >= 2 for e in plots)  # both runs drawn


def _arm(run: Path, solve, depth, probe_score, tied: float = 0.3, n: int = 30, spread: float = 0.04) -> Path:
    """A run directory for arm_criteria: per-step solve(s) and depth(s), probe rows at steps 0 and n (90 tasks,
    score probe_score(i) at the end, 0.2 at step 0) and a step-0 noise floor of ``spread``."""
    metrics = [{"step": s, "student/matched_solve_rate": solve(s), "complexity/ast_depth": depth(s),
                "student/zero_adv_group_frac": tied} for s in range(1, n + 1)]
    probe = [{"step": 0, "noise_floor": {"spread": spread, "n": 2, "replicates": [], "identical": True}}]
    for step, score in ((0, lambda i: 0.2), (n, probe_score)):
        probe += [{"step": step, "member": "s0", "role": "student", "task": f"L1:{i}", "level": 1,
                   "score": score(i), "age": step, "counted": True} for i in range(90)]
    return _write(run, metrics, probe=probe)


def test_arm_criteria_hold_on_the_paper_shapes_and_not_on_drift(tmp_path):
    """The paper's outcome (the single agent calibrates to easy tasks; the populations race in the band around the
    step-0 solve rate with harder tasks and learn more than the role split, which learns more than the agent) holds
    every registered criterion; a null arm that drifts fails null.flat, and arms no better than null learn nothing."""
    s0, band = C.ARMS_STEP0_SOLVE, C.ARMS_BAND
    wave = lambda s: s0 + 0.08 * math.sin(s)  # noqa: E731
    dirs = {
        "null": _arm(tmp_path / "null", lambda s: s0, lambda s: 6.0 + 0.1 * (s % 2), lambda i: 0.2),
        "single": _arm(tmp_path / "single", lambda s: min(1.0, s0 + s / 30), lambda s: 5.0 - s / 30 + 0.1 * (s % 2),
                       lambda i: 0.3),
        "1T+1S": _arm(tmp_path / "1t", wave, lambda s: 6.0 + s / 10 + 0.1 * (s % 2), lambda i: 0.4),
        "2T+2S": _arm(tmp_path / "2t", wave, lambda s: 6.0 + s / 10 + 0.1 * (s % 2), lambda i: 0.5 + 0.1 * (i % 2)),
    }
    out = C.arm_criteria(dirs)
    verdicts = {k: v["held"] for k, v in out.items() if isinstance(v, dict) and "held" in v}
    assert len(verdicts) == 17 and all(verdicts.values()), {k: v for k, v in verdicts.items() if not v}
    assert abs(out["population.vs_single"]["value"]["diff"] - 0.25) < 1e-9
    assert out["population.vs_single"]["value"]["noise_floor"] == 0.04

    # a drifting null arm fails null.flat; arms that are no better than it learn nothing, whatever the rest does
    drift = _arm(tmp_path / "drift", lambda s: s0 + band * 2 * s / 30, lambda s: 6.0, lambda i: 0.55)
    out = C.arm_criteria(dict(dirs, null=drift))
    assert out["null.flat"]["held"] is False
    assert out["learning.single"]["held"] is False and out["learning.2T+2S"]["held"] is False
    # a gain under the noise floor does not hold, even with every task ahead
    small = _arm(tmp_path / "small", wave, lambda s: 6.0, lambda i: 0.53, spread=0.04)
    assert C.probe_gain(small, dirs["2T+2S"])["held"] is False
    assert C.probe_gain(dirs["2T+2S"], small)["held"] is False  # +0.02 mean: under the 0.04 floor

    # missing arms are unjudged, never failed, and across_seeds counts them so
    part = C.arm_criteria({"2T+2S": dirs["2T+2S"], "null": dirs["null"]})
    assert part["population.vs_single"]["held"] is None and "single" in part["population.vs_single"]["why"]
    assert part["learning.2T+2S"]["held"] is True
    agg = C.across_seeds([out, part, part])
    assert agg["learning.2T+2S"] == {"held_in": 2, "failed_in": 1, "unjudged": 0, "holds": True}
    assert agg["population.vs_single"]["unjudged"] == 2 and agg["population.vs_single"]["holds"] is False
