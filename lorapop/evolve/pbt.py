"""PBT replacement (docs/METHOD.md, "Evolve"): who is replaced, by whose child, made by which operator.

Pure planning: :func:`plan_replacements` takes member descriptors (``id, slot, role, fitness``; fitness is TrueSkill's
expose ``mu - 3 sigma``, passed in as numbers) and a ``torch.Generator`` and returns a list of :class:`Replacement`.
No engine, no ratings. :func:`apply_plan` turns a plan into children with two callables (``get_adapter(slot)``,
``set_adapter(slot, adapter)``) and returns the parameters each child was made with; everything else a birth
implies (new member id and lineage record: :meth:`lorapop.train.population.Population.replace`; rating reset to the
parents' mean mu and prior sigma, fresh optimizer state, age 0: the trainer) happens outside.

Rules, Ray Tune's PBT adapted to roles:

* schedule: a round happens at step ``s`` (1-based) iff ``s >= burn_in_period`` and ``s % perturbation_interval ==
  0`` (Ray perturbs once ``time >= burn_in_period`` and ``interval`` has passed since the last perturbation; with the
  defaults 20/20 the rounds are at steps 20, 40, ...).
* evidence first: a member whose descriptor says it has played fewer than ``min_rated_matches`` rated matches
  (``n_matches``; a descriptor without it counts as enough) sits the round out: it is neither replaced nor a parent.
  :func:`too_few_matches` lists them, so the caller can log the skip.
* within each role with >= 2 members taking part (never across roles; a single-member role is never replaced):
  ``q = min(n // 2, max(1, ceil(n * quantile_fraction)))``; members are ranked by fitness, ties broken at random
  by the generator (at the start every member has the same prior rating); the bottom q are replaced, the top q are
  the parents. Bottom and top never overlap (q <= n // 2).
* per replaced member an operator is drawn with probability weight / sum(weights).
  - one-parent operators (mutations, clone): the parent is drawn uniformly from the top quantile.
  - two-parent crossovers (and the any-number ones, which get 2): two distinct parents drawn from the top quantile,
    ordered best first (X3 takes its top-k from the first, X4 extrapolates towards it). If the top quantile has a
    single member, the second parent is the best member that is neither in the top nor being replaced. If no such
    member exists (a role of 2), the operator is redrawn among the positive-weight one-parent operators (``clone``
    if there are none), and the replacement's ``note`` says so.
  - ``xes`` needs good and bad parents in equal numbers: ``g = min(2, q)`` good parents drawn from the top quantile
    and the g worst members of the role as the bad ones. Bad parents are members being replaced in the same round:
    :func:`apply_plan` reads every parent before it writes any child, and a trainer that applies plans itself must
    do the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lorapop.evolve.config import EvolveConfig
from lorapop.evolve.operators import get_operator, make_child


@dataclass(frozen=True)
class MemberInfo:
    id: str
    slot: int
    role: str
    fitness: float
    n_matches: int | None = None  # rated matches since birth; None: not counted (always enough)


@dataclass(frozen=True)
class Replacement:
    """One planned birth: the member in ``slot`` (``old_id``) is replaced by a child of ``parents``."""

    slot: int
    role: str
    old_id: str
    parents: tuple[str, ...]  # parent member ids: best first for crossovers; for xes good (best first) then bad
    parent_slots: tuple[int, ...]
    fitness: tuple[float, ...]  # the parents' fitness, aligned with ``parents``
    operator: str
    params: dict[str, Any] = field(default_factory=dict)  # config overrides to pass to make_child
    step: int = 0
    note: str = ""

    @property
    def operator_id(self) -> str:
        """The operator's short id in the method's tables (M1..M4, X1..X5)."""
        return get_operator(self.operator).id


def is_evolve_step(step: int, cfg: EvolveConfig) -> bool:
    """True at steps (1-based) that are multiples of ``perturbation_interval`` once ``burn_in_period`` is reached."""
    return step >= 1 and step >= cfg.burn_in_period and step % cfg.perturbation_interval == 0


def quantile_size(n: int, fraction: float) -> int:
    """Ray Tune's quantile: ``ceil(n * fraction)``, at least 1, at most ``n // 2``; 0 for a role of one."""
    if n < 2:
        return 0
    # the 1e-9 keeps 0.25 * 8 from becoming 3 through float noise
    return min(n // 2, max(1, math.ceil(n * fraction - 1e-9)))


def _as_member(m: Any) -> MemberInfo:
    get = m.get if isinstance(m, Mapping) else lambda k: getattr(m, k)
    fitness = float(get("fitness"))
    if not math.isfinite(fitness):
        raise ValueError(f"member {get('id')}: fitness must be finite, got {fitness}")
    try:
        n = get("n_matches")
    except (KeyError, AttributeError):
        n = None
    return MemberInfo(str(get("id")), int(get("slot")), str(get("role")), fitness, None if n is None else int(n))


def _enough(m: MemberInfo, cfg: EvolveConfig) -> bool:
    return m.n_matches is None or m.n_matches >= cfg.min_rated_matches


def too_few_matches(members: Iterable[Any], cfg: EvolveConfig) -> list[MemberInfo]:
    """The members that sit a PBT round out for lack of evidence (fewer than ``cfg.min_rated_matches`` rated
    matches), in slot order."""
    return sorted((m for m in map(_as_member, members) if not _enough(m, cfg)), key=lambda m: m.slot)


def _pick(items: Sequence, generator: torch.Generator) -> Any:
    return items[int(torch.randint(len(items), (), generator=generator, device=generator.device))]


def _sample(items: Sequence, k: int, generator: torch.Generator) -> list:
    idx = torch.randperm(len(items), generator=generator, device=generator.device)[:k].tolist()
    return [items[i] for i in idx]


def _draw_operator(names: list[str], weights: list[float], generator: torch.Generator) -> str:
    w = torch.tensor(weights, dtype=torch.float64)
    return names[int(torch.multinomial(w.to(generator.device), 1, generator=generator))]


def plan_replacements(members: Iterable[Any], step: int, cfg: EvolveConfig, generator: torch.Generator
                      ) -> list[Replacement]:
    """The replacements of PBT round ``step`` (empty when ``step`` is not a round, see :func:`is_evolve_step`).

    ``members``: mappings or objects with ``id, slot, role, fitness``. Deterministic for a given generator state;
    the result does not depend on the order members are listed in.
    """
    cfg.validate()
    infos = sorted((_as_member(m) for m in members), key=lambda m: m.slot)
    if len({m.id for m in infos}) != len(infos) or len({m.slot for m in infos}) != len(infos):
        raise ValueError("plan_replacements: member ids and slots must be unique")
    if not is_evolve_step(step, cfg):
        return []
    names = [n for n, w in cfg.operators.items() if w > 0]
    weights = [float(cfg.operators[n]) for n in names]
    single = [(n, w) for n, w in zip(names, weights) if get_operator(n).n_parents == 1]
    plan: list[Replacement] = []
    for role in sorted({m.role for m in infos}):
        group = [m for m in infos if m.role == role and _enough(m, cfg)]
        q = quantile_size(len(group), cfg.quantile_fraction)
        if q == 0:
            continue
        ties = torch.rand(len(group), generator=generator, device=generator.device).tolist()
        ranked = [m for _, m in sorted(zip(ties, group), key=lambda t: (-t[1].fitness, t[0]))]
        top, middle, bottom = ranked[:q], ranked[q:len(ranked) - q], ranked[len(ranked) - q:]
        for old in reversed(bottom):  # worst first
            op = _draw_operator(names, weights, generator)
            note = ""
            need = get_operator(op).n_parents
            if op == "xes":
                g = min(2, q)
                good = sorted(_sample(top, g, generator), key=lambda m: -m.fitness)
                parents = good + list(reversed(ranked))[:g][::-1]  # the g worst, better of them first
            elif need == 1:
                parents = [_pick(top, generator)]
            elif len(top) >= 2:
                parents = sorted(_sample(top, 2, generator), key=lambda m: -m.fitness)
            elif middle:
                parents = [top[0], middle[0]]
            else:
                fallback = [n for n, _ in single] or ["clone"]
                fw = [w for _, w in single] or [1.0]
                new_op = _draw_operator(fallback, fw, generator)
                note = f"{op} needs 2 parents but the top quantile of role {role} has 1 and no other member " \
                       f"survives; redrawn as {new_op}"
                op = new_op
                parents = [_pick(top, generator)]
            plan.append(Replacement(slot=old.slot, role=role, old_id=old.id, parents=tuple(p.id for p in parents),
                                    parent_slots=tuple(p.slot for p in parents),
                                    fitness=tuple(p.fitness for p in parents), operator=op,
                                    params=dict(cfg.params.get(op, {})), step=step, note=note))
    return plan


def apply_plan(plan: Sequence[Replacement], get_adapter: Callable[[int], dict],
               set_adapter: Callable[[int, dict], None], *, generator: torch.Generator, scaling: float
               ) -> list[dict[str, Any]]:
    """Make and install every child of ``plan``; returns, per replacement, the parameters its operator actually
    used (draws included), for the lineage record.

    Every parent adapter is read (``get_adapter(slot)``) before any child is written (``set_adapter(slot, child)``),
    so a parent replaced in the same round still contributes its pre-round weights. The caller still names the
    child, records its lineage and resets its optimizer state and rating.
    """
    slots = {s for rep in plan for s in rep.parent_slots}
    adapters = {s: get_adapter(s) for s in sorted(slots)}
    used = []
    for rep in plan:
        child, record = make_child(rep.operator, [adapters[s] for s in rep.parent_slots], generator=generator,
                                   scaling=scaling, fitness=list(rep.fitness), params=rep.params)
        set_adapter(rep.slot, child)
        used.append(dict(record["params"]))
    return used
