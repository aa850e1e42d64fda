"""What a student is shown must be what runs: a teacher's text that the student's tokenizer would rewrite is refused.

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
from collections.abc import Iterable
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
