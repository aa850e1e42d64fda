"""Members of the population: ids, slots in the engine, roles, ages and lineage.

A member's ``slot`` is its adapter index in the engine and never changes; when PBT replaces a member, the child takes
the same slot under a new id (``t4``, ``s5``: a per-role counter), so per-member metric series end and begin cleanly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

ROLES = ("teacher", "student")
AGENT = "agent"  # single mode: one member plays both roles


@dataclass
class Member:
    id: str
    slot: int
    role: str
    born_step: int = 0
    parents: list[str] = field(default_factory=list)
    operator: str | None = None

    def age(self, step: int) -> int:
        return step - self.born_step


@dataclass
class Population:
    members: list[Member]
    lineage: list[dict[str, Any]] = field(default_factory=list)
    next_index: dict[str, int] = field(default_factory=dict)

    @classmethod
    def create(cls, mode: str, n_teachers: int, n_students: int) -> "Population":
        if mode == "single":
            return cls([Member("a0", 0, AGENT)], next_index={AGENT: 1})
        members = [Member(f"t{i}", i, "teacher") for i in range(n_teachers)]
        members += [Member(f"s{i}", n_teachers + i, "student") for i in range(n_students)]
        return cls(members, next_index={"teacher": n_teachers, "student": n_students})

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

    def replace(self, slot: int, record: dict[str, Any], step: int) -> Member:
        """Put a new member in ``slot`` (same role) and store the lineage ``record`` (parents, operator, params as
        made by :func:`lorapop.evolve.pbt.apply_plan`) with the child's id filled in; returns the child."""
        old = self.at_slot(slot)
        prefix = {"teacher": "t", "student": "s"}.get(old.role, "a")
        idx = self.next_index.get(old.role, 0)
        self.next_index[old.role] = idx + 1
        child = Member(f"{prefix}{idx}", slot, old.role, born_step=step, parents=list(record.get("parents", [])),
                       operator=record.get("operator"))
        self.members[self.members.index(old)] = child
        self.lineage.append({**record, "step": step, "child": child.id, "replaced": old.id, "slot": slot,
                             "role": old.role})
        return child

    def state_dict(self) -> dict[str, Any]:
        return {"members": [asdict(m) for m in self.members], "lineage": list(self.lineage),
                "next_index": dict(self.next_index)}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> "Population":
        return cls([Member(**m) for m in state["members"]], list(state["lineage"]), dict(state["next_index"]))
