"""Prompt formats, registered by name (``selfplay.prompt_format``): how a prompt is wrapped into the model's ids,
what every reply starts with, and what the parsers read of a reply (the format check). ``short``: one chat-template
turn with the short prompts of the proposal style, the assistant turn started with the style's block prefill.
``azr``: AZR's R1 plain-text template with AZR's own prompts (lorapop/tasks/azr_prompts.py); every reply starts
inside ``<think>`` and is read inside its answer block once it passes AZR's format check
(lorapop/tasks/azr_format.py). docs/ARCHITECTURE.md, "Proposal styles and prompt formats", says how to add one.
"""

from __future__ import annotations

import random
from typing import Any

from lorapop.configlib import ConfigError
from lorapop.tasks.azr_format import THINK_OPEN, r1_prompt_ids, unwrap
from lorapop.tasks.base import Answer, ParseError, Proposal, Task, TaskType
from lorapop.tasks.styles.base import ProposalStyle, lookup


class PromptFormat:
    """The short chat prompt; :class:`AzrFormat` overrides what AZR's template changes."""
    name = "short"
    # the longest prompt `lorapop plan` assumes unless told: the short prompts' budget (teacher prompts with their
    # references come near it)
    plan_prompt_tokens = 1024

    def check_config(self, sp: Any) -> None:
        """Refuse a ``selfplay`` section this format cannot work under (raises ConfigError)."""

    def reply_start(self, prefill: str) -> str:
        """What every reply starts with, in the prompt's ids (and what the parsers read before the completion):
        here the style's block prefill (empty without selfplay.response_prefill)."""
        return prefill

    def proposal_start(self, style: ProposalStyle, tt: TaskType, response_prefill: bool) -> str:
        """:meth:`reply_start` of a teacher's reply: the style's proposal prefill under selfplay.response_prefill."""
        return self.reply_start(style.proposal_prefill(tt) if response_prefill else "")

    def answer_start(self, style: ProposalStyle, tt: TaskType, response_prefill: bool) -> str:
        """:meth:`reply_start` of a student's reply: the style's answer prefill under selfplay.response_prefill."""
        return self.reply_start(style.answer_prefill(tt) if response_prefill else "")

    def prompt_ids(self, engine: Any, text: str, prefill: str) -> list[int]:
        """The chat prompt of ``text``, its assistant turn started with ``prefill`` (may be empty)."""
        ids = engine.chat_prompt(text)
        return ids + list(engine.tokenizer.encode(prefill, add_special_tokens=False)) if prefill else ids

    def answer_text(self, reply: Any) -> Any:
        """What the block parsers read of a reply: the reply itself."""
        return reply

    def teacher_prompt(self, style: ProposalStyle, tt: TaskType, references: list[Task],
                       rng: random.Random | None = None) -> str:
        return style.teacher_prompt(tt, references, rng)

    def student_prompt(self, style: ProposalStyle, tt: TaskType, task: Task) -> str:
        return style.student_prompt(tt, task)

    def parse_proposal(self, style: ProposalStyle, tt: TaskType, reply: Any, *, program: str | None = None
                       ) -> Proposal | ParseError:
        text = self.answer_text(reply)
        return text if isinstance(text, ParseError) else style.parse_proposal(tt, text, program=program)

    def parse_answer(self, tt: TaskType, reply: Any) -> Answer | ParseError:
        text = self.answer_text(reply)
        return text if isinstance(text, ParseError) else tt.parse_answer(text)


class AzrFormat(PromptFormat):
    name = "azr"
    # AZR's proposer prompt has one layout
    styles = ("azr",)
    # AZR drops prompts longer than this (max_prompt_length). Its proposer prompts with K=6 seed references are
    # 1.4k-2.7k tokens and grow with the programs in the buffer, so plan for the longest AZR keeps.
    plan_prompt_tokens = 6144

    def check_config(self, sp: Any) -> None:
        # AZR's reply opens with its think block: no block can be prefilled, and its one proposal layout is AZR's,
        # so the 135M-model layouts and prefills are refused rather than silently ignored
        if sp.response_prefill:
            raise ConfigError("selfplay.response_prefill: must be false with selfplay.prompt_format: azr (the "
                              "reply starts inside <think>, its blocks inside <answer>: nothing to prefill)")
        if sp.proposal_style not in self.styles:
            raise ConfigError(f"selfplay.proposal_style: must be azr with selfplay.prompt_format: azr (AZR's "
                              f"proposer prompt has one layout), got {sp.proposal_style}")

    def reply_start(self, prefill: str) -> str:
        """The R1 template's ``<think>`` (the parsers and AZR's format check read it)."""
        return THINK_OPEN

    def prompt_ids(self, engine: Any, text: str, prefill: str) -> list[int]:
        """The R1 plain-text prompt, which ends with ``Assistant: <think>`` (``prefill`` is that ``<think>``)."""
        return r1_prompt_ids(engine.tokenizer, text)

    def answer_text(self, reply: Any) -> Any:
        """The content of the reply's answer block once it passes AZR's format check; a ParseError (a format error)
        when it does not."""
        return unwrap(reply)

    def teacher_prompt(self, style: ProposalStyle, tt: TaskType, references: list[Task],
                       rng: random.Random | None = None) -> str:
        return tt.azr_teacher_prompt(references)

    def student_prompt(self, style: ProposalStyle, tt: TaskType, task: Task) -> str:
        return tt.azr_student_prompt(task)


FORMATS: dict[str, PromptFormat] = {}


def register_format(fmt: PromptFormat) -> PromptFormat:
    FORMATS[fmt.name] = fmt
    return fmt


SHORT = register_format(PromptFormat())
AZR = register_format(AzrFormat())


def prompt_format(name: str) -> PromptFormat:
    return lookup(FORMATS, name, "selfplay.prompt_format")
