"""Typed results of the task domain and the TaskType protocol.

Inputs are stored as the argument text of a call: input ``"'ab', 3"`` means ``f('ab', 3)``. Outputs are canonical
``repr`` strings produced in the sandbox. Everything here is JSON-able (``to_dict``/``from_dict``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the Protocol only; the sandbox itself loads where it runs
    from lorapop.executor.base import Executor


@dataclass
class Task:
    type: str
    program: str
    inputs: list[str]
    outputs: list[str]
    message: str = ""
    proposer: str | None = None
    step: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Task":
        return cls(type=d["type"], program=d["program"], inputs=list(d["inputs"]), outputs=list(d["outputs"]),
                   message=d.get("message", ""), proposer=d.get("proposer"), step=int(d.get("step", 0)))


@dataclass
class Proposal:
    """A teacher's parsed output; not yet executed."""
    type: str
    program: str
    inputs: list[str]
    message: str = ""


@dataclass
class Answer:
    """A student's parsed output: the predicted output (code_o), the input (code_i) or the program (code_f)."""
    type: str
    text: str


@dataclass
class ParseError:
    """Format error: a block is missing or malformed (reward -1)."""
    reason: str
    detail: str = ""


@dataclass
class Invalid:
    """A well-formed proposal that is not a valid task (reward -0.5). Reason codes: syntax_error, no_f,
    multiple_f, extra_toplevel, has_class, banned_import, banned_name, dunder_access, not_literal, too_long,
    duplicate_inputs, timeout, memory, runtime_error, crashed, output_too_long, output_not_literal,
    nondeterministic, too_slow (a validation run took more than MAX_RUN_SHARE of the wall clock: lorapop/tasks/
    common.py), unreadable (parsing the proposal raised: it is that proposal's failure, never the step's),
    not_tokenizer_stable / answer_over_budget (what the student would be shown is not what runs, or the answer cannot
    fit the student's reply: lorapop/tasks/shown.py), too_few_inputs, not_reproduced (valid when proposed, but its
    program did not give back its output when the answers were checked)."""
    reason: str
    detail: str = ""


@dataclass
class Outcome:
    """Result of checking one answer: status "correct" | "wrong" | "format_error" | "void" (no verdict: the task's
    own program did not reproduce its stored output when run again, or its runs on one input disagreed;
    lorapop/tasks/common.py, check_answers)."""
    status: str
    detail: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def correct(self) -> bool:
        return self.status == "correct"


class TaskType(Protocol):
    name: str
    # Opening of the first block each reply must hold; with selfplay.response_prefill the assistant turn starts with
    # it (the parser then reads prefill + completion)
    proposal_prefill: str
    answer_prefill: str

    # The prompts and parsers here are the task type's own: the short prompts in AZR's layout, and AZR's prompts
    # (prompt_format azr). Proposal styles (lorapop/tasks/styles/) change the layout of some types; prompt formats
    # (lorapop/tasks/formats.py) wrap the prompts and unwrap the replies before these parsers read them.
    def teacher_prompt(self, references: list[Task], rng=None) -> str: ...
    def azr_teacher_prompt(self, references: list[Task]) -> str: ...
    def parse_proposal(self, text: str, *, program: str | None = None) -> Proposal | ParseError: ...
    def validate(self, proposal: Proposal, executor: Executor) -> Task | Invalid: ...
    def validate_many(self, proposals: list[Proposal], executor: Executor) -> list[Task | Invalid]: ...
    def student_prompt(self, task: Task) -> str: ...
    def azr_student_prompt(self, task: Task) -> str: ...
    def parse_answer(self, text: str) -> Answer | ParseError: ...
    def check(self, task: Task, answer: Answer, executor: Executor) -> bool: ...
    def check_many(self, task: Task, answers: list[Answer | ParseError], executor: Executor) -> list[Outcome]: ...
