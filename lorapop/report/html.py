"""One self-contained report.html for one run or several overlaid (the page `lorapop report` writes).

The page is static HTML with inline SVG (lorapop/report/svg.py) and inline CSS: no script, nothing fetched, so it
opens from disk on an offline machine and in a CI artifact viewer. Runs are read tolerantly
(lorapop/records/run_data.py); whatever was skipped is listed at the top of the page.

With several runs, run-level curves (rewards by role, solve rate, validity, complexity, coverage, lengths) share axes
with one colour per run; per-member plots, the lineage and the config are shown run by run.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
from html import escape
from pathlib import Path
from typing import Any

from lorapop.records import RunDirError
from lorapop.records.run_data import (RunData, complexity_series, complexity_stats, complexity_teachers, in_role,
                                      lineage, load_run, member_ids, roles)
from lorapop.report.svg import (DASHES, Life, Series, color, line_chart, lineage_timeline, no_data,
                                yardstick_series)

RATE = (0.0, 1.0)
ZERO = (0.0, 0.0)  # anchors the y axis at 0 without stretching it to 1: coverage of 512 cells stays small
ROLE_COLORS = {"teacher": "#d62728", "student": "#1f77b4", "agent": "#9467bd", "member": "#7f7f7f"}
SECTIONS = [("summary", "Runs"), ("rewards", "Rewards"), ("solve", "Solve rates"), ("probe", "Capability probe"),
            ("validity", "Valid tasks and format errors"), ("complexity", "Program complexity"),
            ("coverage", "Coverage"), ("trueskill", "TrueSkill"), ("lineage", "Lineage"),
            ("lengths", "Response lengths"), ("timing", "Stage timings and memory"), ("eval", "Evaluation"),
            ("retention", "Operator retention"), ("config", "Config")]

CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1260px;padding:8px 16px;
color:#222;background:#fff}
h1{font-size:22px;margin:10px 0}h2{font-size:18px;border-bottom:1px solid #ccc;margin-top:26px;padding-bottom:3px}
h3{font-size:15px;margin:14px 0 4px}nav a{margin-right:12px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:8px 14px}
figure.chart{margin:0}figure.wide{grid-column:1/-1}svg.plot{width:100%;height:auto;display:block}
svg.plot .ttl{font-size:13px;font-weight:600}svg.plot .tick{font-size:10px;fill:#555}
svg.plot .axl{font-size:11px;fill:#333}svg.plot .grid{stroke:#e6e6e6;stroke-width:1}
svg.plot .frame{fill:none;stroke:#999;stroke-width:1}svg.plot .series path{fill:none;stroke-width:1.8}
svg.plot .band{fill-opacity:.15;stroke:none}svg.plot .barl{font-size:10px;fill:#fff}
svg.plot .link{stroke:#444;stroke-width:1;stroke-dasharray:3 2;fill:none}svg.plot .linkdot{fill:#444}
svg.plot .opl{font-size:10px;fill:#222}
.legend{font-size:12px;margin:0 0 6px 58px}.legend .li{margin-right:12px;white-space:nowrap}
.legend svg{vertical-align:middle;margin-right:3px}
.noplot{border:1px dashed #bbb;padding:10px;color:#777;min-height:60px}.noplot .ptitle{font-weight:600}
table{border-collapse:collapse;font-size:12px;margin:4px 0 10px}td,th{border:1px solid #ddd;padding:2px 6px;
text-align:left;vertical-align:top}th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
.notes{background:#fff6e0;border:1px solid #e0b050;padding:6px 12px;margin:8px 0}.notes li{font-family:monospace}
pre{background:#f7f7f7;border:1px solid #ddd;padding:8px;overflow:auto;max-height:520px;font-size:12px}
.muted{color:#777}.tw{overflow-x:auto;max-width:100%}
"""


# ---- small helpers -------------------------------------------------------------------------------------------------

def _cell(v: Any) -> str:
    if v is None:
        return "<td></td>"
    if isinstance(v, bool):
        return f"<td>{v}</td>"
    if isinstance(v, (int, float)):
        return f'<td class="num">{escape(f"{v:.4g}" if isinstance(v, float) else str(v))}</td>'
    if isinstance(v, (list, tuple)) and all(not isinstance(x, (dict, list)) for x in v):
        return f"<td>{escape(', '.join(map(str, v)))}</td>"
    if isinstance(v, (dict, list)):
        return f"<td><code>{escape(json.dumps(v, sort_keys=True, default=str)[:400])}</code></td>"
    return f"<td>{escape(str(v))}</td>"


def table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    if not rows:
        return '<p class="muted">(empty)</p>'
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(r.get(c, "")) for c in columns) + "</tr>" for r in rows)
    return f'<div class="tw"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _flatten(d: dict, prefix: str = "", depth: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and depth < 2:
            out.update(_flatten(v, key + ".", depth + 1))
        else:
            out[key] = v
    return out


def _depth(v: Any) -> int:
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    return 0


def json_tables(obj: Any, title: str = "") -> str:
    """Any JSON as tables: a dict of dicts is one row per key, a list of dicts one row per item, scalars a key/value
    table; deeper nesting is flattened into dotted column names. Used for eval.json, whose exact shape belongs to
    another module and may grow."""
    h = f"<h3>{escape(title)}</h3>" if title else ""
    if isinstance(obj, dict):
        # One row per key when the values are records (scalars, or one level of dicts such as per-member scores);
        # deeper values get a table of their own, or a benchmark table would grow one column per member per bench.
        if obj and all(isinstance(v, dict) and _depth(v) <= 2 for v in obj.values()):
            return h + table([{"": k, **_flatten(v)} for k, v in obj.items()])
        scalars = {k: v for k, v in obj.items() if not isinstance(v, (dict, list))}
        parts = [h]
        if scalars:
            parts.append(table([{"key": k, "value": v} for k, v in scalars.items()]))
        for k, v in obj.items():
            if isinstance(v, (dict, list)):
                parts.append(json_tables(v, f"{title} / {k}" if title else str(k)))
        return "".join(parts)
    if isinstance(obj, list):
        if obj and all(isinstance(v, dict) for v in obj):
            return h + table([_flatten(v) for v in obj])
        return h + table([{"#": i, "value": v} for i, v in enumerate(obj)])
    return h + f"<p>{escape(str(obj))}</p>"


def _grid(items: list[str]) -> str:
    return '<div class="grid">' + "".join(items) + "</div>"


# ---- plots -----------------------------------------------------------------------------------------------------------

def overlay(runs: list[RunData], keys: list[tuple[str, str]], title: str, *, ylabel: str = "",
            y_range: tuple[float, float] | None = None) -> str:
    """Run-level keys of every run on one chart: colour per run (per key when there is one run), dash per key."""
    multi = len(runs) > 1
    series = []
    for i, run in enumerate(runs):
        for j, (key, label) in enumerate(keys):
            series.append(Series(label=f"{run.name} · {label}" if multi else label, points=run.series(key),
                                 color=color(i) if multi else color(j), dash=DASHES[j % len(DASHES)] if multi else ""))
    return line_chart(series, title, ylabel=ylabel, y_range=y_range,
                      why_empty=f"{', '.join(k for k, _ in keys)} not in metrics.jsonl")


def per_member(run: RunData, role: str, metric: str | tuple[str, ...], title: str, *,
               key_fmt: str = "member/{id}/{metric}", y_range: tuple[float, float] | None = None,
               ylabel: str = "") -> str:
    """One line per member of `role`. With several metric names, each member uses the first it has: the trainer logs
    `teacher_reward`/`student_reward` beside the plain `reward` for a member that plays both roles."""
    r, ids = roles(run), member_ids(run)
    metrics = (metric,) if isinstance(metric, str) else metric
    series = []
    for mid in ids:
        if not in_role(r.get(mid, "member"), role):
            continue
        key = next((k for k in (key_fmt.format(id=mid, metric=x) for x in metrics) if run.has(k)), None)
        if key is not None:
            series.append(Series(mid, run.series(key), color=color(ids.index(mid))))
    return line_chart(series, f"{title} — {run.name}", ylabel=ylabel, y_range=y_range,
                      why_empty=f"no {key_fmt.format(id='<' + role + ' id>', metric=metrics[0])} keys")


def _by_task_type(runs: list[RunData], metric: str, title: str) -> list[str]:
    """`<task type>/<metric>` curves (code_o, code_i, code_f), only when the trainer logs them."""
    skip = {"teacher", "student", "member", "trueskill", "complexity", "coverage", "time", "completions"}
    figs = []
    for run in runs:
        types = sorted({k.split("/")[0] for k in run.keys() if k.count("/") == 1 and k.endswith("/" + metric)
                        and k.split("/")[0] not in skip})
        if types:
            figs.append(line_chart([Series(t, run.series(f"{t}/{metric}"), color=color(i), dash=DASHES[i % 4])
                                    for i, t in enumerate(types)], f"{title} — {run.name}", y_range=RATE))
    return figs


def trueskill_chart(run: RunData, role: str) -> str:
    r, ids = roles(run), member_ids(run)
    series = []
    for mid in ids:
        if not in_role(r.get(mid, "member"), role) or not run.has(f"trueskill/{mid}/mu"):
            continue
        mu, sg = dict(run.series(f"trueskill/{mid}/mu")), dict(run.series(f"trueskill/{mid}/sigma"))
        band = [(s, mu[s] - sg[s], mu[s] + sg[s]) for s in mu if mu[s] is not None and sg.get(s) is not None]
        series.append(Series(mid, list(mu.items()), color=color(ids.index(mid)), band=band))
    return line_chart(series, f"TrueSkill μ ± σ, {role}s — {run.name}", ylabel="μ",
                      why_empty=f"no trueskill/<{role} id>/mu keys")


def complexity_section(runs: list[RunData]) -> str:
    stats: dict[str, None] = {}
    for run in runs:
        stats.update(dict.fromkeys(complexity_stats(run)))
    if not stats:
        return no_data("Program complexity", "no complexity/* keys and no diagnostics in tasks.jsonl")
    multi = len(runs) > 1
    figs = []
    for stat in stats:
        series = [Series(run.name if multi else "all teachers", complexity_series(run, stat), color=color(i))
                  for i, run in enumerate(runs)]
        figs.append(line_chart(series, f"{stat} (mean over the step's valid tasks)", ylabel=stat))
    parts = ["<h3>All runs</h3>" if multi else "", _grid(figs)]
    for run in runs:
        ids, figs = member_ids(run), []
        for stat in complexity_stats(run):
            series = [Series(t, complexity_series(run, stat, t), color=color(ids.index(t) if t in ids else 0))
                      for t in complexity_teachers(run)]
            figs.append(line_chart(series, f"{stat} per teacher — {run.name}", ylabel=stat))
        counts = [{"proposer": p, "type": t, "valid tasks": n} for (p, t), n in sorted(run.task_counts.items())]
        parts.append(f"<h3>{escape(run.name)}: per teacher</h3>" + _grid(figs)
                     + f"<details><summary>valid tasks in tasks.jsonl: {run.n_tasks}</summary>{table(counts)}"
                       "</details>")
    return "".join(parts)


@functools.lru_cache(maxsize=8)
def _probe_yardsticks(style: str, per_level: int) -> dict[str, Any] | str:
    """The trivial yardsticks of a probe family (lorapop/train/yardsticks.py), checked in a sandbox started for the
    call; the error's text where none can start (the panel then says so rather than leaving the line out)."""
    from lorapop.train.yardsticks import probe_yardsticks

    try:
        return probe_yardsticks(style, per_level)
    except Exception as e:  # noqa: BLE001 - a report must render whatever the sandbox can do here
        return f"{type(e).__name__}: {e}"


def run_probe_family(run: RunData) -> tuple[str, int]:
    """(proposal style, probe tasks per level) the run's probe used, from its config.yaml (defaults where absent)."""
    from lorapop.config import RunConfig, SelfPlayConfig

    cfg = run.config or {}
    style = (cfg.get("selfplay") or {}).get("proposal_style",
                                            SelfPlayConfig.__dataclass_fields__["proposal_style"].default)
    per_level = (cfg.get("run") or {}).get("probe_per_level",
                                           RunConfig.__dataclass_fields__["probe_per_level"].default)
    return str(style), int(per_level)


def probe_section(runs: list[RunData]) -> str:
    """probe.jsonl (run.probe_interval): per run, the mean score of its students (the single agent) at each probe
    step, with a band of +- the std of identical members' scores at step 0 (the noise floor, lorapop/train/probe.py),
    and the floor itself written under the chart; dashed grey lines at the probe family's best trivial yardsticks
    (always the first element, the last..., lorapop/train/yardsticks.py), and every strategy's score under it. Rows
    of PBT children younger than run.probe_min_age are left out, as lorapop/criteria.py leaves them out."""
    from lorapop.records.probe import describe_noise_floor, read_noise_floor, score_rows, step_means
    from lorapop.train.yardsticks import describe

    probed = [r for r in runs if r.probe]
    if not probed:
        return '<p class="muted">no probe.jsonl (the runs did not set run.probe_interval)</p>'
    series, notes, families = [], [], {}
    for i, r in enumerate(probed):
        nf = read_noise_floor(r.probe)
        points = [(float(s), v) for s, v in step_means(r.probe)]
        sd = (nf or {}).get("std")
        band = [(s, v - sd, v + sd) for s, v in points] if isinstance(sd, (int, float)) else []
        series.append(Series(r.name, points, color=color(i), band=band))
        families.setdefault(run_probe_family(r), []).append(points)
        young = sum(1 for x in r.probe if "member" in x) - len(score_rows(r.probe))
        notes.append(f"<li><b>{escape(r.name)}</b>: {escape(describe_noise_floor(nf))}"
                     + (f"; {young} rows of children younger than run.probe_min_age left out" if young else "")
                     + "</li>")
    for (style, per_level), curves in families.items():
        xs = [x for pts in curves for x, _ in pts] or [0.0]
        ys = _probe_yardsticks(style, per_level)
        what = f"of the {style} probe"
        if isinstance(ys, str):
            notes.append(f"<li>trivial yardsticks {escape(what)}: not computed ({escape(ys)})</li>")
            continue
        series += yardstick_series(ys, min(xs), max(xs), top=3 if len(families) == 1 else 1)
        notes.append(f"<li>{escape(describe(ys, what))}</li>")
    chart = line_chart(series, "Probe score: mean over the counted students (the single agent)", y_range=RATE,
                       why_empty="no score rows in probe.jsonl")
    return (_grid([chart]) + "<p>Each probe scores the members after that step's update and before its PBT "
            "replacement; the band is &plusmn; the standard deviation of identical members' mean scores at step 0, "
            "what the probe's sampling alone moves a member's score by. The dashed grey lines are trivial "
            "yardsticks: the score of always giving one fixed answer (the list's first element, its last, its "
            "largest...), checked like the members' answers; a curve near them may have learned only that "
            "rule.</p><ul>" + "".join(notes) + "</ul>")


def lives(run: RunData) -> tuple[list[list[Life]], list[str]]:
    """Timeline rows: each initial member starts a row, a child takes the row of the member it replaced."""
    r, last = roles(run), run.last_step
    pop = run.population or {}
    info = {str(m["id"]): m for m in pop.get("members", []) if isinstance(m, dict) and "id" in m} \
        if isinstance(pop.get("members"), list) else {}
    events = lineage(run)
    children = {str(e["child"]) for e in events if e.get("child") is not None}
    life: dict[str, Life] = {}
    rows: list[list[Life]] = []
    row_of: dict[str, int] = {}
    for mid in member_ids(run):
        if mid in children:
            continue
        born = info.get(mid, {}).get("born_step", 0)
        life[mid] = Life(mid, r.get(mid, "member"), float(born) if isinstance(born, (int, float)) else 0.0, last,
                         False)
        row_of[mid] = len(rows)
        rows.append([life[mid]])
    for e in events:
        step = float(e.get("step") or 0)
        old = str(e["replaced"]) if e.get("replaced") is not None else None
        if old in life:
            life[old].end, life[old].died = step, True
        if e.get("child") is None:
            continue
        child = str(e["child"])
        parents = tuple(str(p) for p in e.get("parents") or [])
        life[child] = Life(child, r.get(child, str(e.get("role", "member"))), step, last, False,
                           str(e.get("operator") or "?"), parents)
        if old in row_of:
            row_of[child] = row_of[old]
            rows[row_of[old]].append(life[child])
        else:
            row_of[child] = len(rows)
            rows.append([life[child]])
    labels = []
    for row in rows:
        slot = next((info[x.member].get("slot") for x in row if x.member in info
                     and info[x.member].get("slot") is not None), None)
        labels.append(f"{'slot ' + str(slot) + ' · ' if slot is not None else ''}{row[0].role}")
    return rows, labels


def lineage_section(run: RunData) -> str:
    rows, labels = lives(run)
    fig = lineage_timeline(rows, labels, f"Population over steps — {run.name}", run.last_step, ROLE_COLORS)
    ev = [{k: e.get(k) for k in ("step", "child", "replaced", "parents", "operator", "role", "params")}
          for e in lineage(run)]
    pop = run.population or {}
    members = [m for m in pop.get("members", []) if isinstance(m, dict)] if isinstance(pop.get("members"), list) \
        else []
    cols = ["id", "slot", "role", "mu", "sigma", "age", "born_step", "parents", "operator"]
    return (f"<h3>{escape(run.name)}</h3>" + fig
            + f"<h3>Replacements and births ({len(ev)})</h3>"
            + (table(ev) if ev else '<p class="muted">no lineage events (no replacement yet)</p>')
            + f"<h3>Members at step {escape(str(pop.get('step', '?')))}</h3>"
            + (table(members, cols) if members else '<p class="muted">no population.json</p>'))


# ---- page ------------------------------------------------------------------------------------------------------------

def _eval_run(r: RunData) -> dict | None:
    """This run's entry in its eval.json (``lorapop eval`` writes one per run dir), or None."""
    ev = r.eval if isinstance(r.eval, dict) else None
    runs = ev.get("runs") if ev else None
    return runs[0] if isinstance(runs, list) and runs and isinstance(runs[0], dict) else None


def _is_single(r: RunData) -> bool:
    return isinstance(r.config, dict) and (r.config.get("population") or {}).get("mode") == "single"


def eval_comparison(runs: list[RunData]) -> str:
    """The paper's evaluation layout: per benchmark, the base model, the single-agent baseline, and mean / min / max
    over the population's students and over all its members (greedy pass@1, %). Built from each run's eval.json;
    the baseline is the evaluated run whose config says ``population.mode: single``."""
    evaluated = [(r, _eval_run(r)) for r in runs]
    evaluated = [(r, e) for r, e in evaluated if e is not None]
    if not evaluated:
        return ('<p class="muted">no eval.json written by `lorapop eval` (or `lorapop compare`) to compare; '
                'any other eval.json is shown as it is below</p>')
    baseline = next((e for r, e in evaluated if _is_single(r) or e.get("is_baseline")), None)
    pops = [(r, e) for r, e in evaluated if e is not baseline]
    base = (evaluated[0][0].eval.get("base") or {}).get("scores") or {}
    benches = list(dict.fromkeys(b for _, e in evaluated for m in e.get("members", [])
                                 for b in (m.get("scores") or {})))
    benches = [b for b in benches if b != "aggregate"] + (["aggregate"] if benches else [])

    def pct(x: Any) -> str | None:
        return f"{100 * x:.1f}" if isinstance(x, (int, float)) else None

    def trip(st: Any) -> str | None:
        if not isinstance(st, dict):
            return None
        return " / ".join(pct(st.get(k)) or "-" for k in ("mean", "min", "max"))

    # greedy pass@1, or with `lorapop eval --samples` one table per k (population["pass@k"][k], base["pass@k"][k])
    sampling = evaluated[0][0].eval.get("sampling")
    ks = [str(k) for k in sampling.get("k") or []] if isinstance(sampling, dict) else []

    def pop_of(e: dict | None, k: str | None) -> dict:
        pop = (e or {}).get("population") or {}
        return pop if k is None else (pop.get("pass@k") or {}).get(k) or {}

    out = []
    for r, e in pops or evaluated:
        for k in ks or [None]:
            base_k = base if k is None else \
                ((evaluated[0][0].eval.get("base") or {}).get("pass@k") or {}).get(k) or {}
            rows = []
            for b in benches:
                row = {"benchmark": b, "base": pct(base_k.get(b)),
                       "baseline (single agent)": pct((pop_of(baseline, k).get("students", {}).get(b) or {})
                                                      .get("mean")) if baseline else None}
                for label, key in (("students mean / min / max", "students"),
                                   ("all members mean / min / max", "all")):
                    row[label] = trip(pop_of(e, k).get(key, {}).get(b))
                rows.append(row)
            step = e.get("step")
            out.append(f"<h3>{escape(r.name)} (checkpoint step {escape(str(step))}) vs baseline "
                       f"{escape(next((q.name for q, f in evaluated if f is baseline), 'none'))}"
                       f"{f', pass@{k}' if k else ''}</h3>" + table(rows))
    n = evaluated[0][0].eval.get("n_problems") or {}
    what = (f"pass@k in % from {sampling.get('samples')} samples per problem at temperature "
            f"{sampling.get('temperature')}, top_p {sampling.get('top_p')} (unbiased estimator, Chen et al. 2021)"
            if ks else "greedy pass@1 in %")
    return (f"<p>{escape(what)}; problems per benchmark: "
            + escape(", ".join(f"{b} {k}" for b, k in n.items())) + "</p>" + "".join(out))


def _recovery_rule(ret: dict, against: str) -> str:
    """How the file judged recovery: within the noise floor of the continuation (newer files carry the floor),
    or, in older files, a share (``threshold``) of the reference rate."""
    floor = ret.get("noise_floor")
    if isinstance(floor, dict) and isinstance(floor.get("spread"), (int, float)):
        return (f"lost = a drop beyond the noise floor right after the operator, recovered = back within it of "
                f"{escape(against)}; noise floor {floor['spread']:.3f} (the spread of {escape(str(floor.get('n')))} "
                f"replicates of the parent)")
    return f"recovered = held-out solve rate &ge; {escape(str(ret.get('threshold')))} &times; {escape(against)}"


def retention_section(run: RunData) -> str:
    """retention.json (`lorapop retention`): held-out solve rate per arm over the steps after the operator (one curve
    per operator, the continuation arm, the reference, dashed black; the parent's pre-operator rate dotted; dashed
    grey, the probe family's best trivial yardsticks), and the recovery table. Files written before the continuation
    became the reference have no ``reference`` key: their recovery was against the parent's pre-operator
    rate, and the text says so."""
    ret = run.retention or {}
    arms = ret.get("arms") or {}
    pre = (ret.get("parent_heldout") or {}).get("solve_rate")
    against_continuation = ret.get("reference") == "continuation"
    series = [Series(name, [(float(i), _num_or_none(v)) for i, v in enumerate(arm.get("heldout") or [])],
                     color="#000000" if against_continuation and name == "continuation" else color(i),
                     dash="6 3" if against_continuation and name == "continuation" else "")
              for i, (name, arm) in enumerate(arms.items())]
    steps = max((len(a.get("heldout") or []) for a in arms.values()), default=1)
    probe = ret.get("probe") or {}
    if isinstance(probe.get("style"), str) and isinstance(probe.get("per_level"), int):
        ys = _probe_yardsticks(probe["style"], probe["per_level"])  # the file's probe family: its trivial scores
        series += yardstick_series(ys, 0.0, float(steps - 1)) if isinstance(ys, dict) else []
    if isinstance(pre, (int, float)):
        series.append(Series(f"parent before operator ({pre:.3f})", [(0.0, float(pre)), (float(steps - 1), float(pre))],
                             color="#888888", dash="2 3"))
    rows = [{"arm": name, "operator id": (arm.get("record") or {}).get("id") or "",
             "after operator": (arm.get("heldout") or [None])[0], "final": (arm.get("heldout") or [None])[-1],
             "drop": arm.get("drop", ""), "final gap": arm.get("final_gap", ""),
             "recovered at step": "reference" if against_continuation and name == "continuation"
             else arm.get("recovered_step") if arm.get("recovered_step") is not None else "not recovered"}
            for name, arm in arms.items()]
    mini = ret.get("mini_eval") or {}
    against = ("the continuation arm's at the same step" if against_continuation
               else "the parent's before the operator (a file from before the continuation became the reference)")
    head = (f"<p>parent <b>{escape(str(ret.get('parent')))}</b>"
            + (f" ({escape(str(ret.get('parent_selfplay_steps')))} self-play steps)"
               if ret.get("parent_selfplay_steps") is not None else "")
            + f", second parent {escape(str(ret.get('second_parent')))}, checkpoint "
            f"{escape(str(ret.get('checkpoint')))}; {_recovery_rule(ret, against)}</p>"
            + (f"<p>mini-eval: {escape(str(mini.get('n_tasks')))} held-out tasks &times; "
               f"{escape(str(mini.get('samples_per_task')))} answer(s), resolution "
               f"{escape(format(mini.get('resolution', 0), '.3f'))}; arms trained with the "
               f"{escape(str(ret.get('training')))}</p>" if mini else "")
            + (f"<p><b>note</b>: {escape(str(ret['note']))}</p>" if ret.get("note") else ""))
    return f"<h3>{escape(run.name)}</h3>" + head + _grid([line_chart(
        series, "Held-out solve rate after the operator", xlabel="steps after the operator", y_range=RATE)]) + table(rows)


MEMORY_STAGE = "perf/cpu_memory_peak_gb/"  # + stage: that stage's peak resident memory (lorapop/train/loop.py)


def memory_section(run: RunData) -> str:
    """Peak resident memory per stage (a chart) and, per step, the peak and the stage that reached it (a table);
    nothing for a run that logged no stage peaks."""
    keys = sorted(k for k in run.keys() if k.startswith(MEMORY_STAGE))
    if not keys:
        return ""
    chart = line_chart([Series(k[len(MEMORY_STAGE):], run.series(k), color=color(i)) for i, k in enumerate(keys)],
                       f"Peak resident memory per stage — {run.name}", ylabel="GB")
    rows = [{"step": m["step"], "peak resident memory (GB)": m.get("perf/cpu_memory_step_peak_gb"),
             "reached in": m.get("perf/cpu_memory_peak_stage"),
             "run's peak so far (GB)": m.get("perf/cpu_memory_peak_gb")}
            for m in run.metrics if "perf/cpu_memory_step_peak_gb" in m]
    return f"<h3>Memory — {escape(run.name)}</h3>" + _grid([chart]) + table(rows)


def _num_or_none(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) else None


def build_html(runs: list[RunData], notes: list[str]) -> str:
    multi = len(runs) > 1
    S: dict[str, str] = {}
    summary = [{"run": r.name, "path": str(r.path), "steps logged": len(r.metrics),
                "last step": r.last_step, "members": len(member_ids(r)), "valid tasks": r.n_tasks,
                "lineage events": len(lineage(r)), "files": ", ".join(
                    f for f in ("config.yaml", "metrics.jsonl", "tasks.jsonl", "population.json", "eval.json")
                    if (r.path / f).is_file())} for r in runs]
    all_notes = notes + [f"{r.name}: {n}" for r in runs for n in r.notes]
    S["summary"] = "".join(
        f'<div class="notes"><b>{escape(r.name)}: sandbox NOT ISOLATED</b> (executor.allow_unisolated): '
        f"model-written programs ran with the trainer's access to files and network; "
        f"{escape(', '.join(f'{k}={v}' for k, v in r.unisolated.items()))}</div>" for r in runs if r.unisolated
    ) + table(summary) + (
        '<div class="notes"><b>Skipped or missing</b><ul>' + "".join(f"<li>{escape(n)}</li>" for n in all_notes)
        + "</ul></div>" if all_notes else '<p class="muted">every file was read in full</p>')
    S["rewards"] = _grid(
        [overlay(runs, [("teacher/reward", "teacher"), ("student/reward", "student")], "Reward by role"),
         overlay(runs, [("reward", "reward")], "Mean student-sample reward"),
         overlay(runs, [("teacher/zero_adv_group_frac", "teacher"), ("student/zero_adv_group_frac", "student")],
                 "TRR++ groups whose rewards all tie (advantage 0)", y_range=RATE)]
        + [per_member(r, role, (f"{role}_reward", "reward"), f"Reward per {role}") for r in runs
           for role in ("teacher", "student")]
        + [per_member(r, "member", "loss", "Policy-gradient loss per member") for r in runs
           if any(k.startswith("member/") and k.endswith("/loss") for k in r.keys())])
    # matched: this step's valid tasks, answered by their teacher's matched student (the single agent's own); the
    # top-ups from the buffer are another distribution, drawn apart (docs/METHOD.md, Diagnostics)
    S["solve"] = _grid([overlay(runs, [("student/matched_solve_rate", "matched"),
                                       ("student/topup_solve_rate", "top-up (buffer tasks)")],
                                "Student solve rate: matched (this step's valid tasks) and top-ups", y_range=RATE)]
                       + [per_member(r, "student", "matched_solve_rate",
                                     "Matched solve rate per student", y_range=RATE) for r in runs]
                       + _by_task_type(runs, "matched_solve_rate", "Matched solve rate by task type"))
    S["probe"] = probe_section(runs)
    S["validity"] = _grid(
        [overlay(runs, [("valid_rate", "valid")], "Valid-task rate", y_range=RATE),
         overlay(runs, [("format_error_rate", "all"), ("teacher/format_error_rate", "teacher"),
                        ("student/format_error_rate", "student")], "Format-error rate", y_range=RATE)]
        + [f for r in runs for f in (
            per_member(r, "teacher", "valid_rate", "Valid-task rate per teacher", y_range=RATE),
            per_member(r, "member", "format_error_rate", "Format-error rate per member", y_range=RATE))]
        + _by_task_type(runs, "valid_rate", "Valid-task rate by task type"))
    S["complexity"] = complexity_section(runs)
    S["coverage"] = _grid(
        [overlay(runs, [("coverage", "coverage")], "Coverage (fraction of CVT cells ever filled)", y_range=ZERO)]
        + [f for r in runs for f in (
            per_member(r, "teacher", "", "Coverage by teacher (tasks proposed)", key_fmt="coverage/teacher/{id}",
                       y_range=ZERO),
            per_member(r, "student", "", "Coverage by student (tasks faced)", key_fmt="coverage/student/{id}",
                       y_range=ZERO))])
    S["trueskill"] = _grid([trueskill_chart(r, role) for r in runs for role in ("teacher", "student")])
    S["lineage"] = "".join(lineage_section(r) for r in runs)
    S["lengths"] = _grid([overlay(runs, [("completions/mean_length", "all completions")],
                                  "Mean completion length", ylabel="tokens")]
                         + [per_member(r, "member", "mean_length", "Mean completion length per member",
                                       ylabel="tokens") for r in runs])
    timing = []
    for r in runs:
        stages = sorted({k for k in r.keys() if k.startswith("time/")})
        timing.append(line_chart([Series(k[5:], r.series(k), color=color(i)) for i, k in enumerate(stages)],
                                 f"Seconds per stage — {r.name}", ylabel="s", why_empty="no time/* keys"))
    S["timing"] = _grid(timing) + "".join(memory_section(r) for r in runs)
    S["eval"] = eval_comparison(runs) + "".join(f"<h3>{escape(r.name)}</h3>" + (
        json_tables(r.eval) if r.eval is not None else '<p class="muted">no eval.json (run `lorapop eval`)</p>')
        for r in runs)
    S["retention"] = "".join(retention_section(r) for r in runs if r.retention) or (
        '<p class="muted">no retention.json (run `lorapop retention RUN_DIR`)</p>')
    S["config"] = "".join(
        f"<details{'' if multi else ' open'}><summary>config.yaml — {escape(r.name)}</summary>"
        + (f"<pre>{escape(r.config_text)}</pre>" if r.config_text is not None
           else '<p class="muted">no config.yaml</p>')
        + "</details>" for r in runs)
    nav = "".join(f'<a href="#{sid}">{escape(t)}</a>' for sid, t in SECTIONS)
    body = "".join(f'<section id="{sid}"><h2>{escape(t)}</h2>{S[sid]}</section>' for sid, t in SECTIONS)
    title = "lorapop report — " + ", ".join(r.name for r in runs)
    now = _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f'<meta name="viewport" content="width=device-width,initial-scale=1"><style>{CSS}</style></head><body>'
            f'<h1>{escape(title)}</h1><p class="muted">generated {now}; hover a line for its label</p>'
            f"<nav>{nav}</nav>{body}</body></html>\n")


def write_report(run_dirs: list[Path], out: Path | None = None) -> Path:
    """Reads the runs, writes report.html, returns its path. Unreadable runs are skipped with a note as long as one
    run is readable; otherwise RunDirError. Default output: <first readable run>/report.html."""
    if not run_dirs:
        raise RunDirError("no run directory given")
    runs, notes = [], []
    for d in run_dirs:
        try:
            runs.append(load_run(d))
        except RunDirError as e:
            notes.append(f"skipped run: {e}")
    if not runs:
        raise RunDirError("; ".join(n.removeprefix("skipped run: ") for n in notes))
    names = [r.name for r in runs]
    for r in runs:  # runs/a/x and runs/b/x would otherwise share a legend label
        if names.count(r.name) > 1:
            r.name = f"{r.path.resolve().parent.name}/{r.name}"
    out = Path(out) if out is not None else runs[0].path / "report.html"
    if out.is_dir():
        out = out / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    html = build_html(runs, notes)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")  # the run may be viewed while it is being rewritten
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, out)
    return out
