"""Verdicts decided in the trainer: model-written outputs and answers read as values and compared by trusted code.

A program being judged is written by a policy trained to win, so nothing it runs may reach the comparison that
judges it. Every run of model-written code (a teacher's program, a student's program, a teacher's program on a
student's input) returns only text, the ``repr`` of its result, as data; this module parses that text with a literal
parser (length and nesting capped, no name lookup, no call, no code of anyone's) and compares the values here, in the
trainer's process. The run can choose what text it returns, which is the same as choosing what it returns: it is
judged on exactly that.

Equality is AZR's (``eval(gold) == eval(answer)``) on the parsed values, which can only be ``None``, ``bool``,
``int``, ``float``, ``complex``, ``str``, ``bytes``, ``Ellipsis`` and tuples, lists, sets and dicts of them, so
``==`` is Python's own and no object of a program's can override it. What that means, written out:

* ``1 == 1.0 == True`` and ``-0.0 == 0.0``: as in AZR;
* sets compare as sets and dicts as mappings, whatever order their repr listed them in (a set of strings is printed
  in an order that depends on the hash seed; its value does not);
* ``nan`` cannot occur: no literal denotes it (``repr(float('nan'))`` is ``nan``, a name, so an output that is nan is
  not a literal and never a valid task); ``1e999`` parses to ``inf``, which no valid output is;
* tuples and lists differ (``(1, 2) != [1, 2]``), as in Python.

The same parser and limits read a teacher's output when the task is validated and when it is checked, so an output
that was valid when stored can always be compared later.

Every parse here goes through lorapop/modeltext.py, the one parser of model-written text, total and silent.
"""

from __future__ import annotations

import ast
from typing import Any

from lorapop.modeltext import NotLiteral, literal_of, parse_text

MAX_CALL_CHARS = 4000  # an argument list read by call_value (the checks cap inputs at 1000 before)
MAX_DEPTH = 64  # nesting of containers in one value; deeper is "not a literal" at validation and at checking


def _depth_ok(node: ast.AST) -> bool:
    stack = [(node, 0)]
    while stack:
        n, d = stack.pop()
        if d > MAX_DEPTH:
            return False
        stack.extend((c, d + 1) for c in ast.iter_child_nodes(n))
    return True


def literal_value(text: Any, max_chars: int) -> Any:
    """The value of ``text``, one Python literal of at most ``max_chars`` characters nested at most ``MAX_DEPTH``
    deep; raises :class:`NotLiteral` otherwise. Never evaluates anything but literal syntax."""
    if not isinstance(text, str) or not text.strip():
        raise NotLiteral("not_literal", "empty")
    if len(text) > max_chars:
        raise NotLiteral("output_too_long", f"{len(text)} chars > {max_chars}")
    tree = parse_text(text.strip(), mode="eval")
    if not _depth_ok(tree.body):
        raise NotLiteral("not_literal", f"nested more than {MAX_DEPTH} deep")
    return literal_of(tree.body)


def same_value(a: Any, b: Any) -> bool:
    """AZR's equality of two parsed literal values (see the module docstring)."""
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 # pragma: no cover - plain literal values, depth-capped
        return False


def same_text(gold: str, text: str | None, max_chars: int) -> bool:
    """Whether ``text`` (an answer or a run's output) denotes the same value as the stored ``gold``; text that is not
    a literal within ``max_chars`` never does."""
    if text is None:
        return False
    try:
        return same_value(literal_value(gold, max(max_chars, len(gold))), literal_value(text, max_chars))
    except NotLiteral:
        return False


def value_key(v: Any) -> Any:
    """A hashable key of a parsed literal value such that ``value_key(a) == value_key(b)`` exactly when ``a == b``
    (AZR's equality, :func:`same_value`): ``1``, ``1.0``, ``True`` and ``1+0j`` share one, as do ``0.0`` and ``-0.0``;
    sets and dicts compare whatever order the literal listed them in. Used wherever inputs must be told apart by value
    (duplicate inputs, the task buffer)."""
    if isinstance(v, (bool, int, float, complex)):
        c = complex(v) if not isinstance(v, int) else None
        if c is not None and c.imag != 0:
            return "c", value_key(c.real)[1], value_key(c.imag)[1]
        r = int(v) if c is None else c.real
        return "n", int(r) if isinstance(r, float) and r.is_integer() else r  # 1.0 == 1, -0.0 == 0
    if isinstance(v, (list, tuple)):
        return type(v).__name__, tuple(value_key(x) for x in v)
    if isinstance(v, (set, frozenset)):
        return "set", frozenset(value_key(x) for x in v)
    if isinstance(v, dict):
        return "dict", frozenset((value_key(k), value_key(x)) for k, x in v.items())
    return type(v).__name__, v  # str, bytes, None, Ellipsis


def _call(text: str) -> ast.Call:
    """The parsed ``f(text)`` of an argument list made of literals; raises :class:`NotLiteral` otherwise."""
    if not isinstance(text, str) or len(text) > MAX_CALL_CHARS:
        raise NotLiteral("not_literal", "not an argument list of at most %d chars" % MAX_CALL_CHARS)
    call = parse_text(f"f({text})", mode="eval").body
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "f"):
        raise NotLiteral("not_literal", "not a plain argument list")
    if not _depth_ok(call):
        raise NotLiteral("not_literal", f"nested more than {MAX_DEPTH} deep")
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        raise NotLiteral("not_literal", "unpacking in an argument list")
    for node in (*call.args, *(k.value for k in call.keywords)):
        literal_of(node)
    return call


def call_value(text: str) -> tuple[tuple, dict]:
    """The positional and keyword argument values of an argument list ``text`` (the inside of ``f(...)``), read by
    the literal parser alone; raises :class:`NotLiteral` when it is not one made of literals."""
    call = _call(text)
    return tuple(literal_of(a) for a in call.args), {k.arg: literal_of(k.value) for k in call.keywords}


def call_form(text: str) -> str:
    """The syntax tree of an argument list without its positions (``ast.dump``): equal for two spellings only when
    they differ in white space, redundant parentheses, or the spelling of one constant (``0x10`` and ``16``, ``'a'``
    and ``"a"``), so that the same code runs either way. Sets and dicts keep the order the text lists them in, and
    nothing is computed in this process: the order a set of strings iterates in depends on the hash seed of the
    process that builds it, which here is not the sandbox's. Raises :class:`NotLiteral` as :func:`call_value`."""
    return ast.dump(_call(text))


def call_key(text: str) -> Any:
    """:func:`value_key` of an argument list: equal for calls that pass equal values in the same positions and
    keywords."""
    args, kwargs = call_value(text)
    return tuple(value_key(a) for a in args), frozenset((k, value_key(v)) for k, v in kwargs.items())
