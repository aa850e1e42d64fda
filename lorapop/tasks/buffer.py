"""Per-type task buffers: identity seed, optional seed files, K references, dedup, JSON-able state."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import TYPE_CHECKING

from lorapop.tasks.base import Invalid, Proposal, Task
from lorapop.modeltext import NotLiteral, parse_text
from lorapop.tasks.values import call_key

if TYPE_CHECKING:  # the Protocol only; the sandbox itself loads where it runs
    from lorapop.executor.base import Executor

IDENTITY_PROGRAM = "def f(a):\n    return a"
IDENTITY_MESSAGE = "Write a function that returns whatever you input"


def identity_task(type_name: str) -> Task:
    return Task(type=type_name, program=IDENTITY_PROGRAM, inputs=['"Hello world"'], outputs=["'Hello world'"],
                message=IDENTITY_MESSAGE if type_name == "code_f" else "", proposer="seed", step=0)


def _normalise(program: str) -> str:
    try:
        return ast.unparse(parse_text(program))  # ignores formatting and comments
    except (NotLiteral, ValueError, RecursionError, MemoryError):  # unparse of a program deep enough
        return program.strip()


def _with_imports(snippet: str, imports: list[str]) -> str:
    missing = [i.strip() for i in imports if i.strip() and i.strip() not in snippet]
    return "\n".join(missing + [snippet]) if missing else snippet


def read_seed_file(path, type_name: str) -> list[Task]:
    """Rows of either AZR seed layout: {snippet, input, output, imports} or {snippet, inputs, outputs, message,
    imports}. Outputs are stored as given (some are truncated in the files); validate to recompute them."""
    tasks = []
    with open(Path(path), encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            d = json.loads(line)
            inputs = d["inputs"] if "inputs" in d else [d["input"]]
            outputs = d["outputs"] if "outputs" in d else [d["output"]]
            tasks.append(Task(type=type_name, program=_with_imports(d["snippet"], d.get("imports") or []),
                              inputs=list(inputs), outputs=list(outputs), message=d.get("message", ""),
                              proposer="seed", step=0))
    return tasks


class TaskBuffer:
    """One task type's valid tasks, deduplicated by normalised program and inputs. ``max_tasks`` (0: no bound) caps
    its length: adding past it drops the oldest proposed task (seed tasks stay; only a buffer of seeds alone drops
    its oldest seed), so a long run's buffer stops growing. A dropped task's key goes with it: proposed again, it
    counts as new."""

    def __init__(self, type_name: str, seed_identity: bool = True, max_tasks: int = 0):
        self.type = type_name
        self.max_tasks = int(max_tasks)
        self.tasks: list[Task] = []
        self._keys: set[tuple] = set()
        self._key_of: dict[int, tuple] = {}  # id of a stored task -> its key: computing one parses the inputs
        if seed_identity:
            self.add(identity_task(type_name))

    @staticmethod
    def key(task: Task) -> tuple:
        """The normalised program and the inputs by value (``1`` and ``1.0`` are one input, as a verdict reads
        them); an input that is no literal argument list (never a validated one) by its text."""
        def one(text: str):
            try:
                return call_key(text)
            except NotLiteral:
                return text.strip()

        return _normalise(task.program), tuple(one(i) for i in task.inputs)

    def add(self, task: Task) -> bool:
        """False (and nothing stored) for a duplicate program+inputs."""
        k = self.key(task)
        if k in self._keys:
            return False
        self._keys.add(k)
        self.tasks.append(task)
        self._key_of[id(task)] = k
        if self.max_tasks and len(self.tasks) > self.max_tasks:
            i = next((j for j, t in enumerate(self.tasks) if t.proposer != "seed"), 0)
            self._keys.discard(self._stored_key(self.tasks.pop(i), forget=True))
        return True

    def _stored_key(self, task: Task, forget: bool = False) -> tuple:
        k = self._key_of.pop(id(task), None) if forget else self._key_of.get(id(task))
        return k if k is not None else self.key(task)

    def discard(self, task: Task) -> bool:
        """Remove ``task`` (found by its key); False when it is not here. A buffer keeps at least one task: the last
        one is never removed, since every step samples from it."""
        k = self.key(task)
        if k not in self._keys or len(self.tasks) <= 1:
            return False
        self._keys.discard(k)
        keep = []
        for t in self.tasks:
            if self._stored_key(t) == k:
                self._key_of.pop(id(t), None)
            else:
                keep.append(t)
        self.tasks = keep
        return True

    def load_seed_file(self, path, executor: Executor | None = None, task_type=None) -> int:
        """Adds the file's tasks; with an executor and the task type object (``lorapop.tasks.TASK_TYPES[type]``:
        passed in, since that registry imports this module), only those that pass full validation, with outputs
        recomputed in the sandbox. Returns how many were added."""
        tasks = read_seed_file(path, self.type)
        if executor is not None:
            if task_type is None or task_type.name != self.type:
                raise ValueError(f"load_seed_file: validating through the executor needs task_type, the "
                                 f"{self.type} TaskType object (got {task_type!r})")
            props = [Proposal(self.type, t.program, t.inputs, t.message) for t in tasks]
            tasks = [r for r in task_type.validate_many(props, executor) if not isinstance(r, Invalid)]
            for t in tasks:
                t.proposer = "seed"
        return sum(self.add(t) for t in tasks)

    def sample(self, k: int, rng) -> list[Task]:
        """k distinct tasks (all of them when the buffer is smaller). `rng`: random.Random or numpy Generator."""
        n = len(self.tasks)
        k = min(int(k), n)
        if k <= 0:
            return []
        if hasattr(rng, "sample"):
            idx = rng.sample(range(n), k)
        else:
            idx = [int(i) for i in rng.choice(n, size=k, replace=False)]
        return [self.tasks[i] for i in idx]

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self):
        return iter(self.tasks)

    def state_dict(self) -> dict:
        return {"type": self.type, "tasks": [t.to_dict() for t in self.tasks]}

    def load_state_dict(self, state: dict) -> None:
        self.type = state.get("type", self.type)
        self.tasks, self._keys = [], set()
        for d in state["tasks"]:
            self.add(Task.from_dict(d))
