"""Per-program descriptors of a proposed task (docs/METHOD.md, Diagnostics).

`program_descriptors(program, inputs)` returns a flat ``dict[str, float]``:

| key | meaning |
| --- | --- |
| ``ast_depth`` | depth of the module's AST (``Module`` is depth 1; ``def f(x): return x`` is 5, the ``Load`` of ``x`` counting) |
| ``cyclomatic`` | McCabe complexity from radon: the sum over every function and method (nested ones included) plus the module body's own decision points; at least 1 |
| ``loc`` | source lines of code (radon ``sloc``: no blank lines, no comment-only lines) |
| ``n_node_types`` | number of distinct AST node classes in the program (expression contexts such as ``Load`` excluded) |
| ``input_size`` | total characters of the inputs' canonical literal reprs, summed over the inputs (see `input_size`) |
| ``n_inputs`` | number of inputs |
| ``parse_ok`` | 1.0 when the program parsed; 0.0 when it did not, and then every other descriptor is 0.0 |

Never raises: junk programs and junk inputs give zeros plus ``parse_ok = 0.0`` rather than an exception, because a
diagnostics bug must not kill a training step.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from lorapop.modeltext import literal_of, quiet_parse

DESCRIPTOR_KEYS: tuple[str, ...] = ("ast_depth", "cyclomatic", "loc", "n_node_types", "input_size", "n_inputs",
                                    "parse_ok")

# Contexts and operator singletons are attached to almost every expression; counting them as "node types" would add
# the same constant to every program and hide the variety that the descriptor is meant to show.
_IGNORED_NODE_TYPES = (ast.expr_context, ast.boolop, ast.operator, ast.unaryop, ast.cmpop)


def ast_depth(tree: ast.AST) -> int:
    # Iterative so a pathologically nested program cannot hit the interpreter's recursion limit.
    best, stack = 0, [(tree, 1)]
    while stack:
        node, d = stack.pop()
        best = max(best, d)
        stack.extend((child, d + 1) for child in ast.iter_child_nodes(node))
    return best


def node_types(tree: ast.AST) -> set[str]:
    return {type(n).__name__ for n in ast.walk(tree) if not isinstance(n, _IGNORED_NODE_TYPES)}


def cyclomatic(program: str) -> int:
    from radon.visitors import ComplexityVisitor, Function

    v = ComplexityVisitor.from_ast(quiet_parse(program))  # radon's from_code would parse it aloud (its warnings)
    # radon's `blocks` lists methods both inside their class and flattened beside it: start from the top level only.
    total, stack = max(0, v.complexity - 1), list(v.functions) + list(v.classes)
    while stack:
        b = stack.pop()
        if isinstance(b, Function):
            total += b.complexity
            stack.extend(b.closures)
        else:  # a class: its methods and inner classes carry the complexity
            stack.extend(b.methods)
            stack.extend(b.inner_classes)
    return max(1, total)


def source_loc(program: str) -> int:
    from radon.raw import analyze

    return int(analyze(program).sloc)


def input_size(inputs: Iterable[str]) -> int:
    """Characters of each input's canonical repr, summed.

    An input is the literal argument text of one call, e.g. ``"[1, 2, 3], 'ab'"``. It is evaluated with
    ``ast.literal_eval`` and re-``repr``'d, so spacing and quoting style do not change the size; text that is not a
    literal counts with its stripped length instead.
    """
    total = 0
    for s in inputs:
        s = s if isinstance(s, str) else repr(s)
        try:
            total += len(repr(literal_of(s)))
        except Exception:  # noqa: BLE001 - junk input still has a size
            total += len(s.strip())
    return total


def program_descriptors(program: str, inputs: list[str] | None = None) -> dict[str, float]:
    inputs = list(inputs or [])
    out = dict.fromkeys(DESCRIPTOR_KEYS, 0.0)
    try:
        out["input_size"] = float(input_size(inputs))
        out["n_inputs"] = float(len(inputs))
    except Exception:  # noqa: BLE001
        pass
    try:
        tree = quiet_parse(program)
        depth, types = ast_depth(tree), node_types(tree)
        cc, loc = cyclomatic(program), source_loc(program)
    except Exception:  # noqa: BLE001 - SyntaxError, ValueError (null bytes), RecursionError, radon errors
        return out
    out.update(ast_depth=float(depth), cyclomatic=float(cc), loc=float(loc), n_node_types=float(len(types)),
               parse_ok=1.0)
    return out
