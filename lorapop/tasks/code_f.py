"""code_f (induction): the teacher gets one program from the buffers and writes inputs and a one-line message; the
student sees the message and the first `n_shown` input/output pairs and must write a program that also reproduces
the hidden outputs.

Checking cannot be forged by the student's program: it runs on each hidden input in its own fresh sandbox process
(the gold outputs are never in it) and returns only its output's text; the trainer reads each as a literal and
compares it with its gold output (lorapop/tasks/values.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lorapop.tasks.base import Answer, Invalid, Outcome, ParseError, Proposal, Task
from lorapop.tasks import azr_prompts
from lorapop.tasks.buffer import IDENTITY_PROGRAM
from lorapop.tasks.common import FORMAT_RULES, check_answers, fence, validate_many
from lorapop.tasks.parsing import extract
from lorapop.tasks.validity import call_code, check_program

if TYPE_CHECKING:  # the Protocol only; the sandbox itself loads where it runs
    from lorapop.executor.base import Executor


def shown_program(references: list[Task]) -> str:
    """The program a code_f proposer prompt shows, which its reply is parsed with: the first reference's, or the
    identity program when there is none (every reference dropped to fit the prompt budget)."""
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
        program = shown_program(references)
        example = "\n".join([fence("input", "[3, 1, 2]"), fence("input", "'abc', 2"), "...",
                             fence("message", "Think about order and length.")])
        return (f"Here is a Python function f.\n{fence('python', program)}\n\n"
                f"Write {self.n_inputs} different inputs for f, each in its own ```input block holding the arguments "
                "exactly as written inside f(...), using Python literals only. Pick inputs that reveal what f does. "
                "Then write a one-line ```message hinting at what f does without giving the code.\n\n"
                f"Format example:\n{example}\n\nNow write one sentence of reasoning, then your blocks.")

    def azr_teacher_prompt(self, references: list[Task]) -> str:
        """AZR's induction proposer prompt (prompt_format azr)."""
        return azr_prompts.propose_inputs_message(shown_program(references), self.n_inputs)

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
        hidden = list(zip(task.inputs[self.n_shown:], task.outputs[self.n_shown:]))

        def prepare(a: Answer) -> list[tuple[str, str]] | Outcome:
            bad = check_program(a.text, getattr(executor, "importable", None))  # the sandbox's modules only
            if bad is not None:
                return Outcome("wrong", f"program {bad.reason}: {bad.detail}"[:200])
            if not hidden:
                return Outcome("wrong", "task has no hidden pairs")
            return [(call_code(a.text, inp), out) for inp, out in hidden]

        control = [(call_code(task.program, inp), out) for inp, out in hidden]
        return check_answers(answers, prepare, control, executor, program=task.program)
