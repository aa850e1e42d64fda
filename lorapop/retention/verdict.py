"""The registered retention rule applied literally over several parents, the null arms judged by it too, and how far
the design can see (docs/RESULTS.md, "Operator retention from parents that learned: pre-registration").

The registered rule, per operator (over the parents that count; "an operator's verdict holds when it holds for all
of them but at most one", :func:`holds`):

* the premise: the operator *loses* (drop at step 0 beyond the parent's noise floor);
* *for*: an operator that loses is back within the floor of the continuation by step 20 (a recovered step);
* *against*: an operator that loses is "not recovered" by step 20, or, over the operators that lose, most end with
  a final gap beyond the floor.

The registration did not say what holds when both branches are met; :func:`registered_verdict` says whether each
is met and leaves both standing. The same rule is applied to the two arms with no operator: the ``clone`` (an
exact copy, judged against the continuation like every child) and the ``continuation`` (judged against the clone,
the other replicate of the same weights): what the rule says of an operator that does nothing.

Power: the floor is the spread of step-0 scorings (scoring noise); training adds its own. The *training noise* of
a parent is the standard deviation of the step-20 scores of its arms that lost nothing at the operator
(continuation and clone included), leaving out the arms that ended at 0.000 (a collapse in training is its own
finding, not noise around the plateau). With one run per arm, a child's final gap to the continuation then has a
standard deviation of about ``sqrt(2)`` times it, which :func:`power` turns into the losses the rule would flag and
the smallest loss a one-sided test could tell from zero.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

# the two arms with no operator: the parent trained on (the reference every child is judged against) and its exact
# copy; lorapop/retention/study.py names its arms with these
CONTINUATION = "continuation"
CLONE = "clone"
ALPHA, POWER = 0.05, 0.8  # a one-sided test at 5%, detected 4 times out of 5: the usual convention
LOSSES = (0.05, 0.03)  # persisting losses a decisive design should find: the registered-strength drops were 0.022-0.053


def holds(k: int, n: int) -> bool:
    """The registered "all of them but at most one", over the ``n`` parents that have the arm (at least one)."""
    return n >= 1 and k >= max(1, n - 1)


def floor_spread(ret: dict[str, Any]) -> float:
    """The floor a study's arms are judged by: the spread of its noise floor (0 when none was measured)."""
    return float((ret.get("noise_floor") or {}).get("spread") or 0.0)


def gaps(reference: list[float | None], curve: list[float | None]) -> list[float | None]:
    """``reference - curve`` at every step (None where either was not scored)."""
    return [None if r is None or v is None else r - v for r, v in zip(reference, curve)]


def recovered_step(curve: list[float | None], reference: list[float | None], floor: float) -> int | None:
    """First scored step (0 = right after the operator; None: a step not scored) whose gap to the reference (the
    continuation arm's value at the same step) is within ``floor``, else None."""
    for step, (v, ref) in enumerate(zip(curve, reference)):
        if v is not None and ref is not None and ref - v <= floor:
            return step
    return None


def arm_outcome(ret: dict[str, Any], name: str) -> dict[str, Any]:
    """One arm on one parent under the registered rule: drop, lost, recovered step, final gap and whether it is
    beyond the floor. The continuation is judged against the clone, every other arm against the continuation."""
    arms, floor = ret["arms"], floor_spread(ret)
    ref_name = CLONE if name == CONTINUATION else CONTINUATION
    child, ref = arms[name]["heldout"], arms[ref_name]["heldout"]
    gap = gaps(ref, child)
    lost = gap[0] > floor
    return {"against": ref_name, "drop": gap[0], "lost": lost, "recovered_step": recovered_step(child, ref, floor),
            "final_gap": gap[-1], "final_beyond": gap[-1] > floor, "floor": floor}


def arm_names(rets: Sequence[dict[str, Any]]) -> list[str]:
    """Every arm of the parents, in first-seen order, the null arms (clone, continuation) last."""
    names = list(dict.fromkeys(n for r in rets for n in r["arms"] if n not in (CLONE, CONTINUATION)))
    return names + [n for n in (CLONE, CONTINUATION) if all(n in r["arms"] for r in rets) and CLONE in rets[0]["arms"]]


def rule_row(rets: Sequence[dict[str, Any]], name: str) -> dict[str, Any]:
    """The rule over the parents for one arm: counts per predicate and the verdicts they give."""
    outs = {r.get("_name", str(i)): arm_outcome(r, name) for i, r in enumerate(rets) if name in r["arms"]}
    n = len(outs)
    lost = sum(o["lost"] for o in outs.values())
    back = sum(o["recovered_step"] is not None for o in outs.values())
    not_rec = sum(o["lost"] and o["recovered_step"] is None for o in outs.values())
    beyond = sum(o["final_beyond"] for o in outs.values())
    loses = holds(lost, n)
    return {"arm": name, "parents": n, "lost_on": lost, "back_on": back, "not_recovered_on": not_rec,
            "final_beyond_on": beyond, "loses": loses, "for": loses and holds(back, n),
            "against_not_recovered": loses and holds(not_rec, n), "final_beyond": holds(beyond, n),
            "per_parent": outs}


def training_noise(ret: dict[str, Any]) -> dict[str, Any]:
    """The parent's training noise: the standard deviation of the last step's scores of the arms that lost nothing at
    the operator (continuation and clone included) and did not end at 0.000; the same of their mean over the last
    three scored steps (what a design averaging them would see); and how many collapsed."""
    calm, collapsed = [], 0
    for name, a in ret["arms"].items():
        if name != CONTINUATION and arm_outcome(ret, name)["lost"]:
            continue
        if a["heldout"][-1] == 0.0:
            collapsed += 1
            continue
        calm.append([v for v in a["heldout"] if v is not None])
    last = [c[-1] for c in calm]
    tail = [statistics.fmean(c[-3:]) for c in calm]
    return {"n": len(calm), "collapsed": collapsed, "sd_final": statistics.stdev(last) if len(last) > 1 else None,
            "sd_last3": statistics.stdev(tail) if len(tail) > 1 else None}


def _at_least(ps: Sequence[float], k: int) -> float:
    """P(at least ``k`` of independent events with probabilities ``ps``)."""
    dist = [1.0]
    for p in ps:
        dist = [(dist[i] if i < len(dist) else 0.0) * (1 - p) + (dist[i - 1] * p if i >= 1 else 0.0)
                for i in range(len(dist) + 1)]
    return sum(dist[k:])


def power(rets: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What the design could see. Per parent: the floor, the training noise, the share of arms that lost nothing
    at the operator (clone included) yet end beyond the floor (the rule's false alarms, measured), and the smallest
    persisting loss a one-sided test at :data:`ALPHA` tells from zero with :data:`POWER` from one child and one
    continuation. Over the parents: the chance that an arm with no effect meets "final gap beyond the floor on all
    parents but one" (from the measured shares), and the loss at which the rule flags that with :data:`POWER`."""
    z = NormalDist().inv_cdf(1 - ALPHA) + NormalDist().inv_cdf(POWER)
    per, shares, sds, floors = {}, [], [], []
    for i, r in enumerate(rets):
        nulls = [n for n in r["arms"] if n != CONTINUATION and not arm_outcome(r, n)["lost"]]
        beyond = sum(arm_outcome(r, n)["final_beyond"] for n in nulls)
        tn = training_noise(r)
        sd = tn["sd_final"] or 0.0
        per[r.get("_name", str(i))] = {"floor": floor_spread(r), "training_noise": tn, "null_arms": len(nulls),
                                       "null_final_beyond": beyond,
                                       "min_detectable_loss": z * sd * math.sqrt(2) if tn["sd_final"] else None}
        shares.append(beyond / len(nulls) if nulls else 0.0)
        sds.append(sd)
        floors.append(floor_spread(r))
    k = max(1, len(rets) - 1)

    def flags(d: float) -> float:  # the rule's chance of "final gap beyond the floor" on k of the parents
        return _at_least([1 - NormalDist(d, s * math.sqrt(2) or 1e-9).cdf(f) for s, f in zip(sds, floors)], k)

    lo, hi = 0.0, 1.0
    for _ in range(40):
        lo, hi = (lo, (lo + hi) / 2) if flags((lo + hi) / 2) >= POWER else ((lo + hi) / 2, hi)
    total = sum(p["null_arms"] for p in per.values())
    tails = [x["training_noise"]["sd_last3"] for x in per.values() if x["training_noise"]["sd_last3"]]
    return {"per_parent": per, "null_arms": total, "sd_last3_max": max(tails, default=None),
            "replicates": {str(d): replicates_for(max(tails), d) for d in LOSSES} if tails else {},
            "null_final_beyond": sum(p["null_final_beyond"] for p in per.values()),
            "null_meets_final_beyond": _at_least(shares, k), "rule_flags_at_power": hi,
            "alpha": ALPHA, "power": POWER}


def replicates_for(sd: float, loss: float) -> int:
    """Training-seed replicates per arm (and as many of the clone, the null) for a one-sided test at :data:`ALPHA`
    to find a persisting ``loss`` with :data:`POWER`, when one run's score has standard deviation ``sd``."""
    z = NormalDist().inv_cdf(1 - ALPHA) + NormalDist().inv_cdf(POWER)
    return math.ceil(2 * (z * sd / loss) ** 2)


def registered_verdict(rets: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The registered rule over ``rets`` (one finished retention.json per parent that counts): per arm its
    :func:`rule_row`, which operators meet each branch, whether each branch is met, and :func:`power`."""
    rows = [rule_row(rets, n) for n in arm_names(rets)]
    ops = [r for r in rows if r["arm"] not in (CLONE, CONTINUATION)]
    losing = [r for r in ops if r["loses"]]
    beyond = [r["arm"] for r in losing if r["final_beyond"]]
    registered = [r["arm"] for r in ops if "@" not in r["arm"]]
    return {
        "parents": [r.get("_name") for r in rets], "rows": rows,
        "premise": {"lose": [r["arm"] for r in losing],
                    "registered_strength_lose": [r["arm"] for r in losing if r["arm"] in registered]},
        "for": {"operators": [r["arm"] for r in losing if r["for"]],
                "every_losing_operator": bool(losing) and all(r["for"] for r in losing)},
        "against": {"not_recovered": [r["arm"] for r in losing if r["against_not_recovered"]],
                    "final_beyond": beyond, "losing": len(losing),
                    "most_final_beyond": bool(losing) and len(beyond) > len(losing) / 2},
        "null": {r["arm"]: {k: r[k] for k in ("lost_on", "final_beyond_on", "parents", "loses", "final_beyond")}
                 for r in rows if r["arm"] in (CLONE, CONTINUATION)},
        "power": power(rets)}


def branches_met(v: dict[str, Any]) -> tuple[bool, bool]:
    """(for met by some operator that loses, against met by some operator or by most of them)."""
    a = v["against"]
    return bool(v["for"]["operators"]), bool(a["not_recovered"]) or a["most_final_beyond"]


def _f(v: float | None) -> str:
    return "not measurable (fewer than 2 arms)" if v is None else f"{v:.3f}"


def _k(row: dict[str, Any], key: str) -> str:
    return f"{row[key]}/{row['parents']}"


def verdict_lines(v: dict[str, Any]) -> list[str]:
    """The verdict as markdown: the per-arm table under the rule (null arms last), both branches, the power and
    the headline the figures carry."""
    yes = {True: "yes", False: "no"}
    lines = ["| arm | parents | lost on | back within the floor on | not recovered on | final gap beyond the floor on "
             "| loses | for | against (not recovered) | final gap beyond |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in v["rows"]:
        if not (r["lost_on"] or r["arm"] in (CLONE, CONTINUATION)):
            continue
        name = r["arm"] + (" (against the clone)" if r["arm"] == CONTINUATION else "")
        lines.append(f"| {name} | {r['parents']} | {_k(r, 'lost_on')} | {_k(r, 'back_on')} | "
                     f"{_k(r, 'not_recovered_on')} | {_k(r, 'final_beyond_on')} | {yes[r['loses']]} | "
                     f"{yes[r['for']]} | {yes[r['against_not_recovered']]} | {yes[r['final_beyond']]} |")
    f_met, a_met = branches_met(v)
    a, p = v["against"], v["power"]
    null = v["null"].get(CLONE)
    lines += ["", "(arms that lost on no parent and are not null arms are left out: the rule says nothing of them)", "",
              "- premise (an operator loses on all parents but at most one): "
              f"{', '.join(v['premise']['lose']) or 'none'}"
              f"; at the registered strength: {', '.join(v['premise']['registered_strength_lose']) or 'none'}.",
              f"- *for* {'met' if f_met else 'not met'}: back within the floor on all parents but at most one: "
              f"{', '.join(v['for']['operators']) or 'none'} (every operator that loses: "
              f"{yes[v['for']['every_losing_operator']]}).",
              f"- *against* {'met' if a_met else 'not met'}: lose and not recovered: "
              f"{', '.join(a['not_recovered']) or 'none'}; final gap beyond the floor for "
              f"{len(a['final_beyond'])} of the {a['losing']} operators that lose ({', '.join(a['final_beyond'])}): "
              f"{'most' if a['most_final_beyond'] else 'not most'}.",
              f"- both branches met: {yes[f_met and a_met]} (the registration does not say what then holds)."]
    if null:
        lines.append(f"- the clone (no operator) under the same rule: lost on {null['lost_on']}/{null['parents']}, "
                     f"final gap beyond the floor on {null['final_beyond_on']}/{null['parents']}"
                     f" ({'meets' if null['final_beyond'] else 'does not meet'} the test the *against* branch counts).")
    per = p["per_parent"]
    lines.append(f"- power: arms that lost nothing at the operator yet end beyond the floor: {p['null_final_beyond']} "
                 f"of {p['null_arms']}; an operator with no effect meets \"final gap beyond the floor on all parents "
                 f"but one\" with probability {p['null_meets_final_beyond']:.2f}. Training noise (sd of the last "
                 "step's scores of the arms that lost nothing, collapses left out): "
                 + ", ".join(f"{k} {_f(x['training_noise']['sd_final'])}" for k, x in per.items())
                 + f"; the smallest persisting loss one child against one continuation tells from noise "
                 f"(one-sided {p['alpha']:g}, power {p['power']:g}): "
                 + ", ".join(_f(x["min_detectable_loss"]) for x in per.values())
                 + f"; the rule flags a persisting loss on all parents but one with probability {p['power']:g} "
                 f"from {p['rule_flags_at_power']:.3f} on (and no loss at all with the probability above).")
    if p.get("replicates"):
        lines.append(f"- a design that could decide it: with scores averaged over the last three scored steps "
                     f"(sd up to {p['sd_last3_max']:.3f} across arms that lost nothing), "
                     + ", ".join(f"{r} training-seed replicates per arm and of the clone find a persisting loss of "
                                 f"{d}" for d, r in p["replicates"].items())
                     + f" (one-sided {p['alpha']:g}, power {p['power']:g}).")
    return lines


def headline(v: dict[str, Any]) -> str:
    f_met, a_met = branches_met(v)
    null = v["null"].get(CLONE) or {}
    if f_met and a_met and null.get("final_beyond"):
        return ("not shown either way: both branches of the registered rule are met, and the exact clone meets the "
                "test the against branch counts, so at this scale this design cannot tell an operator's loss from "
                "training noise")
    if a_met and not f_met:
        return "the registered rule counts against the claim (only the against branch is met)"
    if f_met and not a_met:
        return "the registered rule counts for the claim (only the for branch is met)"
    return "neither branch of the registered rule is met"
