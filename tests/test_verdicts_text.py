"""Model-written text read by the trainer, through the trainer's path (parse_proposal, parse_answer, validate_many,
check_many): whatever a text makes the parser raise is that one item's failure, never the batch's or the step's;
parsing it prints nothing; and a teacher's text that the student's tokenizer would show otherwise than it runs is
refused. The one parser is lorapop/modeltext.py."""

from __future__ import annotations

import random
import warnings

import pytest

from lorapop.executor import ExecutorConfig, SandboxExecutor
from lorapop.modeltext import MODEL_TEXT, NotLiteral, literal_of, parse_text
from lorapop.tasks import TASK_TYPES, Invalid, Task
from lorapop.tasks.code_f import CodeF

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
