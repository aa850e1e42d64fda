"""Sanitize a generated program the way EvalPlus's ``evalplus/sanitize.py`` does, with the standard ``ast`` module.

A model's answer often carries more than the solution: a usage line (``print(f(3))``), a top-level ``input()``, an
example ``assert`` that fails, an ``if __name__ == "__main__":`` block, or an answer cut off by ``max_new_tokens``.
Run as is, any of them fails a correct function. :func:`sanitize` keeps what the entry point needs:

1. the longest run of lines that parses (drops a truncated tail or prose around the code);
2. every top-level import (also those nested in a top-level ``try``/``if`` made only of imports);
3. the functions, classes and top-level assignments reachable from the entry point through the names they use,
   in their original order. Everything else at top level (calls, prints, asserts, ``__main__`` blocks) goes.

Where this differs from EvalPlus on purpose: EvalPlus drops a function that has no ``return`` statement, which
drops generator functions (``yield`` only) and fails Mbpp/630's own canonical solution; here a function is kept
whatever its body.
"""

from __future__ import annotations

import ast

from lorapop.modeltext import quiet_parse

# O(n^2) parses to find the longest valid block; above this many lines only prefixes and suffixes are tried.
_MAX_QUADRATIC_LINES = 200
# The search's work is bounded by characters parsed: each failed parse is charged the text up to the line where the
# parser stopped (a block that fails at its first line of prose costs that line, so chatty answers stay cheap), or
# all of it where the parser had to read to the end to know (a bracket never closed, a string never ended), and
# the search stops once PARSE_BUDGET_FACTOR times the text's length plus PARSE_FLOOR_CHARS is spent. A second bound
# counts every block whole (PARSE_BACKSTOP_FACTOR, PARSE_BACKSTOP_FLOOR_CHARS), whatever the parser reported. A
# text written so that every block fails only at its end ("(a +a" on each of 200 lines: 128 s before) thereby
# costs about a second. Past either bound the longest block found so far is kept (blocks are tried longest first).
PARSE_BUDGET_FACTOR = 64
PARSE_FLOOR_CHARS = 1 << 16
PARSE_BACKSTOP_FACTOR = 256
PARSE_BACKSTOP_FLOOR_CHARS = 4 << 20
_READ_TO_THE_END = ("never closed", "unterminated triple-quoted", "EOF", "incomplete input")


def _parse_cost(src: str) -> tuple[bool, int, int | None]:
    """(whether ``src`` parses, the characters charged for finding out, the line the parser stopped at when it did
    not need the rest of the text to fail, else None)."""
    try:
        quiet_parse(src)  # the candidate is model text: its SyntaxWarnings would flood the log
        return True, len(src), None
    except SyntaxError as e:  # IndentationError included
        line = max(e.lineno or 0, e.end_lineno or 0)
        if line <= 0 or any(w in str(e.msg) for w in _READ_TO_THE_END):
            return False, len(src), None
        end = -1
        for _ in range(line):
            end = src.find("\n", end + 1)
            if end < 0:
                return False, len(src), None
        return False, end + 1, line
    except Exception:  # noqa: BLE001 - ValueError (NUL), RecursionError, MemoryError, OverflowError: unparsable
        # ValueError: NUL bytes; RecursionError, MemoryError ("parser stack overflowed"): nesting past the parser's
        # depth, which a program cannot run with either
        return False, len(src), None


def _parses(src: str) -> bool:
    return _parse_cost(src)[0]


def longest_valid_block(code: str) -> str:
    """The contiguous run of lines that parses and has the most non-blank lines (EvalPlus's ``code_extract``)."""
    if _parses(code):
        return code
    lines = code.splitlines()
    n = len(lines)
    weight = [0] * (n + 1)
    for i, l in enumerate(lines):
        weight[i + 1] = weight[i] + bool(l.strip())
    if n > _MAX_QUADRATIC_LINES:
        spans = [(0, j) for j in range(n, 0, -1)] + [(i, n) for i in range(n)]
    else:
        spans = [(i, j) for i in range(n) for j in range(i + 1, n + 1)]
    best, best_w = "", 0
    budget = PARSE_BUDGET_FACTOR * len(code) + PARSE_FLOOR_CHARS
    backstop = PARSE_BACKSTOP_FACTOR * len(code) + PARSE_BACKSTOP_FLOOR_CHARS
    # A block that failed before its last line fails again with more lines after that one: the parser reads left to
    # right and stopped before them. dead[i]: every block from line i that ends past this line fails.
    dead: dict[int, int] = {}
    for i, j in sorted(spans, key=lambda s: -(weight[s[1]] - weight[s[0]])):
        w = weight[j] - weight[i]
        if w <= best_w:
            break  # sorted by weight: nothing later can beat the best found
        if j > dead.get(i, n):
            continue
        block = "\n".join(lines[i:j])
        backstop -= len(block)
        if budget < 0 or backstop < 0:
            break
        ok, cost, stop = _parse_cost(block)
        budget -= cost
        if ok:
            best, best_w = block, w
        elif stop is not None and stop < j - i:
            dead[i] = min(dead.get(i, n), i + stop)
    return best


def _is_import_only(node: ast.stmt) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return True
    if isinstance(node, ast.Try):
        body = node.body + [s for h in node.handlers for s in h.body] + node.orelse + node.finalbody
        return all(_is_import_only(s) or isinstance(s, ast.Pass) for s in body)
    return False


def _defined_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
        if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
    names = []
    for t in targets:
        names += [n.id for n in ast.walk(t) if isinstance(n, ast.Name)]
    return names


def _used_names(node: ast.AST) -> set[str]:
    """Global names a definition reads. A function's own parameters and local assignments are left out, so a
    parameter ``n`` does not pull in a top-level ``n = int(input())``."""
    loads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return loads
    a = node.args
    params = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x is not None}
    stores = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    declared = {name for n in ast.walk(node) if isinstance(n, ast.Global) for name in n.names}
    return loads - ((params | stores) - declared)


def sanitize(code: str, entry_point: str | None) -> str:
    """``code`` reduced to its imports and the definitions reachable from ``entry_point`` (all definitions when it
    is None or not defined, so that the harness reports the missing entry point rather than a syntax error)."""
    block = longest_valid_block(code)
    tree = quiet_parse(block)
    imports, defs = [], []  # defs: (node, names it defines)
    for node in tree.body:
        if _is_import_only(node):
            imports.append(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)):
            names = _defined_names(node)
            if names:
                defs.append((node, names))
    by_name: dict[str, list[int]] = {}
    for k, (_, names) in enumerate(defs):
        for n in names:
            by_name.setdefault(n, []).append(k)
    if entry_point and entry_point in by_name:
        keep: set[int] = set()
        todo = [entry_point]
        seen = set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            for k in by_name.get(name, ()):
                if k not in keep:
                    keep.add(k)
                    todo += _used_names(defs[k][0])
    else:
        keep = set(range(len(defs)))
    chosen = {id(n) for n in imports} | {id(defs[k][0]) for k in keep}
    lines = block.splitlines()
    out: list[str] = []
    last_end = 0
    for n in tree.body:
        if id(n) not in chosen:
            continue
        start = min([n.lineno] + [d.lineno for d in getattr(n, "decorator_list", [])])
        if start <= last_end:  # two statements on one line ("import a; x = 1"): the line is already in
            continue
        out += lines[start - 1:n.end_lineno]
        last_end = n.end_lineno
    return "\n".join(out) + "\n"
