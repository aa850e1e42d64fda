"""Fenced-block parsing of model output. Strings only: nothing here evaluates model text.

Forgiving about whitespace (indented fences, trailing spaces, ``` python, a closing fence glued to the last line,
upper-case tags); strict about content: a missing block is a format error, and so is an unclosed fence unless the
closed blocks before it already hold everything the reply needs. A block left open at the end is what a reply cut
off by the length cap looks like after it has done its job (small models go on writing blocks until the cap), and
a regex search for each block would ignore it too; what is inside it is never used.
"""

from __future__ import annotations

import re

from lorapop.tasks.base import ParseError

MAX_TEXT_CHARS = 64_000  # model outputs are a few hundred tokens; anything far longer is junk, not a task
_OPEN = re.compile(r"^\s*```[ \t]*([A-Za-z_]*)[ \t]*$")


def coerce_text(text) -> str | ParseError:
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    if not isinstance(text, str):
        return ParseError("not_text", type(text).__name__)
    if len(text) > MAX_TEXT_CHARS:
        return ParseError("too_long", f"{len(text)} chars")
    if "\x00" in text:
        return ParseError("binary", "NUL byte in output")
    return text


def fenced_blocks(text) -> tuple[list[tuple[str, str]], str | None] | ParseError:
    """The closed blocks as [(tag, body)] in order of appearance (tag lower-cased, "" for a bare fence), and the tag
    of a block still open at the end (None when every fence is closed)."""
    text = coerce_text(text)
    if isinstance(text, ParseError):
        return text
    blocks: list[tuple[str, str]] = []
    tag, body = None, []
    for line in text.splitlines():
        if tag is None:
            m = _OPEN.match(line)
            if m:
                tag, body = m.group(1).lower(), []
            continue
        stripped = line.rstrip()
        if stripped.lstrip() == "```":
            blocks.append((tag, "\n".join(body)))
            tag = None
        elif stripped.endswith("```"):
            body.append(stripped[:-3])
            blocks.append((tag, "\n".join(body)))
            tag = None
        else:
            body.append(line)
    return blocks, tag


def _clean(body: str, tag: str) -> str:
    if tag == "python":
        lines = body.splitlines()
        while lines and not lines[0].strip():
            lines.pop(0)
        indent = min((len(l) - len(l.lstrip()) for l in lines if l.strip()), default=0)
        return "\n".join(l[indent:] for l in lines).rstrip()
    return body.strip()


def extract(text, want: dict[str, int]) -> dict[str, list[str]] | ParseError:
    """Blocks by tag. `want` maps tag -> minimum count; for minimum 1 the last block of that tag wins (models often
    echo the prompt's example first); for larger minimums every non-empty block is returned in order. A block still
    open at the end is ignored when the closed ones suffice, and is the error (unclosed_fence) when they do not."""
    got = fenced_blocks(text)
    if isinstance(got, ParseError):
        return got
    blocks, open_tag = got
    out: dict[str, list[str]] = {}
    for tag, n in want.items():
        found = [_clean(b, tag) for t, b in blocks if t == tag or (tag == "python" and t in ("py", "python3"))]
        found = [b for b in found if b]
        if len(found) < n:
            if open_tag is not None:
                return ParseError("unclosed_fence", f"```{open_tag} is never closed")
            return ParseError(f"missing_{tag}", f"need {n} ```{tag} block(s), found {len(found)}")
        out[tag] = found[-1:] if n == 1 else found
    return out
