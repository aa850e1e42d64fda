"""Reading a run directory for the report, tolerantly, through :mod:`lorapop.records.rundir`.

A run may still be in progress or may have been killed mid-write, so every file is optional and every line is
checked on its own: what cannot be read is skipped and described in `RunData.notes`, which the report shows. Only a
directory with nothing readable at all raises `RunDirError`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lorapop.records import RunDirError
from lorapop.records.members import AGENT, role_from_id
from lorapop.records.rundir import (CONFIG, EVAL, KNOWN_FILES, METRICS, POPULATION, PROBE, RETENTION, TASKS, RunDir,
                                    iter_jsonl, read_json, read_text)


@dataclass
class RunData:
    path: Path
    name: str
    config_text: str | None = None
    config: dict[str, Any] | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)  # one dict per step, sorted by step
    population: dict[str, Any] | None = None
    eval: Any = None
    retention: dict[str, Any] | None = None  # retention.json (`lorapop retention`), when present
    probe: list[dict[str, Any]] = field(default_factory=list)  # probe.jsonl (run.probe_interval), small: kept whole
    # tasks.jsonl aggregated while streaming: a long run has too many tasks to hold.
    task_diag: dict[tuple[int, str], dict[str, list[float]]] = field(default_factory=dict)  # (step, proposer)
    task_counts: dict[tuple[str, str], int] = field(default_factory=dict)  # (proposer, type) -> valid tasks
    n_tasks: int = 0
    notes: list[str] = field(default_factory=list)
    unisolated: dict[str, Any] | None = None  # population.json's sandbox record, when it did not isolate
    # Memo of derived views (keys, series, members, roles): a report asks for them hundreds of times and a long run
    # has thousands of steps. Valid because a RunData is not changed after load_run returns it.
    _memo: dict = field(default_factory=dict, repr=False)

    @property
    def steps(self) -> list[float]:
        return [m["step"] for m in self.metrics]

    @property
    def last_step(self) -> float:
        s = [m["step"] for m in self.metrics]
        if self.population and isinstance(self.population.get("step"), (int, float)):
            s.append(self.population["step"])
        s += [k[0] for k in self.task_diag]
        return float(max(s)) if s else 0.0

    def keys(self) -> set[str]:
        if "keys" not in self._memo:
            out: set[str] = set()
            for m in self.metrics:
                out.update(m)
            self._memo["keys"] = out
        return self._memo["keys"]

    def series(self, key: str) -> list[tuple[float, float | None]]:
        """(step, value) over every logged step; None where the key is absent or not a finite number."""
        k = ("series", key)
        if k not in self._memo:
            self._memo[k] = [(m["step"], _num(m.get(key))) for m in self.metrics]
        return self._memo[k]

    def has(self, key: str) -> bool:
        return key in self.keys() and any(v is not None for _, v in self.series(key))


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _read_metrics(run: RunData) -> None:
    by_step: dict[float, dict] = {}
    dup = 0
    for i, obj in iter_jsonl(run.path / METRICS, run.notes):
        step = _num(obj.get("step"))
        if step is None:
            run.notes.append(f"metrics.jsonl line {i}: no numeric 'step', skipped")
            continue
        obj["step"] = step
        if "matched_solve_rate" in obj:  # its older name (the same quantity, task-mean of matched tasks)
            obj.setdefault("student/matched_solve_rate", obj["matched_solve_rate"])
        if step in by_step:
            dup += 1
        by_step[step] = obj  # a resumed run re-logs the steps after its checkpoint: the later line is the truth
    if dup:
        run.notes.append(f"metrics.jsonl: {dup} step(s) logged more than once (resumed run?); the later line kept")
    run.metrics = [by_step[s] for s in sorted(by_step)]


def _read_tasks(run: RunData) -> None:
    diag: dict[tuple[int, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for _, t in iter_jsonl(run.path / TASKS, run.notes):
        run.n_tasks += 1
        proposer = str(t.get("proposer", "?"))
        counts[(proposer, str(t.get("type", "?")))] += 1
        step, d = _num(t.get("step")), t.get("diagnostics")
        if step is None or not isinstance(d, dict):
            continue
        for k, v in d.items():
            v = _num(v)
            if v is not None:
                diag[(step, proposer)][k].append(v)
    run.task_diag = {k: dict(v) for k, v in diag.items()}
    run.task_counts = dict(counts)


def load_run(path: str | Path) -> RunData:
    path = RunDir(path).path
    if not path.exists():
        raise RunDirError(f"{path}: no such directory")
    if not path.is_dir():
        raise RunDirError(f"{path}: not a directory")
    present = [f for f in KNOWN_FILES if (path / f).is_file()]
    if not present:
        raise RunDirError(f"{path}: not a run directory (none of {', '.join(KNOWN_FILES)})")
    run = RunData(path=path, name=path.resolve().name or str(path))
    run.config_text = read_text(path / CONFIG, run.notes)
    if run.config_text is not None:
        try:
            import yaml

            cfg = yaml.safe_load(run.config_text)
            run.config = cfg if isinstance(cfg, dict) else None
        except Exception as e:  # noqa: BLE001 - yaml raises many types; the raw text is still shown
            run.notes.append(f"config.yaml: not valid YAML ({type(e).__name__}), shown as text")
    _read_metrics(run)
    _read_tasks(run)
    pop = read_json(path / POPULATION, run.notes)
    if pop is not None and not isinstance(pop, dict):
        run.notes.append("population.json: not a JSON object, skipped")
        pop = None
    run.population = pop
    sandbox = (pop or {}).get("sandbox")
    if isinstance(sandbox, dict) and sandbox.get("isolated") is False:
        run.unisolated = sandbox
    run.eval = read_json(path / EVAL, run.notes)
    ret = read_json(path / RETENTION, run.notes)
    if ret is not None and not (isinstance(ret, dict) and isinstance(ret.get("arms"), dict)):
        run.notes.append("retention.json: no 'arms' object, skipped")
        ret = None
    run.retention = ret
    run.probe = [row for _, row in iter_jsonl(path / PROBE, run.notes) if isinstance(row.get("step"), int)]
    if METRICS not in present:
        run.notes.append("metrics.jsonl: missing (run not started yet?)")
    elif not run.metrics:
        run.notes.append("metrics.jsonl: no readable step yet")
    readable = run.config_text is not None or run.metrics or run.n_tasks or run.population or run.eval is not None
    if not readable:
        raise RunDirError(f"{path}: nothing readable ({'; '.join(run.notes) or 'all files empty'})")
    return run


# ---- members and roles -------------------------------------------------------------------------------------------

ROLE_KEYS = {"teacher": ("valid_rate",), "student": ("solve_rate",)}


def member_ids(run: RunData) -> list[str]:
    """Every member seen anywhere in the run, in order of first appearance (initial members first)."""
    if "member_ids" in run._memo:
        return run._memo["member_ids"]
    seen: dict[str, None] = {}
    # Metrics first: their key order follows the trainer's member order, children after the members they replaced.
    for m in run.metrics:
        for k in m:
            parts = k.split("/")
            if len(parts) >= 3 and parts[0] in ("member", "trueskill"):
                seen.setdefault(parts[1], None)
    for e in lineage(run):
        for k in ("replaced", "child"):
            if e.get(k) is not None:
                seen.setdefault(str(e[k]), None)
    pop = run.population or {}
    for m in pop.get("members", []) if isinstance(pop.get("members"), list) else []:
        if isinstance(m, dict) and "id" in m:
            seen.setdefault(str(m["id"]), None)
    run._memo["member_ids"] = list(seen)
    return run._memo["member_ids"]


def lineage(run: RunData) -> list[dict]:
    pop = run.population or {}
    lin = pop.get("lineage", [])
    if not isinstance(lin, list):
        return []
    return sorted((e for e in lin if isinstance(e, dict)), key=lambda e: _num(e.get("step")) or 0.0)


def roles(run: RunData) -> dict[str, str]:
    """member id -> "teacher" | "student" | "agent" (the single agent plays both) | "member" (unknown)."""
    if "roles" in run._memo:
        return run._memo["roles"]
    out: dict[str, str] = {}
    pop = run.population or {}
    for m in pop.get("members", []) if isinstance(pop.get("members"), list) else []:
        if isinstance(m, dict) and "id" in m and isinstance(m.get("role"), str):
            out[str(m["id"])] = m["role"]
    for e in lineage(run):
        if e.get("child") is not None and isinstance(e.get("role"), str):
            out.setdefault(str(e["child"]), e["role"])
        if e.get("replaced") is not None and isinstance(e.get("role"), str):
            out.setdefault(str(e["replaced"]), e["role"])  # replacement happens within a role (docs/METHOD.md, Evolve)
    keys = run.keys()
    for mid in member_ids(run):
        if mid in out:
            continue
        is_t = any(f"member/{mid}/{k}" in keys for k in ROLE_KEYS["teacher"]) or \
            any(k.startswith(f"complexity/{mid}/") for k in keys)
        is_s = any(f"member/{mid}/{k}" in keys for k in ROLE_KEYS["student"])
        out[mid] = AGENT if is_t and is_s else "teacher" if is_t else "student" if is_s else \
            role_from_id(mid) or "member"
    run._memo["roles"] = out
    return out


def in_role(role: str, wanted: str) -> bool:
    """`wanted` "member" matches everyone; a role other than teacher/student (the single agent) matches both."""
    return wanted == "member" or role == wanted or role not in ("teacher", "student")


def complexity_stats(run: RunData) -> list[str]:
    """Descriptor names with data, from complexity/* metric keys or else from tasks.jsonl diagnostics."""
    stats: dict[str, None] = {}
    for k in sorted(run.keys()):
        parts = k.split("/")
        if parts[0] == "complexity" and len(parts) in (2, 3):
            stats.setdefault(parts[-1], None)
    if not stats:
        for d in run.task_diag.values():
            for k in d:
                stats.setdefault(k, None)
    stats.pop("parse_ok", None)  # 1.0 on every valid task: nothing to plot
    stats.pop("n_inputs", None)  # fixed by the task format, not a property of the program
    order = ["cyclomatic", "ast_depth", "loc", "n_node_types", "input_size"]
    return sorted(stats, key=lambda s: (order.index(s) if s in order else len(order), s))


def complexity_series(run: RunData, stat: str, teacher: str | None = None) -> list[tuple[float, float | None]]:
    key = f"complexity/{teacher}/{stat}" if teacher else f"complexity/{stat}"
    if run.has(key):
        return run.series(key)
    # Fallback for runs whose trainer logged no complexity keys: per-step means of the tasks' own diagnostics.
    acc: dict[float, list[float]] = defaultdict(list)
    for (step, proposer), d in run.task_diag.items():
        if teacher is None or proposer == teacher:
            acc[step] += d.get(stat, [])
    return [(s, sum(v) / len(v)) for s, v in sorted(acc.items()) if v]


def complexity_teachers(run: RunData) -> list[str]:
    ts: dict[str, None] = {}
    for k in sorted(run.keys()):
        parts = k.split("/")
        if parts[0] == "complexity" and len(parts) == 3:
            ts.setdefault(parts[1], None)
    if not ts:
        for _, p in sorted(run.task_diag):
            ts.setdefault(p, None)
    order = {m: i for i, m in enumerate(member_ids(run))}
    return sorted(ts, key=lambda m: (order.get(m, len(order)), m))
