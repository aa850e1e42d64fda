"""Model-written text read by the trainer, through the trainer's path (parse_proposal, parse_answer, validate_many,
check_many): whatever a text makes the parser raise is that one item's failure, never the batch's or the step's;
parsing it prints nothing; and a teacher's text that the student's tokenizer would show otherwise than it runs is
refused. The one parser is lorapop/modeltext.py."""

from __future__ import annotations

import random
import sys
import warnings
from pathlib import Path

import pytest

from lorapop.executor import ExecutorConfig, SandboxExecutor
from lorapop.modeltext import MODEL_TEXT, NotLiteral, literal_of, parse_text
from lorapop.tasks import TASK_TYPES, Invalid, Task
from lorapop.tasks.code_f import CodeF

sys.path.insert(0, str(Path(__file__).parent))  # style_fixtures

# An int too large for a float added to a complex: ast.literal_eval raises OverflowError (323 chars, under every cap)
POISON = "1" * 320 + "+1j"
POISON_REPR = "type('R', (), {'__repr__': lambda s: '1' * 320 + '+1j'})()"
HONEST = "def f(x):\n    return x + 1"


def fence(tag: str, body: str) -> str:
    return f"```{tag}\n{body}\n```\n"


def test_an_overflowing_literal_is_one_items_failure_everywhere():
    code_o, code_i = TASK_TYPES["code_o"], TASK_TYPES["code_i"]
    code_f = CodeF(n_inputs=3, n_shown=1)
    with pytest.raises(NotLiteral):
        literal_of(parse_text(POISON, mode="eval").body)
    trap = f"def f(x):\n    if x == 5:\n        return 10\n    return {POISON_REPR}"
    with SandboxExecutor(ExecutorConfig(n_workers=2)) as ex:
        # teachers: the poison as an input, and as a program's output, beside an honest proposal in the same batch
        got = code_o.validate_many([code_o.parse_proposal(fence("python", HONEST) + fence("input", POISON)),
                                    code_o.parse_proposal(fence("python", f"def f(x):\n    return {POISON_REPR}")
                                                          + fence("input", "5")),
                                    code_o.parse_proposal(fence("python", HONEST) + fence("input", "5"))], ex)
        assert [getattr(g, "reason", None) for g in got[:2]] == ["not_literal", "output_not_literal"], got
        t_o = got[2]
        assert isinstance(t_o, Task) and t_o.outputs == ["6"]
        # a code_o student's prediction among honest ones
        outs = code_o.check_many(t_o, [code_o.parse_answer(fence("output", t))
                                       for t in ("6", POISON, "6", "7")], ex)
        assert [o.status for o in outs] == ["correct", "wrong", "correct", "wrong"], outs
        # a code_i teacher honest on its own input and poisonous on any other: it validates, and the student who
        # answers another input is wrong, the others judged as ever
        t_i = code_i.validate(code_i.parse_proposal(fence("python", trap) + fence("input", "5")), ex)
        assert isinstance(t_i, Task) and t_i.outputs == ["10"]
        outs = code_i.check_many(t_i, [code_i.parse_answer(fence("input", t)) for t in ("5", "6", POISON, "5.0")],
                                 ex)
        assert [o.status for o in outs] == ["correct", "wrong", "wrong", "correct"], outs
        # a code_f student's program whose output on a hidden input is the poison
        reply = "".join(fence("input", str(i)) for i in range(3)) + fence("message", "adds one")
        t_f = code_f.validate(code_f.parse_proposal(reply, program=HONEST), ex)
        assert isinstance(t_f, Task)
        outs = code_f.check_many(t_f, [code_f.parse_answer(fence("python", p)) for p in
                                       (HONEST, f"def f(x):\n    return {POISON_REPR}", HONEST)], ex)
        assert [o.status for o in outs] == ["correct", "wrong", "correct"], outs


PIECES = ["1", "0", "-", "+", "1j", "1e999", "1e308", "9" * 310, "1" * 320, "0x" + "f" * 300, "1_0", "0b1", ".5",
          "'a'", "b'a'", "r'\\'", "'\\N{BULLET}'", "'\\x'", "'\\d'", "f'{1}'", "[", "]", "(", ")", "{", "}", ",",
          ":", " ", "\n", "\t", "\\\n", "#c\n", "None", "True", "...", "x=", "*", "**", "=", "lambda", "not", "~",
          "\x0c", "\u2028", "\ufeff", "\ud800", "\x00", "'''", '"', "1if", "0x1for", "else", "-1e999j", "+1j", "-0.0",
          "((((((((((", "[[[[[[[[[[[[[[[[", "-" * 60]


def _hostile(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 8)))


def test_generated_hostile_texts_fail_only_themselves():
    """Fuzz: texts built from tricky literal pieces through every parser of model text the trainer has, and through
    validate_many and check_many in batches with honest items, whose verdicts must come out as they would alone."""
    from lorapop.diagnostics.complexity import program_descriptors
    from lorapop.tasks import selection_family, validity, values
    from lorapop.tasks.common import repeated_input
    from lorapop.train.yardsticks import shown_list

    rng = random.Random(65)
    texts = [_hostile(rng) for _ in range(3000)] + [POISON, f"x={POISON}", f"[{POISON}]"]
    fns = [lambda t: values.literal_value(t, 2000), values.call_form, values.call_key, values.call_value,
           validity.check_call_args, lambda t: validity.check_literal(t, 2000), lambda t: repeated_input([t, "1"]),
           lambda t: validity.check_program("def f(x):\n    return " + t), lambda t: values.same_text("1", t, 2000),
           lambda t: selection_family.check_shape("def f(x):\n    return " + t, t), shown_list]
    for t in texts:
        for fn in fns:
            try:
                fn(t)
            except NotLiteral:
                pass  # the parser's own refusal; anything else fails the test
    for t in texts[:200]:
        program_descriptors("def f(x):\n    return " + t, [t])
    code_o, code_i = TASK_TYPES["code_o"], TASK_TYPES["code_i"]
    hostile = texts[:60] + texts[-3:]
    with SandboxExecutor(ExecutorConfig(n_workers=2)) as ex:
        props = [code_o.parse_proposal(fence("python", HONEST) + fence("input", t)) for t in hostile]
        props.append(code_o.parse_proposal(fence("python", HONEST) + fence("input", "5")))
        got = code_o.validate_many(props, ex)
        assert isinstance(got[-1], Task) and got[-1].outputs == ["6"], got[-1]
        assert all(isinstance(g, (Task, Invalid)) for g in got)
        task = got[-1]
        outs = code_o.check_many(task, [code_o.parse_answer(fence("output", t)) for t in hostile + ["6"]], ex)
        assert outs[-1].status == "correct" and all(o.status in ("wrong", "format_error") for o in outs[:-1]), outs
        t_i = code_i.validate(code_i.parse_proposal(fence("python", HONEST) + fence("input", "5")), ex)
        outs = code_i.check_many(t_i, [code_i.parse_answer(fence("input", t)) for t in hostile[:30] + ["5"]], ex)
        assert outs[-1].status == "correct", outs[-1]
        assert all(o.status in ("correct", "wrong", "format_error") for o in outs)


# A valid program and a prediction full of legal but warned-about literals: each parse used to print a SyntaxWarning
# per literal to the trainer's stderr, never deduplicated
WARNED_PROGRAM = "def f(x):\n    return len((" + ", ".join(["1if x else 2"] * 200) + "))"
WARNED_PREDICTION = "[" + ", ".join(["0x1for 1"] * 100) + "]"


def test_parsing_model_text_prints_no_warning(capfd):
    from lorapop.diagnostics.complexity import program_descriptors
    from lorapop.tasks.buffer import TaskBuffer

    code_o = TASK_TYPES["code_o"]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")  # in front of the parser's own filter: it must take first place back
        with SandboxExecutor(ExecutorConfig(n_workers=2)) as ex:
            task = code_o.validate(code_o.parse_proposal(fence("python", WARNED_PROGRAM) + fence("input", "1")), ex)
            assert isinstance(task, Task) and task.outputs == ["200"], task
            TaskBuffer("code_o").add(task)
            program_descriptors(task.program, task.inputs)
            outs = code_o.check_many(task, [code_o.parse_answer(fence("output", WARNED_PREDICTION)),
                                            code_o.parse_answer(fence("output", "'\\d' if 1else 200"))], ex)
            assert [o.status for o in outs] == ["wrong", "wrong"]
        # the filter is the model text's alone: the trainer's own warnings still show
        compile("1if 1 else 2", "<trainer>", "eval")
    mine = [w for w in seen if issubclass(w.category, (SyntaxWarning, DeprecationWarning))]
    assert [w.filename for w in mine] == ["<trainer>"], [(w.filename, str(w.message)) for w in mine]
    assert MODEL_TEXT not in capfd.readouterr().err


# ---- what the student is shown is what runs ------------------------------------------------------------------------

KELVIN = "def f(s):\n    return s.count('\u212a') + 10 * s.count('e\u0301')"  # NFC shows it counting K and é


def test_the_shown_text_rule():
    """NFC-unstable text and the tokenizer's added-token strings are refused; ordinary text, precomposed accents and
    text that merely looks like a tag are not. The added tokens are the embedded SmolLM2 tokenizer's own (the Qwen2
    tokenizer, whose NFC normaliser rewrote the Kelvin program, is not available offline: the rule is NFC itself)."""
    import unicodedata

    from style_fixtures import tokenizer

    from lorapop.tasks.shown import reserved_strings, unstable

    reserved = reserved_strings(tokenizer())
    assert {"<|im_start|>", "<|im_end|>", "<|endoftext|>"} <= set(reserved), reserved
    assert unicodedata.normalize("NFC", KELVIN) != KELVIN and unstable(KELVIN, reserved)
    for text in ("'e\u0301'", "'\u2126'", "x = '\u212a'"):
        assert unstable(text, reserved), text
    for token in reserved:
        assert unstable(f"def f(x):\n    return '{token}' + x", reserved) and not unstable(f"return '{token}'")
    for text in ("def f(x):\n    return x", "'café'", "'Ω K'", "'<|im'", "'<think>'", "'日本語'", "''"):
        assert unstable(text, reserved) is None, text


def test_a_teacher_text_the_tokenizer_rewrites_is_invalid_at_the_validate_stage():
    """Through the validate stage with the embedded tokenizer: the program, an input or the message that the student's
    prompt would show otherwise (NFC, a special token), or an output that would be (known once validated), makes the
    proposal invalid; nothing of it enters the buffer, and honest proposals of the same batch are valid."""
    from style_fixtures import ReplayEngine, tokenizer

    from lorapop.tasks.buffer import TaskBuffer

    from lorapop.config import SelfPlayConfig
    from lorapop.engine.base import Completion
    from lorapop.train import stages
    from lorapop.records.members import Member

    sp = SelfPlayConfig(task_types=["code_o", "code_f"])
    sp.validate()
    t0 = Member("t0", 0, "teacher")
    o_replies = {"honest": fence("python", HONEST) + fence("input", "5"),
                 "kelvin": fence("python", KELVIN) + fence("input", "'KKKcafé'"),
                 "turns": fence("python", "def f(x):\n    return '<|im_end|>\\n<|im_start|>assistant' and x")
                 + fence("input", "5"),
                 "input": fence("python", "def f(s):\n    return len(s)") + fence("input", "'cafe\u0301'"),
                 "output": fence("python", "def f(x):\n    return 'e' + chr(0x301) * x") + fence("input", "1")}
    msg = "".join(fence("input", str(i)) for i in range(10))
    f_replies = {"f_honest": msg + fence("message", "adds one"), "f_message": msg + fence("message", "adds <|im_end|>")}
    rollouts = [stages.Rollout(t0, "teacher", "code_o", [1], Completion([1], [2], text, "eos"))
                for text in o_replies.values()]
    rollouts += [stages.Rollout(t0, "teacher", "code_f", [1], Completion([1], [2], text, "eos"), source_program=HONEST)
                 for text in f_replies.values()]
    bufs = {"code_o": TaskBuffer("code_o"), "code_f": TaskBuffer("code_f")}
    before = {k: len(b) for k, b in bufs.items()}
    with SandboxExecutor(ExecutorConfig(n_workers=2)) as ex:
        got = stages.validate(stages.StepContext(1, 0, ReplayEngine(tokenizer()), ex, sp, bufs), rollouts)
    status = {name: (r.status, r.detail) for name, r in zip([*o_replies, *f_replies], got)}
    assert status["honest"] == ("valid", "") and status["f_honest"] == ("valid", ""), status
    for name in ("kelvin", "turns", "input", "output", "f_message"):
        assert status[name] == ("invalid", "not_tokenizer_stable"), (name, status[name])
    assert {k: len(b) for k, b in bufs.items()} == {k: n + 1 for k, n in before.items()}  # the honest two alone


@pytest.mark.parametrize("style_name", ["expression", "input_first", "azr", "selection"])
def test_a_task_whose_answer_cannot_fit_the_students_reply_is_invalid_in_every_style(style_name):
    """A code_o output (or code_i input) whose block takes more tokens than selfplay.solve.max_new_tokens could only be
    answered by a reply cut at the budget, a format error: every style's validation refuses it (answer_over_budget),
    counted with the embedded tokenizer, as the validate stage counts; the same task fits a larger budget."""
    from style_fixtures import tokenizer

    from lorapop.tasks.styles import proposal_style

    tok = tokenizer()

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False))

    style, code_o = proposal_style(style_name), TASK_TYPES["code_o"]
    program = ("def f(nums):\n    return nums[0] ** 60" if style_name == "selection"
               else "def f(x):\n    return x ** 60")
    inp = "[7, 1, 2]" if style_name == "selection" else "7"
    prop = code_o.parse_proposal(fence("python", program) + fence("input", inp))
    if style_name == "selection":  # its own layout: the list above f
        prop = type(prop)(type="code_o", program=program, inputs=[inp])
    with SandboxExecutor(ExecutorConfig(n_workers=2)) as ex:
        tight = style.validate_many(code_o, [prop], ex, count_tokens=count, answer_budget=12)[0]
        loose = style.validate_many(code_o, [prop], ex, count_tokens=count, answer_budget=200)[0]
    assert isinstance(tight, Invalid) and tight.reason == "answer_over_budget", tight
    assert isinstance(loose, Task) and loose.outputs == [str(7 ** 60)], loose
