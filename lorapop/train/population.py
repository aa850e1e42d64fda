"""Members of the population: ids, slots in the engine, roles, ages and lineage.

A member's ``slot`` is its adapter index in the engine and never changes; when PBT replaces a member, the child takes
the same slot under a new id (``t4``, ``s5``: a per-role counter), so per-member metric series end and begin cleanly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lorapop.records.members import AGENT, ROLE_PREFIX, Member, initial_members

if TYPE_CHECKING:
    from lorapop.evolve.pbt import Replacement

__all__ = ["AGENT", "Member", "Population"]


@dataclass
class Population:
    members: list[Member]
    lineage: list[dict[str, Any]] = field(default_factory=list)
    next_index: dict[str, int] = field(default_factory=dict)

    @classmethod
    def create(cls, mode: str, n_teachers: int, n_students: int) -> "Population":
        if mode == "single":
            return cls(initial_members(mode, 1, 0), next_index={AGENT: 1})
        return cls(initial_members(mode, n_teachers, n_students),
                   next_index={"teacher": n_teachers, "student": n_students})

    @property
    def single(self) -> bool:
        return len(self.members) == 1 and self.members[0].role == AGENT

    def by_role(self, role: str) -> list[Member]:
        return [m for m in self.members if m.role == role]

    @property
    def teachers(self) -> list[Member]:
        return self.by_role(AGENT) if self.single else self.by_role("teacher")

    @property
    def students(self) -> list[Member]:
        return self.by_role(AGENT) if self.single else self.by_role("student")

    def get(self, member_id: str) -> Member:
        for m in self.members:
            if m.id == member_id:
                return m
        raise KeyError(f"no member with id {member_id!r}")

    def at_slot(self, slot: int) -> Member:
        for m in self.members:
            if m.slot == slot:
                return m
        raise KeyError(f"no member in slot {slot}")

    def replace(self, rep: Replacement, params: dict[str, Any], step: int) -> tuple[Member, dict[str, Any]]:
        """Put the child of ``rep`` in its slot (same role, next id of the role) and record its lineage: ``{step,
        child, replaced, parents, operator, params, role, slot, id}`` (+ ``note``), ``params`` being what the
        operator actually used. Returns the child and its lineage record."""
        old = self.at_slot(rep.slot)
        idx = self.next_index.get(old.role, 0)
        self.next_index[old.role] = idx + 1
        child = Member(f"{ROLE_PREFIX[old.role]}{idx}", rep.slot, old.role, born_step=step,
                       parents=tuple(rep.parents), operator=rep.operator)
        self.members[self.members.index(old)] = child
        record = {"step": step, "child": child.id, "replaced": old.id, "parents": list(rep.parents),
                  "operator": rep.operator, "params": dict(params), "role": old.role, "slot": rep.slot,
                  "id": rep.operator_id}
        if rep.note:
            record["note"] = rep.note
        self.lineage.append(record)
        return child, record

    def state_dict(self) -> dict[str, Any]:
        return {"members": [m.to_json() for m in self.members], "lineage": list(self.lineage),
                "next_index": dict(self.next_index)}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> "Population":
        return cls([Member.from_json(m) for m in state["members"]], list(state["lineage"]),
                   dict(state["next_index"]))
