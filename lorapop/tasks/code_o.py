"""code_o (deduction): the student sees program and input and predicts the output."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lorapop.tasks.base import Answer, Outcome, ParseError, Task
from lorapop.tasks import azr_prompts
from lorapop.tasks.common import ProgramInputTask, check_answers, fence
from lorapop.tasks.parsing import extract
from lorapop.tasks.validity import check_literal
from lorapop.tasks.values import same_text

if TYPE_CHECKING:  # the Protocol only; the sandbox itself loads where it runs
    from lorapop.executor.base import Executor

MAX_ANSWER_CHARS = 2000


class CodeO(ProgramInputTask):
    name = "code_o"
    answer_prefill = "```output\n"
    goal = "A solver will see f and the input and must predict the output, so make it take careful reasoning."

    def student_prompt(self, task: Task) -> str:
        # One prompt for every style: under selection, the list shown in the teacher's layout (`nums = [...]` above
        # f, "Call: f(nums)") made the base solve 0.14 of fixed tasks against 0.18 with the list in the call
        # (docs/RESULTS.md, "Dynamics, second design: the step-0 gate").
        return ("Predict the value returned by f for the input below.\n"
                f"{fence('python', task.program)}\nCall: f({task.inputs[0]})\n\n"
                # No example value: the 135M base copied the old one ([1, 'a']) into most answers. No "think step by
                # step" either: with response_prefill the reply starts inside the block, and on easy tasks (prefilled,
                # 16 tokens, temperature 0.3) the base solved 41/312 with that line and 69/312 without it.
                "Give the returned value as a Python literal in an ```output block.")

    def azr_student_prompt(self, task: Task) -> str:
        return azr_prompts.solve_output(task)

    def parse_answer(self, text) -> Answer | ParseError:
        got = extract(text, {"output": 1})
        return got if isinstance(got, ParseError) else Answer(self.name, got["output"][0])

    def check_many(self, task: Task, answers: list, executor: Executor) -> list[Outcome]:
        """The prediction is read as a literal and compared with the stored output in the trainer; the only run is
        the control (the task's program on its input, in a fresh process: lorapop/tasks/common.py)."""
        def prepare(a: Answer) -> Outcome:
            if not same_text(task.outputs[0], a.text, MAX_ANSWER_CHARS):
                bad = check_literal(a.text, MAX_ANSWER_CHARS)
                return Outcome("wrong", f"prediction {bad.reason}" if bad else a.text[:80])
            return Outcome("correct", "")

        return check_answers(answers, prepare, self.control(task), executor, program=task.program)
