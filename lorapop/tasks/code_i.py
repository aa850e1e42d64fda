"""code_i (abduction): the student sees program and output and must give an input that produces it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lorapop.tasks.base import Answer, Outcome, ParseError, Task
from lorapop.tasks import azr_prompts
from lorapop.tasks.common import ProgramInputTask, check_answers, fence
from lorapop.tasks.parsing import extract
from lorapop.tasks.validity import call_code, check_call_args
from lorapop.modeltext import NotLiteral
from lorapop.tasks.values import call_form


if TYPE_CHECKING:  # the Protocol only; the sandbox itself loads where it runs
    from lorapop.executor.base import Executor

class CodeI(ProgramInputTask):
    name = "code_i"
    answer_prefill = "```input\n"
    goal = "A solver will see f and its output and must find an input that produces it, so make that hard."

    def student_prompt(self, task: Task) -> str:
        return ("Find arguments for f that make it return the output below.\n"
                f"{fence('python', task.program)}\nOutput: {task.outputs[0]}\n\n"
                # no example arguments and no "think" line, as in code_o (small bases copy the example)
                "Give the arguments, exactly as written inside f(...), in an ```input block.")

    def azr_student_prompt(self, task: Task) -> str:
        return azr_prompts.solve_input(task)

    def parse_answer(self, text) -> Answer | ParseError:
        got = extract(text, {"input": 1})
        return got if isinstance(got, ParseError) else Answer(self.name, got["input"][0])

    def check_many(self, task: Task, answers: list, executor: Executor) -> list[Outcome]:
        """The teacher's validated f runs on the student's literal arguments in a fresh sandbox process and returns
        only its output's text; the trainer compares that value with the stored output (lorapop/tasks/values.py), so
        f cannot reach the comparison that judges the answer. The control runs f on the task's own input; f runs on
        every input several times, and runs of one input that disagree void the task (lorapop/tasks/common.py)."""
        gold = _form(task.inputs[0])

        def prepare(a: Answer) -> list[tuple[str, str]] | Outcome:
            bad = check_call_args(a.text)
            if bad is not None:
                return Outcome("wrong", f"input {bad.reason}")
            # The task's own input, however it is spelled ("5", " 5", "(5)"), runs as the task's own text: the run is
            # then the control's, byte for byte, and counts as one (lorapop/tasks/common.py, check_answers), so f
            # cannot treat a student giving its input otherwise than the control without voiding the task. Only the
            # same syntax tree counts as the same input, never an equal value: {'w1', 'w0'} equals {'w0', 'w1'} but
            # may iterate otherwise in the sandbox (its hash seed), and then it is AZR's wrong answer.
            text = task.inputs[0] if gold is not None and _form(a.text) == gold else a.text
            return [(call_code(task.program, text), task.outputs[0])]

        return check_answers(answers, prepare, self.control(task), executor, program=task.program)


def _form(text: str):
    """The argument list's syntax tree (lorapop/tasks/values.py, call_form), or None."""
    try:
        return call_form(text)
    except NotLiteral:
        return None
