"""Math answers: extraction from model output and checking with ``math-verify``, with a bounded time per check.

Extraction, in order:

1. AZR's rule: the content of the last ``<answer>...</answer>`` (and within it the last ``\\boxed{}``, if any);
2. the content of the last ``\\boxed{...}`` (or ``\\fbox{}``);
3. none of those: the whole text goes to ``math_verify.parse`` (its own extraction finds "the answer is 42" in
   "The answer is 42. (checked in 3 steps)");
4. math-verify found nothing: the last number in the text (``-1,234.5`` style, commas dropped; also ``3/4``).

No answer -> wrong. Scientific notation written the programming way (``1.3e-6``) is rewritten as
``1.3 \\times 10^{-6}`` first: math-verify's LaTeX parser reads ``1.3e-6`` as ``1.3 e - 6`` (Euler's e). Answers and
golds are wrapped in ``\\boxed{}`` before ``parse`` so that its LaTeX extractor sees both the same way.

**Bounded time.** math-verify guards parse and verify with ``signal.alarm``, which works only on a process's main
thread, and some sympy work (a huge power) runs in C where no signal handler gets a chance. So every check runs in
one long-lived helper process (spawned, so it never inherits torch's threads), on that process's main thread with
math-verify's own timeouts on; the caller waits at most ``timeout_s`` for the answer, and a helper that does not
answer in time is killed (the check counts as wrong, with ``"timeout": true``) and replaced on the next check. This
holds from any thread of the caller, and never touches the caller's own SIGALRM.

**Bounded memory.** The helper's address space is capped (``memory_mb``, RLIMIT_AS): an answer that makes sympy build
a huge number or expression ends in a MemoryError inside the helper (the answer counts as wrong) or, when the helper
itself dies of it, in a replaced helper. Nothing of an answer is parsed in the caller but by the regular expressions
of :func:`extract_answer` and :func:`last_number`, whose time is linear in the text.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import subprocess
import sys
import threading
import time

from lorapop.eval.data import last_boxed
from lorapop.executor.base import ready
from lorapop.executor.worker import write_all

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")
_SCI = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?)[eE]([+-]?\d+)(?![\w.])")
_ANSWER_TAG = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)

# math-verify's own limits inside the helper (seconds); the caller's bound (timeout_s) sits above them.
PARSE_TIMEOUT_S = 5
VERIFY_TIMEOUT_S = 5
# The helper's address-space cap (MiB): python, sympy and math-verify take about 190 MiB of it.
MEMORY_MB = 2048


def normalize_scientific(s: str) -> str:
    """``1.3e-6`` -> ``1.3 \\times 10^{-6}`` (see the module docstring)."""
    return _SCI.sub(lambda m: f"{m.group(1)} \\times 10^{{{int(m.group(2))}}}", s)


def extract_answer(text: str) -> str | None:
    """Steps 1-2 of the module docstring: the tagged or boxed answer, or None when there is neither."""
    tags = _ANSWER_TAG.findall(text) if "<answer>" in text else []
    if tags:
        inner = tags[-1].strip()
        boxed = last_boxed(inner)
        inner = boxed.strip() if boxed is not None else inner
        if inner.startswith("\\[") and inner.endswith("\\]"):
            inner = inner[2:-2].strip()
        return inner or None
    boxed = last_boxed(text)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    return None


def last_number(text: str) -> str | None:
    nums = _NUMBER.findall(text)
    return nums[-1].replace(",", "").replace(" ", "") if nums else None


def _clean_gold(g: str) -> str:
    g = g.strip()
    if len(g) >= 2 and g[0] == "$" and g[-1] == "$":
        g = g.strip("$").strip()
    return g


# ---- runs in the helper process ---------------------------------------------------------------------------------

def _matches(golds: list[str], pred: list, answer: str) -> bool:
    from math_verify import parse, verify

    for g in golds:
        gold = parse("\\boxed{" + normalize_scientific(_clean_gold(g)) + "}", parsing_timeout=PARSE_TIMEOUT_S)
        if gold and pred and verify(gold, pred, timeout_seconds=VERIFY_TIMEOUT_S):
            return True
        # A gold that math-verify cannot parse still counts when the strings agree exactly.
        if not gold and _clean_gold(g).replace(" ", "") == answer.replace(" ", ""):
            return True
    return False


def score_here(golds: list[str], output: str) -> dict:
    """The check itself, in the current process (the helper calls it on its main thread)."""
    from math_verify import parse

    ans = extract_answer(output)
    if ans is None:
        whole = parse(normalize_scientific(output), parsing_timeout=PARSE_TIMEOUT_S)
        if whole:
            return {"pass": _matches(golds, whole, str(whole[-1])), "answer": str(whole[-1])}
        ans = last_number(output)
    if ans is None:
        return {"pass": False, "answer": None}
    pred = parse("\\boxed{" + normalize_scientific(ans) + "}", parsing_timeout=PARSE_TIMEOUT_S)
    return {"pass": _matches(golds, pred, ans), "answer": ans}


def _serve(memory_mb: int = 0) -> None:
    """The helper's loop: one JSON line ``[id, golds, output]`` in, one JSON line (the result, with that id) out;
    its address space capped at ``memory_mb`` MiB (0: no cap)."""
    import json
    import logging
    import resource

    if memory_mb:
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20,) * 2)

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "Timeout during comparison" is in our result
    import math_verify  # noqa: F401  (load sympy before saying ready)

    # The results go out on a private copy of stdout; fd 1 itself now leads to stderr (discarded), so nothing a
    # library prints while it reads an answer can pass for a result line.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        rid = None
        try:
            rid, golds, output = json.loads(line)
            res = score_here(golds, output)
        except Exception as e:  # a check that breaks (MemoryError included) counts as wrong, the helper lives on
            res = {"pass": False, "answer": None, "error": f"{type(e).__name__}: {str(e)[:200]}"}
        out.write(json.dumps({**res, "id": rid}) + "\n")
        out.flush()


# ---- caller side ------------------------------------------------------------------------------------------------

class MathChecker:
    """One helper process; :meth:`score` answers within ``timeout_s`` (plus the helper's start-up once).

    The helper is a plain ``python -c`` child speaking JSON lines on its stdin/stdout (not multiprocessing, whose
    spawn re-imports the caller's main script)."""

    def __init__(self, timeout_s: float = 20.0, startup_timeout_s: float = 120.0, memory_mb: int = MEMORY_MB):
        self.timeout_s, self.startup_timeout_s, self.memory_mb = timeout_s, startup_timeout_s, memory_mb
        self._proc: subprocess.Popen | None = None
        self._buf = b""
        self._lock = threading.Lock()
        self.n_timeouts = 0
        self._next_id = 0  # each request's id, echoed in its reply: a reply out of step is never taken for another

    def _readline(self, timeout_s: float) -> bytes | None:
        deadline = time.monotonic() + timeout_s
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not ready([fd], [], left)[0]:  # poll: any descriptor number (select stops at 1023)
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def _start(self) -> None:
        code = (f"import sys; sys.path[:0] = {[p for p in sys.path if p]!r}; "
                f"from lorapop.eval.mathcheck import _serve; _serve({int(self.memory_mb)})")
        self._proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, bufsize=0)
        self._buf = b""
        if self._readline(self.startup_timeout_s) != b"ready":
            self._stop()
            raise RuntimeError(f"the math-verify helper did not start within {self.startup_timeout_s:g}s "
                               f"(is math-verify installed for {sys.executable}?)")

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc.stdin.close()
            self._proc.stdout.close()
        self._proc = None

    def score(self, golds: list[str], output: str) -> dict:
        """``{"pass": bool, "answer": str | None}`` (+ ``"timeout": True`` when the bound was hit)."""
        with self._lock:
            try:
                if self._proc is None or self._proc.poll() is not None:
                    self._stop()
                    self._start()
            except BaseException:  # an interrupted start: its "ready" unread would be taken for the next reply
                self._stop()
                raise
            try:
                self._next_id += 1
                rid = self._next_id
                # all of it: a write a signal interrupted returns short (a long answer was cut, and the helper
                # waited for the rest of its line until the clock ended)
                write_all(self._proc.stdin.fileno(), (json.dumps([rid, list(golds), output]) + "\n").encode())
                line = self._readline(self.timeout_s)
                res = json.loads(line) if line is not None else None
                if isinstance(res, dict) and res.pop("id", None) == rid and isinstance(res.get("pass"), bool):
                    return res
            except (OSError, ValueError):
                pass
            except BaseException:  # an interrupt: the helper may still answer this request, so it is not kept
                self._stop()
                raise
            self.n_timeouts += 1
            self._stop()  # a stuck (or garbled) helper is replaced on the next check
            return {"pass": False, "answer": extract_answer(output) or last_number(output), "timeout": True}

    def close(self) -> None:
        with self._lock:
            self._stop()


_default: MathChecker | None = None
_default_lock = threading.Lock()


def default_checker() -> MathChecker:
    global _default
    with _default_lock:
        if _default is None:
            _default = MathChecker()
            atexit.register(_default.close)
        return _default


def score_math(golds: list[str], output: str, checker: MathChecker | None = None) -> dict:
    """Extract the answer from ``output`` and check it against the golds (see the module docstring)."""
    return (checker or default_checker()).score(golds, output)


def check_answer(golds: list[str], answer: str | None, checker: MathChecker | None = None) -> bool:
    """True when the bare ``answer`` is equivalent to a gold (it is checked as if it were boxed)."""
    if answer is None or not answer.strip():
        return False
    return bool(score_math(golds, "\\boxed{" + answer + "}", checker)["pass"])
