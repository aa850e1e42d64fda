"""Trivial yardsticks (lorapop/train/yardsticks.py) on task sets small enough to check by hand, through the real
sandbox and the real math checker; and the registered retention rule (lorapop/retention/verdict.py) on
hand-made retention files, the clone and the continuation judged by it like every operator."""

from __future__ import annotations

import math
import statistics

import pytest

from lorapop.tasks.base import Task


def _task(program: str, arg: str, out: str, type_: str = "code_o") -> Task:
    return Task(type=type_, program=program, inputs=[arg], outputs=[out], proposer="test")


HAND = [
    _task("def f(nums):\n    return nums[0]", "[3, 1, 2]", "3"),      # first and max right
    _task("def f(nums):\n    return min(nums)", "[5, 2, 9]", "2"),    # min right
    _task("def f(nums):\n    return nums[-1]", "[4, 4, 7]", "7"),     # last and max right
    _task("def f(x):\n    return x", "3", "3"),                       # no list: copy right, positional n/a
    _task("def f(nums):\n    return nums", "[1,2]", "[1, 2]"),         # copy right only as a value, not as text
]


@pytest.fixture(scope="module")
def executor():
    from lorapop.executor import ExecutorConfig, SandboxExecutor

    ex = SandboxExecutor(ExecutorConfig(n_workers=1))
    yield ex
    ex.close()


def test_each_strategy_scored_by_hand_through_the_sandbox(executor):
    from lorapop.train.yardsticks import task_yardsticks

    ys = task_yardsticks(HAND, executor)
    st = {k: (v["correct"], v["applies"]) for k, v in ys["strategies"].items()}
    # most common output: "3" (tasks 1 and 4); the argument "[1,2]" is the output [1, 2] as a value
    assert st == {"first": (1, 4), "last": (1, 4), "max": (2, 4), "min": (1, 4), "most_common": (2, 5),
                  "copy": (2, 5)}
    assert ys["n_tasks"] == 5 and ys["strategies"]["max"]["score"] == pytest.approx(2 / 5)
    assert ys["strategies"]["most_common"]["answer"] == "3"
    assert ys["best"] == "max" and ys["best_score"] == pytest.approx(0.4)  # ties go to the earlier strategy
    with pytest.raises(ValueError, match="code_o"):
        task_yardsticks([_task("def f(x):\n    return x", "3", "3", "code_i")], executor)


def test_the_selection_probe_sits_at_a_positional_answer(executor):
    """The retention and dynamics probe (90 selection tasks): always nums[0] solves 26, always nums[-1] 29."""
    from lorapop.train.yardsticks import describe, probe_yardsticks

    ys = probe_yardsticks("selection", 30, executor, by_level=True)
    st = ys["strategies"]
    assert ys["n_tasks"] == 90 and st["first"]["correct"] == 26 and st["last"]["correct"] == 29
    assert st["copy"]["correct"] == 0  # no probe program returns its list
    assert sum(lv["first"]["correct"] for lv in ys["by_level"].values()) == 26
    assert describe(ys).startswith("trivial yardsticks (90 tasks): last 0.322")


def test_math_yardsticks_use_the_eval_judge():
    from lorapop.train.yardsticks import math_yardsticks

    qs = ["A box holds 12 pens; 3 are red. How many pens?", "She had 7 and lost 2.", "Pay 4 dollars, then 12."]
    ys = math_yardsticks(qs, [["12"], ["5"], ["12.0"]])
    st = {k: v["correct"] for k, v in ys["strategies"].items()}
    # most common gold "12" (the judge takes 12 for 12.0); max is 12 on questions 1 and 3
    assert st == {"first": 1, "last": 1, "max": 2, "min": 0, "most_common": 2}
    assert "copy" not in ys["strategies"]


def _ret(name: str, floor: float, arms: dict[str, list[float]]) -> dict:
    return {"_name": name, "steps": len(arms["continuation"]) - 1, "noise_floor": {"spread": floor},
            "arms": {n: {"heldout": h} for n, h in arms.items()}}


# three parents, floor 0.02; `op` loses 0.1 on every parent and recovers on two; `big@3x` is on two parents only and
# loses on one; the clone ends 0.05 under the continuation on two parents (beyond the floor): training noise
PARENTS = [
    _ret("p0", 0.02, {"continuation": [0.30, 0.30, 0.30], "clone": [0.30, 0.28, 0.25], "op": [0.20, 0.30, 0.30],
                      "big@3x": [0.10, 0.29, 0.30], "quiet": [0.31, 0.30, 0.30]}),
    _ret("p1", 0.02, {"continuation": [0.30, 0.32, 0.30], "clone": [0.31, 0.31, 0.25], "op": [0.20, 0.25, 0.20],
                      "big@3x": [0.30, 0.30, 0.30], "quiet": [0.30, 0.30, 0.0]}),
    _ret("p2", 0.02, {"continuation": [0.30, 0.30, 0.30], "clone": [0.30, 0.30, 0.31], "op": [0.20, 0.29, 0.29],
                      "quiet": [0.30, 0.33, 0.40]}),
]


def test_the_registered_rule_counts_all_parents_but_one_and_judges_the_null_arms():
    from lorapop.retention.verdict import arm_outcome, headline, holds, registered_verdict, verdict_lines

    assert [holds(k, 3) for k in range(4)] == [False, False, True, True]
    assert holds(1, 2) and not holds(0, 1) and holds(1, 1)
    assert arm_outcome(PARENTS[0], "continuation")["against"] == "clone"
    assert arm_outcome(PARENTS[0], "continuation")["final_gap"] == pytest.approx(-0.05)
    v = registered_verdict(PARENTS)
    rows = {r["arm"]: r for r in v["rows"]}
    assert (rows["op"]["lost_on"], rows["op"]["back_on"], rows["op"]["final_beyond_on"]) == (3, 2, 1)
    assert rows["op"]["loses"] and rows["op"]["for"] and not rows["op"]["final_beyond"]
    # lost on 1 of the 2 parents that have it: "all but at most one", so it counts as losing
    assert rows["big@3x"]["parents"] == 2 and rows["big@3x"]["loses"] and rows["big@3x"]["for"]
    assert v["premise"] == {"lose": ["op", "big@3x"], "registered_strength_lose": ["op"]}
    assert v["for"] == {"operators": ["op", "big@3x"], "every_losing_operator": True}
    assert not v["against"]["not_recovered"] and not v["against"]["most_final_beyond"]
    # the clone lost nothing yet ends beyond the floor on 2 of 3: it meets the test the against branch counts
    assert v["null"]["clone"] == {"lost_on": 0, "final_beyond_on": 2, "parents": 3, "loses": False,
                                  "final_beyond": True}
    # the continuation against the clone: 0.05 above it on p0 and p1, 0.01 under it on p2 (within the floor)
    assert v["null"]["continuation"]["final_beyond_on"] == 0
    text = "\n".join(verdict_lines(v))
    assert "| clone | 3 | 0/3 | 3/3 | 0/3 | 2/3 | no | no | no | yes |" in text
    assert "*for* met" in text and "*against* not met" in text
    assert headline(v) == "the registered rule counts for the claim (only the for branch is met)"


def test_power_from_the_arms_that_lost_nothing():
    from lorapop.retention.verdict import ALPHA, POWER, power, training_noise

    # p1: `quiet` ended at 0.000 (a collapse): left out of the noise, counted as collapsed
    tn = training_noise(PARENTS[1])
    assert tn["collapsed"] == 1 and tn["n"] == 3  # continuation, clone, big@3x (lost nothing on p1); op lost
    assert tn["sd_final"] == pytest.approx(statistics.stdev([0.30, 0.25, 0.30]))
    p = power(PARENTS)
    # null arms (lost nothing at the operator): clone and quiet on each parent, big@3x on p1: 7; beyond the floor
    # at the end: p0's clone, p1's clone and quiet (p1's big@3x ends level with the continuation) -> 3
    assert p["null_arms"] == 7 and p["null_final_beyond"] == 3
    from statistics import NormalDist

    z = NormalDist().inv_cdf(1 - ALPHA) + NormalDist().inv_cdf(POWER)
    assert p["per_parent"]["p1"]["min_detectable_loss"] == pytest.approx(z * tn["sd_final"] * math.sqrt(2))
    shares = [1 / 2, 2 / 3, 0 / 2]  # per parent: beyond / null arms; "at least 2 of 3"
    want = shares[0] * shares[1] * (1 - shares[2]) + shares[0] * (1 - shares[1]) * shares[2] \
        + (1 - shares[0]) * shares[1] * shares[2] + shares[0] * shares[1] * shares[2]
    assert p["null_meets_final_beyond"] == pytest.approx(want)


def test_retention_table_restates_the_committed_verdict(tmp_path, capsys):
    """bench/retention_table.py on the committed retention runs: the rule over the three parents, the clone under it,
    the yardsticks in the figure, and which rule the plateau's replies answer by."""
    import importlib.util
    import json
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("bench_retention_table", repo / "bench" / "retention_table.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    runs = [str(repo / "docs" / "results" / "retention49" / p) for p in ("seed0-single", "seed0-1T+1S", "seed1-single")]
    assert bench.main(runs + ["--svg", str(tmp_path / "r.svg")]) == 0
    out = capsys.readouterr().out
    v = json.loads(out.strip().splitlines()[-1])["verdict"]
    assert v["headline"].startswith("not shown either way")
    assert v["premise"]["lose"] == ["svd_subspace", "component_masking@3x", "extrapolative@3x", "xes@3x"]
    assert v["for"]["operators"] == ["svd_subspace", "component_masking@3x", "xes@3x"]
    assert v["against"]["not_recovered"] == ["extrapolative@3x"] and v["against"]["most_final_beyond"]
    assert v["null"]["clone"]["final_beyond_on"] == 2 and not v["null"]["clone"]["lost_on"]
    assert (v["power"]["null_final_beyond"], v["power"]["null_arms"]) == (18, 45)
    assert "always the first element: 0.289" in (tmp_path / "r.svg").read_text()
    assert "dare@3x (0.286): first 0.997" in out  # seed 0's plateau answers nums[0]
