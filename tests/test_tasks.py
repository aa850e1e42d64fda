"""Task domain against the real executor: parsing, validity, checking, rewards, buffers, bad input."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from lorapop.executor import ExecutorConfig, SandboxExecutor
from lorapop.tasks import (TASK_TYPES, Answer, Invalid, Outcome, ParseError, Proposal, Task, TaskBuffer,
                           identity_task, student_reward, teacher_reward)
from lorapop.tasks.styles import AZR, INPUT_FIRST
from lorapop.tasks.validity import check_program

PROG = "def f(xs, k):\n    return sorted(xs)[-k:]"


@pytest.fixture(scope="module")
def ex():
    e = SandboxExecutor(ExecutorConfig(timeout_s=1.0, require_isolation=os.geteuid() == 0))
    yield e
    e.close()


def teacher_text(program=PROG, inp="[5, 1, 4], 2"):
    return f"I sort and slice.\n```python\n{program}\n```\n\n```input\n{inp}\n```\n"


def test_registry_has_the_three_azr_types():
    assert set(TASK_TYPES) == {"code_o", "code_i", "code_f"}
    assert all(TASK_TYPES[n].name == n for n in TASK_TYPES)


def test_parse_is_forgiving_about_whitespace():
    text = "reasoning\n  ``` Python  \n    def f(a):\n        return a\n   ```\n```INPUT\n  'x'  \n```"
    p = TASK_TYPES["code_o"].parse_proposal(text)
    assert isinstance(p, Proposal) and p.program == "def f(a):\n    return a" and p.inputs == ["'x'"]


def test_closing_fence_glued_to_last_line_parses():
    p = TASK_TYPES["code_i"].parse_proposal("```python\ndef f(a):\n    return a```\n```input\n1```")
    assert isinstance(p, Proposal) and p.inputs == ["1"]


@pytest.mark.parametrize("text, reason", [
    ("", "missing_python"),
    ("no blocks at all", "missing_python"),
    ("```python\ndef f(a):\n    return a\n```", "missing_input"),
    ("```python\ndef f(a):\n    return a\n```\n```input\n1\n", "unclosed_fence"),
    ("```python\ndef f(a):\n", "unclosed_fence"),
])
def test_format_errors(text, reason):
    r = TASK_TYPES["code_o"].parse_proposal(text)
    assert isinstance(r, ParseError) and r.reason == reason


def test_a_block_left_open_at_the_end_is_ignored_once_the_closed_ones_suffice():
    # what a reply cut off by the length cap looks like after it has written its blocks
    text = "```python\ndef f(a):\n    return a\n```\n```input\n1\n```\nMore:\n```python\ndef f(b):\n    return"
    p = TASK_TYPES["code_o"].parse_proposal(text)
    assert isinstance(p, Proposal) and p.program == "def f(a):\n    return a" and p.inputs == ["1"]
    a = TASK_TYPES["code_o"].parse_answer("```output\n5\n```\n```output\n6")
    assert not isinstance(a, ParseError) and a.text == "5"
    # the open block is the one the reply needed: still unclosed_fence, never its contents
    r = TASK_TYPES["code_o"].parse_proposal("```input\n1\n```\n```python\ndef f(a):\n    return a\n")
    assert isinstance(r, ParseError) and r.reason == "unclosed_fence"


def test_input_first_style_prompts_and_parses_in_its_order():
    ref = Task(type="code_o", program="def f(x):\n    return x[0]", inputs=["[7, 1]"], outputs=["7"])
    for name in ("code_o", "code_i"):
        ty = TASK_TYPES[name]
        p = INPUT_FIRST.teacher_prompt(ty, [ref], random.Random(0))
        assert p.index("```input\n[7, 1]") < p.index("```python\ndef f(x)")  # the reference in the reply's order
        assert "```output" not in p and "Format example" not in p and "sorted(nums)" not in p
        assert INPUT_FIRST.proposal_prefill(ty) == "```input\n"
        assert AZR.proposal_prefill(ty) == "```python\n" and "```output\n7" in AZR.teacher_prompt(ty, [ref])
        reply = "```input\n[3, 4]\n```\n\n```python\ndef f(x):\n    return x[-1]\n```\n\nOutput:\n```\n4"
        prop = INPUT_FIRST.parse_proposal(ty, reply)
        assert isinstance(prop, Proposal) and prop.inputs == ["[3, 4]"] and prop.program.endswith("x[-1]")
    assert INPUT_FIRST.proposal_prefill(TASK_TYPES["code_f"]) == "```input\n"


def test_binary_junk_is_a_format_error():
    junk = bytes(random.Random(0).randrange(256) for _ in range(4000))
    for t in TASK_TYPES.values():
        assert isinstance(t.parse_answer(junk), ParseError)
        assert isinstance(t.parse_answer(junk.decode("latin-1")), ParseError)


def test_megabyte_of_text_is_a_format_error_quickly():
    import time
    text = ("```python\n" + "x = 1\n" * 200_000)[:1_000_000]
    t0 = time.perf_counter()
    r = TASK_TYPES["code_o"].parse_proposal(text)
    assert isinstance(r, ParseError) and time.perf_counter() - t0 < 1


def test_valid_code_o_proposal_becomes_a_task(ex):
    t = TASK_TYPES["code_o"].validate(TASK_TYPES["code_o"].parse_proposal(teacher_text()), ex)
    assert isinstance(t, Task) and t.outputs == ["[4, 5]"] and t.inputs == ["[5, 1, 4], 2"]
    json.dumps(t.to_dict())
    assert Task.from_dict(t.to_dict()) == t


@pytest.mark.parametrize("program, inp, reason", [
    ("def f(a)\n    return a", "1", "syntax_error"),
    ("def g(a):\n    return a", "1", "no_f"),
    ("def f(a):\n    return a\ndef f(b):\n    return b", "1", "multiple_f"),
    ("def f(a):\n    class A:\n        pass\n    return a", "1", "has_class"),
    ("x = 3\ndef f(a):\n    return a", "1", "extra_toplevel"),
    ("import random\ndef f(a):\n    return random.random()", "1", "banned_import"),
    ("import time\ndef f(a):\n    return a", "1", "banned_import"),
    ("from datetime import date\ndef f(a):\n    return a", "1", "banned_import"),
    ("def f(a):\n    return a", "len('ab')", "not_literal"),
    ("def f(a):\n    return a", "1), __import__('os').system('id'", "not_literal"),
    ("def f(a):\n    while True:\n        pass", "1", "timeout"),
    ("def f(a):\n    return [0] * 10 ** 10", "1", "memory"),
    ("def f(a):\n    return 1 / a", "0", "runtime_error"),
    ("def f(a):\n    return 'x' * a", "500", "output_too_long"),
    ("def f(a):\n    return float('inf')", "1", "output_not_literal"),
    ("import re\ndef f(a):\n    return re.compile(a)", "'x+'", "output_not_literal"),
])
def test_invalid_proposals(ex, program, inp, reason):
    r = TASK_TYPES["code_o"].validate(Proposal("code_o", program, [inp]), ex)
    assert isinstance(r, Invalid) and r.reason == reason, r


def test_allowed_imports_and_builtin_shadowing_are_valid(ex):
    prog = "import math\nfrom collections import Counter\ndef f(input, vars):\n    return math.gcd(input, vars), sorted(Counter('abca').items())"
    t = TASK_TYPES["code_i"].validate(Proposal("code_i", prog, ["12, 18"]), ex)
    assert isinstance(t, Task) and t.outputs == ["(6, [('a', 2), ('b', 1), ('c', 1)])"]


def test_code_o_compares_values_not_strings(ex):
    task = Task("code_o", PROG, ["[5, 1, 4], 2"], ["[4, 5]"])
    ty = TASK_TYPES["code_o"]
    answers = [ty.parse_answer(f"so\n```output\n{a}\n```") for a in ["[4,5]", "[ 4, 5 ]", "[5, 4]", "(4, 5)", "[4.0, 5]",
                                                                      "[4, 5.5]"]]
    got = [o.status for o in ty.check_many(task, answers, ex)]
    # AZR's equality of the values: 4.0 == 4, as eval(gold) == eval(answer) has it (lorapop/tasks/values.py)
    assert got == ["correct", "correct", "wrong", "wrong", "correct", "wrong"]


def test_code_o_non_literal_prediction_is_wrong_not_run(ex):
    task = Task("code_o", PROG, ["[5, 1, 4], 2"], ["[4, 5]"])
    a = Answer("code_o", "__import__('os').system('id') or [4, 5]")
    assert TASK_TYPES["code_o"].check_many(task, [a], ex)[0].status == "wrong"


def test_code_i_runs_f_on_the_proposed_input(ex):
    task = Task("code_i", PROG, ["[5, 1, 4], 2"], ["[4, 5]"])
    ty = TASK_TYPES["code_i"]
    answers = [ty.parse_answer(f"```input\n{a}\n```") for a in ["[4, 5, 0], 2", "[9, 9], 2", "[4, 5]"]] + [
        ty.parse_answer("no block")]
    assert [o.status for o in ty.check_many(task, answers, ex)] == ["correct", "wrong", "wrong", "format_error"]


def code_f_task(ex):
    ty = TASK_TYPES["code_f"]
    inputs = "\n".join(f"```input\n{i}, {i + 1}\n```" for i in range(10))
    prop = ty.parse_proposal(f"ok\n{inputs}\n```message\nadds  two\n numbers\n```", program="def f(a, b):\n    return a + b")
    assert isinstance(prop, Proposal) and prop.message == "adds two numbers" and len(prop.inputs) == 10
    task = ty.validate(prop, ex)
    assert isinstance(task, Task) and task.outputs[3] == "7"
    return task


def test_code_f_student_is_checked_on_hidden_pairs(ex):
    ty = TASK_TYPES["code_f"]
    task = code_f_task(ex)
    prompt = ty.student_prompt(task)
    assert "f(4, 5) == 9" in prompt and "f(5, 6)" not in prompt and "return a + b" not in prompt
    answers = [ty.parse_answer(f"```python\n{p}\n```") for p in [
        "def f(x, y):\n    return y + x",
        "def f(x, y):\n    return [1, 3, 5, 7, 9][x] if x < 5 else 0",  # fits the shown pairs only
        "import os\ndef f(x, y):\n    return x + y",
    ]]
    assert [o.status for o in ty.check_many(task, answers, ex)] == ["correct", "wrong", "wrong"]


def test_code_f_needs_ten_inputs_and_a_message(ex):
    ty = TASK_TYPES["code_f"]
    few = "\n".join(f"```input\n{i}\n```" for i in range(4)) + "\n```message\nm\n```"
    assert isinstance(ty.parse_proposal(few, program="def f(a):\n    return a"), ParseError)
    ten = "\n".join(f"```input\n{i}\n```" for i in range(10))
    assert isinstance(ty.parse_proposal(ten, program="def f(a):\n    return a"), ParseError)
    dup = "\n".join("```input\n1\n```" for _ in range(10)) + "\n```message\nm\n```"
    r = ty.validate(ty.parse_proposal(dup, program="def f(a):\n    return a"), ex)
    assert isinstance(r, Invalid) and r.reason == "duplicate_inputs"


def test_prompts_are_concise_and_show_the_format():
    refs = [identity_task("code_o")] * 6
    for name in ("code_o", "code_i"):
        p = TASK_TYPES[name].teacher_prompt(refs, random.Random(0))
        assert "```python" in p and "```input" in p and len(p) < 3000
    p = TASK_TYPES["code_f"].teacher_prompt([identity_task("code_f")], random.Random(0))
    assert "```message" in p and "return a" in p


def test_rewards():
    assert student_reward(Outcome("correct")) == 1.0
    assert student_reward(Outcome("wrong")) == -0.5
    assert student_reward(Outcome("format_error")) == -1.0
    assert student_reward(ParseError("missing_output")) == -1.0
    t = identity_task("code_o")
    assert teacher_reward(ParseError("x")) == -1.0 and teacher_reward(Invalid("x")) == -0.5
    assert teacher_reward(t, 0.25) == 0.75 and teacher_reward(t, 1.0) == 0.0
    assert teacher_reward(t, 0.0, "learnability") == 0.0 and teacher_reward(t, 1.0, "learnability") == 0.0
    assert teacher_reward(t, 0.25, "learnability") == 0.75


def test_buffer_identity_seed_sampling_dedup_and_state():
    b = TaskBuffer("code_o")
    assert len(b) == 1 and b.tasks[0].program == "def f(a):\n    return a" and b.tasks[0].inputs == ['"Hello world"']
    assert not b.add(Task("code_o", "def f(a):\n    return   a  # same", ['"Hello world"'], ["'Hello world'"]))
    for i in range(10):
        assert b.add(Task("code_o", f"def f(a):\n    return a + {i}", ["1"], [str(1 + i)]))
    s1 = b.sample(6, random.Random(3))
    assert len(s1) == 6 and len({id(t) for t in s1}) == 6 and s1 == b.sample(6, random.Random(3))
    import numpy as np
    assert len(b.sample(6, np.random.default_rng(0))) == 6 and len(b.sample(50, random.Random(0))) == 11
    state = json.loads(json.dumps(b.state_dict()))
    b2 = TaskBuffer("code_o", seed_identity=False)
    b2.load_state_dict(state)
    assert [t.to_dict() for t in b2] == [t.to_dict() for t in b] and not b2.add(b.tasks[5])


def test_buffer_discard_parses_only_the_task_it_discards(monkeypatch):
    """A voided task leaves the buffer; the others' keys were stored when they came in, so a discard costs one key
    (the discarded task's), not a parse of every input in the buffer."""
    b = TaskBuffer("code_o")
    tasks = [Task("code_o", f"def f(a):\n    return a + {i}", ["1"], [str(1 + i)]) for i in range(50)]
    for t in tasks:
        b.add(t)
    calls = []
    real = TaskBuffer.key
    monkeypatch.setattr(TaskBuffer, "key", staticmethod(lambda t: calls.append(t) or real(t)))
    assert b.discard(tasks[7]) and len(b) == 50 and tasks[7] not in b.tasks and len(calls) == 1
    assert not b.discard(tasks[7]) and b.add(tasks[7]) and len(b) == 51


def test_both_seed_files_load(data_dir):
    b = TaskBuffer("code_i")
    assert b.load_seed_file(data_dir / "seeds" / "azr_7b_coder_seed_io.jsonl") > 200
    bf = TaskBuffer("code_f")
    assert bf.load_seed_file(data_dir / "seeds" / "azr_7b_coder_code_f_seed_io.jsonl") > 200
    assert all(len(t.inputs) >= 6 for t in bf.tasks[1:]) and sum(bool(t.message) for t in bf.tasks) > 200
    assert "import re" in next(t.program for t in b.tasks if "re." in t.program and "import" in t.program)


def test_seed_file_validated_through_executor(data_dir, ex):
    path = data_dir / "seeds" / "azr_7b_coder_code_f_seed_io.jsonl"
    lines = path.read_text().splitlines()[:12]
    small = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"lorapop-seed-{os.getpid()}.jsonl")
    with open(small, "w") as fh:
        fh.write("\n".join(lines))
    try:
        b = TaskBuffer("code_f", seed_identity=False)
        with pytest.raises(ValueError, match="needs task_type"):
            b.load_seed_file(small, executor=ex)
        n = b.load_seed_file(small, executor=ex, task_type=TASK_TYPES["code_f"])
    finally:
        os.remove(small)
    assert 6 <= n <= 12 and all(len(t.outputs) == 10 for t in b)


@pytest.mark.parametrize("bad", ["", "\x00\x01\x02", "```", "```output\n```", "a" * 1_000_000,
                                 "```python\n" + "(" * 5000 + "\n```"])
def test_bad_student_input_gives_typed_results(ex, bad):
    task = Task("code_o", PROG, ["[5, 1, 4], 2"], ["[4, 5]"])
    for name, ty in TASK_TYPES.items():
        a = ty.parse_answer(bad)
        assert isinstance(a, (ParseError, Answer))
        t = task if name != "code_f" else Task("code_f", "def f(a):\n    return a", [str(i) for i in range(10)],
                                                [str(i) for i in range(10)], "m")
        out = ty.check_many(t, [a], ex)[0]
        assert out.status in ("format_error", "wrong")


def test_deeply_nested_input_is_not_literal_not_an_exception(ex):
    r = TASK_TYPES["code_o"].validate(Proposal("code_o", "def f(a):\n    return a", ["[" * 3000 + "]" * 3000]), ex)
    assert isinstance(r, Invalid) and r.reason in ("not_literal", "too_long")


SLEEPER = "import fractions\ndef f(s):\n    fractions.sys.modules['time'].sleep(s)\n    return s"


def test_a_task_whose_runs_take_over_half_the_wall_clock_is_too_slow():
    """Every check runs a task's program CONTROL_ROUNDS more times, under CHECK_RUN_SHARE of the wall clock, so
    validation bounds its runs below that, at MAX_RUN_SHARE (1.6 s of a 4 s clock here); a run that ends in time but
    past the share makes the proposal ``too_slow``. Validation's runs get the checks' clock (2 s here), so a run past
    it is a timeout, and no run can tell validation from a check by the clock it was asked for."""
    from lorapop.tasks.common import CHECK_RUN_SHARE, MAX_RUN_SHARE

    assert MAX_RUN_SHARE == 0.4 and CHECK_RUN_SHARE == 0.5
    with SandboxExecutor(ExecutorConfig(timeout_s=4.0, n_workers=1, require_isolation=os.geteuid() == 0)) as slow:
        got = TASK_TYPES["code_o"].validate_many([Proposal("code_o", SLEEPER, [s]) for s in ("1.8", "2.6", "0.05")],
                                                 slow)
    assert isinstance(got[0], Invalid) and got[0].reason == "too_slow", got[0]
    assert isinstance(got[1], Invalid) and got[1].reason == "timeout" and "limit 2s" in got[1].detail, got[1]
    assert isinstance(got[2], Task) and got[2].outputs == ["0.05"], got[2]


def test_a_check_gives_every_run_of_the_program_one_clock(ex, monkeypatch):
    """Every run of the task's program in a check, its control's and the students' inputs alike, gets the same
    clock (CHECK_RUN_SHARE of the wall clock): no program can time out on students' inputs while its control runs in
    time. And a run cannot tell validation's clock from a check's: a task returning its CPU limit validates, and
    the check reproduces it (its limit follows the config's clock, not the run's)."""
    import lorapop.tasks.common as common

    clocks = []
    real = common.run_rounds

    def spy(executor, codes, rounds, spread_s, timeout_s=None):
        clocks.append(timeout_s)
        return real(executor, codes, rounds, spread_s, timeout_s)

    code_i = TASK_TYPES["code_i"]
    prog = ("import fractions\ndef f(x):\n    resource = fractions.sys.modules['resource']\n"
            "    return [resource.getrlimit(resource.RLIMIT_CPU)[0], x % 3]")
    task = code_i.validate_many([Proposal("code_i", prog, ["4"])], ex)[0]
    assert isinstance(task, Task), task
    monkeypatch.setattr(common, "run_rounds", spy)
    got = code_i.check_many(task, [code_i.parse_answer(f"```input\n{a}\n```") for a in ("4", "7", "5")], ex)
    assert [o.status for o in got] == ["correct", "correct", "wrong"], got
    assert clocks == [common.CHECK_RUN_SHARE * ex.config.timeout_s], clocks


def test_the_runs_of_one_input_start_spread_apart_and_overlap(ex):
    """run_rounds, as every check runs the task's program: each run of an input is handed to a worker at least
    CONTROL_SPREAD_S after the one before it, so the program sees its runs start that far apart (less the difference
    of two forks' start-up, a few milliseconds at most); and it does not wait for the one before it to end (here
    each run lasts 0.3 s: the second starts long before the first ends), so a slow task's check costs about one run
    on two workers, not three in a row."""
    from lorapop.tasks.common import CONTROL_ROUNDS, CONTROL_SPREAD_S, run_rounds

    code = "import fractions\nt = fractions.sys.modules['time']\n_result = t.monotonic()\nt.sleep(0.3)"
    got = run_rounds(ex, [code], CONTROL_ROUNDS, CONTROL_SPREAD_S)
    assert [r.status for r in got[code]] == ["ok"] * CONTROL_ROUNDS, got
    starts = sorted(float(r.value) for r in got[code])
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert all(g >= CONTROL_SPREAD_S - 0.01 for g in gaps), gaps
    assert gaps[0] < 0.25, gaps  # two workers: the first two runs overlap


def test_an_import_the_sandbox_cannot_make_is_refused_wherever_it_is(ex):
    """A module the sandbox cannot import (not loaded by its worker, which nothing can load after the chroot) fails
    there on every run and works in plain Python: a code_i teacher importing one on every input but its own had
    right inputs judged wrong, never voided. Such a program is refused before it runs; a loaded module's import is
    not."""
    assert "collections" in ex.importable and "difflib" not in ex.importable
    progs = ["def f(x):\n    if x == 5:\n        return 1\n    import difflib\n    return 1",
             "def f(x):\n    from statistics import mean\n    return x",
             "def f(x):\n    from json import tool\n    return x",  # a submodule, not an attribute
             "import collections\nfrom collections import defaultdict\ndef f(x):\n    return x",
             "from __future__ import annotations\nfrom encodings import cp1252\ndef f(x: int) -> int:\n    return x",
             "def f(x):\n    if x == 5:\n        return 1\n    return credits"]  # a name only site.py adds
    got = TASK_TYPES["code_i"].validate_many([Proposal("code_i", p, ["5"]) for p in progs], ex)
    assert [g.reason if isinstance(g, Invalid) else "valid" for g in got] == (["banned_import"] * 3 + ["valid"] * 2
                                                                            + ["banned_name"]), got
    assert "not importable in the sandbox" in got[0].detail


def test_every_codec_plain_python_knows_works_in_the_sandbox(ex):
    """Codecs are modules (encodings.*) that nothing can import after the chroot: one the worker had not loaded failed
    in the sandbox alone, so a teacher could use it on every input but its own. The worker keeps them all compiled,
    and loads what they import."""
    prog = ("import codecs\ndef f(s):\n    return [s.encode(c) for c in ('utf-16-le', 'cp1252', 'cp437', 'mac-roman', "
            "'shift_jis', 'gbk', 'utf-7')] + [codecs.encode(s, 'rot13'), codecs.encode(s.encode(), 'hex')]")
    got = TASK_TYPES["code_o"].validate(Proposal("code_o", prog, ["'ab'"]), ex)
    assert isinstance(got, Task), got
    assert got.outputs == [repr([b"a\x00b\x00", b"ab", b"ab", b"ab", b"ab", b"ab", b"ab", "no", b"6162"])], got


_DESCRIBE_CODECS = """import sys
def describe(name):
    m = __import__(name, fromlist=["_"])
    base = lambda p: p and p.rsplit("/", 1)[-1]
    codes = sorted({base(v.__code__.co_filename) for v in vars(m).values() if hasattr(v, "__code__")})
    return (base(m.__file__), base(m.__cached__), type(m.__loader__).__name__, base(m.__loader__.path),
            m.__loader__ is m.__spec__.loader, base(m.__spec__.origin), base(m.__spec__.cached), m.__spec__.has_location,
            m.__spec__.parent, m.__package__, sorted(vars(m)), codes)
import collections, encodings
out = [[hasattr(encodings, n) for n in ("utf_8", "utf_16", "idna", "latin_1", "cp1252")]]
for name in ("encodings.cp1252", "encodings.shift_jis", "encodings.rot_13", "encodings.utf_16", "encodings.mbcs"):
    try:
        out.append(describe(name))
    except Exception as exc:
        out.append(type(exc).__name__)
out.append(["\u00e9\u20ac\u65e5".encode(c, "replace") for c in ("cp1252", "shift_jis", "koi8_r", "hz")])
try:  # the frames a failed import leaves in its traceback (the interpreter trims its own import machinery)
    import encodings.oem
except ImportError as exc:
    tb, names = exc.__traceback__, []
    while tb is not None:
        names.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    out.append(names)
"""


def test_a_codec_kept_compiled_is_in_a_run_what_a_script_imports(ex):
    """The worker keeps the standard library's codecs as compiled code, not loaded (each page of the worker is mapped
    again in every run's fork): a run that imports one gets the module a plain script gets, the same attributes (file
    names cut to base names, as for every loaded module), the same code and results, and the same error where the
    codec is another platform's; a run that does not import one finds it nowhere in its process."""
    assert {"encodings.cp1252", "encodings.shift_jis", "_codecs_jp"} <= ex.importable
    assert "stored" not in ex.importable
    plain = subprocess.run([sys.executable, "-s", "-S", "-c", _DESCRIBE_CODECS + "print(repr(out))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    same = f"_result = [i for i, x in enumerate(out) if repr(x) != repr({plain}[i])] + [repr(out) == {plain!r}]"
    got, loaded = ex.run_many([_DESCRIBE_CODECS + same, "import sys\n_result = [m in sys.modules for m in ('encodings.cp1252', 'encodings.utf_16', 'encodings.utf_8')]"],
                              hashseed=ex.hashseeds[0])
    assert (got.status, got.value) == ("ok", "[True]"), got  # else the entries that differ from the script's
    assert (loaded.status, loaded.value) == ("ok", "[False, False, True]"), loaded  # utf_8: every interpreter's


def test_a_name_taken_from_a_module_is_checked_as_an_import(ex):
    """``from M import name`` hands a program M's attribute: a banned module or builtin under its own name or another
    (enum keeps builtins as ``bltns``), a private name, or anything of the worker's own modules (their namespaces hold
    sys and os) is refused as if imported."""
    progs = ["from enum import sys\ndef f(x):\n    return x", "from dataclasses import inspect\ndef f(x):\n    return x",
             "from __main__ import sys\ndef f(x):\n    return x", "from ambient import os\ndef f(x):\n    return x",
             "from re import _compiler\ndef f(x):\n    return x", "from enum import bltns\ndef f(x):\n    return x",
             "from typing import List\ndef f(x: List[int]):\n    return x",
             "from collections import abc\ndef f(x):\n    return isinstance(x, abc.Sequence)"]
    got = TASK_TYPES["code_o"].validate_many([Proposal("code_o", p, ["5"]) for p in progs], ex)
    assert [g.reason if isinstance(g, Invalid) else "valid" for g in got] == ["banned_import"] * 6 + ["valid"] * 2, got


def test_the_static_check_imports_nothing_a_program_names():
    """The check looks a module's attributes up among the modules the trainer has loaded; it never imports one a
    program names (a code_f answer is checked with no importable list: ``from lib2to3.__main__ import x`` raised
    SystemExit in the trainer, ``venv.__main__`` made a virtual environment from the trainer's argv)."""
    names = ["lib2to3.__main__", "venv.__main__", "this", "unittest.__main__", "antigravity"]
    before = set(sys.modules)
    for name in names:
        check_program(f"from {name} import x\ndef f(x):\n    return x")
        check_program(f"from {name} import x\ndef f(x):\n    return x", frozenset({name}))
    assert not set(names) & (set(sys.modules) - before)
    asked = []  # nor does it ask a loaded module's __getattr__ (a package's lazy imports: transformers' load thousands)
    lazy = type(sys)("lorapop_lazy_probe")
    lazy.__getattr__ = lambda name: asked.append(name)
    sys.modules[lazy.__name__] = lazy
    try:
        check_program(f"from {lazy.__name__} import x\ndef f(x):\n    return x")
    finally:
        del sys.modules[lazy.__name__]
    assert asked == []


_DEEPEST = ("def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\ndef deepest():\n    lo, hi = 1, 5000\n"
            "    while lo < hi:\n        mid = (lo + hi + 1) // 2\n        try:\n            f(mid)\n            lo = mid\n"
            "        except RecursionError:\n            hi = mid - 1\n    return lo\n")


# a __repr__ recursing as deep as it can; one returning a str subclass whose methods would rewrite the result
_STR_SUB = ("type('R', (), {'__repr__': lambda self: type('S', (str,), {'__radd__': lambda s, o: o + '[3, 2, 1]', "
            "'__len__': lambda s: 10 ** 6})(str(deepest()))})()")


@pytest.mark.parametrize("result", ["deepest()", "type('R', (), {'__repr__': lambda self: str(deepest())})()",
                                    _STR_SUB])
def test_a_program_recurses_as_deep_in_the_sandbox_as_in_a_script(ex, tmp_path, result):
    """The program runs beneath the launcher's, the worker's and its child's frames (and two exec calls), which the
    interpreter is made not to count (lockdown.rebase_recursion), so the deepest recursion that succeeds is a plain
    script's (a teacher recursing just past the sandbox's depth had right answers judged wrong). The result's repr is
    taken as deep as the program's module level, as a script takes it: in the worker's own frame it had two frames
    more (a __repr__ recursing as deep as it could gave 997 against 995); and a str subclass it returns is taken as
    the str it is (its __radd__ rewrote the packed result, its __len__ made it an output limit)."""
    prog = _DEEPEST + f"_result = {result}\n"
    script = tmp_path / "deep.py"
    script.write_text(prog + "print(repr(_result))\n")
    plain = subprocess.run([sys.executable, "-S", str(script)], capture_output=True, text=True, check=True)
    got = ex.run(prog)
    assert got.status == "ok" and int(got.value) == int(plain.stdout), (got, plain.stdout)


_LIMITS = """import fractions
sys = fractions.sys  # no import of sys: the static rule refuses it, and programs reach it like this
def f(n):
    return 0 if n == 0 else 1 + f(n - 1)
def deepest():
    lo, hi = 1, 30000
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            f(mid)
            lo = mid
        except RecursionError:
            hi = mid - 1
    return lo
def attempt(value):
    try:
        sys.setrecursionlimit(value)
        return "set"
    except Exception as exc:  # its type, the numbers in its message and the message's length (a short repr)
        return (type(exc).__name__, [int(w) for w in str(exc).replace(":", " ").split() if w.isdigit()], len(str(exc)))
def at_depth(n, value):
    return attempt(value) if n == 0 else at_depth(n - 1, value)
out = [sys.getrecursionlimit(), deepest()]
sys.setrecursionlimit(2000)
out += [sys.getrecursionlimit(), deepest()]
sys.setrecursionlimit(sys.getrecursionlimit() + 500)
out += [sys.getrecursionlimit(), deepest()]
out += [attempt(0), attempt(1.5), attempt(2 ** 31), attempt(-2 ** 40), attempt("7"), at_depth(40, 30),
        at_depth(40, 43), at_depth(40, 45), sys.getrecursionlimit()]
sys.setrecursionlimit(1000)
out.append(deepest())
try:
    sys.setrecursionlimit(new_limit=1500)
except TypeError as exc:
    out.append(len(str(exc)))
sys.setrecursionlimit(2 ** 31 - 1)
out.append(sys.getrecursionlimit())
sys.setrecursionlimit(1000)
try:
    sys.setrecursionlimit(0)
except ValueError as exc:
    tb, n = exc.__traceback__, 0
    while tb is not None:
        tb, n = tb.tb_next, n + 1
    out.append(n)
def bottom(k, call):  # the depth at which a call at the bottom of a recursion still works
    try:
        return bottom(k + 1, call)
    except RecursionError:
        try:
            call()
            return k
        except RecursionError:
            return -k
out += [bottom(0, sys.getrecursionlimit), bottom(0, lambda: sys.setrecursionlimit(1000))]
sys.setrecursionlimit(1000)
def set_at(k, limit):
    return sys.setrecursionlimit(limit) if k == 0 else set_at(k - 1, limit)
set_at(100, 104)
out.append(deepest())
sys.setrecursionlimit(1000)
"""


def test_the_result_s_repr_sees_what_a_script_s_sees(ex, tmp_path):
    """A __repr__ that evaluates in its caller's namespace (``functools.partial(eval, ...)``) sees the program's own
    names, as at a script's last line: the worker's lookup frame held only its own two names. And a program with no
    ``_result`` reads None, while a NameError of its own is its error."""
    prog = ("import functools\nR = type('R', (), {'__repr__': staticmethod(functools.partial(eval, "
            "'str(sorted(k for k in dir() if not k.startswith(\"__\")))'))})\ny = 2\n_result = R()\n")
    script = tmp_path / "names.py"
    script.write_text(prog + "print(repr(_result))\n")
    plain = subprocess.run([sys.executable, "-S", str(script)], capture_output=True, text=True, check=True)
    # a __repr__ that deletes _result and raises the NameError the lookup would: the program's own error still
    fake = ("g = (i for i in ()).gi_frame.f_globals\ndef rp(s):\n    g.pop('_result')\n"
            "    raise NameError('x', name='_result')\n_result = type('R', (), {'__repr__': rp})()")
    got, missing, own, faked = ex.run_many([prog, "x = 1", "_result = 1\ndef f():\n    return nothere\n_result = f()",
                                            fake], hashseed=ex.hashseeds[0])
    assert (got.status, got.value) == ("ok", plain.stdout.strip()), (got, plain.stdout)
    assert (missing.status, missing.value) == ("ok", "None"), missing
    assert own.status == "error" and "nothere" in own.error, own
    assert faked.status == "error" and "NameError" in faked.error, faked


# Programs that meet the result step or the output streams where a script's last line or its own streams would
# behave otherwise; each is run as a script ending in print(repr(_result)) and the two must agree.
_SCRIPT_STEP = {
    # the old value's __del__ (run by the trainer's own `_result = f(...)`) pops the new one: a script's NameError
    "deleted by the store": ("def f(x):\n    g = (i for i in ()).gi_frame.f_globals\n    g['_result'] = type('D', (), "
                             "{'__del__': lambda s: g.pop('_result', None)})()\n    return x", "[1, 2, 3]"),
    # ... and a rebound __builtins__ then offers a _result of the program's choosing
    "deleted, builtins rebound": ("def f(x):\n    g = (i for i in ()).gi_frame.f_globals\n    g['__builtins__'] = "
                                  "{'_result': x[::-1]}\n    g['_result'] = type('D', (), {'__del__': lambda s: "
                                  "g.pop('_result', None)})()\n    return x", "[1, 2, 3]"),
    # a key colliding with '_result' pops it while the lookup compares keys (at the store there is none to pop)
    "deleted by a colliding key": ("def f(x):\n    g = (i for i in ()).gi_frame.f_globals\n    busy = []\n"
                                   "    def eq(s, o):  # at the store (no _result yet) and at the lookup\n"
                                   "        if not busy:\n            busy.append(1)\n"
                                   "            g.pop('_result', None)\n            busy.pop()\n        return False\n"
                                   "    K = type('K', (str,), {'__eq__': eq, '__hash__': lambda s: hash('_result')})\n"
                                   "    g[K('zz')] = 0\n    return x", "[1, 2, 3]"),
    # a script looks the name repr up before it calls it: a key colliding with 'repr' sees that
    "the repr lookup": ("seen = []\ndef f(x):\n    g = (i for i in ()).gi_frame.f_globals\n    K = type('K', (str,), "
                        "{'__eq__': lambda s, o: seen.append(1) or False, '__hash__': lambda s: hash('repr')})\n"
                        "    rp = repr\n    g[K('zz')] = 0\n    n = len(seen)\n    return type('R', (), "
                        "{'__repr__': lambda s: rp(x if len(seen) == n else x[::-1])})()", "[1, 2, 3]"),
    # a repr no UTF-8 text can carry: a script's print of it fails
    "an unencodable repr": ("def f(x):\n    q = chr(39)\n    return type('R', (), {'__repr__': lambda s: q + "
                            "chr(0xd800) + q})()", "1"),
    # a script's stdout cannot encode a lone surrogate
    "print of a surrogate": ("def f(x):\n    try:\n        print(chr(0xd800))\n        return x\n"
                             "    except UnicodeEncodeError:\n        return x[::-1]", "[1, 2, 3]"),
    "the streams": ("import fractions\ndef f(x):\n    out, err = fractions.sys.stdout, fractions.sys.stderr\n"
                    "    try:\n        out.write(b'x')\n        took = 'bytes'\n    except TypeError as exc:\n"
                    "        took = str(exc)\n    err.write(chr(0xd800))\n    return [out is err, out.errors, "
                    "err.errors, out.encoding, out.name, err.name, took, out.write('ab\\n')]", "0"),
}


@pytest.mark.parametrize("case", sorted(_SCRIPT_STEP))
def test_the_result_step_and_the_streams_are_a_script_s(ex, tmp_path, case):
    """Each program, through the trainer's own call, gives what a script gives: the value or the error. A deleted
    ``_result`` had read as None (a script's NameError), and then a rebound ``__builtins__`` gave a gold of the
    program's choosing; the name ``repr`` was never looked up; a lone surrogate passed as a literal; the streams were
    one object that took bytes and any text."""
    from lorapop.tasks.validity import call_code

    prog = call_code(*_SCRIPT_STEP[case])
    script = tmp_path / "step.py"
    script.write_text(prog + "print(repr(_result))\n", encoding="utf-8")
    plain = subprocess.run([sys.executable, "-S", str(script)], capture_output=True, text=True,
                           env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"})
    got = ex.run(prog)
    if plain.returncode:
        last = plain.stderr.strip().splitlines()[-1]
        assert got.status == "error" and got.error.split(":")[0] == last.split(":")[0], (got, plain.stderr)
    else:
        assert (got.status, got.value) == ("ok", plain.stdout.strip().splitlines()[-1]), (got, plain.stdout)


def test_a_program_that_deletes_its_result_makes_no_task(ex):
    """Through validation: the program whose _result is popped by the trainer's own store (a script's NameError) had
    validated with the gold None, which every code_i input then matched, and with its builtins rebound, a gold of
    its choosing."""
    for case in ("deleted by the store", "deleted, builtins rebound", "deleted by a colliding key"):
        program, inp = _SCRIPT_STEP[case]
        for kind in ("code_o", "code_i"):
            got = TASK_TYPES[kind].validate(Proposal(kind, program, [inp]), ex)
            assert isinstance(got, Invalid), (case, kind, got)


def test_a_declared_source_encoding_other_than_utf8_is_refused():
    """A script saved as the UTF-8 the program is decodes it by its declared encoding (``len('éé')`` is 4 under
    latin-1; ``'é'`` is a SyntaxError under ascii); runs take the text as it is: refused, not misjudged."""
    body = "def f(x):\n    return [len('éé'), x]\n"
    for line in ("# -*- coding: latin-1 -*-", "# coding: ascii", "#!/usr/bin/env python\n# vim: fileencoding=cp1252",
                 "# coding=bogus"):
        got = check_program(line + "\n" + body)
        assert got is not None and got.reason == "encoding_declared", (line, got)
    for line in ("# -*- coding: utf-8 -*-", "# coding=UTF8", "# a comment", ""):
        assert check_program(line + "\n" + body) is None, line


def test_a_limit_a_program_sets_itself_gives_it_a_script_s_headroom(ex, tmp_path):
    """sys.setrecursionlimit(N) with an absolute N (competitive code's idiom) left the program the worker's frames
    fewer than a script (1992 against 1997 at 2000), so a teacher's gold could be a RecursionError where a script
    returns. The limit functions take the worker's frames off what they read and add them to what they set: what a
    program reads, the headroom it gets and the errors it meets are a script's."""
    script = tmp_path / "limits.py"
    script.write_text(_LIMITS + "print(repr(out))\n")
    plain = subprocess.run([sys.executable, "-S", str(script)], capture_output=True, text=True, check=True)
    got = ex.run(_LIMITS + "_result = out", timeout_s=30.0)
    assert got.status == "ok" and got.value == plain.stdout.strip(), (got, plain.stdout)
    assert eval(got.value)[:4] == [1000, 997, 2000, 1997]
    assert eval(got.value)[-5] == 2 ** 31 - 1
