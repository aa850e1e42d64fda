"""code_f (induction): the teacher gets one program from the buffers and writes inputs and a one-line message; the
student sees the message and the first `n_shown` input/output pairs and must write a program that also reproduces
the hidden outputs.

Checking runs in two phases so a student program cannot forge its verdict: phase 1 runs the student's f on the
hidden inputs (the gold outputs are not in that process) and returns reprs; those must be literals; phase 2
compares them with the gold outputs in a fresh run with no model code in it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lorapop.tasks.base import Answer, Invalid, Outcome, ParseError, Proposal, Task
from lorapop.tasks import azr_prompts
from lorapop.tasks.buffer import IDENTITY_PROGRAM
from lorapop.tasks.common import FORMAT_RULES, fence, validate_many
from lorapop.tasks.parsing import extract
from lorapop.tasks.validity import call_code, check_literal, check_program, compare_code

if TYPE_CHECKING:  # the Protocol only; the sandbox itself loads where it runs
    from lorapop.executor.sandbox import Executor


def _shown_program(references: list[Task]) -> str:
    return references[0].program if references else IDENTITY_PROGRAM


class CodeF:
    name = "code_f"
    proposal_prefill = "```input\n"
    answer_prefill = "```python\n"

    def __init__(self, n_inputs: int = 10, n_shown: int = 5):
        self.n_inputs, self.n_shown = n_inputs, n_shown

    def teacher_prompt(self, references: list[Task], rng=None) -> str:
        """Uses `references[0].program` (sample one reference with your rng); parse the reply with
        `parse_proposal(text, program=references[0].program)`. One layout for every style: the reply is
        inputs and a message only."""
        program = _shown_program(references)
        example = "\n".join([fence("input", "[3, 1, 2]"), fence("input", "'abc', 2"), "...",
                             fence("message", "Think about order and length.")])
        return (f"Here is a Python function f.\n{fence('python', program)}\n\n"
                f"Write {self.n_inputs} different inputs for f, each in its own ```input block holding the arguments "
                "exactly as written inside f(...), using Python literals only. Pick inputs that reveal what f does. "
                "Then write a one-line ```message hinting at what f does without giving the code.\n\n"
                f"Format example:\n{example}\n\nNow write one sentence of reasoning, then your blocks.")

    def azr_teacher_prompt(self, references: list[Task]) -> str:
        """AZR's induction proposer prompt (prompt_format azr)."""
        return azr_prompts.propose_inputs_message(_shown_program(references), self.n_inputs)

    def parse_proposal(self, text, *, program: str | None = None) -> Proposal | ParseError:
        if not program:
            return ParseError("no_program", "code_f proposals need the program the teacher was given")
        got = extract(text, {"input": self.n_inputs, "message": 1})
        if isinstance(got, ParseError):
            return got
        message = " ".join(got["message"][0].split())
        return Proposal(type=self.name, program=program, inputs=got["input"][: self.n_inputs], message=message)

    def validate(self, proposal: Proposal, executor: Executor) -> Task | Invalid:
        return self.validate_many([proposal], executor)[0]

    def validate_many(self, proposals: list[Proposal], executor: Executor, **kw) -> list[Task | Invalid]:
        return validate_many(self.name, proposals, executor, min_inputs=self.n_inputs, **kw)

    def student_prompt(self, task: Task) -> str:
        pairs = "\n".join(f"f({i}) == {o}" for i, o in zip(task.inputs[: self.n_shown], task.outputs[: self.n_shown]))
        return (f"Write a Python function f that matches these examples.\nHint: {task.message}\n{pairs}\n\n"
                f"{FORMAT_RULES}\nThink briefly, then give the whole program in a ```python block, for example:\n"
                + fence("python", "def f(x):\n    return x"))

    def azr_student_prompt(self, task: Task) -> str:
        return azr_prompts.solve_function(task, self.n_shown)

    def parse_answer(self, text) -> Answer | ParseError:
        got = extract(text, {"python": 1})
        return got if isinstance(got, ParseError) else Answer(self.name, got["python"][0])

    def check(self, task: Task, answer, executor: Executor) -> bool:
        return self.check_many(task, [answer], executor)[0].correct

    def check_many(self, task: Task, answers: list, executor: Executor) -> list[Outcome]:
        hidden_in, hidden_out = task.inputs[self.n_shown:], task.outputs[self.n_shown:]
        outcomes: list[Outcome | None] = [None] * len(answers)
        jobs = []
        for i, a in enumerate(answers):
            if isinstance(a, ParseError):
                outcomes[i] = Outcome("format_error", a.reason)
                continue
            bad = check_program(a.text)
            if bad is not None:
                outcomes[i] = Outcome("wrong", f"program {bad.reason}: {bad.detail}"[:200])
                continue
            jobs.extend((i, call_code(a.text, inp)) for inp in hidden_in)
        produced: dict[int, list[str]] = {}
        for (i, _), r in zip(jobs, executor.run_many([c for _, c in jobs])):
            if outcomes[i] is not None:
                continue
            if r.status != "ok" or check_literal(r.value) is not None:
                outcomes[i] = Outcome("wrong", r.error or f"non-literal output {str(r.value)[:60]}")
            else:
                produced.setdefault(i, []).append(r.value)
        pending = [i for i in produced if outcomes[i] is None]
        gold = "[" + ", ".join(hidden_out) + "]"
        codes = [compare_code("[" + ", ".join(produced[i]) + "]", gold) for i in pending]
        for i, r in zip(pending, executor.run_many(codes)):
            outcomes[i] = Outcome("correct" if r.status == "ok" and r.value == "True" else "wrong",
                                  r.error or r.value or "")
        for i in range(len(answers)):
            if outcomes[i] is None:  # no hidden inputs at all: nothing to reproduce
                outcomes[i] = Outcome("wrong", "task has no hidden pairs")
        return outcomes  # type: ignore[return-value]
