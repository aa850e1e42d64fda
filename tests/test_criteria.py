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
    from lorapop.tasks.expressions import LEVELS, program
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
