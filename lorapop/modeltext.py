"""The one parser of model-written text in the trainer: :func:`parse_text` and :func:`literal_of` (programs,
inputs, outputs, answers, through lorapop/tasks/values.py; the styles' shape checks, the yardsticks, the program
diagnostics, the eval harness's sanitiser through :func:`quiet_parse`).

Both are total: whatever a text makes ``ast.parse`` or ``ast.literal_eval`` raise (``OverflowError`` from
``"1"*320 + "+1j"``, an int past a float's range added to a complex; ``MemoryError``, ``RecursionError``, anything
else) is :class:`NotLiteral`, that one text's failure, never the step's or another candidate's.

They print nothing. The warnings a parse would print (``SyntaxWarning`` for ``1if`` or ``0x1for``,
``DeprecationWarning`` for an invalid escape such as ``'\\d'``) are compile-time warnings, which the warnings module
never deduplicates: a reply full of them wrote tens of kilobytes to the trainer's log at every parse. Every parse of
model text is given one file name, :data:`MODEL_TEXT`, and one filter ignores whatever warnings come from that
"module": thread-safe (no filter is changed per call, as ``warnings.catch_warnings`` would; validation runs in
threads) and blind to every warning of the trainer's own code. The filter is put back in first place whenever
something installed another in front of it (``-W error``, a test harness).
"""

from __future__ import annotations

import ast
import re
import warnings
from typing import Any

MODEL_TEXT = "<model-text>"  # the file name model-written text is parsed under: its warnings are ignored by it


class NotLiteral(ValueError):
    """The text is not one Python literal within the limits (or, from :func:`parse_text`, no Python at all);
    ``reason`` is ``not_literal`` or ``output_too_long``."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


_QUIET: list = []  # the filter entry installed by _quiet, to see at a glance whether it still comes first


def _quiet() -> None:
    """Put the filter that ignores every warning of :data:`MODEL_TEXT` first among the warning filters, where a filter
    installed later (``-W error``, a test harness's ``always``) would otherwise win over it."""
    if _QUIET and warnings.filters and warnings.filters[0] is _QUIET[0]:
        return
    warnings.filterwarnings("ignore", module=re.escape(MODEL_TEXT) + r"\Z")
    _QUIET[:] = warnings.filters[:1]


def quiet_parse(text: str, mode: str = "exec") -> ast.AST:
    """``ast.parse`` of model-written ``text`` that prints no warning; raises what ``ast.parse`` raises (for a caller
    that reads a ``SyntaxError``'s position, and must then catch every exception itself)."""
    _quiet()
    return ast.parse(text, filename=MODEL_TEXT, mode=mode)


def parse_text(text: str, mode: str = "exec") -> ast.AST:
    """``ast.parse`` of model-written ``text``, total: raises :class:`NotLiteral` (reason ``not_literal``, the
    exception's name and message as detail) for anything the parse raises, and prints no warning."""
    try:
        return quiet_parse(text, mode)
    except Exception as exc:  # noqa: BLE001 - whatever model text causes is that text's failure
        raise NotLiteral("not_literal", _why(exc, text)) from None


def literal_of(node: ast.AST) -> Any:
    """``ast.literal_eval`` of a node :func:`parse_text` gave, total as it is: raises :class:`NotLiteral` for
    anything the evaluation raises (``OverflowError``: an int past a float's range added to a complex). A string is
    parsed first, by :func:`parse_text`."""
    if isinstance(node, str):
        node = parse_text(node.strip(), mode="eval").body
    try:
        return ast.literal_eval(node)
    except Exception as exc:  # noqa: BLE001 - as parse_text
        raise NotLiteral("not_literal", _why(exc, "")) from None


def _why(exc: BaseException, text: str) -> str:
    try:
        msg = str(exc)[:120]
    except Exception:  # noqa: BLE001 - an exception whose str itself fails
        msg = ""
    return f"{type(exc).__name__}: {msg or text[:80]}"[:200]
