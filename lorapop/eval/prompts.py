"""Prompt templates for ``lorapop eval``: EvalPlus's instruction format, AZR's evaluation templates, and a plain one.

A template turns a problem's task text into the token ids the engine continues. Every template here is explicit:
the exact text is below (and in the README), and no model's *default* system prompt is added (SmolLM2's and
Qwen2.5's chat templates insert one when the messages have no system turn; :func:`chat_ids` renders the messages
with a placeholder system turn and cuts that turn out again).

``--prompt`` picks per family:

==========  ==============  ==============
--prompt    code            math
==========  ==============  ==============
auto        evalplus        azr
evalplus    evalplus        plain (EvalPlus has no math template)
azr         azr             azr
plain       plain           plain
==========  ==============  ==============

* **evalplus** (``evalplus/codegen.py`` + ``evalplus/provider/utility.py::make_raw_chat_prompt``): the user turn is
  the instruction prefix, then the task prompt in a bare code fence; the assistant turn is *prefilled* with the
  response prefix and an opening ```python fence, and the model continues the code.
* **azr**, code: AZR's fork of EvalPlus (``evalperf_type == "azr"``): the same format with AZR's instruction prefix
  and ``Assistant: <think>`` as the response prefix. **azr**, math: AZR's ``math_eval`` ``azr`` prompt type, raw
  text with no chat template (as AZR's evaluation script runs it); answers are read from ``<answer>`` tags first.
* **plain**: one user turn (the task and a one-line instruction) under the chat template, nothing prefilled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lorapop.tasks.azr_format import AZR_PREAMBLE, AZR_RESPONSE_PREFIX

EVALPLUS_INSTRUCTION_PREFIX = ("Please provide a self-contained Python script that solves the following problem in a "
                               "markdown code block:")
EVALPLUS_RESPONSE_PREFIX = ("Below is a Python script with a self-contained function that solves the problem and "
                            "passes corresponding tests:")
# AZR's R1 sentence and response prefix are self-play's too (selfplay.prompt_format: azr): one definition, in the
# task layer below this one
AZR_CODE_INSTRUCTION_PREFIX = (AZR_PREAMBLE + " User: Please provide an efficient and self-contained Python script "
                               "that solves the following problem in a markdown code block:")
AZR_CODE_RESPONSE_PREFIX = AZR_RESPONSE_PREFIX
AZR_MATH_TEMPLATE = AZR_PREAMBLE + " User: {input}\nAssistant:"
PLAIN_MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
PLAIN_CODE_INSTRUCTION = "Write your solution as a complete Python program in a single ```python code block."

PROMPT_CHOICES = ("auto", "evalplus", "azr", "plain")
_BY_FAMILY = {"auto": {"code": "evalplus", "math": "azr"}, "evalplus": {"code": "evalplus", "math": "plain"},
              "azr": {"code": "azr", "math": "azr"}, "plain": {"code": "plain", "math": "plain"}}

# Markers that cannot occur in a task: where the prefilled assistant turn is cut, and the placeholder system turn.
_SPLIT = "-[[]]-this-is-really-our-highest-priority-[[]]-"  # EvalPlus's _MAGIC_SPLITTER_
_NO_SYSTEM = "\x1elorapop-placeholder-system-turn\x1e"


def template_for(prompt: str, family: str) -> str:
    """The template name used for a benchmark family ("code" or "math") under ``--prompt prompt``."""
    if prompt not in _BY_FAMILY:
        raise ValueError(f"unknown prompt template {prompt!r}; valid: {', '.join(PROMPT_CHOICES)}")
    return _BY_FAMILY[prompt][family]


@dataclass(frozen=True)
class Rendered:
    ids: list[int]
    text: str  # the prompt as text (recorded in eval.json for the first problem)
    response_prefix: str  # what the assistant turn was prefilled with: extraction sees prefix + completion


def _render(tok: Any, messages: list[dict], add_generation_prompt: bool) -> str:
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def chat_text(tok: Any, messages: list[dict], add_generation_prompt: bool) -> str:
    """The chat template applied to ``messages`` with no system turn, not even the template's default one."""
    sys_turn = [{"role": "system", "content": _NO_SYSTEM}]
    try:
        full = _render(tok, sys_turn + messages, add_generation_prompt)
        alone = _render(tok, sys_turn, False)
    except Exception:  # a template without a system role: it cannot add a default one either
        return _render(tok, messages, add_generation_prompt)
    if not full.startswith(alone) or _NO_SYSTEM not in alone:
        return _render(tok, messages, add_generation_prompt)
    rest = full[len(alone):]
    bos = getattr(tok, "bos_token", None) or ""
    if bos and alone.startswith(bos) and not rest.startswith(bos):
        rest = bos + rest  # e.g. Llama 3's <|begin_of_text|> sits before the system header
    return rest


def _ids(tok: Any, text: str, add_special_tokens: bool = False) -> list[int]:
    return [int(t) for t in tok(text, add_special_tokens=add_special_tokens)["input_ids"]]


def _prefilled(tok: Any, instruction_prefix: str, response_prefix: str, task: str) -> Rendered:
    """``make_raw_chat_prompt``: instruction prefix + fenced task; assistant turn cut right after ```python."""
    user = f"{instruction_prefix}\n```\n{task.strip()}\n```\n"
    prefill = f"{response_prefix}\n```python\n"
    text = chat_text(tok, [{"role": "user", "content": user},
                           {"role": "assistant", "content": prefill + _SPLIT + "\n```\n"}], False).split(_SPLIT)[0]
    return Rendered(_ids(tok, text), text, prefill)


def render(tok: Any, template: str, family: str, task: str) -> Rendered:
    """Token ids for one problem. ``task`` is the benchmark's own task text (see :class:`lorapop.eval.data.Problem`)."""
    if family == "code":
        if template == "evalplus":
            return _prefilled(tok, EVALPLUS_INSTRUCTION_PREFIX, EVALPLUS_RESPONSE_PREFIX, task)
        if template == "azr":
            return _prefilled(tok, AZR_CODE_INSTRUCTION_PREFIX, AZR_CODE_RESPONSE_PREFIX, task)
        user = f"{task.strip()}\n\n{PLAIN_CODE_INSTRUCTION}"
    else:
        if template == "azr":
            text = AZR_MATH_TEMPLATE.format(input=task)
            return Rendered(_ids(tok, text, add_special_tokens=True), text, "")
        user = f"{task.strip()}\n\n{PLAIN_MATH_INSTRUCTION}"
    if template not in ("plain", "evalplus"):
        raise ValueError(f"unknown prompt template {template!r}")
    text = chat_text(tok, [{"role": "user", "content": user}], True)
    return Rendered(_ids(tok, text), text, "")


def describe(template: str, family: str) -> dict:
    """What eval.json records about a template: its name and the exact strings it is made of."""
    if family == "code" and template == "evalplus":
        return {"name": "evalplus", "instruction_prefix": EVALPLUS_INSTRUCTION_PREFIX,
                "response_prefix": EVALPLUS_RESPONSE_PREFIX, "chat_template": True, "system_prompt": None}
    if family == "code" and template == "azr":
        return {"name": "azr", "instruction_prefix": AZR_CODE_INSTRUCTION_PREFIX,
                "response_prefix": AZR_CODE_RESPONSE_PREFIX, "chat_template": True, "system_prompt": None}
    if template == "azr":
        return {"name": "azr", "template": AZR_MATH_TEMPLATE, "chat_template": False}
    return {"name": "plain", "instruction": PLAIN_CODE_INSTRUCTION if family == "code" else PLAIN_MATH_INSTRUCTION,
            "chat_template": True, "system_prompt": None}
