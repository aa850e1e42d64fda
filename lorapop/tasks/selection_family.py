"""``selfplay.proposal_style: selection`` (the cpu_selection config): tasks the embedded 135M model can
partly answer and learn. One ```python block opens with the input line ``nums = [<small ints>]`` and defines
``f(nums)`` as one ``return <expr>`` line whose expression copies or selects: ``nums``, a constant, ``nums[k]``,
``max``/``min``/``len``, ``sorted(nums)[k]``, ``nums[i] if nums[j] > k else nums[l]``, or two of these composed.

Why this family: on integer expressions (proposal_style ``expression``) the base mispredicts even ``x * 2``, solving
about 0.1 of valid tasks with almost no task solved sometimes (docs/RESULTS.md, "On-policy sampling at step 0"),
so a learnability reward had nothing to tell apart; bench/learns.py showed the base learns copy and selection
programs (identity, constants, ``nums[k]``, max/min, ``sorted(nums)[k]``, a conditional) within 8 updates.

The reference tasks come at three levels, each turning one knob a teacher can turn too: longer lists, negative or
computed indices, composition of two selections. ``seeds/select_seed_io.jsonl`` is :func:`seed_rows` of
:data:`SEED_LEVELS`, level 1 only (``python -m lorapop.tasks.selection_family`` rewrites it; a test checks it still
is). The expressions are written here, never by a model; outputs come from running them in this process.

Validity beyond the shared checks (:func:`check_shape` before them, :func:`check_task` after; both applied by the
style's ``validate_many``, lorapop/tasks/styles/selection.py, which the validate stage calls for code_o and code_i):
the input is one list of ints, f's body is exactly one ``return <expr>``, the output is not None, and the student's
answer (the output's repr for code_o, the input for code_i) with its closing fence fits ``selfplay.solve``'s
``max_new_tokens`` as the model's tokenizer counts it: an answer the student cannot finish inside its budget can
never be solved, so a teacher would be paid for a task that measures the budget, not the student.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Callable

from lorapop.tasks.base import Invalid, Task
from lorapop.tasks.shown import over_budget
from lorapop.modeltext import NotLiteral, parse_text
from lorapop.tasks.values import MAX_CALL_CHARS, literal_value

# level -> expressions over nums. 1: one selection on a short list; 2: negative or sorted positions, a slice, a
# conditional; 3: computed indices and two selections composed, on longer lists.
LEVELS: dict[int, tuple[str, ...]] = {
    1: ("nums[0]", "nums[1]", "nums[-1]", "max(nums)", "min(nums)", "len(nums)", "nums", "7"),
    2: ("nums[2]", "nums[-2]", "sorted(nums)[0]", "sorted(nums)[-1]", "max(nums[1:])", "min(nums[:2])",
        "nums[0] if nums[0] > 4 else nums[1]", "nums[len(nums) - 1]"),
    3: ("sorted(nums)[-2]", "sorted(nums)[1]", "nums[len(nums) // 2]", "max(nums[:3])", "min(nums[-2:])",
        "nums[1] if nums[2] > 5 else nums[-1]", "nums[nums[0] % len(nums)]", "sorted(nums[1:])[0]"),
}
# list length per level (the first knob): an element is three tokens ("3", ",", " ") to read and, for code_i, write
LIST_LEN: dict[int, int] = {1: 2, 2: 3, 3: 4}
# the levels the shipped seed file holds: teachers copy their references' level, and at step 0 the base solved 0.39 of
# valid tasks proposed from level-1 references against 0.16 from all three (docs/RESULTS.md, "Dynamics, second
# design: the step-0 gate"); levels 2-3 stay written here as the probe's held-out exclusions and a teacher's next steps
SEED_LEVELS: tuple[int, ...] = (1,)
SEED_FILE = "seeds/select_seed_io.jsonl"
SEED_FILE_SEED = 38
PARAM = "nums"
# the reply starts inside the block, after the opening bracket of the input list (as expression's after `x = `)
SELECTION_PREFILL = "```python\nnums = ["


def program(expr: str) -> str:
    return f"def f({PARAM}):\n    return {expr}"


def run(expr: str, nums: list[int]):
    ns: dict = {}
    exec(program(expr), ns)  # noqa: S102 - our own expressions, never model output
    return ns["f"](nums)


def draw_list(rng: random.Random, n: int, lo: int = 0, hi: int = 9) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def seed_rows(seed: int = SEED_FILE_SEED, levels: tuple[int, ...] = tuple(LEVELS)) -> list[dict]:
    """Every expression of ``levels`` of :data:`LEVELS` once, on a list of :data:`LIST_LEN` digits, in AZR's seed
    layout; the shipped file is ``seed_rows(levels=SEED_LEVELS)``. Lists are drawn level by level from one stream, so
    a level's rows are the same whichever levels follow it."""
    rng = random.Random(f"select:{seed}")
    rows = []
    for level in sorted(levels):
        for expr in LEVELS[level]:
            nums = draw_list(rng, LIST_LEN[level])
            rows.append({"snippet": program(expr), "input": repr(nums), "output": repr(run(expr, nums)),
                         "imports": []})
    return rows


def selection_block(t: Task) -> str:
    return f"```python\nnums = {t.inputs[0] if t.inputs else '[]'}\n{t.program}\n```"


def teacher_prompt(references: list[Task], goal: str, rules: str) -> str:
    refs = "\n\n".join(f"Reference {i + 1}:\n{selection_block(t)}" for i, t in enumerate(references))
    return ("Write one list nums of small integers and a new Python function f(nums) whose body is a single return "
            "line that picks a value out of nums: an element, a position in sorted(nums), max, min, len, or a choice "
            f"between two elements. {goal}\n{rules}\n\n"
            f"{refs}\n\nNow write your own ```python block in the same layout: the line nums = [...], then f.")


def code_i_student_prompt(task: Task) -> str:
    """code_i's student prompt under this style: the program and the output; the answer is a list (prefilled up to
    its ``[``). code_o keeps its usual prompt (lorapop/tasks/code_o.py says why)."""
    return ("Find a list nums for which f(nums) returns the output below.\n"
            f"```python\n{task.program}\n```\nOutput: {task.outputs[0]}\n\n"
            "Give the list nums in an ```input block.")


def check_shape(program: str, inp: str) -> Invalid | None:
    """Static checks of the style: the input is a list of ints, and f has one parameter and a body of exactly one
    ``return <expr>`` (the shared checks have already required exactly one top-level f)."""
    try:
        value = literal_value(inp, MAX_CALL_CHARS)
    except NotLiteral:
        value = None
    if not (isinstance(value, list) and value and all(type(v) is int for v in value)):
        return Invalid("input_not_int_list", f"the input must be a non-empty list of ints, got {inp[:60]!r}")
    try:
        tree = parse_text(program)
    except NotLiteral as exc:  # the shared checks report it first
        return Invalid("syntax_error", exc.detail)
    f = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "f"), None)
    if f is None:
        return Invalid("no_f", "no def f")
    a = f.args
    if len(a.args) + len(a.posonlyargs) != 1 or a.vararg or a.kwarg or a.kwonlyargs:
        return Invalid("not_one_param", "f must take exactly one parameter, the list")
    if len(f.body) != 1 or not isinstance(f.body[0], ast.Return) or f.body[0].value is None:
        return Invalid("not_one_return", "f's body must be exactly one `return <expr>` line")
    return None


def check_task(type_name: str, task: Task, count_tokens: Callable[[str], int] | None,
               answer_budget: int | None) -> Invalid | None:
    """The checks on a task the shared validation passed: the output is not None, and the answer fits the budget.
    ``count_tokens`` None skips the budget (a caller without a tokenizer; the validate stage always passes the
    engine's). Under code_i the prefilled ``[`` is counted too: the check errs by one token on the safe side."""
    if task.outputs[0] == "None":
        return Invalid("output_none", "f returns None")
    return over_budget(type_name, task, count_tokens, answer_budget)


# The capability probe's held-out family (lorapop/train/probe.py): level -> selection shapes over nums; {i} a
# position in the list but the last ({j}: but the last two, {l}: any), {m} one in 1..len, {k} a threshold (no
# constant programs: they are answered from the page and would only pad the probe); a draw that indexes past its list
# is skipped. Held out: a program of the seed file is skipped, and so is a list the seed file calls f on; the lists
# are one element longer than the seed file's at each level.
PROBE_SHAPES: dict[int, tuple[str, ...]] = {
    1: ("nums[{l}]", "nums[-{m}]", "sorted(nums)[{l}]"),
    2: ("max(nums[{i}:])", "min(nums[{i}:])", "sorted(nums)[-{m}]", "nums[{i}] if nums[{j}] > {k} else nums[{l}]",
        "max(nums[:{m}])"),
    3: ("sorted(nums[{i}:])[{j}]", "nums[len(nums) - {m}]", "min(nums[-{m}:]) if nums[{i}] > {k} else max(nums)",
        "nums[nums[{i}] % len(nums)]", "sorted(nums)[len(nums) // 2]"),
}
PROBE_LIST_LEN = {1: 4, 2: 5, 3: 6}


def probe_tasks(per_level: int, seed: int) -> list[tuple[int, Task]]:
    """(level, code_o task) pairs, ``per_level`` distinct tasks at each level of :data:`PROBE_SHAPES`, the same for
    the same arguments."""
    rows = seed_rows()
    refs, ref_inputs = {r["snippet"] for r in rows}, {r["input"] for r in rows}
    rng = random.Random(f"probe-select:{seed}")
    out: list[tuple[int, Task]] = []
    for level, shapes in sorted(PROBE_SHAPES.items()):
        n = PROBE_LIST_LEN[level]
        seen: set[tuple[str, str]] = set()
        while len(seen) < per_level:
            expr = rng.choice(shapes).format(i=rng.randrange(n - 1), j=rng.randrange(n - 2), l=rng.randrange(n),
                                             m=rng.randint(1, n), k=rng.randint(2, 7))
            nums = draw_list(rng, n)
            prog, inp = program(expr), repr(nums)
            if prog in refs or inp in ref_inputs or (prog, inp) in seen:
                continue
            try:
                value = run(expr, nums)
            except IndexError:
                continue
            seen.add((prog, inp))
            out.append((level, Task(type="code_o", program=prog, inputs=[inp], outputs=[repr(value)],
                                    proposer="probe", step=0)))
    return out


if __name__ == "__main__":  # regenerate the shipped seed file
    import json

    from lorapop.data import PACKAGE_DATA_DIR

    with open(PACKAGE_DATA_DIR / SEED_FILE, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in seed_rows(levels=SEED_LEVELS))
