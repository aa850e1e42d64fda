"""`lorapop compare` end to end at a tiny size: both runs trained from one config, evaluated, one report."""

from __future__ import annotations

import json

import pytest

from lorapop.cli import main

TINY = ["--selfplay.task_types=[code_o,code_i]", "--selfplay.tasks_per_type=2", "--selfplay.n_solve=2",
        "--selfplay.propose.max_new_tokens=24", "--selfplay.solve.max_new_tokens=12", "--run.steps=1",
        "--selfplay.seed_files=[]", "--run.progress=none", "--run.tensorboard=false"]


@pytest.mark.parametrize("pop_name, single_name", [("cpu_demo", "cpu_single"), ("cpu_dynamics", "cpu_dynamics_single")])
def test_shipped_single_twin_is_its_population_config_as_a_single_agent(pop_name, single_name):
    from lorapop.commands.compare import compare_configs
    from lorapop.config import load_config, resolve_config_path
    from lorapop.configlib import to_dict

    demo, single = (to_dict(load_config(resolve_config_path(n))) for n in (pop_name, single_name))
    derived = to_dict(compare_configs(pop_name, [], "x", "out")[1])
    for d in (demo, single, derived):
        d.pop("evolve")  # a single agent has no PBT
        d["run"].pop("name"), d["run"].pop("output_dir")
    # the one other difference: the baseline is AZR, its proposer paid learnability (the population adversarially)
    assert demo["selfplay"].pop("teacher_reward") == "adversarial"
    assert single["selfplay"].pop("teacher_reward") == derived["selfplay"].pop("teacher_reward") == "learnability"
    assert single["population"]["mode"] == derived["population"]["mode"] == "single"
    assert {k: v for k, v in single.items() if k != "population"} == \
        {k: v for k, v in demo.items() if k != "population"} == {k: v for k, v in derived.items() if k != "population"}


def test_compare_rejects_what_it_sets_itself_and_single_configs(tmp_path, capsys):
    assert main(["compare", "cpu_demo", f"--output-dir={tmp_path}", "--population.mode=single"]) == 2
    assert "sets population.mode" in capsys.readouterr().err
    assert main(["compare", "cpu_single", f"--output-dir={tmp_path}"]) == 2
    assert "needs a population config" in capsys.readouterr().err
    assert main(["compare", "no_such_config", f"--output-dir={tmp_path}"]) == 2
    assert not any(tmp_path.iterdir())  # nothing trained, nothing written


@pytest.mark.slow
def test_compare_trains_both_evaluates_and_reports(tmp_path, capsys):
    rc = main(["compare", "cpu_demo", "--name=tiny", f"--output-dir={tmp_path}", "--eval-benchmarks=mbppplus",
               "--eval-limit=1", "--eval-max-new-tokens=16", *TINY])
    out = capsys.readouterr().out
    assert rc == 0, out
    root = tmp_path / "tiny"
    pop, single = root / "population", root / "single"
    lines = {d.name: [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()] for d in (pop, single)}
    assert [m["step"] for m in lines["population"]] == [m["step"] for m in lines["single"]] == [1]
    # same per-adapter compute: every adapter of both runs trained on the same number of samples
    counts = {k: v for run in lines.values() for k, v in run[0].items() if k.endswith("/n_samples")}
    # (2 task types x T = 2: 4 per teacher and per student; the agent trains on both roles' groups, 8)
    assert counts == {"member/t0/n_samples": 4, "member/t1/n_samples": 4, "member/s0/n_samples": 4,
                      "member/s1/n_samples": 4, "member/a0/n_samples": 8}
    for d in (pop, single):  # the same base, seed and amounts: only the mode differs
        assert (d / "eval.json").is_file()
    ev = json.loads((root / "eval.json").read_text())
    assert ev["baseline"] == str(single) and ev["n_problems"] == {"mbppplus": 1}
    assert {r["run_dir"]: r["is_baseline"] for r in ev["runs"]} == {str(pop): False, str(single): True}
    html = (root / "report.html").read_text()
    for text in ("baseline (single agent)", "students mean / min / max", "all members mean / min / max",
                 "population", "single", "TRR++ groups whose rewards all tie"):
        assert text in html, text
    summary = json.loads((root / "compare.json").read_text())
    assert summary["compute_per_adapter"]["samples_per_update"] == 4
    assert summary["compute_per_adapter"]["agent_samples_per_update"] == 8
    assert set(summary["curves"]) == {"population", "single"}
    assert len(summary["curves"]["single"]["student/matched_solve_rate"]) == 1
    crit = json.loads((root / "criteria.json").read_text())  # written for every pair; a 1-step run gets no verdict
    assert crit["arms_race.band"]["held"] is None and "at least" in crit["arms_race.band"]["why"]
    # the solve-rate curve is the matched one, top-ups apart: every answer of the step is one of the two kinds
    m = lines["single"][0]
    assert "student/matched_solve_rate" in m or "student/topup_solve_rate" in m
    assert "student/topup_frac" in m and "matched_solve_rate" not in m
    assert "mbppplus" in out and f"report: {root / 'report.html'}" in out
    # run again with the same name: both runs are complete, nothing is retrained, the report is rewritten
    assert main(["compare", "cpu_demo", "--name=tiny", f"--output-dir={tmp_path}", "--skip-eval", *TINY]) == 0
    assert len((pop / "metrics.jsonl").read_text().splitlines()) == 1
