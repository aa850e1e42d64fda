"""Shared machinery of the three task types: batched validation (static checks, two runs under different
PYTHONHASHSEEDs) and the prompt pieces."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from lorapop.tasks import azr_prompts
from lorapop.tasks.base import Invalid, Outcome, ParseError, Proposal, Task
from lorapop.tasks.validity import MAX_OUTPUT_CHARS, call_code, check_call_args, check_program, status_to_invalid
from lorapop.modeltext import NotLiteral
from lorapop.tasks.values import call_key, literal_value, same_text

if TYPE_CHECKING:  # the Protocol only; the sandbox itself loads where it runs
    from lorapop.executor.base import Executor

DETERMINISM_SEEDS = (1, 2, 3)  # hash seeds of an executor that names none (the sandbox draws its own at random)
_SHUFFLE = random.SystemRandom()  # the order of a check's runs: nothing a program can see or predict


def executor_seeds(executor: Executor) -> tuple[int, ...]:
    """The executor's hash seeds: validation runs under the first two, a check's rounds under all of them."""
    return tuple(getattr(executor, "hashseeds", None) or DETERMINISM_SEEDS)


def validate_many(type_name: str, proposals: list[Proposal], executor: Executor, *, min_inputs: int = 1,
                  hashseeds: tuple[int, int] | None = None, timeout_s: float | None = None
                  ) -> list[Task | Invalid]:
    hashseeds = hashseeds or executor_seeds(executor)[:2]
    results: list[Task | Invalid | None] = [None] * len(proposals)
    jobs: list[tuple[int, int, str]] = []  # (proposal index, input index, code)
    importable = getattr(executor, "importable", None)  # an executor that does not say: the banned list alone
    for pi, p in enumerate(proposals):
        bad = static_invalid(p, min_inputs, importable)
        if bad is not None:
            results[pi] = bad
            continue
        jobs.extend((pi, ii, call_code(p.program, inp)) for ii, inp in enumerate(p.inputs))
    # The two determinism runs go to the two hash-seed pools at once: run one after the other, half the workers
    # would sit idle. (A proposal that fails its first run costs a wasted second run; rare, and cheaper than that.)
    codes = [c for _, _, c in jobs]
    limit = float(timeout_s if timeout_s is not None else getattr(getattr(executor, "config", None), "timeout_s", 5.0))
    # The clock every run of the task's program gets in a check (check_answers): a run can find its clock in its own
    # memory (the worker's freed request), so one clock for all makes a check's runs indistinguishable from these. A
    # run over MAX_RUN_SHARE is refused anyway (too_slow), over CHECK_RUN_SHARE it is a timeout: invalid alike.
    clock = CHECK_RUN_SHARE * limit
    with ThreadPoolExecutor(2) as pool:
        second_f = pool.submit(executor.run_many, codes, timeout_s=clock, hashseed=hashseeds[1])
        first = executor.run_many(codes, timeout_s=clock, hashseed=hashseeds[0])
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
            continue
        if max(r.duration_s, r2.duration_s) > MAX_RUN_SHARE * limit:
            # every check runs the program CONTROL_ROUNDS times more (check_answers): bounded, so that a slow task
            # costs each check about one wall clock on two workers, not several
            failed[pi] = Invalid("too_slow", f"a run took {max(r.duration_s, r2.duration_s):.2f} s, more than "
                                             f"{MAX_RUN_SHARE:g} of the {limit:g} s wall clock")
            continue
        try:
            literal_value(r.value, MAX_OUTPUT_CHARS)
        except NotLiteral as exc:
            failed[pi] = Invalid("output_too_long" if exc.reason == "output_too_long" else "output_not_literal",
                                 exc.detail)
            continue
        # Compared as values, as every verdict is: a set of strings prints in a hash-seed order, its value does not
        if not same_text(r.value, r2.value, MAX_OUTPUT_CHARS):
            failed[pi] = Invalid("nondeterministic", f"{r.value[:60]!r} vs {r2.value[:60]!r}")
        else:
            outputs.setdefault(pi, []).append(r.value)
    for pi, p in enumerate(proposals):
        if results[pi] is None:
            results[pi] = failed[pi] if pi in failed else Task(type=type_name, program=p.program, inputs=list(p.inputs),
                                                 outputs=outputs[pi], message=p.message)
    return results  # type: ignore[return-value]


def static_invalid(p: Proposal, min_inputs: int, importable: frozenset[str] | None = None) -> Invalid | None:
    """The checks of a proposal that run nothing. Total: the parsers of model text are (lorapop/modeltext.py), and
    anything else one proposal's text could make them raise is that proposal's ``unreadable``, never the batch's.
    ``importable``: the executor's (check_program)."""
    try:
        bad = check_program(p.program, importable)
        if bad is None and len(p.inputs) < min_inputs:
            bad = Invalid("too_few_inputs", f"{len(p.inputs)} < {min_inputs}")
        for inp in p.inputs if bad is None else []:
            bad = check_call_args(inp)
            if bad is not None:
                break
        return bad if bad is not None else repeated_input(p.inputs)
    except Exception as exc:  # noqa: BLE001 - one proposal's failure
        return Invalid("unreadable", f"{type(exc).__name__}: {str(exc)[:120]}")


def repeated_input(inputs: list[str]) -> Invalid | None:
    """``duplicate_inputs`` when two inputs pass equal argument values, as a verdict compares values (``1`` and
    ``1.0``, ``[1]`` and ``([1])`` are one input): a hidden input that is a shown one respelled would hand its output
    to the student. The inputs have passed ``check_call_args``."""
    seen: dict = {}
    for i, text in enumerate(inputs):
        try:
            k = call_key(text)
        except NotLiteral as exc:
            return Invalid("not_literal", exc.detail)
        if k in seen:
            return Invalid("duplicate_inputs", f"input {i + 1} equals input {seen[k] + 1} by value")
        seen[k] = i
    return None


def read_answer(prepare, answer) -> Outcome | list[tuple[str, str]]:
    """``prepare(answer)``, total: whatever one answer's text makes the parsers raise is that answer's ``wrong``,
    never the other answers' or the step's (the parsers themselves are total, lorapop/modeltext.py: this is the
    net under them)."""
    try:
        return prepare(answer)
    except Exception as exc:  # noqa: BLE001 - one answer's failure
        return Outcome("wrong", f"unreadable answer: {type(exc).__name__}")


FORMAT_RULES = ("Rules: one function named f, standard library only; no classes, printing, randomness, time, "
                "files, network or os/sys. f must be deterministic and return a value whose repr is short.")


def fence(tag: str, body: str) -> str:
    return f"```{tag}\n{body}\n```"


def render_reference(t: Task, with_output: bool = True) -> str:
    parts = [fence("python", t.program), fence("input", t.inputs[0] if t.inputs else "")]
    if with_output and t.outputs:
        parts.append(fence("output", t.outputs[0]))
    return "\n".join(parts)


class ProgramInputTask:
    """code_o and code_i: the teacher writes a program and one input; they differ in what the student sees."""

    name = ""
    goal = ""
    proposal_prefill = "```python\n"
    answer_prefill = ""

    def teacher_prompt(self, references: list[Task], rng=None) -> str:
        """AZR's layout in the short prompts (proposal_style azr): references as program, input and output blocks,
        a format example, and the reply's blocks in AZR's order (program, then input)."""
        refs = "\n\n".join(f"Reference {i + 1}:\n{render_reference(t)}" for i, t in enumerate(references))
        example = "\n".join([fence("python", "def f(nums, k):\n    return sorted(nums)[-k:]"),
                             fence("input", "[5, 1, 4, 2], 2")])
        return (f"Write a new Python function f and one input for it. {self.goal}\n{FORMAT_RULES}\n"
                "The input block holds the arguments exactly as written inside f(...).\n\n"
                f"{refs}\n\nFormat example:\nf keeps the k largest numbers.\n{example}\n\n"
                "Now write one sentence of reasoning, then your own ```python and ```input blocks.")

    def azr_teacher_prompt(self, references: list[Task]) -> str:
        """AZR's proposer prompt (prompt_format azr; lorapop/tasks/azr_prompts.py)."""
        return azr_prompts.propose_program_input(self.name, references)

    def parse_proposal(self, text, *, program: str | None = None):
        """A program block and an input block, in either order."""
        from lorapop.tasks.parsing import extract

        got = extract(text, {"python": 1, "input": 1})
        if isinstance(got, ParseError):
            return got
        return Proposal(type=self.name, program=got["python"][0], inputs=[got["input"][0]])

    def validate(self, proposal: Proposal, executor: Executor) -> Task | Invalid:
        return self.validate_many([proposal], executor)[0]

    def validate_many(self, proposals: list[Proposal], executor: Executor, **kw) -> list[Task | Invalid]:
        return validate_many(self.name, proposals, executor, **kw)

    def check(self, task: Task, answer, executor: Executor) -> bool:
        return self.check_many(task, [answer], executor)[0].correct

    @staticmethod
    def control(task: Task) -> list[tuple[str, str]]:
        """The task's own run for :func:`check_answers`: its program on its input, which must give its output."""
        return [(call_code(task.program, task.inputs[0]), task.outputs[0])]


_CALL = call_code("", "")[:-len(")\n")]  # what call_code puts between a program and its input
CONTROL_ROUNDS = 3  # runs of the task's program per distinct input and check
CONTROL_SPREAD_S = 0.025  # at least this long between the starts of two runs of one input
MAX_RUN_SHARE = 0.4  # of the wall clock: the longest a valid task's validation run may take
CHECK_RUN_SHARE = 0.5  # of the wall clock: what every run of the task's program gets in a check (control included)


def check_answers(answers: list, prepare, control: list[tuple[str, str]], executor: Executor, *, program: str,
                  rounds: int = CONTROL_ROUNDS, spread_s: float = CONTROL_SPREAD_S) -> list[Outcome]:
    """The shared shape of a ``check_many``. Parse errors are format errors. ``prepare(answer)`` either decides an
    answer without running anything (returns an Outcome) or returns ``(code, gold output)`` pairs: the answer is
    correct when every such run returns a value equal to its gold output. Every run returns only text; the values
    are parsed and compared here, in the trainer (lorapop/tasks/values.py), never in a process that ran model-written
    code.

    ``control`` holds the task's own ``(code, gold output)`` runs: its reference program (``program``) on its stored
    inputs, run again in fresh processes with the answers. When any of them does not give back its stored output the
    task had no stable answer (its program reads the clock, or anything else two validation runs moments apart could
    not tell apart), so no verdict is given: every well-formed answer gets ``void`` (lorapop/train/stages.py drops the
    task and counts it invalid for its teacher). Nothing runs when no answer is well formed.

    The control cannot be told from the answers' runs (docs/METHOD.md, "The control run"). Every run starts from the
    same state and leaves nothing (worker.py). Every distinct run of the task's own program (the control's, and
    code_i's answers, which run that program on the student's input; an answer whose code is the same text as a
    control run is that run) runs ``rounds`` times, each start at least ``spread_s`` after the one before, each under
    another of the executor's hash seeds (so in another worker process), the runs of all inputs interleaved in a
    fresh order each round, drawn from the operating system's randomness (:func:`run_rounds`). When the
    runs of one input disagree (one returns a value and another fails, or two return different values) the program
    had no stable answer there and the task is void, so a program keyed on any channel, on its own input or on a
    student's, is either honest in all its runs or voided. Runs of other programs (code_f's answers) all end before
    the first run of the task's program starts, so no run of the reference can hand anything to them, even through
    the clock (docs/METHOD.md, "Determinism, and the clock")."""
    outcomes: list[Outcome | None] = [None] * len(answers)
    jobs: list[tuple[int, str, str]] = []  # (answer index; code; gold output)
    parsed = []
    for i, a in enumerate(answers):
        if isinstance(a, ParseError):
            outcomes[i] = Outcome("format_error", a.reason)
            continue
        parsed.append(i)
        got = read_answer(prepare, a)
        if isinstance(got, Outcome):
            outcomes[i] = got
        else:
            jobs += [(i, code, gold) for code, gold in got]
    if not parsed:
        return outcomes  # type: ignore[return-value]
    own = program + _CALL
    others = list(dict.fromkeys(c for _, c, _ in jobs if not c.startswith(own)))
    ran = {code: [r] for code, r in zip(others, executor.run_many(others))} if others else {}
    mine = list(dict.fromkeys([code for code, _ in control] + [c for _, c, _ in jobs if c.startswith(own)]))
    # Every run of the task's program in a check, its control's and the students' inputs alike, gets one clock:
    # half the wall clock, above validation's bound (MAX_RUN_SHARE) so that load at check time does not void an
    # honest task. One clock, so that no program can time out on the students' inputs while its control does not
    # (a program slow in some minutes of the wall clock, say); and a bounded one, so that a program slow on every
    # input but its own cannot make each check cost rounds x inputs wall clocks.
    limit = float(getattr(getattr(executor, "config", None), "timeout_s", 5.0))
    ran.update(run_rounds(executor, mine, rounds, spread_s, timeout_s=CHECK_RUN_SHARE * limit))
    void = next((f"{why}" for code, gold in control if (why := _failure(ran[code], gold))), None)
    void = void or next((f"its runs of one input disagree: {why}" for code in mine
                         if (why := _disagreement(ran[code]))), None)
    for i in parsed:
        if void:
            outcomes[i] = Outcome("void", "the task's program did not reproduce its output: " + void[:200])
        elif outcomes[i] is None:
            why = next((w for j, code, gold in jobs if j == i and (w := _failure(ran[code], gold))), None)
            outcomes[i] = Outcome("wrong", why[:200]) if why else Outcome("correct", "")
    return outcomes  # type: ignore[return-value]


def _failure(results: list, gold: str) -> str | None:
    """Why the runs of one code do not all give ``gold``, or None when they do."""
    for r in results:
        if not (r.ok and same_text(gold, r.value, MAX_OUTPUT_CHARS)):
            return r.error or f"returned {str(r.value)[:60]}, expected {gold[:60]}"
    return None


def _disagreement(results: list) -> str | None:
    """How two runs of one code differ (one returned a value and another did not, or two values differ), or None.
    Failures of different kinds agree: each gives the answer no value."""
    first = results[0]
    for r in results[1:]:
        if r.ok != first.ok or (r.ok and r.value != first.value
                                and not same_text(first.value, r.value, MAX_OUTPUT_CHARS)):
            return (f"{first.status} {str(first.value or first.error)[:60]} vs "
                    f"{r.status} {str(r.value or r.error)[:60]}")
    return None


def run_rounds(executor: Executor, codes: list[str], rounds: int, spread_s: float,
               timeout_s: float | None = None) -> dict[str, list]:
    """Each code run ``rounds`` times -> {code: its results, in round order}. Round by round, each in a fresh order
    drawn from the operating system's randomness, so no run's place among the others (its worker, what ran before
    it, how many runs its worker has made) says which input or which round it is, and the places of one input's
    runs are independent. Each code's rounds run under the executor's hash seeds in an order drawn for that code,
    one seed a round: its runs go to different worker pools, so whatever one worker process holds for its whole life
    (its hash order, its memory layout, its filesystem's identity) differs between them and a program keyed on it
    disagrees with itself. A round starts ``spread_s`` after the last run of the round before started, never
    waiting for runs to end: a slow program's runs overlap, so a check costs about one of its runs, not ``rounds``
    of them in a row. At most ``executor.config.n_workers`` runs are handed out at once, so each starts when it is
    handed out. ``timeout_s``: every run's wall clock (None: the executor's default)."""
    seeds = executor_seeds(executor)
    rounds = max(1, int(rounds))
    slots = max(1, int(getattr(getattr(executor, "config", None), "n_workers", 1)))
    free = threading.Semaphore(slots)
    seed_of = {c: _SHUFFLE.sample(seeds, len(seeds)) for c in codes}

    def one(code: str, seed: int):
        try:
            return executor.run(code, hashseed=seed, timeout_s=timeout_s)
        finally:
            free.release()

    futures: list[tuple[str, Future]] = []
    with ThreadPoolExecutor(slots) as pool:
        last = None
        for r in range(rounds):
            if last is not None:
                time.sleep(max(0.0, last + spread_s - time.monotonic()))
            for c in _SHUFFLE.sample(codes, len(codes)):
                free.acquire()
                last = time.monotonic()
                futures.append((c, pool.submit(one, c, seed_of[c][r % len(seeds)])))
    out: dict[str, list] = {c: [] for c in codes}
    for c, f in futures:
        out[c].append(f.result())
    return out
