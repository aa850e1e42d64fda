"""Prioritized fictitious self-play (PFSP) matchmaking (docs/METHOD.md, Matchmaking).

Each teacher draws one student with probability proportional to TrueSkill's 1v1 match quality plus ``floor``.
When there are as many teachers as students the draw is without replacement, so every student is matched exactly
once per step and gets the same amount of work; otherwise students are drawn with replacement.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence


def pfsp_probabilities(teacher: str, students: Sequence[str], quality: Callable[[str, str], float],
                       floor: float) -> list[float]:
    weights = [max(quality(teacher, s), 0.0) + floor for s in students]
    total = sum(weights)
    if total <= 0:  # floor 0 and every quality 0: fall back to uniform rather than divide by zero
        return [1.0 / len(students)] * len(students)
    return [w / total for w in weights]


def matchmake(teachers: Sequence[str], students: Sequence[str], quality: Callable[[str, str], float],
              floor: float, rng: random.Random) -> dict[str, str]:
    """Return ``{teacher_id: student_id}``."""
    if not teachers or not students:
        raise ValueError("matchmaking needs at least one teacher and one student")
    pairs: dict[str, str] = {}
    without_replacement = len(teachers) == len(students)
    order = list(teachers)
    rng.shuffle(order)  # who picks first must not favour a fixed teacher when drawing without replacement
    available = list(students)
    for t in order:
        pool = available if without_replacement else list(students)
        probs = pfsp_probabilities(t, pool, quality, floor)
        s = rng.choices(pool, weights=probs, k=1)[0]
        pairs[t] = s
        if without_replacement:
            available.remove(s)
    return {t: pairs[t] for t in teachers}
