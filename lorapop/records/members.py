"""A population member as a run records it (`Member`, with the PEFT files of a checkpointed one), the members a run
starts with, and the role an id stands for. A record of the run: the run directory (lorapop/records/rundir.py), the
config, adapters, eval and the training loop read it from here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lorapop.records import RunDirError

AGENT = "agent"  # single mode: one member plays both roles
ROLE_PREFIX = {"teacher": "t", "student": "s", AGENT: "a"}  # member ids are <prefix><per-role counter>


class NoAdapterFiles(RunDirError):
    """A member not read from a checkpoint asked for its adapter files (a caller's mistake: every member the run
    directory reads from a checkpoint has them)."""


@dataclass(frozen=True)
class AdapterFiles:
    """A checkpointed PEFT adapter directory and the LoRA shape its adapter_config.json declares."""
    dir: Path
    rank: int
    lora_alpha: float
    target_modules: list[str]


@dataclass(frozen=True)
class Member:
    """A population member as the run directory records it. ``slot`` is its adapter index in the engine and never
    changes; a PBT child takes its replaced member's slot under a new id. ``adapter`` is set when read from a
    checkpoint."""
    id: str
    slot: int
    role: str  # "teacher" | "student" | "agent"
    born_step: int = 0
    parents: tuple[str, ...] = ()
    operator: str | None = None
    adapter: AdapterFiles | None = field(default=None, compare=False)

    def age(self, step: int) -> int:
        return step - self.born_step

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "slot": self.slot, "role": self.role, "born_step": self.born_step,
                "parents": list(self.parents), "operator": self.operator}

    @classmethod
    def from_json(cls, d: dict[str, Any], adapter: AdapterFiles | None = None) -> "Member":
        return cls(str(d["id"]), int(d.get("slot", -1)), str(d["role"]), int(d.get("born_step", 0)),
                   tuple(d.get("parents") or ()), d.get("operator"), adapter)

    # the eval engine's view of a checkpointed member
    @property
    def adapter_dir(self) -> Path:
        return self._adapter().dir

    @property
    def rank(self) -> int:
        return self._adapter().rank

    @property
    def lora_alpha(self) -> float:
        return self._adapter().lora_alpha

    @property
    def target_modules(self) -> list[str]:
        return self._adapter().target_modules

    def _adapter(self) -> AdapterFiles:
        if self.adapter is None:
            raise NoAdapterFiles(f"member {self.id}: not read from a checkpoint, it has no adapter files")
        return self.adapter


def initial_members(mode: str, n_teachers: int, n_students: int) -> list[Member]:
    """The members a run starts with, in slot order: ``a0`` in single mode, else ``t0..`` then ``s0..``."""
    if mode == "single":
        return [Member("a0", 0, AGENT)]
    return ([Member(f"t{i}", i, "teacher") for i in range(n_teachers)]
            + [Member(f"s{i}", n_teachers + i, "student") for i in range(n_students)])


def role_from_id(member_id: str) -> str | None:
    """The role an id's prefix stands for (ids are made by `Population`), or None."""
    for role, prefix in ROLE_PREFIX.items():
        if member_id.startswith(prefix) and member_id[len(prefix):].isdigit():
            return role
    return None


# ---- low-level writing and reading ---------------------------------------------------------------------------------
