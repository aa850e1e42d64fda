"""``selfplay.proposal_style: input_first`` (the CPU demo configs): the reply's input block first, the references in
that order without their outputs, and no format example. The 135M base, shown AZR's layout, writes the program and
then an ```output block (or more programs) where the input belongs, and copies the example's two-argument f onto its
own one-argument input; shown this one, it writes the input, then a program for it (docs/RESULTS.md, "The CPU demo
step by step"). The parser is the task type's own: it reads the two blocks in either order."""

from __future__ import annotations

import random

from lorapop.tasks.base import Task, TaskType
from lorapop.tasks.common import FORMAT_RULES, fence
from lorapop.tasks.styles.base import ProposalStyle, register_style


class InputFirstStyle(ProposalStyle):
    name = "input_first"
    types = ("code_o", "code_i")
    seed_files = ("seeds/easy_seed_io.jsonl",)

    def proposal_prefill(self, tt: TaskType) -> str:
        return "```input\n" if self.lays_out(tt) else super().proposal_prefill(tt)

    def teacher_prompt(self, tt: TaskType, references: list[Task], rng: random.Random | None = None) -> str:
        if not self.lays_out(tt):
            return super().teacher_prompt(tt, references, rng)
        refs = "\n\n".join(f"Reference {i + 1}:\n" + "\n".join([fence("input", t.inputs[0] if t.inputs else ""),
                                                              fence("python", t.program)])
                            for i, t in enumerate(references))
        return (f"Write one input and a new Python function f that takes it. {tt.goal}\n{FORMAT_RULES}\n"
                "The input block holds the arguments exactly as written inside f(...).\n\n"
                f"{refs}\n\nNow write your own ```input block, then your own ```python block.")


INPUT_FIRST = register_style(InputFirstStyle())
