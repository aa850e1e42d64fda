"""Reference tasks for ``selfplay.proposal_style: expression`` (the cpu_dynamics configs): ``def f(x): return
<expr>`` on one integer, at three levels of nesting, so a teacher shown them sees that an expression can be made
harder and a student's answer is one integer.

``seeds/expr_seed_io.jsonl`` is :func:`seed_rows` (``python -m lorapop.tasks.expression_family`` rewrites it; a test
checks it still is). The expressions are written here, never by a model; outputs come from running them in this process.
"""

from __future__ import annotations

import random

from lorapop.tasks.base import Task

# level -> expressions over x; level = how many operations deep (AST depth of the body grows with it)
LEVELS: dict[int, tuple[str, ...]] = {
    1: ("x + 3", "x * 2", "x - 4", "x % 5", "x // 2", "-x", "abs(x)", "x * x"),
    2: ("x * 2 + 1", "(x + 3) * 2", "x % 4 + 1", "x // 3 - 2", "abs(x - 7)", "max(x, 5) * 2", "x * x - 1",
        "(x - 1) % 3"),
    3: ("(x * 3 + 1) % 7", "abs(x - 5) * 2 + 1", "(x // 2 + 3) * (x % 3)", "max(x * 2, 9) - x", "(x + 1) * (x - 1) // 4",
        "x % 3 * 4 + x // 5", "min(x, 6) * 3 - 2", "(2 * x - 3) % 5 + x"),
}
SEED_FILE = "seeds/expr_seed_io.jsonl"
SEED_FILE_SEED = 11


def program(expr: str) -> str:
    return f"def f(x):\n    return {expr}"


def seed_rows(seed: int = SEED_FILE_SEED) -> list[dict]:
    """Every expression of :data:`LEVELS` once, each on an integer input drawn in [0, 12], in AZR's seed layout."""
    rng = random.Random(f"expr:{seed}")
    rows = []
    for level in sorted(LEVELS):
        for expr in LEVELS[level]:
            x = rng.randint(0, 12)
            ns: dict = {}
            exec(program(expr), ns)  # noqa: S102 - our own expressions, never model output
            rows.append({"snippet": program(expr), "input": str(x), "output": repr(ns["f"](x)), "imports": []})
    return rows


# The capability probe's held-out family (lorapop/train/probe.py): level -> expression shapes; {a}, {b}, {c} are
# small constants drawn per task; a program of LEVELS (the references) is never a probe task.
PROBE_SHAPES: dict[int, tuple[str, ...]] = {
    1: ("x + {a}", "x - {a}", "x * {b}", "x % {b}", "x // {b}"),
    2: ("x * {b} + {a}", "(x + {a}) * {b}", "x % {b} + {a}", "abs(x - {c})", "x * x - {a}"),
    3: ("(x * {b} + {a}) % {c}", "abs(x - {c}) * {b} + {a}", "(x + {a}) * (x % {b})", "max(x * {b}, {c}) - x",
        "x % {b} * {a} + x // {b}"),
}


def probe_tasks(per_level: int, seed: int) -> list[tuple[int, Task]]:
    """(level, code_o task) pairs, ``per_level`` distinct tasks at each level of :data:`PROBE_SHAPES`, the same for
    the same arguments."""
    refs = {program(e) for exprs in LEVELS.values() for e in exprs}
    rng = random.Random(f"probe:{seed}")
    out: list[tuple[int, Task]] = []
    for level, shapes in sorted(PROBE_SHAPES.items()):
        seen: set[tuple[str, int]] = set()
        while len(seen) < per_level:
            expr = rng.choice(shapes).format(a=rng.randint(1, 9), b=rng.randint(2, 5), c=rng.randint(3, 11))
            x, prog = rng.randint(0, 12), program(expr)
            if prog in refs or (prog, x) in seen:
                continue
            seen.add((prog, x))
            ns: dict = {}
            exec(prog, ns)  # noqa: S102 - our own expressions, never model output
            out.append((level, Task(type="code_o", program=prog, inputs=[str(x)], outputs=[repr(ns["f"](x))],
                                    proposer="probe", step=0)))
    return out


if __name__ == "__main__":  # regenerate the shipped seed file
    import json

    from lorapop.data import PACKAGE_DATA_DIR

    with open(PACKAGE_DATA_DIR / SEED_FILE, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in seed_rows())
