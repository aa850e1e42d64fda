"""The run report: content on realistic runs, overlays, and bad input (partial, empty, not a run)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from fixtures_runs import write_population_run, write_single_run

from lorapop.commands.report import main
from lorapop.report.html import SECTIONS, json_tables, write_report
from lorapop.config import config_to_yaml, load_config
from lorapop.records.run_data import load_run
from lorapop.records import RunDirError
from lorapop.records.rundir import RunDir


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("runs")
    return {"pop": write_population_run(base / "pop4"), "single": write_single_run(base / "single")}


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    (dst / "report.html").unlink(missing_ok=True)
    return dst


def _sections(html: str) -> list[str]:
    return re.findall(r'<section id="([a-z]+)">', html)


def test_one_run_has_every_section_and_plot(runs):
    out = write_report([runs["pop"]])
    assert out == runs["pop"] / "report.html"
    html = out.read_text()
    assert _sections(html) == [sid for sid, _ in SECTIONS]
    assert 'class="noplot"' not in html, re.findall(r'no data: [^<]*', html)
    # rewards 2+2+loss, solve 2+by type, validity 4+by type, complexity 5+5, coverage 3, trueskill 2, lineage 1,
    # lengths 2, timing 1, tie fractions 1, probe 1
    assert html.count('<svg class="plot') == 34
    # self-contained: no scripts, no external fetches
    assert "<script" not in html and not re.search(r'(src|href)="(https?:)?//', html)
    # series of a replaced member end, the child's begin; lineage names operator and parents
    assert "svd_structured" in html and "average" in html and ">t0, t1<" in html
    for mid in ("t0", "t1", "t2", "s0", "s1", "s2"):
        assert f"<title>{mid}</title>" in html
    assert "every file was read in full" in html
    assert "mbpp_plus" in html and "0.334" in html  # eval.json as a table
    assert "tasks_per_type: 3" in html and "n_teachers: 2" in html  # config.yaml verbatim


def test_overlay_of_single_and_population(runs, tmp_path):
    out = write_report([runs["pop"], runs["single"]], tmp_path / "cmp.html")
    html = out.read_text()
    assert out == tmp_path / "cmp.html"
    chart = html[html.index("Reward by role"):html.index("</figure>", html.index("Reward by role"))]
    for label in ("pop4 · teacher", "pop4 · student", "single · teacher", "single · student"):
        assert f"<title>{label}</title>" in chart
    assert "Matched solve rate per student — single" in html and "Matched solve rate per student — pop4" in html

    def chart(title):
        i = html.index(title)
        return html[i:html.index("</figure>", i)]
    # the solve-rate, complexity and coverage panels overlay both runs: the same keys exist for the single agent
    assert "<title>pop4 · matched</title>" in chart("Student solve rate: matched") and \
        "<title>single · matched</title>" in chart("Student solve rate: matched")
    for title in ("ast_depth (mean over the step", "Coverage (fraction of CVT cells"):
        assert "<title>pop4" in chart(title) and "<title>single" in chart(title), title
    assert "<title>a0</title>" in chart("Coverage by teacher (tasks proposed) — single")
    assert "Population over steps — single" in html
    # default output for several runs: the first run's directory
    assert write_report([runs["single"], runs["pop"]]) == runs["single"] / "report.html"


def test_probe_chart_shows_the_noise_floor_and_leaves_out_young_children(runs, tmp_path):
    from lorapop.records.probe import read_noise_floor, step_means

    html = write_report([runs["pop"], runs["single"]], tmp_path / "probe.html").read_text()
    sec = html[html.index('<section id="probe">'):html.index("</section>", html.index('<section id="probe">'))]
    pop, single = load_run(runs["pop"]), load_run(runs["single"])
    for run, who in ((pop, "2 identical members"), (single, "a0 scored 2 times, different seeds")):
        nf = read_noise_floor(run.probe)
        assert f"noise floor (step 0, {who}): scores " in sec and f"spread {nf['spread']:.3f}" in sec
        assert f"std {nf['std']:.3f}" in sec
    assert [r["member"] for r in read_noise_floor(single.probe)["replicates"]] == ["a0", "a0"]
    assert '<path class="band"' in sec or 'class="band"' in sec  # the floor drawn around each curve
    # the probe family's trivial yardsticks, computed for it through the sandbox: dashed lines and every score
    from lorapop.report.html import run_probe_family
    from lorapop.train.yardsticks import describe, probe_yardsticks

    style, per_level = run_probe_family(pop)
    assert (style, per_level) == (pop.config["selfplay"]["proposal_style"], 2)
    ys = probe_yardsticks(style, per_level)
    best = ys["strategies"][ys["best"]]
    assert f"always {best['label']}: {best['score']:.3f}" in sec and 'stroke-dasharray="6 3"' in sec
    assert describe(ys, f"of the {style} probe") in sec.replace("&#x27;", "'")
    # the fixture's s2, born at step 15, is 5 steps old at the step-20 probe, under its run.probe_min_age=10
    young = [r for r in pop.probe if r.get("counted") is False]
    assert {(r["member"], r["step"], r["age"]) for r in young} == {("s2", 20, 5)}
    assert f"pop4</b>: noise floor" in sec and f"{len(young)} rows of children younger" in sec
    s0 = [r["score"] for r in pop.probe if r.get("member") == "s0" and r["step"] == 20]
    assert dict(step_means(pop.probe))[20] == pytest.approx(sum(s0) / len(s0))  # s2 left out of step 20's mean
    # a run without probe.jsonl says so instead of a chart
    bare = _copy(runs["single"], tmp_path / "bare")
    (bare / "probe.jsonl").unlink()
    html = write_report([bare]).read_text()
    assert "no probe.jsonl" in html and 'class="noplot"' not in html


def test_truncated_and_corrupt_metrics_lines(runs, tmp_path):
    run = _copy(runs["pop"], tmp_path / "killed")
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[4] = "{not json\n"
    lines[-1] = lines[-1][: len(lines[-1]) // 2]  # killed mid-write: half a line, no newline
    (run / "metrics.jsonl").write_text("".join(lines))
    html = write_report([run]).read_text()
    assert "metrics.jsonl line 30: truncated, skipped" in html
    assert "metrics.jsonl line 5: not valid JSON, skipped" in html
    assert re.search(r"<td>killed</td><td>[^<]*</td><td class=\"num\">28</td>", html)
    assert 'class="noplot"' not in html


def test_peak_memory_per_stage_and_the_stage_that_reached_it(runs, tmp_path):
    """A run that logged its stages' peaks (lorapop/train/loop.py) gets their chart and, per step, the peak and its
    stage; the fixture runs, which logged none, get neither (test_one_run_has_every_section_and_plot)."""
    run = _copy(runs["pop"], tmp_path / "mem")
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for m in lines:
        stages = {"start": 0.9, "propose": 1.5, "solve": 1.75 + m["step"] / 100, "update": 1.25}
        top = max(stages, key=stages.__getitem__)
        m.update({f"perf/cpu_memory_peak_gb/{k}": v for k, v in stages.items()},
                 **{"perf/cpu_memory_step_peak_gb": stages[top], "perf/cpu_memory_peak_stage": top,
                    "perf/cpu_memory_peak_gb": 1.75 + m["step"] / 100})
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    html = write_report([run]).read_text()
    assert "Peak resident memory per stage" in html and "<title>update</title>" in html
    assert re.search(r'<td class="num">3</td><td class="num">1\.78</td><td>solve</td>', html)
    assert html.count('<svg class="plot') == 35 and 'class="noplot"' not in html


def test_resumed_run_keeps_the_later_copy_of_a_step(runs, tmp_path):
    run = _copy(runs["pop"], tmp_path / "resumed")
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    redo = json.loads(lines[-1])
    redo["reward"] = 0.123456
    (run / "metrics.jsonl").write_text("".join(lines) + json.dumps(redo) + "\n")
    data = load_run(run)
    assert len(data.metrics) == 30 and data.metrics[-1]["reward"] == 0.123456
    assert any("logged more than once" in n for n in data.notes)


def test_run_in_progress_with_only_a_config(tmp_path):
    run = tmp_path / "starting"
    RunDir(run).create(config_to_yaml(load_config(None, ["--run.steps=100"])))  # what a starting run holds
    html = write_report([run]).read_text()
    assert _sections(html) == [sid for sid, _ in SECTIONS]
    assert "metrics.jsonl: missing" in html and "no data:" in html
    assert "steps: 100" in html


def test_nonfinite_values_and_broken_side_files(runs, tmp_path):
    run = _copy(runs["pop"], tmp_path / "odd")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rows[3]["reward"] = float("nan")
    rows[4]["coverage"] = float("inf")
    rows[5]["member/s0/solve_rate"] = "n/a"
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "population.json").write_text('{"step": 30, "members": [')  # torn write
    (run / "eval.json").write_text(json.dumps([{"bench": "x", "score": 0.5}, {"bench": "y", "score": None}]))
    (run / "config.yaml").write_text("a: [unclosed\n</pre><script>alert(1)</script>\n")
    html = write_report([run]).read_text()
    assert "population.json: not valid JSON" in html and "config.yaml: not valid YAML" in html
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)" in html
    geometry = re.findall(r' (?:d|cx|cy|x|y|width)="([^"]*)"', html)
    assert geometry and all(re.fullmatch(r"[-0-9. MLZ]*", g) for g in geometry), "non-finite value drawn"
    assert ">bench<" in html and ">0.5<" in html
    # lineage falls back to the members seen in metrics: every row starts at step 0 with no parents
    assert "Population over steps — odd" in html


def test_complexity_from_tasks_when_metrics_lack_it(runs, tmp_path):
    run = _copy(runs["pop"], tmp_path / "oldtrainer")
    rows = [{k: v for k, v in json.loads(x).items() if not k.startswith("complexity/")}
            for x in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    html = write_report([run]).read_text()
    sec = html[html.index('<section id="complexity">'):html.index('<section id="coverage">')]
    assert "cyclomatic per teacher — oldtrainer" in sec and 'class="noplot"' not in sec
    assert all(f"<title>{t}</title>" in sec for t in ("t0", "t1", "t2"))


@pytest.mark.parametrize("kind", ["missing", "file", "empty_dir", "foreign_dir", "empty_metrics"])
def test_nothing_readable_is_a_clear_error(tmp_path, kind, capsys):
    p = tmp_path / "x"
    if kind == "file":
        p.write_text("hello")
    elif kind == "empty_dir":
        p.mkdir()
    elif kind == "foreign_dir":
        p.mkdir()
        (p / "notes.txt").write_text("not a run")
    elif kind == "empty_metrics":
        p.mkdir()
        (p / "metrics.jsonl").write_text("")
    with pytest.raises(RunDirError, match=str(p)):
        write_report([p])
    assert main([str(p)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lorapop report: error: RunDirError: ") and err.count("\n") == 1
    assert not (tmp_path / "x" / "report.html").exists()


def test_a_bad_run_beside_good_ones_is_skipped_with_a_note(runs, tmp_path, capsys):
    out = tmp_path / "outdir"
    out.mkdir()
    assert main([str(tmp_path / "nope"), str(runs["single"]), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"report: {out / 'report.html'}"
    html = (out / "report.html").read_text()
    assert "skipped run: " in html and "no such directory" in html
    assert "<title>a0</title>" in html


def test_json_tables_generic_shapes():
    html = json_tables({"benchmarks": {"mbpp": {"base": 0.3, "members": {"s0": 0.4}}}, "aggregate": 0.35,
                        "notes": ["a", "b"]})
    assert ">members.s0<" in html and ">aggregate<" in html and ">0.35<" in html and ">b<" in html
    assert "x &amp; y" in json_tables("x & y")


def _eval_json(run_dir, members, is_baseline, base=0.1):
    """The shape `lorapop eval` writes into each run dir (lorapop/eval/runner.py, _assemble): one run per file."""
    def stats(vals):
        return {"mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals), "n": len(vals)}
    students = [v for mid, v in members.items() if mid[0] in "sa"]
    return {"benchmarks": ["mbppplus"], "n_problems": {"mbppplus": 10}, "base": {"scores": {"mbppplus": base,
            "aggregate": base}}, "runs": [{"run_dir": str(run_dir), "step": 4, "is_baseline": is_baseline,
            "members": [{"id": k, "scores": {"mbppplus": v, "aggregate": v}} for k, v in members.items()],
            "population": {"students": {"mbppplus": stats(students), "aggregate": stats(students)},
                           "all": {"mbppplus": stats(list(members.values())),
                                   "aggregate": stats(list(members.values()))}}}]}


def test_evaluation_table_in_the_papers_layout(runs, tmp_path):
    import json

    pop, single = _copy(runs["pop"], tmp_path / "pop"), _copy(runs["single"], tmp_path / "single")
    (pop / "eval.json").write_text(json.dumps(_eval_json(pop, {"t0": 0.0, "s0": 0.2, "s1": 0.4}, False)))
    (single / "eval.json").write_text(json.dumps(_eval_json(single, {"a0": 0.3}, True)))
    html = write_report([pop, single], tmp_path / "r.html").read_text()
    section = html[html.index('<section id="eval">'):]
    row = section[section.index("<td>mbppplus</td>"):section.index("</tr>", section.index("<td>mbppplus</td>"))]
    # base, baseline (the single run's agent), students mean/min/max, all members mean/min/max
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", row)
    assert cells == ["mbppplus", "10.0", "30.0", "30.0 / 20.0 / 40.0", "20.0 / 0.0 / 40.0"]
    assert "vs baseline single" in section and "baseline (single agent)" in section
    # the table is only about the population: the baseline is a column, not a row block of its own
    assert section.count("<h3>pop (checkpoint step 4)") == 1 and "<h3>single (checkpoint" not in section
