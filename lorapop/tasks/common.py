"""Shared machinery of the three task types: batched validation (static checks, two runs under different
PYTHONHASHSEEDs) and the prompt pieces."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from lorapop.tasks import azr_prompts, selections
from lorapop.tasks.azr_format import unwrap
from lorapop.tasks.base import Invalid, Outcome, ParseError, Proposal, Task
from lorapop.tasks.selections import SELECTION_PREFILL
from lorapop.tasks.validity import (MAX_OUTPUT_CHARS, call_code, check_call_args, check_literal, check_program,
                                    status_to_invalid)

if TYPE_CHECKING:  # the Protocol only; the sandbox itself loads where it runs
    from lorapop.executor.sandbox import Executor

DETERMINISM_SEEDS = (1, 2)  # two processes with different hash randomisation


def validate_many(type_name: str, proposals: list[Proposal], executor: Executor, *, min_inputs: int = 1,
                  hashseeds: tuple[int, int] = DETERMINISM_SEEDS, timeout_s: float | None = None
                  ) -> list[Task | Invalid]:
    results: list[Task | Invalid | None] = [None] * len(proposals)
    jobs: list[tuple[int, int, str]] = []  # (proposal index, input index, code)
    for pi, p in enumerate(proposals):
        bad = check_program(p.program)
        if bad is None and len(set(p.inputs)) != len(p.inputs):
            bad = Invalid("duplicate_inputs", "inputs repeat")
        if bad is None and len(p.inputs) < min_inputs:
            bad = Invalid("too_few_inputs", f"{len(p.inputs)} < {min_inputs}")
        for inp in p.inputs if bad is None else []:
            bad = check_call_args(inp)
            if bad is not None:
                break
        if bad is not None:
            results[pi] = bad
            continue
        jobs.extend((pi, ii, call_code(p.program, inp)) for ii, inp in enumerate(p.inputs))
    # The two determinism runs go to the two hash-seed pools at once: run one after the other, half the workers
    # would sit idle. (A proposal that fails its first run costs a wasted second run; rare, and cheaper than that.)
    codes = [c for _, _, c in jobs]
    with ThreadPoolExecutor(2) as pool:
        second_f = pool.submit(executor.run_many, codes, timeout_s=timeout_s, hashseed=hashseeds[1])
        first = executor.run_many(codes, timeout_s=timeout_s, hashseed=hashseeds[0])
        second = second_f.result()
    failed: dict[int, Invalid] = {}
    for (pi, _, _), r in zip(jobs, first):
        if r.status != "ok" and pi not in failed:
            failed[pi] = status_to_invalid(r.status, r.error)
    second_by = {(pi, ii): r for (pi, ii, _), r in zip(jobs, second)}
    outputs: dict[int, list[str]] = {}
    for (pi, ii, _), r in zip(jobs, first):
        if pi in failed:
            continue
        r2 = second_by[(pi, ii)]
        if r2.status != "ok":
            failed[pi] = status_to_invalid(r2.status, r2.error)
        elif r2.value != r.value:
            failed[pi] = Invalid("nondeterministic", f"{r.value[:60]!r} vs {r2.value[:60]!r}")
        else:
            bad = check_literal(r.value, MAX_OUTPUT_CHARS)
            if bad is not None:
                failed[pi] = Invalid("output_too_long" if bad.reason == "output_too_long" else "output_not_literal",
                                     bad.detail)
            else:
                outputs.setdefault(pi, []).append(r.value)
    for pi, p in enumerate(proposals):
        if results[pi] is None:
            results[pi] = failed[pi] if pi in failed else Task(type=type_name, program=p.program, inputs=list(p.inputs),
                                                 outputs=outputs[pi], message=p.message)
    return results  # type: ignore[return-value]


def validate_selection(type_name: str, proposals: list[Proposal], executor: Executor, *,
                       count_tokens=None, answer_budget: int | None = None, **kw) -> list[Task | Invalid]:
    """proposal_style selection (lorapop/tasks/selections.py): its static shape checks, then :func:`validate_many`
    on the proposals that pass them, then its checks on the tasks that returns (output not None, the answer within
    ``answer_budget`` tokens as ``count_tokens`` counts them)."""
    results: list[Task | Invalid | None] = [None] * len(proposals)
    todo = []
    for i, p in enumerate(proposals):
        results[i] = selections.check_shape(p.program, p.inputs[0] if len(p.inputs) == 1 else "")
        if results[i] is None:
            todo.append(i)
    for i, res in zip(todo, validate_many(type_name, [proposals[i] for i in todo], executor, **kw)):
        results[i] = (selections.check_task(type_name, res, count_tokens, answer_budget) or res
                      if isinstance(res, Task) else res)
    return results  # type: ignore[return-value]


def answer_text(reply, fmt: str):
    """What the block parser reads: the reply itself (``short``), or under ``azr`` the content of its answer block
    once the reply passes AZR's format check (a ParseError, a format error, when it does not)."""
    return unwrap(reply) if fmt == "azr" else reply


FORMAT_RULES = ("Rules: one function named f, standard library only; no classes, printing, randomness, time, "
                "files, network or os/sys. f must be deterministic and return a value whose repr is short.")


def fence(tag: str, body: str) -> str:
    return f"```{tag}\n{body}\n```"


def render_reference(t: Task, with_output: bool = True) -> str:
    parts = [fence("python", t.program), fence("input", t.inputs[0] if t.inputs else "")]
    if with_output and t.outputs:
        parts.append(fence("output", t.outputs[0]))
    return "\n".join(parts)


# selfplay.proposal_style "expression" (the dynamics configs): one ```python block that opens with the input line
# `x = <integer>` and then defines f(x) as one return expression; the reply starts after `x = `, and a stop string
# ends it at the block's closing fence. The 135M base, asked for an ```input block and a ```python block (input
# first), parsed 10 of 16 replies and gave 0.19 valid; started inside `def f(x): return`, it never wrote the input
# block after it (0 of 16): docs/RESULTS.md, "Dynamics: the setting".
EXPRESSION_PREFILL = "```python\nx = "
_INPUT_LINE = re.compile(r"^x\s*=\s*(.+?)\s*$")
# proposal_style "selection" (lorapop/tasks/selections.py): the same one-block layout over a list, `nums = [...]`
_LIST_LINE = re.compile(r"^nums\s*=\s*(.+?)\s*$")


def expression_block(t: Task) -> str:
    return fence("python", f"x = {t.inputs[0] if t.inputs else ''}\n{t.program}")


def parse_expression_block(text: str, type_name: str = "code_o", style: str = "expression") -> Proposal | ParseError:
    """The one-block layout of ``proposal_style: expression`` (and ``selection``): input line first, then the
    program."""
    from lorapop.tasks.parsing import extract

    got = extract(text, {"python": 1})
    if isinstance(got, ParseError):
        return got
    first, _, program = got["python"][0].partition("\n")
    m = (_LIST_LINE if style == "selection" else _INPUT_LINE).match(first)
    if m is None or not program.strip():
        line = "nums = [...]" if style == "selection" else "x = <input>"
        return ParseError("missing_input", f"the block must open with `{line}` and then define f")
    return Proposal(type=type_name, program=program.strip("\n"), inputs=[m.group(1)])


class ProgramInputTask:
    """code_o and code_i: the teacher writes a program and one input; they differ in what the student sees."""

    name = ""
    goal = ""
    proposal_prefill = "```python\n"
    answer_prefill = ""

    def answer_prefill_for(self, style: str) -> str:
        return self.answer_prefill

    def proposal_prefill_for(self, style: str) -> str:
        if style == "expression":
            return EXPRESSION_PREFILL
        if style == "selection":
            return SELECTION_PREFILL
        return "```input\n" if style == "input_first" else self.proposal_prefill

    def teacher_prompt(self, references: list[Task], rng=None, style: str = "azr", fmt: str = "short") -> str:
        """``fmt`` is ``selfplay.prompt_format``: ``azr`` is AZR's proposer prompt (lorapop/tasks/azr_prompts.py),
        whatever the style. Under ``short``, style ``azr``: references as program, input and output blocks, a format
        example, and the reply's blocks in AZR's order (program, then input). ``input_first``: the reply's input
        block first, the references in that order without their outputs, and no format example. The 135M base,
        shown the first, writes the program and then an ```output block (or more programs) where the input belongs,
        and copies the example's two-argument f onto its own one-argument input; shown the second, it writes the
        input, then a program for it (docs/RESULTS.md, "The CPU demo step by step")."""
        if fmt == "azr":
            return azr_prompts.propose_program_input(self.name, references)
        if style == "expression":
            refs = "\n\n".join(f"Reference {i + 1}:\n{expression_block(t)}" for i, t in enumerate(references))
            return ("Write one integer input x and a new Python function f(x) whose body is a single return "
                    f"expression. {self.goal}\n{FORMAT_RULES}\n\n"
                    f"{refs}\n\nNow write your own ```python block in the same layout: the line x = ..., then f.")
        if style == "selection":
            return selections.teacher_prompt(references, self.goal, FORMAT_RULES)
        if style == "input_first":
            refs = "\n\n".join(f"Reference {i + 1}:\n" + "\n".join([fence("input", t.inputs[0] if t.inputs else ""),
                                                                  fence("python", t.program)])
                                for i, t in enumerate(references))
            return (f"Write one input and a new Python function f that takes it. {self.goal}\n{FORMAT_RULES}\n"
                    "The input block holds the arguments exactly as written inside f(...).\n\n"
                    f"{refs}\n\nNow write your own ```input block, then your own ```python block.")
        refs = "\n\n".join(f"Reference {i + 1}:\n{render_reference(t)}" for i, t in enumerate(references))
        example = "\n".join([fence("python", "def f(nums, k):\n    return sorted(nums)[-k:]"),
                             fence("input", "[5, 1, 4, 2], 2")])
        return (f"Write a new Python function f and one input for it. {self.goal}\n{FORMAT_RULES}\n"
                "The input block holds the arguments exactly as written inside f(...).\n\n"
                f"{refs}\n\nFormat example:\nf keeps the k largest numbers.\n{example}\n\n"
                "Now write one sentence of reasoning, then your own ```python and ```input blocks.")

    def parse_proposal(self, text, *, program: str | None = None, style: str = "azr", fmt: str = "short"):
        from lorapop.tasks.parsing import extract

        text = answer_text(text, fmt)
        if isinstance(text, ParseError):
            return text
        if style in ("expression", "selection"):
            return parse_expression_block(text, self.name, style)
        got = extract(text, {"python": 1, "input": 1})
        if isinstance(got, ParseError):
            return got
        return Proposal(type=self.name, program=got["python"][0], inputs=[got["input"][0]])

    def validate(self, proposal: Proposal, executor: Executor) -> Task | Invalid:
        return self.validate_many([proposal], executor)[0]

    def validate_many(self, proposals: list[Proposal], executor: Executor, *, style: str = "azr",
                      count_tokens=None, answer_budget: int | None = None, **kw) -> list[Task | Invalid]:
        """``style`` selection adds its own checks (lorapop/tasks/selections.py), the answer budget among them:
        ``count_tokens`` (text -> tokens, the model's tokenizer) and ``answer_budget`` (selfplay.solve's
        max_new_tokens). The other styles ignore both."""
        if style == "selection":
            return validate_selection(self.name, proposals, executor, count_tokens=count_tokens,
                                      answer_budget=answer_budget, **kw)
        return validate_many(self.name, proposals, executor, **kw)

    def check(self, task: Task, answer, executor: Executor) -> bool:
        return self.check_many(task, [answer], executor)[0].correct


def run_checks(answers: list, prepare, executor: Executor) -> list[Outcome]:
    """The shared shape of a ``check_many``: parse errors are format errors, ``prepare(answer)`` either rejects an
    answer statically (returns an Outcome) or returns sandbox code whose ``_result`` is True exactly when the answer
    is correct; all such codes run in one batched executor pass."""
    outcomes: list[Outcome | None] = [None] * len(answers)
    jobs = []
    for i, a in enumerate(answers):
        if isinstance(a, ParseError):
            outcomes[i] = Outcome("format_error", a.reason)
            continue
        got = prepare(a)
        if isinstance(got, Outcome):
            outcomes[i] = got
        else:
            jobs.append((i, got))
    for (i, _), r in zip(jobs, executor.run_many([c for _, c in jobs])):
        outcomes[i] = Outcome("correct" if r.status == "ok" and r.value == "True" else "wrong",
                              r.error or r.value or "")
    return outcomes  # type: ignore[return-value]
