"""Prioritized fictitious self-play (PFSP) matchmaking (docs/METHOD.md, Matchmaking).

Each teacher draws one student, with replacement, with probability proportional to the PFSP weight
``f(p) + floor``, where ``p`` is TrueSkill's probability that the student beats the teacher and ``f(p) = 4 p (1 - p)``
is AlphaStar's ``f_var`` (scaled to peak at 1, the scale of ``floor``): near-balanced matches are preferred, and
``floor`` keeps every student drawable. Draws are independent (with replacement) in every configuration, so a teacher
is never left the one student the others did not take; several teachers may draw the same student and a student may
be drawn by none (its work is then topped up from the buffer: lorapop/train/stages.py ``solve_jobs``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence


def pfsp_weight(p: float) -> float:
    """AlphaStar's ``f_var(p) = p (1 - p)``, times 4 so a balanced match weighs 1."""
    return 4.0 * p * (1.0 - p)


def pfsp_probabilities(teacher: str, students: Sequence[str], win_probability: Callable[[str, str], float],
                       floor: float) -> list[float]:
    """``win_probability(student, teacher)``: the chance the student beats the teacher."""
    weights = [pfsp_weight(win_probability(s, teacher)) + floor for s in students]
    total = sum(weights)
    if total <= 0:  # floor 0 and every match certain: fall back to uniform rather than divide by zero
        return [1.0 / len(students)] * len(students)
    return [w / total for w in weights]


def matchmake(teachers: Sequence[str], students: Sequence[str], win_probability: Callable[[str, str], float],
              floor: float, rng: random.Random) -> dict[str, str]:
    """Return ``{teacher_id: student_id}``, each teacher's student drawn independently (with replacement)."""
    if not teachers or not students:
        raise ValueError("matchmaking needs at least one teacher and one student")
    pairs = {}
    for t in teachers:
        probs = pfsp_probabilities(t, students, win_probability, floor)
        pairs[t] = rng.choices(list(students), weights=probs, k=1)[0]
    return pairs
