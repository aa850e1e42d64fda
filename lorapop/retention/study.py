"""`lorapop retention RUN_DIR`: how fast does a PBT child get back to where its parent would have been (the paper's
Appendix J protocol)?

From a parent trained in self-play (a member of the run's latest checkpoint, at least ``min_parent_steps`` = 20
self-play steps in by default; by default the student, or single mode's agent, with the best TrueSkill expose
``mu - 3 sigma``) one child is made per operator through :func:`lorapop.evolve.operators.make_child`, plus a
``continuation`` arm: the parent itself, trained on. Crossovers take a second parent: the second-best member of the
same role, or ``--second-parent`` (any adapter source, e.g. ``RUN_DIR:best`` of another seed's run, for runs with one
student). ``clone`` (an exact copy) is one of the operators. ``--stronger K`` adds, for operators with a strength knob
(:data:`lorapop.evolve.config.STRENGTH_KNOBS`), an arm ``<op>@Kx`` with the knob turned up K times: for the operators
named, or (``auto``) for those whose child did not move the score beyond the noise floor right after the operator.

Every arm is trained for ``steps`` steps with the student loop of :mod:`lorapop.train.student` (TRR++, ``lr``; the
run's ``engine.lr`` by default) on training tasks of the run's probe family (the probe's shapes drawn with another
seed, none a held-out task): every arm sees the same tasks with the same training seeds, so a child's gap to the
continuation is the operator's doing, not a different draw of teachers and tasks.

The held-out score is the run's own capability probe (:func:`lorapop.train.probe.run_probe`: its 90 tasks at the
run's ``probe_per_level``, the run's ``selfplay.solve`` sampling and prefill), ``answers`` (``K``) answers per task,
after the operator (step 0) and after every step; an arm's score is the mean over tasks of the share answered right.
``eval_every`` > 1 scores only after steps 0, 1, 2, every ``eval_every``-th and the last (the others are ``null``):
a scoring costs more than a training step. Each arm is scored with its own sampling seeds, so two arms with the same weights (the continuation and the clone)
are two replicates of one scoring: the *noise floor* is the probe's (:func:`lorapop.train.probe.noise_floor`),
the spread (max - min) of the step-0 scores of the continuation, the clone and ``floor_replicates`` further
scorings of the parent, each with its own seeds. A child *lost* skill right after the operator when
``drop = continuation - child`` at step 0 exceeds the floor; it has *recovered* at the first step whose gap to the
continuation *at the same step* (not the parent's score before the operator: the parent keeps learning) is within
the floor again; never within the budget is "not recovered" (``null``). ``final_gap`` is the gap at the last step.

Resumable: ``retention.json`` (in ``--out``, the run directory by default) is rewritten after every group of arms;
run again with the same arguments, finished arms are kept and the others trained (a changed setting is refused).
The raw samples: ``answers/<arm>.jsonl`` beside it, one row per scoring of a probe task (arm, step, scoring: the
arm's own or a ``#replicate``, task, score, the replies and their checker statuses), written with the group.
``lorapop report`` renders the file of a run directory. After the arms, ``lorapop retention`` prints the registered
rule applied to this parent (lorapop/retention/verdict.py), with the clone and the continuation (against the
clone) judged by it like every operator, the parent's training noise and the losses one run per arm can see.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lorapop.configlib import check_fields, doc
from lorapop.records.rundir import RETENTION
from lorapop.retention.verdict import CLONE, CONTINUATION, floor_spread, gaps, recovered_step

ANSWERS = "answers"  # beside retention.json: the raw samples of every scoring, one file per arm


def stronger_arm(op: str, factor: float) -> str:
    """The arm name of ``op`` with its strength knob times ``factor`` (``svd_structured@3x``)."""
    return f"{op}@{factor:g}x"


@dataclass
class RetentionConfig:
    operators: list[str] = doc([], "operators to test (default: every registered one, clone included)")
    member: str | None = doc(None, "parent member id (default: the student with the best TrueSkill expose)")
    second_parent: str | None = doc(None, "crossovers' second parent, an adapter source (PEFT directory, RUN_DIR:best, "
                                          "RUN_DIR:<id>); default: the second-best member of the parent's role")
    steps: int = doc(20, "training steps per arm after the operator (the paper's window is about 20)", ge=1)
    answers: int = doc(4, "answers per probe task in every scoring (the score's resolution is 1 / (tasks x answers))",
                       ge=1)
    eval_every: int = doc(1, "score the arms after every this many steps (and always after steps 0, 1, 2 and the "
                              "last): scoring costs more than a step", ge=1)
    floor_replicates: int = doc(4, "extra scorings of the parent at step 0, beside the continuation and the clone, "
                                   "for the noise floor", ge=0)
    stronger: float = doc(0.0, "strength factor of the stronger arms (0: none)", ge=0)
    stronger_ops: list[str] = doc(["auto"], "operators that get a stronger arm: names, or auto (those whose drop at "
                                            "step 0 is within the noise floor)")
    probe_per_level: int | None = doc(None, "probe tasks per level (default: the run's run.probe_per_level); fewer "
                                            "for a quick check only", ge=1)
    n_train_per_level: int = doc(30, "training tasks per probe level (drawn from the probe's shapes with another seed)",
                                 ge=1)
    group_size: int = doc(4, "arms trained together in one engine (slots = group_size)")
    min_parent_steps: int = doc(20, "refuse a checkpoint fewer self-play steps in than this: the protocol starts "
                                    "from a parent trained in self-play", ge=0)
    backend: str = doc("torch", "what generates the arms' answers: torch or vllm (engine.backend)",
                       choices=("torch", "vllm"))
    out: str | None = doc(None, "directory of retention.json (default: the run directory)")

    def validate(self) -> None:
        check_fields(self, "retention")


def eval_steps(steps: int, every: int) -> list[int]:
    """Steps after which the arms are scored: 0 (right after the operator), 1, 2, every ``every``-th, the last."""
    return sorted({0, min(1, steps), min(2, steps), steps, *range(0, steps + 1, every)})


TRAINING = ("student loop (lorapop/train/student.py: answers to code_o tasks of the run's probe family, not the "
            "probe's own, TRR++), not self-play: every arm sees the same tasks and seeds, so a child's gap to the "
            "continuation is the operator's")


def rank_members(run_dir: Path, ckpt: Path, role: str) -> list[tuple[Any, float]]:
    """Members of ``role`` in the checkpoint (an ``agent`` counts as a student), best expose first."""
    from lorapop.records import RunDirError
    from lorapop.records.rundir import POPULATION, RunDir, read_json

    rd = RunDir(run_dir)
    try:  # the checkpoint's own ratings; else population.json's (written every step); else the prior's
        ratings = {k: float(mu) - 3 * float(sigma)
                   for k, (mu, sigma) in (rd.read_trainer_state(ckpt).get("ratings") or {}).items()}
    except (RunDirError, TypeError, ValueError):
        pop = read_json(rd.file(POPULATION), []) or {}
        ratings = {str(m.get("id")): float(m["expose"]) for m in pop.get("members") or []
                   if isinstance(m, dict) and isinstance(m.get("expose"), (int, float))}
    members = [m for m in rd.checkpoint_members(ckpt) if m.role == role or (role == "student" and m.role == "agent")]

    def expose(mid: str) -> float:
        return ratings.get(mid, 0.0)  # the TrueSkill prior's expose: 25 - 3 * 25/3

    return sorted(((m, expose(m.id)) for m in members), key=lambda x: (-x[1], x[0].id))


def parent_steps(rd: Any, ckpt: Path) -> int:
    """Self-play steps behind the checkpoint (its trainer state's ``step``, else its directory's number)."""
    from lorapop.records import RunDirError
    from lorapop.records.rundir import checkpoint_step

    try:
        return int(rd.read_trainer_state(ckpt).get("step"))
    except (RunDirError, TypeError, ValueError):
        return checkpoint_step(ckpt)


def family_tasks(style: str, per_level: int, train_per_level: int, seed: int) -> tuple[list[Any], list[Any]]:
    """(held-out, training) code_o tasks of ``style``'s probe family: the run's probe tasks (``per_level`` per level,
    the probe's seed), and the same shapes drawn with another seed, less any (program, input) held out."""
    from lorapop.tasks.styles import proposal_style
    from lorapop.train.probe import PROBE_SEED

    family = proposal_style(style)
    held = [t for _, t in family.probe_tasks(per_level, PROBE_SEED)]
    seen = {(t.program, tuple(t.inputs)) for t in held}
    train = [t for _, t in family.probe_tasks(train_per_level, PROBE_SEED + 1 + seed)
             if (t.program, tuple(t.inputs)) not in seen]
    return held, train


def replicate_floor(out: dict[str, Any]) -> dict[str, Any] | None:
    """The noise floor (:func:`lorapop.train.probe.noise_floor`) of the step-0 replicates in ``out``: the
    continuation, the clone and the parent's extra scorings, per task."""
    from lorapop.train.probe import noise_floor

    reps = [(name, out["arms"][name]["step0_tasks"]) for name in (CONTINUATION, CLONE)
            if name in out["arms"] and out["arms"][name].get("step0_tasks")]
    reps += [(f"parent#{i + 1}", r) for i, r in enumerate(out.get("parent_replicates") or [])]
    if len(reps) < 2:
        return None
    return noise_floor([(n, [{"score": x} for x in r]) for n, r in reps], True, out["probe"]["answers"])["noise_floor"]


def summarise(out: dict[str, Any]) -> None:
    """Per arm, against the continuation at the same step and the noise floor: gap, drop, lost, recovered step."""
    out["noise_floor"] = replicate_floor(out)
    floor = floor_spread(out)
    ref = out["arms"][CONTINUATION]["heldout"]
    for name, arm in out["arms"].items():
        arm["gap"] = gaps(ref, arm["heldout"])
        arm["drop"], arm["final_gap"] = arm["gap"][0], arm["gap"][-1]
        arm["lost"] = None if name == CONTINUATION else arm["drop"] > floor
        arm["recovered_step"] = None if name == CONTINUATION else recovered_step(arm["heldout"], ref, floor)
    if CLONE in out["arms"]:  # the floor along the way: two replicates of the same weights at every step
        out["clone_gap"] = out["arms"][CLONE]["gap"]


@dataclass
class Study:
    """One retention study as read from the run: its parents, the probe family the arms are scored on, the student
    loop that trains them, and where retention.json goes."""
    rd: Any  # RunDir
    ckpt: Path
    trained: int  # self-play steps behind the parent
    parent: Any  # Member
    p_fit: float
    second: tuple[str, Path, float] | None  # (label, adapter dir, expose) of the crossovers' second parent
    ops: list[str]
    run_cfg: dict[str, Any]
    style: str
    solve: Any  # SamplingConfig
    prefill: str
    per_level: int
    loop: Any  # StudentLoopConfig
    held: list[Any]
    train: list[Any]
    settings: dict[str, Any]
    out_dir: Path

    @property
    def out_path(self) -> Path:
        return self.out_dir / RETENTION


def check_operators(cfg: RetentionConfig) -> list[str]:
    """The operators to test; unknown names and stronger arms without a strength knob are refused."""
    from lorapop.evolve.config import STRENGTH_KNOBS
    from lorapop.evolve.operators import OPERATORS

    ops = list(cfg.operators or OPERATORS)
    unknown = [o for o in ops + [o for o in cfg.stronger_ops if o != "auto"] if o not in OPERATORS]
    if unknown:
        raise ValueError(f"unknown operator(s) {unknown}; known: {', '.join(OPERATORS)}")
    knobless = [o for o in cfg.stronger_ops if o != "auto" and o not in STRENGTH_KNOBS]
    if cfg.stronger and knobless:
        raise ValueError(f"--stronger-ops {knobless}: no strength knob; these have one: {', '.join(STRENGTH_KNOBS)}")
    return ops


def pick_parents(rd: Any, ckpt: Path, cfg: RetentionConfig, ops: list[str], log: Any
                 ) -> tuple[Any, float, tuple[str, Path, float] | None, list[str]]:
    """(parent, its expose, the second parent or None, the operators left): the best student (or ``cfg.member``),
    the second parent from ``--second-parent`` or the next of its role; crossovers dropped when there is none."""
    from lorapop.evolve.operators import OPERATORS

    ranked = rank_members(rd.path, ckpt, "student")
    if cfg.member is not None:
        chosen = [x for x in ranked if x[0].id == cfg.member]
        if not chosen:
            raise ValueError(f"member {cfg.member!r} is not a student of {ckpt} ({[m.id for m, _ in ranked]})")
        ranked = chosen + [x for x in ranked if x[0].id != cfg.member and x[0].role == chosen[0][0].role]
    if not ranked:
        raise ValueError(f"{ckpt}: no student or agent member to take as the parent")
    (parent, p_fit) = ranked[0]
    second: tuple[str, Path, float] | None = None
    if cfg.second_parent is not None:
        from lorapop.adapters import resolve_source

        src = resolve_source(cfg.second_parent)
        rating = src.picked.rating if src.picked is not None else None
        second = (src.label, src.dir, rating.expose if rating is not None else 0.0)
    elif len(ranked) > 1:
        second = (ranked[1][0].id, ranked[1][0].adapter_dir, ranked[1][1])
    if second is None and any(OPERATORS[o].kind == "crossover" for o in ops):
        log(f"retention: only one {parent.role} in {ckpt.name} and no --second-parent; skipping crossovers")
        ops = [o for o in ops if OPERATORS[o].kind != "crossover"]
    return parent, p_fit, second, ops


def plan_study(run_dir: str | Path, cfg: RetentionConfig, loop_overrides: dict[str, Any] | None, log: Any) -> Study:
    """The study a run's last checkpoint allows: refused when the parent has too few self-play steps; the probe,
    sampling and learning rate are the run's own."""
    from lorapop.config import SamplingConfig
    from lorapop.records.rundir import RunDir
    from lorapop.tasks import TASK_TYPES
    from lorapop.tasks.styles import proposal_style
    from lorapop.train.student import StudentLoopConfig

    cfg.validate()
    ops = check_operators(cfg)
    rd = RunDir(run_dir)
    ckpt = rd.find_checkpoint()
    trained = parent_steps(rd, ckpt)
    if trained < cfg.min_parent_steps:
        raise ValueError(f"{ckpt}: the parent has {trained} self-play step(s); the protocol (Appendix J) starts from "
                         f"a parent trained in self-play, at least {cfg.min_parent_steps} steps: train the run longer "
                         f"(lorapop train --resume {rd.path} --run.steps={cfg.min_parent_steps}) or lower "
                         "--min-parent-steps")
    parent, p_fit, second, ops = pick_parents(rd, ckpt, cfg, ops, log)
    run_cfg = rd.read_config()
    sp, rcfg = run_cfg.get("selfplay") or {}, run_cfg.get("run") or {}
    style = str(sp.get("proposal_style", "azr"))
    solve = SamplingConfig(**{k: v for k, v in (sp.get("solve") or {}).items()
                              if k in SamplingConfig.__dataclass_fields__})
    prefill = proposal_style(style).answer_prefill(TASK_TYPES["code_o"]) if sp.get("response_prefill") else ""
    per_level = cfg.probe_per_level or int(rcfg.get("probe_per_level") or 30)
    loop = StudentLoopConfig(**{"lr": float((run_cfg.get("engine") or {}).get("lr", 1e-3)),
                                "temperature": solve.temperature, "eval_temperature": solve.temperature,
                                "max_new_tokens": solve.max_new_tokens,
                                "response_prefill": bool(sp.get("response_prefill")), "eval_samples": cfg.answers,
                                **(loop_overrides or {}), "steps": cfg.steps})
    loop.validate()
    held, train = family_tasks(style, per_level, cfg.n_train_per_level, loop.seed)
    n_answers = len(held) * cfg.answers
    settings = {"run": str(rd.path), "checkpoint": ckpt.name, "parent": parent.id, "parent_selfplay_steps": trained,
                "second_parent": second[0] if second else None, "reference": CONTINUATION, "training": TRAINING,
                "steps": cfg.steps, "loop": {k: getattr(loop, k) for k in loop.__dataclass_fields__},
                "probe": {"style": style, "n_tasks": len(held), "per_level": per_level, "answers": cfg.answers,
                          "resolution": 1.0 / n_answers, "temperature": solve.temperature,
                          "max_new_tokens": solve.max_new_tokens, "prefill": prefill},
                "n_train_tasks": len(train), "floor_replicates": cfg.floor_replicates,
                "eval_steps": eval_steps(cfg.steps, cfg.eval_every)}
    return Study(rd, ckpt, trained, parent, p_fit, second, ops, run_cfg, style, solve, prefill, per_level, loop, held,
                 train, settings, Path(cfg.out) if cfg.out else rd.path)


def resume_output(study: Study, cfg: RetentionConfig) -> dict[str, Any]:
    """retention.json's content so far: the arms a killed study finished are kept (same settings only)."""
    out: dict[str, Any] = {**study.settings, "arms": {}, "seconds": 0.0}
    if study.out_path.is_file():
        old = json.loads(study.out_path.read_text())
        changed = [k for k in study.settings if old.get(k) != study.settings[k]]
        if changed:
            raise ValueError(f"{study.out_path} was made with other settings ({', '.join(changed)}): delete it or "
                             "give another --out")
        out.update(old)
        out["arms"] = {n: a for n, a in old["arms"].items() if len(a.get("heldout") or []) == cfg.steps + 1}
    n_answers = len(study.held) * cfg.answers
    # mini_eval: the keys lorapop report reads
    out["mini_eval"] = {"n_tasks": len(study.held), "samples_per_task": cfg.answers, "resolution": 1.0 / n_answers}
    return out


Spec = tuple[str, str, "dict[str, float] | None"]  # (arm name, operator, the operator's parameters over defaults)


def arm_specs(ops: list[str], cfg: RetentionConfig) -> list[Spec]:
    """The continuation (the reference), one arm per operator, and the named stronger arms."""
    from lorapop.evolve.config import scaled_params

    specs: list[Spec] = [(CONTINUATION, CONTINUATION, None)]
    specs += [(o, o, None) for o in ops]
    if cfg.stronger and cfg.stronger_ops != ["auto"]:
        specs += [(stronger_arm(o, cfg.stronger), o, scaled_params(o, cfg.stronger)) for o in cfg.stronger_ops]
    return specs


def study_engine(study: Study, cfg: RetentionConfig) -> Any:
    """The run's engine settings (dtype, batch sizes...), so the parent scores as the run's probe scored it, with
    ``group_size`` slots (at least 2: the second parent's)."""
    import torch

    from lorapop.engine.base import EngineConfig
    from lorapop.engine.factory import make_engine

    parent = study.parent
    ecfg = EngineConfig(**{**{k: v for k, v in (study.run_cfg.get("engine") or {}).items()
                              if k in EngineConfig.__dataclass_fields__ and k not in ("replicas", "ray_address")},
                           "rank": parent.rank, "lora_alpha": parent.lora_alpha,
                           "target_modules": parent.target_modules, "backend": cfg.backend,
                           "device": "cpu" if not torch.cuda.is_available() else "auto"})
    return make_engine(study.rd.model_name(), max(2, cfg.group_size), ecfg, seed=study.loop.seed)
