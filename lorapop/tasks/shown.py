"""What a student is shown must be what runs, and what it must write must fit its reply: a teacher's text that the
student's tokenizer would rewrite is refused, and so is a task whose answer cannot fit the student's budget.

A task's program, inputs, outputs and message reach a student (and later teachers, as references) through the
chat template and the tokenizer, while the sandbox runs the text as generated. Two rewrites lie between:

* Unicode normalisation: Qwen2's tokenizer (the paper's Qwen2.5 bases) applies NFC before it splits, so a program
  that counts U+212A KELVIN SIGN, or ``e`` followed by a combining acute accent, is shown counting ``K`` and ``é``:
  every student answers the program it was shown, and is judged on another. Text that NFC leaves as it is reaches the
  student unchanged under any NFC tokenizer, and under one without a normaliser (SmolLM2's) as well.
* Added tokens: ``<|im_end|>`` written inside a program is encoded as the special token itself, so the program's
  text becomes turn boundaries of the student's prompt (a fake assistant turn, a new user turn). Any of the
  tokenizer's added-token strings is refused, special or not: each is one token however it is spelled around.

A proposal is refused (``Invalid("not_tokenizer_stable")``, the invalid task's reward) at the validate stage
(lorapop/train/stages.py): its program, inputs and message before anything runs, its outputs once validated. A
student's answer needs no such check: it is judged as it runs, never shown to anyone. Tokenizers that normalise to
NFKC (or lower-case) would need that form here instead; the configs' tokenizers (SmolLM2, Qwen2.5) are at most NFC.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterable
from typing import Any

from lorapop.tasks.base import Invalid

REASON = "not_tokenizer_stable"


def reserved_strings(tokenizer: Any) -> tuple[str, ...]:
    """The tokenizer's added-token strings (special or not: ``<|im_start|>``, ``<|endoftext|>``, SmolLM2's
    ``<repo_name>``...), longest first; empty for None."""
    if tokenizer is None:
        return ()
    out = {str(t) for t in getattr(tokenizer, "all_special_tokens", None) or ()}
    for tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        out.add(str(getattr(tok, "content", tok)))
    return tuple(sorted((s for s in out if s), key=lambda s: (-len(s), s)))


def unstable(text: str, reserved: Iterable[str] = ()) -> str | None:
    """Why ``text`` would not reach a student as written (not NFC, or holding one of ``reserved``), else None."""
    if not unicodedata.is_normalized("NFC", text):
        norm = unicodedata.normalize("NFC", text)
        at = next((i for i, (a, b) in enumerate(zip(text, norm)) if a != b), min(len(text), len(norm)))
        return f"not NFC: the tokenizer would rewrite {text[at:at + 2]!r} (at character {at})"
    hit = next((s for s in reserved if s in text), None)
    return None if hit is None else f"holds the tokenizer's token {hit!r}"


def shown_invalid(texts: Iterable[tuple[str, str]], reserved: Iterable[str] = ()) -> Invalid | None:
    """``Invalid(not_tokenizer_stable)`` for the first (what, text) pair :func:`unstable` refuses, else None."""
    reserved = tuple(reserved)
    for what, text in texts:
        why = unstable(text, reserved) if isinstance(text, str) else None
        if why:
            return Invalid(REASON, f"{what}: {why}"[:200])
    return None


def proposal_texts(p: Any) -> list[tuple[str, str]]:
    """What of a proposal (or a validated task) a student is shown: program, inputs, outputs, message."""
    out = [("program", p.program)] + [(f"input {i + 1}", t) for i, t in enumerate(p.inputs)]
    out += [(f"output {i + 1}", t) for i, t in enumerate(getattr(p, "outputs", None) or [])]
    return out + ([("message", p.message)] if getattr(p, "message", None) else [])


def answer_of(type_name: str, task: Any) -> str:
    """What the student writes inside its answer block: the output (code_o) or the input (code_i)."""
    return task.inputs[0] if type_name == "code_i" else task.outputs[0]


def answer_tokens(answer: str, count_tokens: Callable[[str], int]) -> int:
    # The answer block's content and the newline and fence the stop string ends at: all generated tokens.
    return count_tokens(f"{answer}\n```")


def over_budget(type_name: str, task: Any, count_tokens: Callable[[str], int] | None,
                answer_budget: int | None) -> Invalid | None:
    """``answer_over_budget`` when a code_o or code_i task's answer and its fence take more tokens than the student's
    reply may (``selfplay.solve.max_new_tokens``): the best reply would be cut at the budget, an unclosed block, a
    format error, so no student could answer. Every style's validation applies it (lorapop/tasks/styles/base.py);
    ``count_tokens`` None skips it (a caller without a tokenizer: the validate stage always passes the engine's).
    Under a prefill the prefilled part is counted too: the check errs by a token on the safe side."""
    if type_name not in ("code_o", "code_i") or count_tokens is None or answer_budget is None:
        return None
    n = answer_tokens(answer_of(type_name, task), count_tokens)
    if n > answer_budget:
        return Invalid("answer_over_budget", f"the {type_name} answer and its fence take {n} tokens > "
                                             f"selfplay.solve.max_new_tokens {answer_budget}")
    return None
