"""The operator registry (docs/METHOD.md, Operators) and :func:`make_child`.

Adapters are the engine's ``dict[str, (A (r, d_in), B (d_out, r))]`` with ``dW = scaling * B A``. Every operator
keeps module keys, rank, shapes and dtype, never forms a d_out x d_in matrix, does its linear algebra in float32
(QR-route SVD, :mod:`lorapop.evolve.svd`), draws all randomness from the explicit ``torch.Generator`` it is given,
and never modifies its parents.

==== ============================ =========== ======== ========= =============================================
id   name                         kind        acts on  parents   defaults
==== ============================ =========== ======== ========= =============================================
M1   svd_structured               mutation    dW       1         eps 0.1
M2   layer_selective_gaussian     mutation    factors  1         eps 0.1, fraction 1/3
M3   component_masking            mutation    dW       1         fraction 0.3
M4   full_gaussian                mutation    factors  1         eps 0.15
M5   neftune_style                mutation    factors  1         alpha_n 10
X1   dare                         crossover   factors  >= 2      p 0.7
X2   layer_wise                   crossover   factors  >= 2
X3   svd_subspace                 crossover   dW       2         k ~ U{1..r-1}
X4   extrapolative                crossover   factors  2         eta ~ U(1, 1.5)
X5   xes                          crossover   factors  >= 2 even lr 1 (needs fitness)
--   average                      crossover   factors  >= 2
--   svd_merge                    crossover   dW       >= 2
--   clone                        replacement factors  1
==== ============================ =========== ======== ========= =============================================
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lorapop.evolve import crossovers as X
from lorapop.evolve import mutations as M
from lorapop.evolve._common import Adapter, check_adapters


@dataclass(frozen=True)
class Operator:
    """One registered operator.

    ``fn(parents, *, generator, scaling, fitness=None, log=None, **params) -> child``; ``log``, when given a dict,
    receives values drawn or derived during the call (eta, k, chosen modules...), which :func:`make_child` adds to
    the lineage record. ``n_parents``: 1, 2, or -1 for "any number >= 2".
    """

    name: str
    id: str | None
    kind: str  # "mutation" | "crossover" | "replacement"
    acts_on: str  # "factors" | "dW"
    n_parents: int
    fn: Callable[..., dict]
    defaults: dict[str, float] = field(default_factory=dict)
    needs_fitness: bool = False
    keeps_function: str = "exact"  # "exact" | "expectation"

    def param_names(self) -> set[str]:
        """Keyword parameters ``fn`` accepts beyond the common ones (the overridable ones)."""
        common = {"generator", "scaling", "fitness", "log"}
        sig = inspect.signature(self.fn)
        return {n for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY and n not in common}


OPERATORS: dict[str, Operator] = {}


def _register(op: Operator) -> None:
    OPERATORS[op.name] = op


_register(Operator("svd_structured", "M1", "mutation", "dW", 1, M.svd_structured, {"eps": 0.1}))  # M1
_register(Operator("layer_selective_gaussian", "M2", "mutation", "factors", 1, M.layer_selective_gaussian,
                   {"eps": 0.1, "fraction": 1 / 3}))  # M2
_register(Operator("component_masking", "M3", "mutation", "dW", 1, M.component_masking, {"fraction": 0.3}))  # M3
_register(Operator("full_gaussian", "M4", "mutation", "factors", 1, M.full_gaussian, {"eps": 0.15}))  # M4
_register(Operator("neftune_style", "M5", "mutation", "factors", 1, M.neftune_style, {"alpha_n": 10.0}))  # M5
_register(Operator("dare", "X1", "crossover", "factors", -1, X.dare, {"p": 0.7},
                   keeps_function="expectation"))  # X1
_register(Operator("layer_wise", "X2", "crossover", "factors", -1, X.layer_wise, {}))  # X2
_register(Operator("svd_subspace", "X3", "crossover", "dW", 2, X.svd_subspace, {}))  # X3
_register(Operator("extrapolative", "X4", "crossover", "factors", 2, X.extrapolative,
                   {"eta_min": 1.0, "eta_max": 1.5}))  # X4
_register(Operator("xes", "X5", "crossover", "factors", -1, X.xes, {"lr": 1.0}, needs_fitness=True))  # X5
_register(Operator("average", None, "crossover", "factors", -1, X.average, {}))
_register(Operator("svd_merge", None, "crossover", "dW", -1, X.svd_merge, {}))
_register(Operator("clone", None, "replacement", "factors", 1, X.clone, {}))


def get_operator(name: str) -> Operator:
    try:
        return OPERATORS[name]
    except KeyError:
        raise ValueError(f"unknown operator '{name}'; known: {', '.join(OPERATORS)}") from None


def check_params(op_name: str, params: Mapping[str, Any] | None) -> None:
    """Raise ValueError for a parameter the operator does not take."""
    op = get_operator(op_name)
    allowed = op.param_names()
    for key in params or {}:
        if key not in allowed:
            raise ValueError(f"operator '{op_name}' has no parameter '{key}'; it takes: "
                             f"{', '.join(sorted(allowed)) or 'none'}")


def _plain(v: Any) -> Any:
    """JSON-friendly copy of a parameter value (tensors and numpy scalars become Python numbers/lists)."""
    if isinstance(v, torch.Tensor):
        return v.tolist()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if hasattr(v, "item"):
        return v.item()
    return v


def make_child(op_name: str, parents: Sequence[Adapter], *, generator: torch.Generator, scaling: float,
               fitness: Sequence[float] | None = None, params: Mapping[str, Any] | None = None
               ) -> tuple[Adapter, dict[str, Any]]:
    """Make one child with operator ``op_name``; returns ``(child, record)``.

    ``record = {"operator", "id", "kind", "acts_on", "n_parents", "params"}`` where ``params`` holds every parameter
    actually used: the defaults, the overrides in ``params``, and what was drawn (eta, k, ...), ready for a lineage
    record. Parents must share module keys, shapes and dtype; they are not modified. A crossover given a single
    parent, a wrong parent count, a missing fitness where needed or an unknown parameter raise ValueError.
    """
    op = get_operator(op_name)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"make_child: generator must be a torch.Generator, got {type(generator).__name__}")
    parents = list(parents)
    n = len(parents)
    if op.n_parents == 1 and n != 1:
        raise ValueError(f"operator '{op.name}' ({op.kind}) takes exactly 1 parent, got {n}")
    if op.n_parents == 2 and n != 2:
        raise ValueError(f"crossover '{op.name}' takes exactly 2 parents, got {n}")
    if op.n_parents == -1 and n < 2:
        raise ValueError(f"crossover '{op.name}' needs at least 2 parents, got {n}")
    check_adapters(parents)
    if fitness is not None:
        fitness = [float(f) for f in fitness]
        if len(fitness) != n or not all(math.isfinite(f) for f in fitness):
            raise ValueError(f"make_child: need {n} finite fitness values, got {fitness}")
    if op.needs_fitness and fitness is None:
        raise ValueError(f"operator '{op.name}' needs fitness (one value per parent)")
    check_params(op.name, params)
    used = {**op.defaults, **(params or {})}
    log: dict[str, Any] = {}
    child = op.fn(parents, generator=generator, scaling=scaling, fitness=fitness, log=log, **used)
    record = {"operator": op.name, "id": op.id, "kind": op.kind, "acts_on": op.acts_on, "n_parents": n,
              "params": {k: _plain(v) for k, v in {**used, **log}.items()}}
    return child, record
