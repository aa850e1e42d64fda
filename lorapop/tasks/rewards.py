"""Rewards of docs/METHOD.md, Rewards."""

from __future__ import annotations

from lorapop.tasks.base import Invalid, Outcome, ParseError

STUDENT_CORRECT, STUDENT_WRONG, FORMAT_ERROR, INVALID_TASK = 1.0, -0.5, -1.0, -0.5


def student_reward(outcome: Outcome | ParseError) -> float:
    if isinstance(outcome, ParseError) or outcome.status == "format_error":
        return FORMAT_ERROR
    return STUDENT_CORRECT if outcome.correct else STUDENT_WRONG


def teacher_reward(result, solve_rate: float | None = None, mode: str = "adversarial") -> float:
    """`result` is the ParseError / Invalid / Task of a proposal; `solve_rate` the matched student's rate on it."""
    if isinstance(result, ParseError):
        return FORMAT_ERROR
    if isinstance(result, Invalid):
        return INVALID_TASK
    if solve_rate is None:
        raise ValueError("a valid task needs the matched student's solve rate")
    s = float(solve_rate)
    if mode == "adversarial":
        return 1.0 - s
    if mode == "learnability":
        return 1.0 - s if 0.0 < s < 1.0 else 0.0
    raise ValueError(f"unknown teacher_reward mode {mode!r} (adversarial | learnability)")
