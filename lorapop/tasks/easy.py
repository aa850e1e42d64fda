"""A family of easy tasks in the AZR format, built deterministically from a seed: one-line programs on small literal
inputs (``def f(x): return x + 3`` called on ``4``, ``s.upper()`` on a short word, ``nums[1]`` on a short list...).

Why it exists: the embedded SmolLM2-135M-Instruct almost never answers an AZR seed task correctly (0 of 288
measured), so a reward that is never positive gives TRR++ nothing to learn from and no experiment can tell a working
update path from a broken one. These tasks are easy enough that the base model is rewarded some of the time, which is
what the RL sanity experiment (lorapop/train/student.py, bench/learns.py) needs.

How it is made: ``easy_tasks(n, seed)`` draws, with ``random.Random(f"easy:{seed}")``, a template from
:data:`TEMPLATES` and its constants/argument, renders the program and the call's argument text, and computes the
output as ``repr(f(arg))`` by running the template's own (trusted, generated here, never model-written) source in a
fresh namespace; duplicates (same program and input) are skipped. The same tasks serve as ``code_o`` (predict the
output) or ``code_i`` (find an input) by their ``type``. Disjoint train / held-out sets come from different seeds
plus a dedup against the training set (:func:`split_tasks`: same templates, for retention's mini-eval); held-out
sets that share no template with training come from :func:`split_templates` (bench/learns.py).

What the base measured on it (code_o, 6 tasks per template, 4 answers each, 16 tokens, the reply prefilled with
the ```output fence): 69/312 = 22% correct at temperature 0.3 (the student prompt without an example value; with
the old example ``[1, 'a']`` the base copied it and solved 4-8%). Per template at 0.3: ``first`` 15/24, ``identity``
and ``const`` 12/24, ``index`` 10/24, ``mul`` 7/24, ``max`` 6/24, ``add`` 3/24, ``last``/``length`` 2/24, ``sub``,
``upper``, ``concat``, ``append`` 0/24. So the family as a whole sits in a 10-60% band (learnable), with
templates the base already gets and templates it does not.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from lorapop.tasks.base import Task

WORDS = ("cat", "dog", "sun", "map", "red", "box", "hat", "pen", "cup", "key")

# name -> (program template, argument drawer); {k} is a small constant drawn per task
TEMPLATES: dict[str, tuple[str, Callable[[random.Random], str]]] = {
    # the answer is on the page (the input, or a constant): what a 135M base can sometimes get right
    "identity": ("def f(x):\n    return x", lambda r: r.choice([str(r.randint(0, 99)), repr(r.choice(WORDS))])),
    "const": ("def f(x):\n    return {k}", lambda r: str(r.randint(0, 9))),
    "first": ("def f(nums):\n    return nums[0]", lambda r: repr([r.randint(0, 9) for _ in range(3)])),
    "add": ("def f(x):\n    return x + {k}", lambda r: str(r.randint(0, 9))),
    "sub": ("def f(x):\n    return x - {k}", lambda r: str(r.randint(10, 19))),
    "mul": ("def f(x):\n    return x * {k}", lambda r: str(r.randint(1, 5))),
    "index": ("def f(nums):\n    return nums[{i}]", lambda r: repr([r.randint(0, 9) for _ in range(3)])),
    "last": ("def f(nums):\n    return nums[-1]", lambda r: repr([r.randint(0, 9) for _ in range(r.randint(2, 4))])),
    "length": ("def f(nums):\n    return len(nums)", lambda r: repr([r.randint(0, 9) for _ in range(r.randint(1, 5))])),
    "max": ("def f(nums):\n    return max(nums)", lambda r: repr([r.randint(0, 9) for _ in range(3)])),
    "upper": ("def f(s):\n    return s.upper()", lambda r: repr(r.choice(WORDS))),
    "concat": ("def f(s):\n    return s + '{c}'", lambda r: repr(r.choice(WORDS))),
    "append": ("def f(nums):\n    return nums + [{k}]", lambda r: repr([r.randint(0, 9) for _ in range(2)])),
}

def _render(name: str, rng: random.Random) -> tuple[str, str]:
    template, arg = TEMPLATES[name]
    program = template.format(k=rng.randint(1, 9), i=rng.randint(0, 2), c=rng.choice("xyz"))
    return program, arg(rng)


def _output(program: str, arg: str) -> str:
    ns: dict = {}
    exec(program, ns)  # noqa: S102 - our own template text, never model output
    return repr(ns["f"](eval(arg, {})))  # noqa: S307 - a literal we rendered with repr()


def easy_tasks(n: int, seed: int, task_type: str = "code_o", templates: list[str] | None = None,
               exclude: set[tuple[str, str]] | None = None) -> list[Task]:
    """``n`` distinct easy tasks of ``task_type`` (code_o or code_i), the same for the same arguments.
    ``exclude``: (program, input) pairs that must not appear (a training set, to keep held-out tasks apart)."""
    if task_type not in ("code_o", "code_i"):
        raise ValueError(f"easy tasks are code_o or code_i, not {task_type!r}")
    names = list(templates or TEMPLATES)
    unknown = [t for t in names if t not in TEMPLATES]
    if unknown:
        raise ValueError(f"unknown easy template(s) {unknown}; known: {', '.join(TEMPLATES)}")
    rng = random.Random(f"easy:{seed}")
    seen = set(exclude or ())
    out: list[Task] = []
    for _ in range(100 * n + 100):  # the families hold thousands of distinct tasks; this bound is never reached
        if len(out) == n:
            return out
        program, arg = _render(names[rng.randrange(len(names))], rng)
        if (program, arg) in seen:
            continue
        seen.add((program, arg))
        out.append(Task(type=task_type, program=program, inputs=[arg], outputs=[_output(program, arg)],
                        proposer="easy", step=0))
    raise ValueError(f"could not draw {n} distinct easy tasks from templates {names}")


def split_tasks(n_train: int, n_heldout: int, seed: int, task_type: str = "code_o") -> tuple[list[Task], list[Task]]:
    """A training set and a held-out set that share no (program, input)."""
    train = easy_tasks(n_train, seed, task_type)
    held = easy_tasks(n_heldout, seed + 1_000_003, task_type, exclude={(t.program, t.inputs[0]) for t in train})
    return train, held


# Held-out templates (bench/learns.py): a skeptic's held-out set shares no template with training. Two
# templates that can render the same program text (``first`` is ``index`` with i = 0) form one family and are held
# out together, so no held-out program can appear word for word in training.
BASE_SOLVES = ("identity", "const", "first", "index", "mul", "max")  # the base solves >= 25% of these (docstring)


def _programs(name: str) -> set[str]:
    template = TEMPLATES[name][0]
    return {template.format(k=k, i=i, c=c) for k in range(1, 10) for i in range(3) for c in "xyz"}


def template_families() -> dict[str, tuple[str, ...]]:
    """Family name ("first/index") -> its templates: the connected groups of templates whose program sets meet."""
    families: list[set[str]] = []
    for name in TEMPLATES:
        progs = _programs(name)
        touching = [f for f in families if any(progs & _programs(t) for t in f)]
        merged = {name}.union(*touching)
        families = [f for f in families if f not in touching] + [merged]
    ordered = [tuple(t for t in TEMPLATES if t in f) for f in families]
    return {"/".join(f): f for f in sorted(ordered, key=lambda f: list(TEMPLATES).index(f[0]))}


def family_of(program: str) -> str:
    """The family whose templates render ``program``; a ValueError for a program no template makes."""
    for family, names in template_families().items():
        if any(program in _programs(t) for t in names):
            return family
    raise ValueError(f"not an easy-template program: {program!r}")


def split_templates(seed: int, n_solvable: int = 2, n_other: int = 2) -> tuple[list[str], list[str]]:
    """(training templates, held-out templates) for ``seed``: ``n_solvable`` families drawn from those the base
    solves some of the time (:data:`BASE_SOLVES`) and ``n_other`` from the rest are held out, so the held-out set is
    neither all-copyable nor all-unsolved and training keeps templates of both kinds."""
    fams = template_families()
    solvable = [f for f, ts in fams.items() if any(t in BASE_SOLVES for t in ts)]
    other = [f for f in fams if f not in solvable]
    if not (0 <= n_solvable < len(solvable) and 0 <= n_other < len(other)) or n_solvable + n_other == 0:
        raise ValueError(f"hold out 0..{len(solvable) - 1} of {solvable} and 0..{len(other) - 1} of {other}, "
                         f"at least one in all; got {n_solvable} and {n_other}")
    rng = random.Random(f"easy-split:{seed}")
    held_f = rng.sample(solvable, n_solvable) + rng.sample(other, n_other)
    held = [t for f in held_f for t in fams[f]]
    return [t for t in TEMPLATES if t not in held], [t for t in TEMPLATES if t in held]


def copyable(task: Task) -> bool:
    """Whether the expected output is written in the prompt (program or input): solvable by copying a literal."""
    return task.outputs[0] in task.program or task.outputs[0] in task.inputs[0]


SEED_FILE = "seeds/easy_seed_io.jsonl"  # under lorapop/data; selfplay.seed_files names it like AZR's files
SEED_FILE_TASKS, SEED_FILE_SEED = 64, 7  # the shipped file is easy_tasks(64, seed=7); tests check it still is


def seed_rows(n: int = SEED_FILE_TASKS, seed: int = SEED_FILE_SEED) -> list[dict]:
    """Easy tasks in AZR's seed-file layout (``snippet, input, output, imports``), for ``selfplay.seed_files``:
    one-line references a small base can imitate, so its proposals can reach valid tasks."""
    return [{"snippet": t.program, "input": t.inputs[0], "output": t.outputs[0], "imports": []}
            for t in easy_tasks(n, seed)]


if __name__ == "__main__":  # regenerate the shipped seed file: python -m lorapop.tasks.easy
    import json

    from lorapop.data import PACKAGE_DATA_DIR

    with open(PACKAGE_DATA_DIR / SEED_FILE, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in seed_rows())
