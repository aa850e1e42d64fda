"""Learning evidence: does a student adapter trained through the project's own update path solve
more easy tasks from templates it never trained on than an lr-0 control and a shuffled-reward control?

    PYTHONPATH=. .venv/bin/python bench/learns.py --out runs/learns [--seeds 0 1 2] [--arms trained shuffled control]
        [--steps 8 --lr 1e-3 --tokens 16 --temperature 0.3 --tasks-per-step 8 --n-samples 4]
        [--n-train 64 --n-heldout 96 --eval-samples 4] [--threads 2]

Per seed, the 12 template families of lorapop/tasks/easy.py are split (``split_templates``, drawn with the seed):
2 of the 5 families the base solves some of the time and 2 of the 7 others are held out; training draws its 64 tasks
from the remaining templates only, so no held-out program appears in training (the bench counts and prints it).
Three arms, each from the same adapter draw, run through lorapop/train/student.py (stages.solve -> stages.reward ->
stages.update = TRR++ + engine.train_step): ``trained`` (8 steps of 8 tasks x 4 answers at lr 1e-3),
``shuffled`` (the same steps, its rewards permuted within each TRR++ group before the advantages: updates of the
same size not tied to what was answered) and ``control`` (lr 0, the base). Each answers the 96 held-out tasks 4
times with the same sampling seeds (replies prefilled with the ```output fence, temperature 0.3, 16 tokens).

Reported per arm: the solve rate, the format-error rate (no closed block with one literal) and the accuracy among
well-formed answers (correct / (correct + wrong)): a gain in accuracy is not a formatting gain. Per held-out
family: the same, pooled over the seeds that held it out, and whether its outputs can be copied from the prompt.
Beside them, per seed, the held-out set's trivial yardsticks (lorapop/train/yardsticks.py: always the shown list's
first, last, largest or smallest element, the set's most common output, the argument copied back), checked by the
same code_o checker: what answering without reading the program scores there.

Outputs in ``--out``: ``answers/seed<S>-<arm>.jsonl`` (every answer: seed, arm, phase, step, template family,
task id, program, input, expected output, answer text, status, reward) and ``units/seed<S>-<arm>.json`` (the arm's
scores and curve), each written whole when the arm ends; a killed run resumes at the first (seed, arm) without a
unit file, and units measured under another setting are refused; ``--report`` summarises the units there. The
last line printed is one JSON object (see ``summarise``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning_report import REGISTERED_SEEDS, compute_readings, registered_verdict  # noqa: E402

# the setting every unit records; a resumed run must match it (house rule: no figures mixed across settings)
SETTING = {"steps": 8, "lr": 1e-3, "tokens": 16, "temperature": 0.3, "tasks_per_step": 8, "n_samples": 4,
           "n_train": 64, "n_heldout": 96, "eval_samples": 4, "heldout_solvable": 2, "heldout_other": 2, "rank": 8}


# the registered design (docs/results/learning/REGISTRATION.md): the compute families of
# lorapop/tasks/compute_family.py, every family trained, held-out arguments; the held-out set is n_heldout compute
# tasks (answer never on the page) and n_heldout_page page tasks (answer one of the shown values); the held-out set is
# also answered after every eval_every-th step (the per-step curve)
COMPUTE_SETTING = {"design": "compute", "steps": 12, "lr": 1e-3, "tokens": 16, "temperature": 0.3,
                   "tasks_per_step": 8, "n_samples": 4, "n_train": 256, "n_heldout": 96, "n_heldout_page": 48,
                   "eval_samples": 4, "eval_every": 4, "rank": 8}
DESIGNS = {"templates": SETTING, "compute": COMPUTE_SETTING}


def design_of(setting: dict) -> str:
    return setting.get("design", "templates")


def family_fn(setting: dict):
    """The function naming a program's family under ``setting``'s design."""
    if design_of(setting) == "compute":
        from lorapop.tasks.compute_family import family_of
    else:
        from lorapop.tasks.easy import family_of
    return family_of


def task_id(t) -> str:
    return hashlib.sha1(f"{t.program}\0{t.inputs[0]}".encode()).hexdigest()[:12]


def draw(seed: int, setting: dict):
    """(train templates, held-out templates, training tasks, held-out tasks, overlap counts) of ``seed``. Under the
    compute design every family is trained and held out (on disjoint arguments); the held-out list is the compute
    tasks, then the page tasks."""
    if design_of(setting) == "compute":
        from lorapop.tasks.compute_family import COMPUTE, FAMILIES, PAGE, compute_tasks

        train_t = held_t = list(FAMILIES)
        train = compute_tasks(setting["n_train"], seed, COMPUTE + PAGE, heldout=False)
        held = (compute_tasks(setting["n_heldout"], seed, COMPUTE, heldout=True)
                + compute_tasks(setting["n_heldout_page"], seed, PAGE, heldout=True))
    else:
        from lorapop.tasks.easy import easy_tasks, split_templates

        train_t, held_t = split_templates(seed, setting["heldout_solvable"], setting["heldout_other"])
        train = easy_tasks(setting["n_train"], seed, templates=train_t)
        held = easy_tasks(setting["n_heldout"], seed + 1_000_003, templates=held_t)
    programs = {t.program for t in train}
    overlap = {"program": sum(t.program in programs for t in held),
               "program_and_input": len({task_id(t) for t in train} & {task_id(t) for t in held}),
               "input": sum(t.inputs[0] in {u.inputs[0] for u in train} for t in held),
               "output_in_training_outputs": sum(t.outputs[0] in {u.outputs[0] for u in train} for t in held)}
    return train_t, held_t, train, held, overlap


def answer_rows(seed: int, arm: str, phase: str, step: int, jobs, family_of=None) -> list[dict]:
    if family_of is None:
        from lorapop.tasks.easy import family_of

    return [{"seed": seed, "arm": arm, "phase": phase, "step": step, "template": family_of(j.task.program),
             "task_id": task_id(j.task), "program": j.task.program, "input": j.task.inputs[0],
             "expected": j.task.outputs[0], "answer": r.prefill + r.completion.text, "status": r.status,
             "reward": r.reward} for j in jobs for r in j.rollouts]


def by_template(rows: list[dict]) -> dict[str, dict]:
    """Held-out counts per template family: n, correct, format_error, wrong."""
    out: dict[str, dict] = {}
    for r in rows:
        if r["phase"] == "heldout":
            c = out.setdefault(r["template"], {"n": 0, "correct": 0, "wrong": 0, "format_error": 0})
            c["n"] += 1
            c[r["status"]] += 1
    return out


def write_answers(path: Path, rows: list[dict]) -> None:
    """Rows as jsonl, gzip-compressed when ``path`` ends in .gz (no timestamp: the same rows, the same bytes), written
    whole or not at all."""
    import gzip

    data = "".join(json.dumps(x) + "\n" for x in rows).encode("utf-8")
    if path.suffix == ".gz":
        import io

        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="") as fh:
            fh.write(data)
        data = buf.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def read_answers(path: Path) -> list[dict]:
    import gzip

    raw = path.read_bytes()
    text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def answers_path(out: Path, seed: int, arm: str, setting: dict) -> Path:
    return out / "answers" / f"seed{seed}-{arm}.jsonl{'.gz' if design_of(setting) == 'compute' else ''}"


def run_unit(engine, executor, seed: int, arm: str, setting: dict, out: Path, flip: bool = False) -> dict:
    """One (seed, arm): trains and scores it, writes its answers and unit file, returns the unit."""
    from lorapop.records.rundir import write_json_atomic
    from lorapop.tasks.easy import copyable, family_of
    from lorapop.train.student import StudentLoopConfig, run_arm

    t0 = time.perf_counter()
    train_t, held_t, train, held, overlap = draw(seed, setting)
    cfg = StudentLoopConfig(steps=setting["steps"], tasks_per_step=setting["tasks_per_step"],
                            n_samples=setting["n_samples"], lr=setting["lr"], max_new_tokens=setting["tokens"],
                            temperature=setting["temperature"], eval_temperature=setting["temperature"],
                            eval_samples=setting["eval_samples"], seed=seed, response_prefill=True)
    rows: list[dict] = []

    def log(step, row):
        print(f"seed {seed} {arm} step {step + 1:2d}: train reward {row['reward']:+.3f} format_error "
              f"{row['format_error']:.3f} solve {row['solve_rate']:.3f}", flush=True)

    fam_of = family_fn(setting)
    compute = design_of(setting) == "compute"
    r = run_arm(engine, executor, cfg, arm, train_tasks=train, heldout=held, log=log, flip=flip,
                eval_every=setting.get("eval_every", 0),
                sink=lambda phase, step, jobs: rows.extend(answer_rows(seed, arm, phase, step, jobs, fam_of)))
    write_answers(answers_path(out, seed, arm, setting), rows)
    if compute:
        from lorapop.tasks.compute_family import on_page

        shown = {f: round(statistics.mean(on_page(t.outputs[0], t.program, t.inputs[0]) for t in held
                                          if fam_of(t.program) == f), 3) for f in {fam_of(t.program) for t in held}}
    else:
        shown = {f: round(statistics.mean(copyable(t) for t in held if family_of(t.program) == f), 3)
                 for f in {family_of(t.program) for t in held}}
    unit = {"seed": seed, "arm": arm, "setting": setting, "flip": flip, "train_templates": train_t,
            "heldout_templates": held_t, "overlap": overlap, "heldout": r.heldout.to_json(), "curve": r.curve,
            "per_template": by_template(rows), "copyable": shown,
            "seconds": round(time.perf_counter() - t0, 1)}
    if compute:
        unit["readings"] = compute_readings(rows, setting["steps"])
    (out / "units").mkdir(exist_ok=True)
    write_json_atomic(out / "units" / f"seed{seed}-{arm}.json", unit)
    return unit


def load_unit(out: Path, seed: int, arm: str, setting: dict) -> dict | None:
    path = out / "units" / f"seed{seed}-{arm}.json"
    if not path.exists():
        return None
    unit = json.loads(path.read_text(encoding="utf-8"))
    if unit["setting"] != setting or unit.get("flip"):
        raise SystemExit(f"{path} was measured under {unit['setting']} (flip {unit.get('flip')}), not {setting}; "
                         f"use another --out or delete it")
    return unit


def _mean(xs):
    return round(statistics.mean(xs), 4) if xs else None


def _sd(xs):
    return round(statistics.stdev(xs), 4) if len(xs) > 1 else 0.0


def summarise(units: list[dict]) -> dict:
    """The JSON line: per arm (means over seeds, per-seed lists) of solve_rate, format_error, accuracy; margins
    (mean, sd over seeds) of trained - control, trained - shuffled, shuffled - control; per held-out family pooled
    counts and rates per arm; the share of each family's held-out tasks whose output is written in the prompt
    (``copyable``); overlap counts per seed; seconds (the units' own)."""
    seeds = sorted({u["seed"] for u in units})
    arms = [a for a in ("trained", "shuffled", "control") if any(u["arm"] == a for u in units)]
    get = {(u["seed"], u["arm"]): u for u in units}
    out: dict = {"seeds": seeds, "arms": {}, "margins": {}, "per_template": {}}
    for a in arms:
        out["arms"][a] = {m: {"mean": _mean(v := [get[s, a]["heldout"][m] for s in seeds if (s, a) in get]),
                              "per_seed": v} for m in ("solve_rate", "format_error", "accuracy")}
    for x, y in (("trained", "control"), ("trained", "shuffled"), ("shuffled", "control")):
        both = [s for s in seeds if (s, x) in get and (s, y) in get]
        if both:
            out["margins"][f"{x}-{y}"] = {m: {"mean": _mean(d := [get[s, x]["heldout"][m] - get[s, y]["heldout"][m]
                                                                 for s in both]), "sd": _sd(d)}
                                          for m in ("solve_rate", "format_error", "accuracy")}
    for u in units:
        for fam, c in u["per_template"].items():
            p = out["per_template"].setdefault(fam, {}).setdefault(u["arm"], {"n": 0, "correct": 0, "wrong": 0,
                                                                             "format_error": 0, "seeds": []})
            for k in ("n", "correct", "wrong", "format_error"):
                p[k] += c[k]
            p["seeds"].append(u["seed"])
    for fam, per_arm in out["per_template"].items():
        for p in per_arm.values():
            p["solve_rate"] = round(p["correct"] / p["n"], 4)
            p["format_error_rate"] = round(p["format_error"] / p["n"], 4)
            p["accuracy"] = round(p["correct"] / max(p["correct"] + p["wrong"], 1), 4)
    one = {u["seed"]: u for u in units}
    out["heldout_templates"] = {s: one[s]["heldout_templates"] for s in seeds}
    out["overlap"] = {s: one[s]["overlap"] for s in seeds}
    out["copyable"] = {f: c for u in units for f, c in u["copyable"].items()}
    out["n_heldout"], out["eval_samples"] = units[0]["setting"]["n_heldout"], units[0]["setting"]["eval_samples"]
    out["steps"] = units[0]["setting"]["steps"]
    out["seconds"] = round(sum(u["seconds"] for u in units), 1)
    return out


def heldout_yardsticks(seeds: list[int], setting: dict, executor) -> dict:
    """Per seed, the trivial yardsticks of its held-out set (lorapop/train/yardsticks.py: first, last, max, min
    element, the set's most common output, copying the input), checked by code_o's checker in ``executor``; and
    per strategy the mean over the seeds: what answering without reading the program scores here."""
    from lorapop.train.yardsticks import STRATEGIES, task_yardsticks, three_kinds

    if design_of(setting) == "compute":  # the compute part and the page part of each held-out set apart
        n = setting["n_heldout"]
        parts = {s: draw(s, setting)[3] for s in seeds}
        out = {}
        for part, cut in (("compute", slice(0, n)), ("page", slice(n, None))):
            per = {s: task_yardsticks(parts[s][cut], executor) for s in seeds}
            scores = {s: {k: v["score"] for k, v in y["strategies"].items()} for s, y in per.items()}
            out[part] = {"per_seed": per, "three_kinds": three_kinds(scores)}
        return out
    per_seed = {s: task_yardsticks(draw(s, setting)[3], executor) for s in seeds}
    mean = {k: round(statistics.mean(y["strategies"].get(k, {}).get("score") or 0.0 for y in per_seed.values()), 4)
            for k in STRATEGIES}
    kinds = three_kinds({s: {k: v["score"] for k, v in y["strategies"].items()} for s, y in per_seed.items()})
    return {"per_seed": per_seed, "mean": mean,
            "best_per_seed_mean": round(statistics.mean(y["best_score"] for y in per_seed.values()), 4),
            "three_kinds": kinds}


SIGNAL_SEED = 1000  # the base-signal measurement's tasks: training arguments of a seed no registered unit uses


def base_signal(engine, executor, per_family: int, setting: dict, out: Path) -> dict:
    """Before registering: the base's (an untrained adapter's) answers to ``per_family`` tasks of every compute-design
    family, ``eval_samples`` each at the registered sampling settings. Per family: the solve rate, the share of tasks
    with at least one right answer, and the share the reward tells apart (some answers right, some not). Writes
    ``answers/base-signal.jsonl.gz`` and ``base_signal.json`` in ``out``."""
    from lorapop.tasks.compute_family import CANDIDATES as FAMILIES, compute_tasks
    from lorapop.records.members import Member
    from lorapop.train.student import answer, set_lr

    drawn = {f: compute_tasks(per_family, SIGNAL_SEED, [f], heldout=False) for f in FAMILIES}
    tasks = [t for ts in drawn.values() for t in ts]
    family = {t.program + "\0" + t.inputs[0]: f for f, ts in drawn.items() for t in ts}  # add and add1 share texts
    engine.reset_adapter(0, seed=SIGNAL_SEED)
    engine.reset_optimizer(0)
    set_lr(engine, 0, 0.0)
    jobs = answer(engine, executor, Member("control", 0, "student"), tasks, step=-1, seed=SIGNAL_SEED,
                  n_samples=setting["eval_samples"], temperature=setting["temperature"],
                  max_new_tokens=setting["tokens"], response_prefill=True)
    rows = answer_rows(SIGNAL_SEED, "control", "base_signal", 0, jobs, lambda program: "")
    for r in rows:
        r["template"] = family[r["program"] + "\0" + r["input"]]
    write_answers(out / "answers" / "base-signal.jsonl.gz", rows)
    return signal_from_rows(rows)


def signal_from_rows(rows: list[dict]) -> dict:
    """:func:`base_signal`'s figures from its answer rows alone."""
    from lorapop.tasks.compute_family import CANDIDATES as FAMILIES

    per_task: dict[tuple, list[bool]] = {}
    fam_of = {}
    for r in rows:
        per_task.setdefault((r["program"], r["input"]), []).append(r["status"] == "correct")
        fam_of[(r["program"], r["input"])] = r["template"]
    out = {}
    for f in FAMILIES:
        ts = [v for k, v in per_task.items() if fam_of[k] == f]
        if ts:
            out[f] = {"kind": FAMILIES[f].kind, "group": FAMILIES[f].group, "tasks": len(ts),
                      "solve_rate": round(sum(map(sum, ts)) / sum(map(len, ts)), 4),
                      "any_right": round(sum(any(v) for v in ts) / len(ts), 4),
                      "told_apart": round(sum(any(v) and not all(v) for v in ts) / len(ts), 4)}
    return out


def table(s: dict) -> str:
    lines = ["arm       solve_rate (per seed)            format_error (per seed)          accuracy|well-formed"]
    for a, v in s["arms"].items():
        lines.append(f"{a:9s} " + "  ".join(f"{v[m]['mean']:.3f} {v[m]['per_seed']}" for m in
                                             ("solve_rate", "format_error", "accuracy")))
    for k, v in s["margins"].items():
        lines.append(f"{k:17s} " + "  ".join(f"{m} {v[m]['mean']:+.3f} (sd {v[m]['sd']:.3f})" for m in v))
    lines.append("held-out family   arm: solve / format_error / accuracy (n answers, seeds)")
    for fam, per_arm in sorted(s["per_template"].items()):
        lines.append(f"{fam:11s} copyable {s['copyable'].get(fam, 0):.2f}  " + "  ".join(
            f"{a}: {p['solve_rate']:.3f}/{p['format_error_rate']:.3f}/{p['accuracy']:.3f} (n {p['n']}, "
            f"seeds {p['seeds']})" for a, p in per_arm.items()))
    lines.append(f"held-out programs also in training, per seed: {s['overlap']}")
    if s.get("registered"):
        for name, r in s["registered"].items():
            if isinstance(r, dict):
                lines.append(f"{name}: {r['verdict']}; " + ", ".join(
                    f"{a} {v['mean']}" for a, v in r["per_arm"].items()) + "; trained-control "
                    f"{r['trained-control']['mean']} (sd {r['trained-control']['sd']}, higher in "
                    f"{r['trained-control']['x_higher']} of {len(r['trained-control']['seeds'])} seeds)")
        for part, y in s["yardsticks"].items():
            k = y["three_kinds"]
            lines.append(f"{part} rules fixed in advance: " + ", ".join(f"{r} {v:.3f}" for r, v in k["fixed"].items())
                         + f"; chosen on the other seeds {k['chosen_on_other_seeds']}; hindsight best (ceiling) "
                           f"{k['hindsight_best']}")
        return "\n".join(lines)
    if s.get("yardsticks"):
        from lorapop.train.yardsticks import describe

        y = s["yardsticks"]
        lines += [f"seed {k}: {describe(v)}" for k, v in y["per_seed"].items()]
        lines.append("trivial yardsticks, mean over seeds: " + ", ".join(f"{k} {v:.3f}" for k, v in y["mean"].items())
                     + f"; the best strategy of each seed, mean {y['best_per_seed_mean']:.3f}")
        k = y["three_kinds"]
        fixed = ", ".join(f"{r} {v:.3f}" for r, v in k["fixed"].items())
        lines.append(f"three kinds: each rule fixed in advance {fixed}"
                     + f"; chosen on the other seeds {k['chosen_on_other_seeds'] or 0:.3f}; hindsight best per seed "
                       f"(a ceiling) {k['hindsight_best']:.3f}")
    return "\n".join(lines)


def main(argv=None) -> None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--design", choices=list(DESIGNS), default="templates")
    design = pre.parse_known_args(argv)[0].design
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--design", choices=list(DESIGNS), default="templates",
                    help="templates: held-out template families of lorapop/tasks/easy.py (the first experiment); "
                         "compute: the registered design (docs/results/learning/REGISTRATION.md)")
    ap.add_argument("--out", type=Path, required=True, help="directory for answers/ and units/ (resumable)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", choices=["trained", "shuffled", "control"],
                    default=["trained", "shuffled", "control"])
    for key, default in DESIGNS[design].items():
        if key != "design":
            ap.add_argument(f"--{key.replace('_', '-')}", type=type(default), default=default)
    ap.add_argument("--report", action="store_true", help="summarise the units already in --out and run nothing "
                                                            "(several processes, e.g. one per arm, share one --out)")
    ap.add_argument("--base-signal", type=int, default=0, metavar="N",
                    help="compute design: measure the base on N tasks of every family (before registering), write "
                         "--out/base_signal.json, and run nothing else")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (on a CPU shared with other jobs, 1 can "
                                                             "be several times faster than 2)")
    args = ap.parse_args(argv)
    setting = {k: getattr(args, k) for k in DESIGNS[design] if k != "design"}
    if design != "templates":
        setting = {"design": design, **setting}
    import torch

    torch.set_num_threads(args.threads)

    from lorapop.engine.base import EngineConfig
    from lorapop.engine.torch_engine import TorchEngine
    from lorapop.eval.harness import make_executor

    if args.base_signal:
        if design != "compute":
            raise SystemExit("--base-signal measures the compute design's families: add --design compute")
        executor = make_executor()
        engine = TorchEngine.from_config("embedded", 1, EngineConfig(device="cpu", rank=setting["rank"],
                                                                      lora_alpha=2 * setting["rank"],
                                                                      gen_batch_size=64))
        try:
            t0 = time.perf_counter()
            sig = base_signal(engine, executor, args.base_signal, setting, args.out)
            sig_s = round(time.perf_counter() - t0, 1)
        finally:
            engine.close()
            executor.close()
        for f, v in sig.items():
            print(f"{f:13s} {v['kind']:8s} solve {v['solve_rate']:.3f}  any right {v['any_right']:.3f}  "
                  f"told apart {v['told_apart']:.3f}  ({v['tasks']} tasks)")
        from lorapop.records.rundir import write_json_atomic

        write_json_atomic(args.out / "base_signal.json", {"setting": setting, "per_family": sig,
                                                          "seconds": sig_s})
        print(json.dumps({"base_signal": sig, "seconds": sig_s}))
        return
    todo = [(s, a) for s in args.seeds for a in args.arms]
    units = {k: u for k in todo if (u := load_unit(args.out, *k, setting)) is not None}
    if args.report:
        todo = [k for k in todo if k in units]
        if not todo:
            raise SystemExit(f"no units of this setting in {args.out}")
    executor = make_executor()
    try:
        if not args.report and len(units) < len(todo):
            engine = TorchEngine.from_config("embedded", 1, EngineConfig(device="cpu", rank=setting["rank"],
                                                                          lora_alpha=2 * setting["rank"],
                                                                          gen_batch_size=64))
            try:
                for seed, arm in todo:
                    if (seed, arm) in units:
                        continue
                    print(f"seed {seed}, arm {arm}", flush=True)
                    u = units[seed, arm] = run_unit(engine, executor, seed, arm, setting, args.out)
                    h = u["heldout"]
                    print(f"seed {seed} {arm}: held-out solve {h['solve_rate']:.3f} format_error "
                          f"{h['format_error']:.3f} accuracy {h['accuracy']:.3f} ({u['seconds']:.0f} s)", flush=True)
            finally:
                engine.close()
        s = summarise([units[k] for k in todo])
        s["yardsticks"] = heldout_yardsticks(s["seeds"], setting, executor)
        if design == "compute":
            s["registered"] = registered_verdict(list(units.values()))
    finally:
        executor.close()
    print(table(s))
    print(json.dumps(s))


if __name__ == "__main__":
    main()
