"""Trivial yardsticks: what a policy that learned nothing about the programs scores on a probe or a held-out set.

A solve rate means little without it. On the selection probe (lorapop/train/probe.py, ``proposal_style:
selection``), always answering the list's first element already solves 26 of the 90 tasks, and children that
"recovered" in the retention experiment answered ``nums[0]`` almost every time. So every probe figure is shown beside
these scores (docs/RESULTS.md, "Trivial yardsticks"; the report's probe panel, bench/retention_table.py's figure).

The strategies, each a fixed rule that never reads the program:

* ``first``, ``last``, ``max``, ``min``: that element of the shown list (the call's argument, when it is one list of
  numbers; a task without one counts as unsolved by the strategy);
* ``most_common``: the same answer for every task, the most common expected answer of the set itself (an oracle's
  constant: no real policy can know it in advance, so it bounds every constant answer from above);
* ``copy``: the call's argument written back unchanged (the "answer is on the page" shortcut).

Each strategy's answer goes through the checker the real answers go through: the task type's ``check_many`` with the
real sandbox executor (code_o: the predicted literal read and compared with the output by value in the trainer,
lorapop/tasks/values.py), or, for a math benchmark, :func:`lorapop.eval.mathcheck.check_answer`. A deterministic strategy answers a task the same way every
sample, so its score on a task is 0 or 1 and its figure is the share of tasks solved, comparable with a probe score
(mean over tasks of the share of answers right).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from lorapop.tasks.base import Answer, Task
from lorapop.modeltext import NotLiteral
from lorapop.tasks.values import MAX_CALL_CHARS, literal_value

STRATEGIES = ("first", "last", "max", "min", "most_common", "copy")
LABELS = {"first": "the first element", "last": "the last element", "max": "the largest element",
          "min": "the smallest element", "most_common": "the most common answer", "copy": "the argument copied"}
POSITIONAL = {"first": lambda xs: xs[0], "last": lambda xs: xs[-1], "max": max, "min": min}
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def shown_list(text: str) -> list[Any] | None:
    """The call's argument as a list of numbers (``"[3, 1, 4]"``), else None: positional strategies need one."""
    try:
        value = literal_value(text, MAX_CALL_CHARS)
    except NotLiteral:
        return None
    if isinstance(value, list) and value and all(type(v) in (int, float) for v in value):
        return value
    return None


def strategy_answers(tasks: Sequence[Task]) -> tuple[dict[str, list[str | None]], str | None]:
    """Per strategy, per task, the answer text (None where the strategy has no answer), and the set's most common
    expected output (ties: the one met first)."""
    mode = Counter(t.outputs[0] for t in tasks).most_common(1)[0][0] if tasks else None
    out: dict[str, list[str | None]] = {s: [] for s in STRATEGIES}
    for t in tasks:
        xs = shown_list(t.inputs[0]) if t.inputs else None
        for name, pick in POSITIONAL.items():
            out[name].append(repr(pick(xs)) if xs is not None else None)
        out["most_common"].append(mode)
        out["copy"].append(t.inputs[0] if t.inputs else None)
    return out, mode


def _summary(n: int, correct: dict[str, int], applies: dict[str, int], mode: str | None) -> dict[str, Any]:
    strategies = {s: {"score": correct[s] / n if n else None, "correct": correct[s], "applies": applies[s],
                      "label": LABELS[s]} for s in STRATEGIES if applies[s]}
    if "most_common" in strategies:
        strategies["most_common"].update(answer=mode, label=f"{LABELS['most_common']} ({mode})")
    best = max(strategies, key=lambda s: (strategies[s]["score"] or 0.0, -STRATEGIES.index(s)), default=None)
    return {"n_tasks": n, "strategies": strategies, "best": best,
            "best_score": strategies[best]["score"] if best else None}


def task_yardsticks(tasks: Sequence[Task], executor: Any) -> dict[str, Any]:
    """Each strategy's score on ``tasks`` (code_o tasks: a probe, a held-out set), checked by code_o's
    ``check_many`` in ``executor``: ``{"n_tasks", "strategies": {name: {"score", "correct", "applies"[,
    "answer"]}}, "best", "best_score"}``. A strategy that applies to no task is left out."""
    from lorapop.tasks import TASK_TYPES

    wrong = sorted({t.type for t in tasks} - {"code_o"})
    if wrong:
        raise ValueError(f"trivial yardsticks answer code_o tasks (a predicted output); got {wrong}")
    code_o = TASK_TYPES["code_o"]
    answers, mode = strategy_answers(tasks)
    correct = dict.fromkeys(STRATEGIES, 0)
    applies = {s: sum(a is not None for a in answers[s]) for s in STRATEGIES}
    for i, task in enumerate(tasks):
        named = [(s, answers[s][i]) for s in STRATEGIES if answers[s][i] is not None]
        outcomes = code_o.check_many(task, [Answer("code_o", a) for _, a in named], executor)
        for (s, _), o in zip(named, outcomes):
            correct[s] += o.status == "correct"
    return _summary(len(tasks), correct, applies, mode)


def rule_scores(tasks: Sequence[Task]) -> dict[str, float]:
    """Each strategy's score on code_o ``tasks`` without a sandbox: its answer read as a literal and compared by value
    with the expected output, which is what code_o's checker decides for an answer (lorapop/tasks/values.py); the
    sandbox's part, running the trusted program again, adds nothing for tasks whose output was computed by trusted
    code. For reports that recompute yardsticks from saved tasks (bench/claims.py, bench/learning_report.py)."""
    from lorapop.tasks.values import same_text

    answers, _ = strategy_answers(tasks)
    n = max(len(tasks), 1)
    return {s: sum(a is not None and same_text(t.outputs[0], a, 10_000) for t, a in zip(tasks, got)) / n
            for s, got in answers.items()}


def math_yardsticks(questions: Sequence[str], golds: Sequence[Sequence[str]],
                    check: Callable[[Sequence[str], str], bool] | None = None) -> dict[str, Any]:
    """The same for a math benchmark: the first, last, largest and smallest number written in the question, and the
    most common gold answer, each checked as a bare answer by ``check`` (default:
    :func:`lorapop.eval.mathcheck.check_answer`, the judge of ``lorapop eval``). ``copy`` does not apply."""
    if check is None:
        from lorapop.eval.mathcheck import check_answer as check
    mode = Counter(g[0] for g in golds).most_common(1)[0][0] if golds else None
    correct = dict.fromkeys(STRATEGIES, 0)
    applies = dict.fromkeys(STRATEGIES, 0)
    for q, g in zip(questions, golds):
        nums = [float(x) if "." in x else int(x) for x in NUMBER.findall(q.replace(",", ""))]
        picks = {name: pick(nums) for name, pick in POSITIONAL.items()} if nums else {}
        picks["most_common"] = mode
        for s, a in picks.items():
            applies[s] += 1
            correct[s] += bool(check(list(g), str(a)))
    return _summary(len(questions), correct, applies, mode)


def probe_yardsticks(style: str, per_level: int = 30, executor: Any = None, by_level: bool = False) -> dict[str, Any]:
    """:func:`task_yardsticks` of the capability probe of proposal style ``style`` (``per_level`` tasks a level, the
    probe's seed), and with ``by_level`` each level's; ``executor`` None starts a sandbox for the call and closes
    it."""
    from lorapop.train.probe import PROBE_SEED
    from lorapop.tasks.styles import proposal_style

    pairs = proposal_style(style).probe_tasks(per_level, PROBE_SEED)
    own = executor is None
    if own:
        from lorapop.executor import ExecutorConfig, SandboxExecutor
        from lorapop.tasks.common import DETERMINISM_SEEDS

        executor = SandboxExecutor(ExecutorConfig(n_workers=1, hashseeds=DETERMINISM_SEEDS))  # figures recompute alike
    try:
        out = task_yardsticks([t for _, t in pairs], executor)
        if by_level:
            out["by_level"] = {lv: task_yardsticks([t for x, t in pairs if x == lv], executor)["strategies"]
                               for lv in sorted({x for x, _ in pairs})}
    finally:
        if own:
            executor.close()
    out.update(style=style, per_level=per_level)
    return out


def describe(ys: dict[str, Any] | None, what: str = "") -> str:
    """One line to print beside a figure: each strategy's score, the best first."""
    if not ys or not ys.get("strategies"):
        return "trivial yardsticks: none apply"
    st = ys["strategies"]
    order = sorted(st, key=lambda s: -(st[s]["score"] or 0.0))
    parts = [f"{s}{' (' + str(st[s]['answer']) + ')' if s == 'most_common' else ''} {st[s]['score']:.3f}"
             for s in order]
    return f"trivial yardsticks{' ' + what if what else ''} ({ys['n_tasks']} tasks): " + ", ".join(parts)


FIXED_IN_ADVANCE = ("first", "last", "max", "min", "copy")  # rules a reader could name before seeing any answer


def three_kinds(per_seed: dict[Any, dict[str, float]], rules: Sequence[str] = STRATEGIES) -> dict[str, Any]:
    """The three kinds of yardstick a claim over seeds is shown beside, from each seed's score per rule:

    * ``fixed``: each rule fixed in advance (:data:`FIXED_IN_ADVANCE`), its mean over the seeds. A claim is
      "beyond the rules" only when it beats every one of these.
    * ``chosen_on_other_seeds``: per seed, the rule fixed in advance with the best mean on the *other* seeds, scored
      on this one (ties: the first listed); the mean over seeds. What a reader who tuned a rule on the rest of the
      data would score on held-out data. The most common answer is not carried over: its constant is each set's own.
    * ``hindsight_best``: per seed, the best rule on that seed itself, scored on it; the mean over seeds. A ceiling
      picked with the answers known: no policy could name it in advance.

    Returns those, each seed's chosen and best rule, and the seeds."""
    seeds = list(per_seed)
    names = [r for r in rules if any(r in per_seed[s] for s in seeds)]

    def mean(xs):
        xs = list(xs)
        return sum(xs) / len(xs) if xs else None

    def score(s, r):
        return per_seed[s].get(r) or 0.0

    fixed = {r: mean(score(s, r) for s in seeds) for r in FIXED_IN_ADVANCE if r in names}
    chosen, best = {}, {}
    for s in seeds:
        others = [o for o in seeds if o != s]
        fixed_names = [r for r in names if r in FIXED_IN_ADVANCE]
        if others and fixed_names:
            pick = max(fixed_names, key=lambda r: (mean(score(o, r) for o in others), -fixed_names.index(r)))
            chosen[s] = {"rule": pick, "score": score(s, pick)}
        top = max(names, key=lambda r: (score(s, r), -names.index(r)))
        best[s] = {"rule": top, "score": score(s, top)}
    return {"seeds": seeds, "fixed": fixed,
            "chosen_on_other_seeds": mean(c["score"] for c in chosen.values()) if chosen else None,
            "chosen_per_seed": chosen, "hindsight_best": mean(b["score"] for b in best.values()),
            "best_per_seed": best}
