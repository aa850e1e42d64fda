"""The arms of a retention study (study.py plans it): trained and scored on one engine, ``group_size`` at a time,
each group written when it completes; :func:`run_retention` runs the whole study."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from lorapop.retention.study import (ANSWERS, TRAINING, RetentionConfig, Spec, Study, arm_specs, plan_study,
                                     resume_output, stronger_arm, study_engine, summarise)
from lorapop.retention.verdict import CONTINUATION


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


class Arms:
    """The arms trained and scored on one engine, ``group_size`` at a time; each group's answers and retention.json
    are written when it completes, so a killed study runs again only the groups it had not finished."""

    def __init__(self, study: Study, cfg: RetentionConfig, out: dict[str, Any], engine: Any, executor: Any,
                 log: Any, t0: float) -> None:
        from lorapop.train.stages import sampling_params

        self.study, self.cfg, self.out, self.engine, self.executor, self.log = study, cfg, out, engine, executor, log
        self.t0 = t0  # since when out["seconds"] has not counted
        self.params = sampling_params(study.solve)
        self.scored = set(study.settings["eval_steps"])
        self.samples: dict[str, list[dict[str, Any]]] = {}  # the group's raw answers per arm
        self.w_parent: Any = None
        self.w_second: Any = None

    def load_parents(self) -> None:
        s = self.study
        self.engine.load_adapter(0, s.parent.adapter_dir)
        self.w_parent = self.engine.get_adapter(0)
        if s.second is not None:
            self.engine.load_adapter(1, s.second[1])
            self.w_second = self.engine.get_adapter(1)
        self.log(f"retention: parent {s.parent.id} ({s.trained} self-play steps, expose {s.p_fit:.2f}), second "
                 f"parent {s.second[0] if s.second else None}")

    def score(self, m: Any, step: int, salt: str = "") -> list[float]:
        import random

        from lorapop.train.probe import run_probe

        s = self.study
        rng = random.Random(f"{s.loop.seed}:{m.id}{salt}:{step}:retention-probe")  # own seeds per arm: replicates
        rows = run_probe(self.engine, self.executor, [m], step, self.params, self.cfg.answers, s.prefill, rng,
                         per_level=s.per_level, style=s.style, answers=True)
        self.samples.setdefault(m.id, []).extend(
            {"arm": m.id, "step": step, "scoring": salt or "arm", "task": r["task"], "score": r["score"],
             "answers": r["answers"], "statuses": r["statuses"]} for r in rows)
        return [r["score"] for r in rows]

    def start_group(self, group: list[Spec]) -> list[Any]:
        """Each arm's child (the operator applied to the parents) in its slot, fresh optimizer state."""
        import zlib

        import torch

        from lorapop.evolve.operators import OPERATORS, make_child
        from lorapop.records.members import Member
        from lorapop.train.student import set_lr

        s, members = self.study, []
        for slot, (name, op, over) in enumerate(group):
            if op == CONTINUATION:
                child, record = self.w_parent, {"operator": CONTINUATION}
            else:
                cross = OPERATORS[op].kind == "crossover"
                gen = torch.Generator().manual_seed(zlib.crc32(f"{s.loop.seed}:{name}".encode()))
                fitness = [s.p_fit, s.second[2]] if cross else [s.p_fit]  # type: ignore[index]
                child, record = make_child(op, [self.w_parent, self.w_second] if cross else [self.w_parent],
                                           generator=gen, scaling=self.engine.scaling, params=over,
                                           fitness=fitness if OPERATORS[op].needs_fitness else None)
            self.engine.set_adapter(slot, child)
            self.engine.reset_optimizer(slot)  # a PBT child starts with fresh optimizer state
            set_lr(self.engine, slot, s.loop.lr)
            members.append(Member(name, slot, "student"))
            self.out["arms"][name] = {"record": record, "train_reward": [], "heldout": [], "step_s": []}
        return members

    def score_step0(self, members: list[Any]) -> None:
        """Every arm right after its operator; the continuation's extra replicates give the noise floor."""
        out, t = self.out, time.perf_counter()
        for m in members:
            tasks0 = self.score(m, 0)
            out["arms"][m.id].update(step0_tasks=tasks0, heldout=[statistics.fmean(tasks0)])
            if m.id == CONTINUATION and "parent_replicates" not in out:
                out["parent_replicates"] = [self.score(m, 0, f"#replicate{i + 1}")
                                            for i in range(self.cfg.floor_replicates)]
        out.setdefault("timing", []).append({"arms": len(members), "step0_score_s": round(time.perf_counter() - t, 1)})

    def train_group(self, members: list[Any]) -> None:
        """``cfg.steps`` student-loop steps on every arm at once, scored after the steps in ``eval_steps``."""
        from lorapop.train.student import train_step

        s, out = self.study, self.out
        for step in range(self.cfg.steps):
            t = time.perf_counter()
            row = train_step(self.engine, self.executor, members, s.train, step, s.loop)
            for m in members:
                arm = out["arms"][m.id]
                arm["train_reward"].append(row[m.id]["reward"])
                arm["heldout"].append(statistics.fmean(self.score(m, step + 1)) if step + 1 in self.scored else None)
            for m in members:  # the step's wall clock (training and scoring) per arm of the group
                out["arms"][m.id]["step_s"].append(round((time.perf_counter() - t) / len(members), 1))
            self.log(f"retention: step {step + 1}/{self.cfg.steps} ({time.perf_counter() - t:.0f} s) " + "  ".join(
                f"{m.id} {_fmt(out['arms'][m.id]['heldout'][-1])}" for m in members))

    def write_group(self, members: list[Any]) -> None:
        """The raw samples first: a group killed before retention.json names it runs again and rewrites them."""
        from lorapop.records.rundir import write_json_atomic, write_text_atomic

        out_dir = self.study.out_dir
        (out_dir / ANSWERS).mkdir(parents=True, exist_ok=True)
        for m in members:
            write_text_atomic(out_dir / ANSWERS / f"{m.id}.jsonl",
                              "".join(json.dumps(r) + "\n" for r in self.samples.pop(m.id, [])))
        write_json_atomic(self.study.out_path, self.out)

    def run(self, todo: list[Spec]) -> None:
        size = max(2, self.cfg.group_size)
        for g in range(0, len(todo), size):
            members = self.start_group(todo[g:g + size])
            self.score_step0(members)
            self.train_group(members)
            self.out["seconds"] = round(self.out["seconds"] + time.perf_counter() - self.t0, 1)
            self.write_group(members)
            self.t0 = time.perf_counter()

    def run_stronger_auto(self) -> None:
        """``--stronger-ops auto``: a stronger arm for each operator whose step-0 drop is within the noise floor."""
        from lorapop.evolve.config import STRENGTH_KNOBS, scaled_params

        out, factor = self.out, self.cfg.stronger
        floor = (out["noise_floor"] or {}).get("spread") or 0.0
        weak = [o for o in self.study.ops if o in STRENGTH_KNOBS and out["arms"][o]["drop"] <= floor]
        out["stronger_auto"] = {"floor": floor, "operators": weak, "factor": factor}
        self.log(f"retention: within the noise floor ({floor:.3f}) at step 0: {weak}; stronger arms x{factor:g}")
        extra = [(stronger_arm(o, factor), o, scaled_params(o, factor)) for o in weak]
        self.run([s for s in extra if s[0] not in out["arms"]])


def run_retention(run_dir: str | Path, cfg: RetentionConfig, loop_overrides: dict[str, Any] | None = None, *,
                  log=print) -> dict[str, Any]:
    """The study (Appendix J) on ``run_dir``'s last checkpoint: every arm trained and scored, retention.json
    written (and returned, with its ``path``)."""
    from lorapop.eval.harness import make_executor
    from lorapop.records.rundir import write_json_atomic

    t0 = time.perf_counter()
    study = plan_study(run_dir, cfg, loop_overrides, log)
    out = resume_output(study, cfg)
    done = set(out["arms"])
    n_answers = len(study.held) * cfg.answers
    log(f"retention: arms trained with the {TRAINING}")
    log(f"retention: scored on the run's probe family ({study.style}): {len(study.held)} tasks x {cfg.answers} "
        f"answers, resolution 1/{n_answers} = {1.0 / n_answers:.4f}; {len(study.train)} training tasks"
        + (f"; {len(done)} arm(s) already in {study.out_path}" if done else ""))
    specs = arm_specs(study.ops, cfg)
    engine = study_engine(study, cfg)
    executor = make_executor()
    arms = Arms(study, cfg, out, engine, executor, log, t0)
    try:
        arms.load_parents()
        study.out_dir.mkdir(parents=True, exist_ok=True)
        arms.run([s for s in specs if s[0] not in done])
        summarise(out)
        if cfg.stronger and cfg.stronger_ops == ["auto"]:
            arms.run_stronger_auto()
    finally:
        executor.close()
        engine.close()
    order = [n for n, _, _ in specs] + sorted(n for n in out["arms"] if "@" in n)  # the stronger arms last
    out["arms"] = {n: out["arms"][n] for n in dict.fromkeys(order) if n in out["arms"]}
    summarise(out)
    write_json_atomic(study.out_path, out)
    out["path"] = str(study.out_path)
    return out
