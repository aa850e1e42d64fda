"""``selfplay.proposal_style: selection`` (the cpu_selection config): the one-block layout of
proposal_style expression over a list, the line ``nums = [<small ints>]`` then an f(nums) whose body is one return
line that copies or selects; the reply starts after ``nums = [``. Why this family, its references and its
validity rules: lorapop/tasks/selection_family.py. What the style changes beyond the layout:

* code_i's answer is a list, so it starts inside it (prefill ``[``): without the bracket the 135M base wrote
  ``f(nums)`` or a new def in most code_i answers (docs/RESULTS.md, "Dynamics, second design: the step-0 gate");
  code_i's student prompt asks for the list nums;
* validity: the style's static shape checks before the shared ones, and after them the output is not None and the
  student's answer fits ``selfplay.solve.max_new_tokens`` in the model's tokenizer;
* the seed file holds the style's references alone (no identity seed, which would read ``nums = "Hello world"``);
* the probe asks list selections (:func:`lorapop.tasks.selection_family.probe_tasks`).
"""

from __future__ import annotations

import random
import re
from typing import TYPE_CHECKING

from lorapop.tasks import selection_family
from lorapop.tasks.base import Invalid, Proposal, Task, TaskType
from lorapop.tasks.common import FORMAT_RULES
from lorapop.tasks.styles.base import register_style
from lorapop.tasks.styles.expression import OneBlockStyle

if TYPE_CHECKING:  # the Protocol only; the sandbox itself loads where it runs
    from lorapop.executor.base import Executor


class SelectionStyle(OneBlockStyle):
    name = "selection"
    param = selection_family.PARAM
    prefill = selection_family.SELECTION_PREFILL
    input_line = re.compile(r"^nums\s*=\s*(.+?)\s*$")
    line_shown = "nums = [...]"
    starts_inside = "`nums = [`"
    replaces_identity_seed = True
    seed_files = (selection_family.SEED_FILE,)

    def answer_prefill(self, tt: TaskType) -> str:
        return tt.answer_prefill + "[" if tt.name == "code_i" else super().answer_prefill(tt)

    def teacher_prompt(self, tt: TaskType, references: list[Task], rng: random.Random | None = None) -> str:
        if not self.lays_out(tt):
            return super().teacher_prompt(tt, references, rng)
        return selection_family.teacher_prompt(references, tt.goal, FORMAT_RULES)

    def student_prompt(self, tt: TaskType, task: Task) -> str:
        # code_o keeps its usual prompt (lorapop/tasks/code_o.py says why)
        return selection_family.code_i_student_prompt(task) if tt.name == "code_i" else super().student_prompt(tt, task)

    def validate_many(self, tt: TaskType, proposals: list[Proposal], executor: Executor, *, count_tokens=None,
                      answer_budget: int | None = None, **kw) -> list[Task | Invalid]:
        """The shape checks (:func:`selection_family.check_shape`), then the shared checks on the proposals that pass
        them, then :func:`selection_family.check_task` on the tasks those return."""
        if not self.lays_out(tt):
            return super().validate_many(tt, proposals, executor, count_tokens=count_tokens,
                                         answer_budget=answer_budget, **kw)
        results: list[Task | Invalid | None] = [None] * len(proposals)
        todo = []
        for i, p in enumerate(proposals):
            results[i] = selection_family.check_shape(p.program, p.inputs[0] if len(p.inputs) == 1 else "")
            if results[i] is None:
                todo.append(i)
        for i, res in zip(todo, tt.validate_many([proposals[i] for i in todo], executor, **kw)):
            results[i] = (selection_family.check_task(tt.name, res, count_tokens, answer_budget) or res
                          if isinstance(res, Task) else res)
        return results  # type: ignore[return-value]

    def probe_tasks(self, per_level: int, seed: int) -> list[tuple[int, Task]]:
        return selection_family.probe_tasks(per_level, seed)


SELECTION = register_style(SelectionStyle())
