"""TrueSkill ratings in one rating space shared by teachers and students (the game is zero-sum).

Every (valid task, matched student) pair is one 1v1 match: the student wins when it solves at least half of its
samples, else the teacher wins (docs/METHOD.md, Ratings). Fitness is TrueSkill's ``expose`` (mu - 3 sigma), compared
within a role only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import trueskill


@dataclass
class MatchResult:
    teacher: str
    student: str
    student_won: bool


class Ratings:
    def __init__(self, mu: float = 25.0, sigma: float = 25.0 / 3, beta: float = 25.0 / 6, tau: float = 25.0 / 300,
                 draw_probability: float = 0.0):
        self.env = trueskill.TrueSkill(mu=mu, sigma=sigma, beta=beta, tau=tau, draw_probability=draw_probability,
                                       backend=None)
        self.ratings: dict[str, trueskill.Rating] = {}
        # rated matches per member since it was added: PBT only judges members with enough of them
        self.n_matches: dict[str, int] = {}

    def add(self, member_id: str, mu: float | None = None) -> None:
        """A new member starts at the prior (or at ``mu``, e.g. its parents' mean) with the prior sigma."""
        self.ratings[member_id] = self.env.create_rating(mu=self.env.mu if mu is None else mu)
        self.n_matches[member_id] = 0

    def mu(self, member_id: str) -> float:
        return self.ratings[member_id].mu

    def sigma(self, member_id: str) -> float:
        return self.ratings[member_id].sigma

    def expose(self, member_id: str) -> float:
        return self.env.expose(self.ratings[member_id])

    def quality(self, a: str, b: str) -> float:
        return trueskill.quality_1vs1(self.ratings[a], self.ratings[b], env=self.env)

    def win_probability(self, a: str, b: str) -> float:
        """P(a beats b) = Phi((mu_a - mu_b) / sqrt(2 beta^2 + sigma_a^2 + sigma_b^2)), TrueSkill's 1v1 model."""
        ra, rb = self.ratings[a], self.ratings[b]
        denom = math.sqrt(2 * self.env.beta ** 2 + ra.sigma ** 2 + rb.sigma ** 2)
        return 0.5 * (1.0 + math.erf((ra.mu - rb.mu) / (denom * math.sqrt(2.0))))

    def record(self, match: MatchResult) -> None:
        t, s = self.ratings[match.teacher], self.ratings[match.student]
        if match.student_won:
            s, t = trueskill.rate_1vs1(s, t, env=self.env)
        else:
            t, s = trueskill.rate_1vs1(t, s, env=self.env)
        self.ratings[match.teacher], self.ratings[match.student] = t, s
        for k in (match.teacher, match.student):
            self.n_matches[k] = self.n_matches.get(k, 0) + 1

    def forget(self, keep: set[str]) -> None:
        """Drop every member not in ``keep`` (the live ones): a replaced member's rating was logged up to its last
        step and nothing reads it again, so a long run's table stays the population's size."""
        for k in [k for k in self.ratings if k not in keep]:
            del self.ratings[k]
            self.n_matches.pop(k, None)

    def matches(self, member_id: str) -> int:
        """Rated matches the member has played since it was added."""
        return self.n_matches.get(member_id, 0)

    def state_dict(self) -> dict:
        return {k: [r.mu, r.sigma, self.matches(k)] for k, r in self.ratings.items()}

    def load_state_dict(self, state: dict) -> None:
        """Reads ``[mu, sigma, n_matches]``; checkpoints from before match counting hold ``[mu, sigma]``, read as
        0 matches: PBT then waits for fresh evidence rather than trusting an unknown count."""
        self.ratings = {k: self.env.create_rating(mu=v[0], sigma=v[1]) for k, v in state.items()}
        self.n_matches = {k: int(v[2]) if len(v) > 2 else 0 for k, v in state.items()}
