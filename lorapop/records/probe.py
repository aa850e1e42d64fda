"""Reading ``probe.jsonl`` back (lorapop/criteria.py, the report, bench scripts): the rows that count in the
aggregate, the step-0 noise floor and its one-line description, each step's mean score. The probe that writes the
rows is lorapop/train/probe.py."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def score_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The (member, task) rows that count in the aggregate: not the noise-floor row, not a child too young."""
    return [r for r in rows if "member" in r and "score" in r and r.get("counted", True) is not False]


def read_noise_floor(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The noise floor a run measured at step 0, or None (a run from before it was recorded)."""
    return next((r["noise_floor"] for r in rows if isinstance(r.get("noise_floor"), dict)), None)


def describe_noise_floor(nf: dict[str, Any] | None) -> str:
    """One line to print beside a probe figure."""
    if not nf:
        return "noise floor: not recorded (probe.jsonl from before it was measured)"
    if nf.get("spread") is None:
        return f"noise floor: not measurable ({nf.get('n', 0)} replicate at step 0)"
    ids = {r["member"] for r in nf["replicates"]}
    if len(ids) == 1:
        what = f"{ids.pop()} scored {nf['n']} times, different seeds"
    else:
        what = f"{nf['n']} {'identical members' if nf.get('identical') else 'members from different adapters'}"
    return (f"noise floor (step 0, {what}): scores "
            + ", ".join(f"{s['score']:.3f}" for s in nf["replicates"])
            + f"; spread {nf['spread']:.3f}, std {nf['std']:.3f}")


def step_means(rows: Sequence[dict[str, Any]], roles: Sequence[str] = ("student", "agent")) -> list[tuple[int, float]]:
    """(step, mean score) over the counted rows of ``roles``: each probe figure's curve."""
    by_step: dict[int, list[float]] = {}
    for r in score_rows(rows):
        if r.get("role") in roles:
            by_step.setdefault(int(r["step"]), []).append(float(r["score"]))
    return sorted((s, statistics.fmean(v)) for s, v in by_step.items())
