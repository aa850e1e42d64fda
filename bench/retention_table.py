"""The retention table and figure from `lorapop retention` outputs: one retention.json per parent.

    .venv/bin/python bench/retention_table.py docs/results/retention49/seed0-single docs/results/retention49/... \
        [--svg docs/results/retention49/retention.svg]

Per parent and arm, as registered (docs/RESULTS.md, "Operator retention from parents that learned:
pre-registration"): the score right after the operator (step 0), the drop (continuation - child at step 0) and
whether it is beyond the noise floor (lost), the first scored step at which the child is back within the floor of the
continuation at the same step ("not recovered" when never within the 20 steps), and the final gap; the stronger
(@3x) arms last. Then the compute used (the files' ``seconds`` and ``timing``). The figure: per parent, each arm's
gap to the continuation over the steps after the operator, the noise band (+- the floor) shaded. A parent whose
file is not finished (an arm with fewer scores than steps + 1, or no summary) is reported as such, never filled in.
Then, over the finished parents: the probe's trivial yardsticks (lorapop/train/yardsticks.py), the registered rule
applied literally with the clone and the continuation judged by it (lorapop/retention/verdict.py), both
branches, the design's power and the headline; the figure also draws, per parent, the scores beside those yardsticks
(dashed). The last line is JSON: per parent, the arms lost, recovered and not recovered; the verdict; the yardsticks.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lorapop.retention.study import stronger_arm  # noqa: E402
from lorapop.retention.verdict import CLONE, CONTINUATION, headline, registered_verdict, verdict_lines  # noqa: E402
from lorapop.report.svg import PALETTE, Series, figure_svg, plot_svg, yardstick_series  # noqa: E402


def load(path: Path) -> dict:
    f = path / "retention.json" if path.is_dir() else path
    out = json.loads(f.read_text(encoding="utf-8"))
    out["_name"] = path.name if path.is_dir() else path.parent.name
    return out


def finished(ret: dict) -> bool:
    """Every arm scored to the last step and given its verdict, and every stronger arm the run chose is there: a
    file saved between two groups of stronger arms has the first group's scores but neither the others nor
    their verdicts (`lorapop retention` writes the verdicts when the last group ends)."""
    arms = ret.get("arms") or {}
    auto = ret.get("stronger_auto") or {}
    wanted = {stronger_arm(o, auto["factor"]) for o in auto.get("operators", [])} if auto else set()
    return (bool(arms) and "noise_floor" in ret and wanted <= set(arms)
            and all(len(a.get("heldout") or []) == ret["steps"] + 1 and "drop" in a for a in arms.values()))


def fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def table(ret: dict) -> list[str]:
    floor = (ret.get("noise_floor") or {}).get("spread")
    arms = ret["arms"]
    lines = [f"**{ret['_name']}**: parent {ret.get('parent')} ({ret.get('parent_selfplay_steps')} self-play steps), "
             f"second parent {ret.get('second_parent')}; noise floor (spread of "
             f"{2 + len(ret.get('parent_replicates') or [])} step-0 replicates) {fmt(floor)}; continuation "
             f"{fmt(arms[CONTINUATION]['heldout'][0])} at step 0, {fmt(arms[CONTINUATION]['heldout'][-1])} at step "
             f"{ret['steps']}.", "",
             "| arm | after operator | drop | lost | recovered at step | final gap |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, a in arms.items():
        if name == CONTINUATION:
            continue
        rec = a.get("recovered_step")
        lines.append(f"| {name} | {fmt(a['heldout'][0])} | {fmt(a.get('drop'))} | "
                     f"{'yes' if a.get('lost') else 'no'} | "
                     f"{rec if rec is not None else 'not recovered'} | {fmt(a.get('final_gap'))} |")
    return lines


def rule_shares(path: Path, ret: dict) -> dict[str, dict[str, float]]:
    """Per arm with saved replies (``answers/<arm>.jsonl``), the share of its own answers at the last step that are
    a trivial strategy's answer (lorapop/train/yardsticks.py: the list's first element...), parsed as code_o parses
    them and compared as text: which fixed rule an arm on a plateau is answering by."""
    from lorapop.tasks import TASK_TYPES
    from lorapop.tasks.base import Answer
    from lorapop.tasks.styles import proposal_style
    from lorapop.train.probe import PROBE_SEED
    from lorapop.train.yardsticks import POSITIONAL, strategy_answers

    pairs = proposal_style(ret["probe"]["style"]).probe_tasks(int(ret["probe"]["per_level"]), PROBE_SEED)
    rules, _ = strategy_answers([t for _, t in pairs])
    index = {f"L{level}:{k}": k for k, (level, _) in enumerate(pairs)}
    out = {}
    for name in ret["arms"]:
        f = path / "answers" / f"{name}.jsonl"
        if not f.is_file():
            continue
        hits, n = dict.fromkeys(POSITIONAL, 0), 0
        for line in f.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row["step"] != ret["steps"] or row["scoring"] != "arm":
                continue
            for reply in row["answers"]:
                a = TASK_TYPES["code_o"].parse_answer(reply)
                n += 1
                for rule in POSITIONAL:
                    hits[rule] += isinstance(a, Answer) and a.text.strip() == rules[rule][index[row["task"]]]
        if n:
            out[name] = {rule: h / n for rule, h in hits.items()}
    return out


def figure(rets: list[dict], ys: dict | None = None) -> str:
    """Per parent, two plots: each child's gap to the continuation with the noise band, and the scores themselves
    (continuation, clone and the children that lost beyond the floor) beside the probe's trivial yardsticks
    (``ys``, dashed grey: always answering the list's last or first element...)."""
    plots, legend = [], {}
    for ret in rets:
        scores = [Series(n, [(float(k), v) for k, v in enumerate(a["heldout"]) if v is not None],
                         color="#000000" if n == CONTINUATION else "#888888" if n == CLONE else
                         PALETTE[i % len(PALETTE)], dash="4 2" if "@" in n else "")
                  for i, (n, a) in enumerate(ret["arms"].items()) if n in (CONTINUATION, CLONE) or a.get("lost")]
        marks = yardstick_series(ys, 0.0, float(ret["steps"]))
        for s in scores + marks:
            legend.setdefault(s.label, s)
        plots.append((f"{ret['_name']}: scores", plot_svg(
            scores + marks, f"{ret['_name']}: probe score (continuation, clone, children that lost)",
            xlabel="steps after the operator", ylabel="probe score", y_range=(0.0, 0.6))))
        floor = (ret.get("noise_floor") or {}).get("spread") or 0.0
        steps = ret["steps"]
        series = [Series(f"noise floor +-{floor:.3f}", [(0.0, 0.0), (float(steps), 0.0)], color="#000000",
                         dash="6 3", band=[(0.0, -floor, floor), (float(steps), -floor, floor)])]
        for i, (name, a) in enumerate(a for a in ret["arms"].items() if a[0] != CONTINUATION):
            # unscored steps (--eval-every) are left out, not drawn as breaks: the line joins the scored ones
            s = Series(name, [(float(k), g) for k, g in enumerate(a.get("gap") or []) if g is not None],
                       color=PALETTE[i % len(PALETTE)], dash="4 2" if "@" in name else "")
            series.append(s)
            legend.setdefault(s.label, s)
        plots.append((f"{ret['_name']}: continuation - child", plot_svg(
            series, f"{ret['_name']}", xlabel="steps after the operator", ylabel="gap to the continuation")))
    return figure_svg(plots, cols=2, legend=list(legend.values()),
                      title="Operator retention: probe scores beside the trivial yardsticks (dashed grey), and each "
                            "child's gap to the continuation (shaded: the noise floor)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("--svg", type=Path, help="write the figure here")
    args = ap.parse_args(argv)
    rets = [load(p) for p in args.paths]
    summary = {}
    done = []
    for path, ret in zip(args.paths, rets):
        if not finished(ret):
            n = sum(len(a.get("heldout") or []) == ret["steps"] + 1 for a in (ret.get("arms") or {}).values())
            print(f"**{ret['_name']}**: not finished ({n} arms scored to step {ret['steps']}); left out.\n")
            summary[ret["_name"]] = "not finished"
            continue
        done.append(ret)
        print("\n".join(table(ret)) + "\n")
        shares = rule_shares(path, ret)
        if shares:
            print(f"Answers at step {ret['steps']} that are a fixed rule's (the arms with saved replies; score at "
                  f"step {ret['steps']}): " + "; ".join(
                      f"{n} ({fmt(ret['arms'][n]['heldout'][-1])}): " + ", ".join(
                          f"{r} {v:.3f}" for r, v in sh.items() if v >= 0.05) for n, sh in shares.items()) + "\n")
        arms = {n: a for n, a in ret["arms"].items() if n != CONTINUATION}
        summary[ret["_name"]] = {
            "floor": (ret.get("noise_floor") or {}).get("spread"),
            "lost": sorted(n for n, a in arms.items() if a.get("lost")),
            "lost_recovered": sorted(n for n, a in arms.items() if a.get("lost") and a.get("recovered_step")
                                     is not None),
            "lost_not_recovered": sorted(n for n, a in arms.items() if a.get("lost") and a.get("recovered_step")
                                         is None),
            "seconds": ret.get("seconds"),
        }
    ys = None
    if done:
        from lorapop.train.yardsticks import describe, probe_yardsticks

        probe = done[0]["probe"]
        ys = probe_yardsticks(probe["style"], int(probe["per_level"]))
        print(describe(ys, f"of the {probe['style']} probe") + "; the parents at step 0 (continuation): "
              + ", ".join(f"{r['_name']} {r['arms'][CONTINUATION]['heldout'][0]:.3f}" for r in done) + "\n")
        v = registered_verdict(done)
        print("**The registered rule over these parents** (an operator's verdict holds on all parents but at most "
              "one):\n")
        print("\n".join(verdict_lines(v)))
        print(f"\n**Headline**: {headline(v)}.\n")
        summary["verdict"] = {"headline": headline(v), "premise": v["premise"], "for": v["for"],
                              "against": v["against"], "null": v["null"],
                              "power": {k: v["power"][k] for k in ("null_arms", "null_final_beyond", "replicates",
                                                                  "sd_last3_max", "null_meets_final_beyond",
                                                                  "rule_flags_at_power")}
                              | {"per_parent": {k: {"training_noise": x["training_noise"]["sd_final"],
                                                    "min_detectable_loss": x["min_detectable_loss"]}
                                                for k, x in v["power"]["per_parent"].items()}}}
        summary["yardsticks"] = {k: x["score"] for k, x in ys["strategies"].items()}
    for ret in done:
        t = ret.get("timing") or []
        print(f"{ret['_name']}: {ret.get('seconds', 0) / 3600:.2f} h of one thread in {len(t)} groups "
              f"(step-0 scorings {sum(x.get('step0_score_s', 0) for x in t) / 60:.0f} min)")
    if args.svg and done:
        args.svg.write_text(figure(done, ys), encoding="utf-8")
        print(f"figure: {args.svg}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
