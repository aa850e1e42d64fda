"""AZR's R1 plain-text template and its format check (``selfplay.prompt_format: azr``; docs/METHOD.md, "lorapop and
AZR, row by row").

Every AZR prompt, proposer or solver, is one plain string with no chat special tokens: the R1 sentence, ``User:``
and the task prompt, then ``Assistant: <think>``; the model continues inside its think block and ends at the base
model's EOS. The reply (``<think>`` plus what the model generated) is well formed when, anchored at its start, it
is a think block, then optional whitespace, then an answer block; text after ``</answer>`` is allowed (AZR's
``get_format_reward``). The blocks a task needs (```python, ```input, ```output, ```message) are read from the
content of the last answer block with the same fenced-block parser as the short prompts.

``lorapop eval``'s AZR templates (lorapop/eval/prompts.py) are built from the same sentence and response prefix,
defined here, the lower layer.
"""

from __future__ import annotations

import re
from typing import Any

from lorapop.tasks.base import ParseError
from lorapop.tasks.parsing import coerce_text

AZR_PREAMBLE = ("A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
                "The assistant first thinks about the reasoning process in the mind and then provides the user with "
                "the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
                "</answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here "
                "</answer>.")
THINK_OPEN = "<think>"
AZR_RESPONSE_PREFIX = "Assistant: " + THINK_OPEN

# AZR's config `banned_words` (paper branch), in its order, the duplicate datetime dropped: the list its proposer
# prompts name. lorapop's validity checks (lorapop/tasks/validity.py) refuse these and more.
AZR_BANNED_KEYWORDS = ("logging", "random", "multiprocessing", "pebble", "subprocess", "threading", "datetime",
                       "time", "hashlib", "hmac", "bcrypt", "os.sys", "os.path", "sys.exit", "os.environ",
                       "calendar")

# AZR's format check: re.match anchors at the start; DOTALL lets both blocks span lines; the lazy .*? with
# backtracking accepts a nested <think> or a second <answer> inside the first. format_ok decides the same in linear
# time (the regex is quadratic in repeats of "</think><answer>" without a "</answer>": 3.4 s for a 64 KB reply).
FORMAT_RE = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)


def r1_prompt(task_prompt: str) -> str:
    """The whole prompt text: AZR's ``instruction_following`` filled with ``task_prompt``."""
    return f"{AZR_PREAMBLE} User: {task_prompt}\n{AZR_RESPONSE_PREFIX}"


def r1_prompt_ids(tokenizer: Any, task_prompt: str) -> list[int]:
    """Token ids of :func:`r1_prompt`, the text as is: no chat template. The tokenizer's own special tokens (a
    Llama BOS) are added as for any plain-text prompt; Qwen2.5's and SmolLM2's add none."""
    return [int(t) for t in tokenizer(r1_prompt(task_prompt), add_special_tokens=True)["input_ids"]]


def format_ok(reply: str) -> bool:
    """AZR's format check (``FORMAT_RE.match``) on a reply that starts with the prompt's ``<think>`` (leading
    whitespace ignored), in linear time. The regex matches exactly when the text starts with ``<think>``, some
    ``</think>`` after it is followed by white space (``\\s``: ``str.isspace``) and ``<answer>``, and a ``</answer>``
    comes after that ``<answer>``; the first such ``<answer>`` leaves the most room for the ``</answer>``, so it
    is the only one to look after. Each stretch of white space is skipped once: it ends before the next ``<``."""
    text = reply.lstrip()
    if not text.startswith("<think>"):
        return False
    close = text.find("</think>", len("<think>"))
    while close >= 0:
        j = close + len("</think>")
        while j < len(text) and text[j].isspace():
            j += 1
        if text.startswith("<answer>", j):
            return text.find("</answer>", j + len("<answer>")) >= 0
        close = text.find("</think>", close + 1)
    return False


def answer_content(reply: str) -> str:
    """The text between the last ``<answer>`` and the ``</answer>`` after it (to the end when unclosed); empty when
    there is no ``<answer>`` (AZR's ``answer_conditional`` extraction)."""
    if "<answer>" not in reply:
        return ""
    return reply.rsplit("<answer>", 1)[1].split("</answer>", 1)[0]


def unwrap(reply) -> str | ParseError:
    """The answer content of a well-formed reply; a :class:`ParseError` (a format error, reward -1) otherwise."""
    text = coerce_text(reply)
    if isinstance(text, ParseError):
        return text
    if not format_ok(text):
        return ParseError("no_think_answer", "the reply is not <think>...</think> then <answer>...</answer>")
    return answer_content(text)
