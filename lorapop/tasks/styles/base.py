"""What a proposal style is, and the registry ``selfplay.proposal_style`` names one from (docs/ARCHITECTURE.md,
"Proposal styles and prompt formats").

A style is the layout teachers propose code_o/code_i tasks in and everything that follows from it: the prefills
that start each proposal and answer, the teacher prompt (and a student prompt where the layout changes what the
student is shown), the proposal parser, its validity checks beyond the shared ones and what they need, the seed
file of its reference tasks and the probe's held-out family, and the config settings it needs (checked when the
config loads). :class:`ProposalStyle` holds AZR's layout, what every task type does by itself: a style overrides
what it changes, for the task types in its ``types``, and leaves the rest (code_f's one layout, say) to the type.

A style reads text the prompt format has already unwrapped (lorapop/tasks/formats.py) and never compares a style
or format name: what differs between styles is a method or attribute of each.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from lorapop.configlib import ConfigError, suggest
from lorapop.tasks import expression_family
from lorapop.tasks.base import Invalid, ParseError, Proposal, Task, TaskType
from lorapop.tasks.shown import over_budget

if TYPE_CHECKING:  # the Protocol only; the sandbox itself loads where it runs
    from lorapop.executor.base import Executor


class ProposalStyle:
    name = ""
    # the task types whose proposals this style lays out; every other type keeps its own layout
    types: tuple[str, ...] = ()
    # a proposal is one block, so selfplay.propose.stop may end it at the block's closing fence
    one_block = False
    # where the reply starts inside the block (shown in the error when selfplay.response_prefill is off); None:
    # the style works without a prefill
    starts_inside: str | None = None
    # the style's seed file holds its references alone: the identity seed (f(a) on a string) is left out
    replaces_identity_seed = False
    # the reference tasks of the style, as shipped in lorapop/data (named by the configs that use it)
    seed_files: tuple[str, ...] = ()

    def lays_out(self, tt: TaskType) -> bool:
        return tt.name in self.types

    # ---- prompts ---------------------------------------------------------------------------------------------------
    def proposal_prefill(self, tt: TaskType) -> str:
        return tt.proposal_prefill

    def answer_prefill(self, tt: TaskType) -> str:
        return tt.answer_prefill

    def teacher_prompt(self, tt: TaskType, references: list[Task], rng: random.Random | None = None) -> str:
        return tt.teacher_prompt(references, rng)

    def student_prompt(self, tt: TaskType, task: Task) -> str:
        return tt.student_prompt(task)

    # ---- reading and checking proposals ----------------------------------------------------------------------------
    def parse_proposal(self, tt: TaskType, text: str, *, program: str | None = None) -> Proposal | ParseError:
        return tt.parse_proposal(text, program=program)

    def validate_many(self, tt: TaskType, proposals: list[Proposal], executor: Executor, *, count_tokens=None,
                      answer_budget: int | None = None, **kw) -> list[Task | Invalid]:
        """The shared checks, then the answer's budget (``count_tokens``: text -> tokens in the model's tokenizer;
        ``answer_budget``: selfplay.solve's max_new_tokens; lorapop/tasks/shown.py, over_budget); a style with its own
        checks adds them."""
        got = tt.validate_many(proposals, executor, **kw)
        return [over_budget(tt.name, r, count_tokens, answer_budget) or r if isinstance(r, Task) else r for r in got]

    # ---- the probe and the config --------------------------------------------------------------------------------
    def probe_tasks(self, per_level: int, seed: int) -> list[tuple[int, Task]]:
        """The capability probe's held-out code_o tasks, (level, task) at three levels: integer expressions unless
        the style has its own family (lorapop/train/probe.py)."""
        return expression_family.probe_tasks(per_level, seed)

    def check_config(self, sp: Any) -> None:
        """Refuse a ``selfplay`` section this style cannot work under (raises ConfigError, saying what to set)."""
        if self.starts_inside is not None and not sp.response_prefill:
            raise ConfigError(f"selfplay.proposal_style: '{self.name}' starts the reply inside its block, "
                              f"after {self.starts_inside}, a prefill: set selfplay.response_prefill: true")


STYLES: dict[str, ProposalStyle] = {}


def register_style(style: ProposalStyle) -> ProposalStyle:
    """Add ``style`` under its name (replacing one of the same name); returns it."""
    if not style.name:
        raise ValueError("a proposal style needs a name")
    STYLES[style.name] = style
    return style


def lookup(registry: dict[str, Any], name: str, key: str) -> Any:
    """``registry[name]``; an unknown name is a ConfigError naming ``key`` and the registered names."""
    try:
        return registry[name]
    except (KeyError, TypeError):
        raise ConfigError(f"{key}: unknown name {name!r}{suggest(str(name), list(registry))}; registered: "
                          f"{', '.join(registry)}") from None


def proposal_style(name: str) -> ProposalStyle:
    return lookup(STYLES, name, "selfplay.proposal_style")


def names_of(styles: list[ProposalStyle]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    names = [s.name for s in styles]
    return " and ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " and " + names[-1]
