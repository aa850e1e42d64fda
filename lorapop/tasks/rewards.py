"""Rewards of docs/METHOD.md, Rewards.

Two readings of AZR's teacher penalties (``selfplay.reward_reading``), because its code and its paper disagree: the
paper's eq. 6 pays a valid proposal nobody learns from 0, an invalid one -0.5 and only a format error -1; AZR's code
(``reward_managers.py``) pays the first -0.5 and every parse or validity failure -1."""

from __future__ import annotations

from lorapop.tasks.base import Invalid, Outcome, ParseError

STUDENT_CORRECT, STUDENT_WRONG, FORMAT_ERROR, INVALID_TASK = 1.0, -0.5, -1.0, -0.5
READINGS = ("azr_paper", "azr_code")
# azr_code: what AZR's code pays in place of the two paper values above
CODE_INVALID_TASK, CODE_UNPAID_VALID = -1.0, -0.5


def student_reward(outcome: Outcome | ParseError) -> float:
    if isinstance(outcome, ParseError) or outcome.status == "format_error":
        return FORMAT_ERROR
    if outcome.status == "void":  # no verdict (the task did not reproduce): neither paid nor penalised
        return 0.0
    return STUDENT_CORRECT if outcome.correct else STUDENT_WRONG


def teacher_reward(result, solve_rate: float | None = None, mode: str = "adversarial",
                   reading: str = "azr_paper") -> float:
    """`result` is the ParseError / Invalid / Task of a proposal; `solve_rate` the matched student's rate on it."""
    if reading not in READINGS:
        raise ValueError(f"unknown reward reading {reading!r} ({' | '.join(READINGS)})")
    if isinstance(result, ParseError):
        return FORMAT_ERROR
    if isinstance(result, Invalid):
        return CODE_INVALID_TASK if reading == "azr_code" else INVALID_TASK
    if solve_rate is None:
        raise ValueError("a valid task needs the matched student's solve rate")
    s = float(solve_rate)
    if mode == "adversarial":
        r = 1.0 - s
    elif mode == "learnability":
        r = 1.0 - s if 0.0 < s < 1.0 else 0.0
    else:
        raise ValueError(f"unknown teacher_reward mode {mode!r} (adversarial | learnability)")
    # AZR's code: `r if r > 0 else -0.5`, which for learnability is its always/never-solved case; adversarial pays
    # nothing only when the student always solves, and gets the same penalty there
    return CODE_UNPAID_VALID if reading == "azr_code" and r <= 0.0 else r
