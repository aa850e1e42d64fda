"""The task families of the registered learning experiment (bench/learns.py ``--design compute``,
docs/results/learning/REGISTRATION.md): families whose answer must be computed, and families whose answer is one of
several values shown on the page.

Why these families. The first learning experiment (lorapop/tasks/easy.py's templates) gained mostly on families
whose answer is written in the prompt, where a fixed rule (always the first element, copy the argument) scores as
much without reading the program; its one computing family that moved (``upper``) was 80 answers. So this design
separates the two questions:

* **compute** families: the answer is never written in the prompt (a task whose output text appears in its program
  or its argument is redrawn), so every rule that reads the page (first, last, largest, smallest element, copying
  the argument) scores 0. Drafted in the three kinds the question names: arithmetic, string transforms and
  compositions of two steps (:data:`CANDIDATES`: a first draft on two-digit numbers and words, a second on +1, x2
  and single letters, closer to what the base answered in easy.py). All were measured on the base before the
  experiment was registered; the registered ones (:data:`REGISTERED`) are those it answered right at least once
  (`succ`, `add1`, `sum2`, `first_add`): on a family whose reward is never positive TRR++ has nothing to reinforce,
  and no gain could be told from none. No string transform qualified.
* **page** families: the answer is one element of a shown list of distinct digits (``first``, ``last``, ``max``,
  ``min``, ``index``), so an answer can be read as the right shown value, another shown value, or neither: "which
  value to copy" is measured (:func:`read_answer`) rather than inferred.

Held-out inputs, not held-out families. Whole held-out families tested transfer of an operation the student never
trained, which a 135M base on 8 steps did not show for any computing family but one; the question here is whether
it learns to compute at all, beyond the rules. So every family is trained, and the held-out tasks use arguments that
never occur in training: per seed, one argument in three (a number, a word, a letter, a list) is held out
(:func:`heldout_arg`), so no held-out argument, hence no held-out (program, argument) pair, appears in any training
prompt (bench/learns.py counts it per seed).

The output is ``repr(f(arg))`` of the family's own trusted template text (never model-written), as in easy.py.
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from lorapop.tasks.base import Task

# 40 lowercase words of 3-5 letters, none a palindrome (``reverse`` of one would be on the page)
WORDS = ("cat", "dog", "sun", "map", "red", "box", "hat", "pen", "cup", "key", "lamp", "tree", "fish", "bird",
         "milk", "rain", "ship", "star", "wolf", "corn", "frog", "gold", "hill", "iron", "jam", "kite", "leaf",
         "moon", "nest", "oak", "pig", "rose", "salt", "toy", "vase", "wind", "yarn", "zinc", "bread", "cloud")


def _int(lo: int, hi: int) -> Callable[[random.Random], str]:
    return lambda r: str(r.randint(lo, hi))


def _word(r: random.Random) -> str:
    return repr(r.choice(WORDS))


def _digits(n: int) -> Callable[[random.Random], str]:
    """A list of ``n`` distinct digits: in a page family the right shown value is then one element, not several."""
    return lambda r: repr(r.sample(range(10), n))


@dataclass(frozen=True)
class Family:
    kind: str  # "compute" (answer never on the page) or "page" (answer one of the shown list's elements)
    group: str  # arithmetic, string, composition, selection
    template: str  # program text; {k} a small constant, {c} a letter, {i} an index, drawn per task
    arg: Callable[[random.Random], str]


LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _letter(r: random.Random) -> str:
    return repr(r.choice(LETTERS))


# Every family measured on the base before registering (docs/results/learning/REGISTRATION.md, "The measured signal");
# FAMILIES below is the registered subset.
CANDIDATES: dict[str, Family] = {
    # first draft: two-digit numbers, words; the base solved 1 of 384 answers on these (the signal measurement)
    "add": Family("compute", "arithmetic", "def f(x):\n    return x + {k}", _int(10, 59)),
    "sub": Family("compute", "arithmetic", "def f(x):\n    return x - {k}", _int(10, 59)),
    "mul": Family("compute", "arithmetic", "def f(x):\n    return x * {m}", _int(3, 20)),
    "sum": Family("compute", "arithmetic", "def f(nums):\n    return sum(nums)", _digits(3)),
    "upper": Family("compute", "string", "def f(s):\n    return s.upper()", _word),
    "reverse": Family("compute", "string", "def f(s):\n    return s[::-1]", _word),
    "repeat": Family("compute", "string", "def f(s):\n    return s * 2", _word),
    "concat": Family("compute", "string", "def f(s):\n    return s + '{c}'", _word),
    "add_mul": Family("compute", "composition", "def f(x):\n    return (x + {k}) * 2", _int(3, 30)),
    "upper_concat": Family("compute", "composition", "def f(s):\n    return s.upper() + '{c}'", _word),
    "first_add": Family("compute", "composition", "def f(nums):\n    return nums[0] + {k}", _digits(3)),
    "rev_upper": Family("compute", "composition", "def f(s):\n    return s[::-1].upper()", _word),
    # second draft: +1, -1, x2 on small numbers and single letters, closer to what the base answered in easy.py
    "succ": Family("compute", "arithmetic", "def f(x):\n    return x + 1", _int(1, 39)),
    "pred": Family("compute", "arithmetic", "def f(x):\n    return x - 1", _int(3, 39)),
    "add1": Family("compute", "arithmetic", "def f(x):\n    return x + {k}", _int(0, 19)),
    "double": Family("compute", "arithmetic", "def f(x):\n    return x * 2", _int(2, 39)),
    "sum2": Family("compute", "arithmetic", "def f(nums):\n    return sum(nums)", _digits(2)),
    "upper1": Family("compute", "string", "def f(s):\n    return s.upper()", _letter),
    "repeat1": Family("compute", "string", "def f(s):\n    return s * 2", _letter),
    "concat1": Family("compute", "string", "def f(s):\n    return s + '{c}'", _letter),
    "succ_double": Family("compute", "composition", "def f(x):\n    return (x + 1) * 2", _int(1, 39)),
    "first_succ": Family("compute", "composition", "def f(nums):\n    return nums[0] + 1", _digits(3)),
    "upper1_concat": Family("compute", "composition", "def f(s):\n    return s.upper() + '{c}'", _letter),
    "first": Family("page", "selection", "def f(nums):\n    return nums[0]", _digits(4)),
    "last": Family("page", "selection", "def f(nums):\n    return nums[-1]", _digits(4)),
    "max": Family("page", "selection", "def f(nums):\n    return max(nums)", _digits(4)),
    "min": Family("page", "selection", "def f(nums):\n    return min(nums)", _digits(4)),
    "index": Family("page", "selection", "def f(nums):\n    return nums[{i}]", _digits(4)),
}
# The registered families: the compute candidates the base solved at least once in the signal measurement (every
# other compute candidate: 0 of 32 answers, so no reward could ever be positive on it and no update could be told
# from none), and the five page families.
REGISTERED = ("succ", "add1", "sum2", "first_add", "first", "last", "max", "min", "index")
FAMILIES: dict[str, Family] = {f: CANDIDATES[f] for f in REGISTERED}
COMPUTE = tuple(f for f, v in FAMILIES.items() if v.kind == "compute")
PAGE = tuple(f for f, v in FAMILIES.items() if v.kind == "page")


def _render(name: str, rng: random.Random) -> tuple[str, str]:
    fam = CANDIDATES[name]
    program = fam.template.format(k=rng.randint(2, 9), m=rng.randint(2, 4), c=rng.choice("xyz"), i=rng.randint(1, 2))
    return program, fam.arg(rng)


def _output(program: str, arg: str) -> str:
    ns: dict = {}
    exec(program, ns)  # noqa: S102 - our own template text, never model output
    return repr(ns["f"](ast.literal_eval(arg)))


def on_page(output: str, program: str, arg: str) -> bool:
    """Whether the output is written in the prompt: its repr, or a string's bare text, inside the program or the
    argument (the student prompt shows nothing else with a digit or a task word in it)."""
    texts = {output}
    value = ast.literal_eval(output)
    if isinstance(value, str):
        texts.add(value)
    return any(t and (t in program or t in arg) for t in texts)


def heldout_arg(seed: int, arg: str) -> bool:
    """Whether ``arg`` is a held-out argument under ``seed``: one in three, the same for every family, so no held-out
    argument is ever shown in training. Exactly a third of :data:`WORDS`; one integer of each run of three
    (3-5, 6-8, ...), so every family's range keeps a third of its arguments; lists by a hash of (seed, list)."""
    value = ast.literal_eval(arg)
    rng = random.Random(f"compute-split:{seed}:{type(value).__name__}")
    if isinstance(value, str):
        pool = WORDS if value in WORDS else LETTERS
        return value in rng.sample(pool, len(pool) // 3)
    if isinstance(value, int):
        rng = random.Random(f"compute-split:{seed}:int:{value // 3}")
        return value % 3 == rng.randrange(3)
    return int(hashlib.sha1(f"compute-split:{seed}:{arg}".encode()).hexdigest(), 16) % 3 == 0


def family_of(program: str) -> str:
    """The family (of :data:`CANDIDATES`) whose template renders ``program``; a ValueError otherwise. Two candidates
    can render the same text (``add`` and ``add1``): the first listed is named, and no registered pair does."""
    for name, fam in {**FAMILIES, **CANDIDATES}.items():  # a registered family first: add1 before add
        for k in range(2, 10):
            for m in range(2, 5):
                for c in "xyz":
                    for i in (1, 2):
                        if fam.template.format(k=k, m=m, c=c, i=i) == program:
                            return name
    raise ValueError(f"not a compute-family program: {program!r}")


def compute_tasks(n: int, seed: int, families: tuple[str, ...] | list[str], *, heldout: bool,
                  split_seed: int | None = None, exclude: set[tuple[str, str]] | None = None) -> list[Task]:
    """``n`` distinct code_o tasks of ``families``, drawn in turn (each family gets an equal share while it has
    distinct tasks left; a family whose arguments run out, such as one letter upper-cased, leaves its turns to the
    others), with held-out (``heldout=True``) or training arguments of ``split_seed`` (default ``seed``). A compute
    task whose output is on the page is redrawn; ``exclude``: (program, argument) pairs that must not appear."""
    unknown = [f for f in families if f not in CANDIDATES]
    if unknown:
        raise ValueError(f"unknown compute families {unknown}; known: {', '.join(CANDIDATES)}")
    split = seed if split_seed is None else split_seed
    rng = random.Random(f"compute:{seed}:{heldout}")
    seen = set(exclude or ())
    out: list[Task] = []
    live = list(families)
    turn = 0
    while len(out) < n and live:
        name = live[turn % len(live)]
        for _ in range(500):  # every family here has a few dozen tasks at least; 500 misses mean it ran out
            program, arg = _render(name, rng)
            if (program, arg) in seen or heldout_arg(split, arg) != heldout:
                continue
            output = _output(program, arg)
            if CANDIDATES[name].kind == "compute" and on_page(output, program, arg):
                continue
            seen.add((program, arg))
            out.append(Task(type="code_o", program=program, inputs=[arg], outputs=[output], proposer="compute",
                            step=0))
            turn += 1
            break
        else:
            live.remove(name)
    if len(out) < n:
        raise ValueError(f"could not draw {n} distinct tasks of {list(families)}")
    return out


def shown_values(task: Task) -> list[str]:
    """The values a page task shows: the elements of its list argument and the integer constants of its program,
    each as a repr; the expected output is one of them."""
    values = [repr(v) for v in ast.literal_eval(task.inputs[0])] if task.inputs[0].startswith("[") else []
    body = task.program.split("return", 1)[1]
    values += [repr(int(c)) for c in re.findall(r"-?\d+", body)]
    return list(dict.fromkeys(values))


def read_answer(task: Task, answer_text: str) -> str:
    """How a page task's answer reads: ``right`` (the expected value), ``other_shown`` (another value the prompt
    shows), ``other`` (any other literal) or ``unreadable`` (no closed output block holding one literal)."""
    from lorapop.tasks import TASK_TYPES
    from lorapop.modeltext import NotLiteral
    from lorapop.tasks.values import literal_value, same_value

    got = TASK_TYPES["code_o"].parse_answer(answer_text)
    if not hasattr(got, "text"):
        return "unreadable"
    try:
        value = literal_value(got.text, 256)
    except NotLiteral:
        return "unreadable"
    if same_value(literal_value(task.outputs[0], 256), value):
        return "right"
    shown = [literal_value(s, 256) for s in shown_values(task)]
    return "other_shown" if any(same_value(s, value) for s in shown) else "other"
