"""``selfplay.proposal_style: expression`` (the cpu_dynamics configs): one ```python block that opens with the input
line ``x = <integer>`` and then defines f(x) as one return expression, shown such references
(``seeds/expr_seed_io.jsonl``, lorapop/tasks/expression_family.py); the reply starts after ``x = `` and a stop string
may end it at the block's closing fence. The 135M base, asked for an ```input block and a ```python block (input
first), parsed 10 of 16 replies and gave 0.19 valid; started inside ``def f(x): return``, it never wrote the input
block after it (0 of 16): docs/RESULTS.md, "Dynamics: the setting".

:class:`OneBlockStyle` is the layout with the input line first; proposal_style selection
(lorapop/tasks/styles/selection.py) is the same over a list.
"""

from __future__ import annotations

import random
import re

from lorapop.tasks.base import ParseError, Proposal, Task, TaskType
from lorapop.tasks.common import FORMAT_RULES, fence
from lorapop.tasks.expression_family import SEED_FILE
from lorapop.tasks.parsing import extract
from lorapop.tasks.styles.base import ProposalStyle, register_style


class OneBlockStyle(ProposalStyle):
    """One ```python block: the input line ``<param> = <input>``, then f; the reply starts inside the block."""
    types = ("code_o", "code_i")
    one_block = True
    param = "x"
    prefill = "```python\nx = "
    input_line = re.compile(r"^x\s*=\s*(.+?)\s*$")
    line_shown = "x = <input>"  # the line a reply without it is told to open with

    def block(self, t: Task) -> str:
        return fence("python", f"{self.param} = {t.inputs[0] if t.inputs else ''}\n{t.program}")

    def proposal_prefill(self, tt: TaskType) -> str:
        return self.prefill if self.lays_out(tt) else super().proposal_prefill(tt)

    def parse_proposal(self, tt: TaskType, text: str, *, program: str | None = None) -> Proposal | ParseError:
        if not self.lays_out(tt):
            return super().parse_proposal(tt, text, program=program)
        got = extract(text, {"python": 1})
        if isinstance(got, ParseError):
            return got
        first, _, body = got["python"][0].partition("\n")
        m = self.input_line.match(first)
        if m is None or not body.strip():
            return ParseError("missing_input", f"the block must open with `{self.line_shown}` and then define f")
        return Proposal(type=tt.name, program=body.strip("\n"), inputs=[m.group(1)])


class ExpressionStyle(OneBlockStyle):
    name = "expression"
    starts_inside = "`x = `"
    seed_files = (SEED_FILE,)

    def teacher_prompt(self, tt: TaskType, references: list[Task], rng: random.Random | None = None) -> str:
        if not self.lays_out(tt):
            return super().teacher_prompt(tt, references, rng)
        refs = "\n\n".join(f"Reference {i + 1}:\n{self.block(t)}" for i, t in enumerate(references))
        return ("Write one integer input x and a new Python function f(x) whose body is a single return "
                f"expression. {tt.goal}\n{FORMAT_RULES}\n\n"
                f"{refs}\n\nNow write your own ```python block in the same layout: the line x = ..., then f.")


EXPRESSION = register_style(ExpressionStyle())
