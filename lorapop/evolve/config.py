"""Configuration of population-based training: which operators, with what weights and parameters, and when."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lorapop.configlib import ConfigError, check_fields, doc

# Default mix: three mutations and three crossovers, equal weights, from what each operator's child of two trained
# parents computes (docs/METHOD.md, "What a child computes, and the default mix"; bench/operator_children.py). In:
# M1, M2, M4 (children 0.41, 0.08, 0.21 of the parent's dW away from it), X2 and X3 (children made of whole modules or
# whole singular components of the parents, as far from the parents' mean dW as a parent is) and svd_merge (the
# child closest to the parents' mean, and to each parent). Left at 0: average (dominated by svd_merge on every
# distance: its cross terms B_i A_j), M3 (drops 30% of the spectrum: 0.57), M5 (A-only noise larger than a trained
# A: 2.46), X1 DARE (keeps 30% of factor elements: its child is right only on average, 1.9 away in one draw), X4
# (steps away from both parents), X5 (with two parents the reference's weights give the good parent: a clone) and
# clone (PBT's plain exploit: an exact copy adds no diversity). Turn any of them on by weight.
DEFAULT_OPERATORS: dict[str, float] = {
    "svd_structured": 1.0,
    "layer_selective_gaussian": 1.0,
    "full_gaussian": 1.0,
    "layer_wise": 1.0,
    "svd_subspace": 1.0,
    "svd_merge": 1.0,
}


@dataclass
class EvolveConfig:
    operators: dict[str, float] = doc(
        DEFAULT_OPERATORS, "operator name -> weight; a child's operator is drawn with probability weight/sum. Names: "
                           "svd_structured (M1), layer_selective_gaussian (M2), component_masking (M3), full_gaussian "
                           "(M4), neftune_style (M5), dare (X1), layer_wise (X2), svd_subspace (X3), extrapolative "
                           "(X4), xes (X5), average, svd_merge, clone. Default: M1, M2, M4, X2, X3, svd_merge at 1.0")
    params: dict[str, dict[str, float]] = doc(
        {}, "per-operator parameter overrides, e.g. {full_gaussian: {eps: 0.05}, dare: {p: 0.5}}; unset parameters "
            "keep the defaults")
    perturbation_interval: int = doc(
        20, "steps between PBT rounds (Ray Tune's name): evolve at steps that are multiples of it, once "
            "burn_in_period has passed", ge=1)
    burn_in_period: int = doc(
        20, "no replacement before this step (Ray Tune's name); with the defaults the first round is at step 20", ge=0)
    min_rated_matches: int = doc(
        10, "a member takes part in a PBT round (may be replaced or chosen as a parent) only once it has played this "
            "many rated matches since it was born; ratings that never moved cannot tell members apart (Ray Tune's "
            "PBT likewise only ranks trials with real results). A role left with fewer than 2 such members skips the "
            "round; skips are logged (evolve/too_few_matches). 0 turns it off", ge=0)
    quantile_fraction: float = doc(
        0.25, "fraction of each role replaced per round (bottom) and used as parents (top), Ray Tune's rule: "
              "ceil(n * fraction), at least 1, at most n // 2", gt=0, le=0.5)

    def validate(self) -> None:
        """Raise ConfigError naming the field (``evolve.<field>``); called by the config loader and by the planner."""
        from lorapop.evolve.operators import OPERATORS, check_params

        check_fields(self, "evolve")
        if not self.operators:
            raise ConfigError("evolve.operators: expected a non-empty mapping of operator name to weight")
        for name, w in self.operators.items():
            if name not in OPERATORS:
                raise ConfigError(f"evolve.operators: unknown operator '{name}'; known: {', '.join(OPERATORS)}")
            if not math.isfinite(w):
                raise ConfigError(f"evolve.operators.{name}: weight must be a finite number, got {w!r}")
            if w < 0:
                raise ConfigError(f"evolve.operators.{name}: weight must be >= 0, got {w}")
        if sum(self.operators.values()) <= 0:
            raise ConfigError("evolve.operators: weights must sum to a positive number, got "
                              f"{sum(self.operators.values())}")
        for name, over in self.params.items():
            if name not in OPERATORS:
                raise ConfigError(f"evolve.params: unknown operator '{name}'; known: {', '.join(OPERATORS)}")
            try:
                check_params(name, over)
            except ValueError as e:
                raise ConfigError(f"evolve.params.{name}: {e}") from None


# The strength knob of each operator that has one (retention's "stronger setting"): the parameters that set how far a
# child moves from its parent, and how a factor k strengthens them. "mul": the value times k; "mul_cap1": times k, at
# most 1 (a share of components); "keep": a drop probability p whose kept share 1 - p is divided by k; "past1": an
# extrapolation coefficient eta whose step past the better parent, eta - 1, is multiplied by k. layer_wise,
# svd_subspace, average, svd_merge and clone have no knob: what they take from each parent is fixed.
STRENGTH_KNOBS: dict[str, dict[str, str]] = {
    "svd_structured": {"eps": "mul"},
    "layer_selective_gaussian": {"eps": "mul"},
    "component_masking": {"fraction": "mul_cap1"},
    "full_gaussian": {"eps": "mul"},
    "neftune_style": {"alpha_n": "mul"},
    "dare": {"p": "keep"},
    "extrapolative": {"eta_min": "past1", "eta_max": "past1"},
    "xes": {"lr": "mul"},
}


def scaled_params(name: str, factor: float, params: dict[str, float] | None = None) -> dict[str, float]:
    """``name``'s parameters (its registered defaults, then ``params``) with its strength knob turned up ``factor``
    times (:data:`STRENGTH_KNOBS`); ValueError for an operator without a knob or a factor <= 0."""
    from lorapop.evolve.operators import get_operator

    op = get_operator(name)
    if name not in STRENGTH_KNOBS:
        raise ValueError(f"operator '{name}' has no strength knob to scale; these do: {', '.join(STRENGTH_KNOBS)}")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        raise ValueError(f"strength factor: must be a number > 0, got {factor!r}")
    base = {**op.defaults, **(params or {})}
    out = {}
    for key, how in STRENGTH_KNOBS[name].items():
        v = float(base[key])
        out[key] = {"mul": v * factor, "mul_cap1": min(1.0, v * factor), "keep": 1 - (1 - v) / factor,
                    "past1": 1 + (v - 1) * factor}[how]
    return {**base, **out}
