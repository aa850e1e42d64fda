"""pass@k from n samples per problem: the unbiased estimator of Chen et al. 2021 (Evaluating Large Language Models
Trained on Code, eq. 1 and its numpy form), ``1 - C(n-c, k) / C(n, k)`` averaged over problems.

The product form ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` avoids the huge binomials (C(200, 100) overflows a float).
"""

from __future__ import annotations

import numpy as np

from lorapop.configlib import ConfigError


class PassKError(ConfigError):
    """A k that the samples cannot estimate (a config error: ``--k`` against ``--samples``)."""


def parse_ks(text: str | None, n: int) -> list[int]:
    """``"1,5,10"`` -> ``[1, 5, 10]``; every k must be in 1..n. None: the ones of 1, 5, 10 that n allows."""
    if text is None or not str(text).strip():
        return [k for k in (1, 5, 10) if k <= n]
    try:
        ks = sorted({int(x) for x in str(text).split(",") if x.strip()})
    except ValueError:
        raise PassKError(f"--k: expected comma-separated integers such as 1,5,10, got {text!r}") from None
    if not ks or ks[0] < 1:
        raise PassKError(f"--k: every k must be at least 1, got {text!r}")
    if ks[-1] > n:
        raise PassKError(f"--k: pass@{ks[-1]} needs at least {ks[-1]} samples per problem, but --samples is {n}; "
                         f"raise --samples to {ks[-1]} or drop the k values above {n}")
    return ks


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of k samples drawn without replacement from n, c of them correct, is
    correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise PassKError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(n: int, correct: list[int], k: int) -> float:
    """pass@k of a benchmark: the estimator averaged over its problems (``correct``: c per problem)."""
    return sum(pass_at_k(n, c, k) for c in correct) / len(correct)
