"""No program being judged can forge its verdict, keep memory or state past its run, or leave the executor degraded,
as root and as an ordinary user (user namespaces). The programs are in tests/verdict_probe.py and go through the
trainer's path (parse, validation, the checks; SandboxExecutor.run for the raw ones); the root path runs the probe in
this process (CI runs as root), the unprivileged path as uid 65534 with every capability gone
(tests/unprivileged.py). Then a generated test: outputs and answers full of comments, quotes, backslashes,
brackets and odd objects never turn a wrong answer into "correct" or a right one into "wrong".
"""

from __future__ import annotations

import ast
import os
import random
import sys
from pathlib import Path

import pytest

import unprivileged  # tests/unprivileged.py: a script as uid 65534
from lorapop.executor import ExecutorConfig, SandboxExecutor
from lorapop.tasks import TASK_TYPES, Task
from lorapop.tasks.code_f import CodeF

sys.path.insert(0, str(Path(__file__).parent))
import verdict_probe  # noqa: E402

ROOT = os.geteuid() == 0
MIB_KB = 1024


def check(out: dict) -> None:
    """What must hold on either path."""
    assert "refused" not in out, out["refused"]
    assert all(out["static_ok"].values()), out["static_ok"]  # the static check is not what stops any of them
    assert out["protections"]["own_hostname"], out["protections"]
    # code_i: the wrong input 3 is wrong, the validated input 5 and its equal 5.0 right, whatever f tried on 3;
    # except where f "forged" the gold output itself for 3, which is just what f(3) returns: 3 is then right
    for name, got in out["code_i"].items():
        # (the frame walker adds the number of names it found to 10: more than none)
        assert got["valid"] and (int(got["output"][0]) > 10 if name == "tell_check_from_validation"
                                 else got["output"] == ["10"]), got
        want = ["correct" if name == "fake_result_gold" else "wrong", "correct", "correct"]
        assert got["checks"] == want, (name, got)
    # code_i: an answer equal to the task's input by value but written in another order (a set of strings that
    # iterates in that order in the sandbox) is wrong, as AZR's run of it is; the task's own text respelled is right
    assert len(out["set_order"]) >= 3, out["set_order"]
    for given, got in out["set_order"].items():
        assert got["valid"] and got["output"] != [got["azr_other"]], (given, got)
        assert got["checks"] == ["wrong", "correct", "correct"], (given, got)
    # code_o: a program looking for a process id finds no function that gives one; no file can be left (a read-only
    # filesystem), and the host name is the sandbox's own
    assert out["code_o"]["pid"]["output"] == ["10"], out["code_o"]["pid"]
    assert out["code_o"]["file_state"]["output"] == ["10"]
    assert out["code_o"]["hostname"]["output"] == (["1"] if out["protections"]["seccomp"] else ["'sandbox'"])
    for name in ("pid", "file_state", "hostname"):
        assert all(c == ["correct", "wrong"] for c in out["code_o"][name]["checks"]), out["code_o"][name]
    # a result a script could not print is no task: an error, not a gold of None or of the program's choosing
    assert out["result_step"] == dict.fromkeys(verdict_probe.RESULT_STEP, "runtime_error"), out["result_step"]
    # the clock: invalid when the two validation runs straddled a second, else void once the second has turned
    clock = out["clock"]
    assert (clock["valid"] and clock["checks"] == ["void"]) or clock.get("reason") == "nondeterministic", clock
    # code_f: nothing computed is never right; right values in odd forms stay right
    assert out["code_f_task"]["valid"], out["code_f_task"]
    for name in verdict_probe.FAKE_F:
        assert out["code_f"][name] == "wrong", (name, out["code_f"])
    for name in verdict_probe.RIGHT_F:
        assert out["code_f"][name] == "correct", (name, out["code_f"])
    assert out["set_output"] == {"valid": True, "checks": ["correct", "wrong"]}
    # raw runs: refused, or cleaned away whole; the next run is served right and sees a fresh, unchanged worker
    first = ast.literal_eval(out["look_first"][1])
    assert first["modules"] == [] and first["ctypes_objects"] == 0, first  # nothing of ctypes or lockdown
    # only its result pipe: none of the worker's descriptors (their flags, pipe size and locks are shared)
    assert len(first["fds"]) == 1 and first["host"] in ("sandbox", 1) and first["listdir"] == [], first
    refused = {"memfd", "nice_worker", "nice_user", "affinity_worker", "idle_worker", "rlimit_worker", "hostname_set"}
    read_only = {"deep_tree", "many_files", "workdir_locked"}
    for name, got in out["raw"].items():
        status, value, error = got["run"]
        if name in refused:
            assert status == "error" and "PermissionError" in error, (name, got)
        elif name in read_only:
            assert status == "error" and "Read-only file system" in error, (name, got)
        elif name.endswith("_sysv"):
            assert value == "(-1, 1)", (name, got)  # EPERM from the filter
        else:
            assert status == "ok", (name, got)
        assert got["next"] == ["ok", "[1, 2, 3]"], (name, got)
        look = ast.literal_eval(got["look"][1])
        assert look["listdir"] == [] and look["fresh"] and look["host"] in ("sandbox", 1), (name, look)
        assert (look["nice"], look["sched"], look["cpus"]) == (first["nice"], first["sched"], first["cpus"]), look
        # the others tried to hold 300 MiB outside their limits
        assert got["shmem_kb_after_run"] < 48 * MIB_KB, (name, got)
    assert out["raw"]["fill_disk"]["run"][1] == "0"  # not one byte written


@pytest.mark.skipif(not ROOT, reason="the root path needs root (CI runs as root)")
def test_no_verdict_forged_and_nothing_kept_as_root():
    out = verdict_probe.probe()
    assert out["protections"]["mechanism"] == "root"
    check(out)


def test_no_verdict_forged_and_nothing_kept_as_an_ordinary_user():
    out = unprivileged.probe_output("tests/verdict_probe.py", timeout=180)
    check(out)


# ---- generated: hostile text and odd objects never flip a verdict ------------------------------------------------

TEXT = "ab#'\"\\\n[](){},: x"


def _value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(11 if depth < 3 else 6)
    if kind == 0:
        return rng.randrange(-10**6, 10**6)
    if kind == 1:
        return rng.choice([0.0, -0.0, 0.5, -2.25, 1e300, 3.0])
    if kind == 2:
        return "".join(rng.choice(TEXT) for _ in range(rng.randrange(6)))
    if kind == 3:
        return rng.choice([None, True, False])
    if kind == 4:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(4)))
    if kind == 5:
        return complex(rng.randrange(-3, 4), rng.randrange(-3, 4))
    items = [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind in (6, 7):
        return items if kind == 6 else tuple(items)
    if kind == 8:
        return {rng.choice([rng.randrange(9), "".join(rng.choice(TEXT) for _ in range(3))]): v for v in items}
    # a set's repr is a literal only when it is not empty (set() is a call)
    return {x for x in items if isinstance(x, (int, str, bytes, float))} or {rng.randrange(9)}


def _values(rng: random.Random, n: int) -> list:
    """``n`` values with distinct reprs short enough to be a task's output (400 characters)."""
    out: list = []
    while len(out) < n:
        v = _value(rng)
        if len(repr(v)) <= 200 and repr(v) not in map(repr, out):
            out.append(v)
    return out


def _wrong(rng: random.Random, v):
    """A value that differs from ``v`` by Python's ==, which is what the verdict is (AZR's eval(gold) == eval(x))."""
    for _ in range(50):
        w = _value(rng)
        if w != v:
            return w
    return [v]


def test_generated_hostile_text_never_flips_a_code_o_verdict():
    rng = random.Random(0)
    code_o = TASK_TYPES["code_o"]
    with SandboxExecutor(ExecutorConfig(n_workers=2)) as ex:
        for v in _values(rng, 12):
            task = code_o.validate(code_o.parse_proposal(f"```python\ndef f(x):\n    return x\n```\n```input\n{v!r}\n```"),
                                   ex)
            assert isinstance(task, Task), (v, task)
            w = _wrong(rng, v)
            # (answer text, whether it is right): the value in other spellings, wrong values, and hostile suffixes
            # that either leave the value as it is (a comment) or make the text no literal at all
            cases = [(repr(v), True), (f"  {v!r}  # {w!r}", True), (repr(w), False), (f"{w!r} # {v!r}", False),
                     (f"{v!r} \\\n", False), (f"({v!r}", False), (f"{v!r}, {v!r}", v == (v, v)),
                     (f"{v!r} or {v!r}", False), (f"'''{v!r}", False), (f"[{v!r}][0]", False)]
            got = code_o.check_many(task, [code_o.parse_answer(f"```output\n{t}\n```") for t, _ in cases], ex)
            for (text, right), o in zip(cases, got):
                assert o.status in ("correct", "wrong"), (text, o)
                assert o.correct == right, (v, text, o)


def test_generated_odd_objects_never_flip_a_code_f_verdict():
    """Student programs whose return values override __eq__, __repr__ or __hash__, or subclass str or int: the verdict
    is the value their output denotes, whatever the object claims about itself."""
    rng = random.Random(1)
    code_f = CodeF(n_inputs=4, n_shown=1)
    values = _values(rng, 4)
    reply = "\n".join(f"```input\n{v!r}\n```" for v in values) + "\n```message\nidentity\n```"
    answers, truth = [], []
    for k in range(24):
        mode = k % 6
        if mode == 0:  # the right value behind an __eq__ that denies everything and a constant hash
            body = "type('T', (type(x),), {'__eq__': lambda s, o: False, '__hash__': lambda s: 0})(x) " \
                   "if type(x) in (int, str, float) else x"
            right = True
        elif mode == 1:  # a wrong value behind an __eq__ that accepts everything
            body = "type('E', (int,), {'__eq__': lambda s, o: True, '__ne__': lambda s, o: False})(7)"
            right = all(v == 7 for v in values[1:])
        elif mode == 2:  # prints the right value with a comment after it
            body = "type('R', (), {'__repr__': lambda s: repr(x) + ' # ' + %r})()" % rng.choice(TEXT)
            right = True
        elif mode == 3:  # prints a hostile suffix that is no literal
            body = "type('R', (), {'__repr__': lambda s: repr(x) + %r})()" % rng.choice(["\\\n", ")", "'", "[", ", ("])
            right = False
        elif mode == 4:  # a str subclass equal to everything, holding the wrong text
            body = "type('S', (str,), {'__eq__': lambda s, o: True, '__hash__': lambda s: 0})(%r)" % TEXT
            right = all(v == TEXT for v in values[1:])
        else:  # prints another value's repr
            w = _wrong(rng, values[1])
            body = "type('R', (), {'__repr__': lambda s: %r})()" % repr(w)
            right = all(v == w for v in values[1:])
        answers.append(f"```python\ndef f(x):\n    return {body}\n```")
        truth.append(right)
    with SandboxExecutor(ExecutorConfig(n_workers=2)) as ex:
        task = code_f.validate(code_f.parse_proposal(reply, program="def f(x):\n    return x"), ex)
        assert isinstance(task, Task), task
        got = code_f.check_many(task, [code_f.parse_answer(a) for a in answers], ex)
    for a, right, o in zip(answers, truth, got):
        assert o.status in ("correct", "wrong") and o.correct == right, (a, right, o)


# ---- inputs are told apart by value, as verdicts read them --------------------------------------------------------

SAME_INPUTS = [("1", "1.0"), ("1", "True"), ("0", "-0.0"), ("[1, 2]", "([1, 2])"), ("'a'", " 'a' "), ("1+0j", "1"),
               ("x=1, y=2", "y=2, x=1.0"), ("{1, 2}", "{2, 1}"), ("{1: 'a'}", "{1.0: 'a'}"), ("(1, [2])", "(1.0, [2.0])")]
OTHER_INPUTS = [("1", "'1'"), ("(1,)", "[1]"), ("'a'", "b'a'"), ("1", "1, 1"), ("x=1", "y=1"), ("{1, 2}", "{1: 2}")]


def test_a_hidden_input_that_is_a_shown_one_respelled_is_a_duplicate():
    """code_f shows the first input's output and hides the rest: a hidden input equal to the shown one by value would
    hand the student its output. The teacher's inputs are compared as values, as verdicts compare (AZR's ==); the
    task buffer keys them the same way."""
    from lorapop.tasks.buffer import TaskBuffer

    code_f = CodeF(n_inputs=3, n_shown=1)
    program = "def f(*a, **k):\n    return [repr(a), sorted(k.items())]"
    with SandboxExecutor(ExecutorConfig(n_workers=2)) as ex:
        for (shown, hidden), same in [(p, True) for p in SAME_INPUTS] + [(p, False) for p in OTHER_INPUTS]:
            reply = "\n".join(f"```input\n{i}\n```" for i in (shown, "'third'", hidden)) + "\n```message\nm\n```"
            got = code_f.validate_many([code_f.parse_proposal(reply, program=program)], ex)[0]
            assert (getattr(got, "reason", None) == "duplicate_inputs") == same, (shown, hidden, got)
            if not same:
                buf = TaskBuffer("code_f", seed_identity=False)
                assert buf.add(got)
                # the same task with its first input respelled the other way round is not new
                respelled = Task(type="code_f", program=got.program, inputs=[hidden, "'third'", shown],
                                 outputs=got.outputs)
                assert buf.add(respelled)
                assert not buf.add(Task(type="code_f", program=got.program, inputs=[f" {shown}", "'third'", hidden],
                                        outputs=got.outputs))
    buf = TaskBuffer("code_o", seed_identity=False)
    assert buf.add(Task(type="code_o", program="def f(x):\n    return x", inputs=["1"], outputs=["1"]))
    assert not buf.add(Task(type="code_o", program="def f(x):\n    return x", inputs=["1.0"], outputs=["1"]))
    assert buf.add(Task(type="code_o", program="def f(x):\n    return x", inputs=["'1'"], outputs=["'1'"]))


def test_value_keys_agree_with_the_verdicts_equality():
    """values.value_key is equal exactly when AZR's == is, over generated literal values (numbers of every kind,
    strings, bytes, nested containers, sets and dicts); the syntax-tree form of their text only when the texts are
    the same literal (the same types, in the same order)."""
    from lorapop.modeltext import NotLiteral
    from lorapop.tasks.values import call_form, literal_value, value_key

    rng = random.Random(2)
    vals = _values(rng, 60) + [1, 1.0, True, 0, -0.0, 0.0, False, 1 + 0j, [1], [1.0], (1,), {1: 2}, {1.0: 2}, {2, 1},
                               {1, 2.0}, "1", b"1", None]
    parsed = [literal_value(repr(v), 10_000) for v in vals]
    for a in parsed:
        for b in parsed:
            assert (value_key(a) == value_key(b)) == (a == b), (a, b)
    forms = []
    for v in vals:
        try:
            forms.append((call_form(repr(v)), call_form(f" ( {v!r} ) "), v))
        except NotLiteral:  # inf, nan
            pass
    assert len(forms) > 60
    for fa, _, va in forms:
        for _, fb, vb in forms:
            if fa == fb:
                assert va == vb and repr(va) == repr(vb), (va, vb)
    # the adversary's pair: equal values, other orders in the sandbox
    assert call_form("{'w0', 'w1'}") != call_form("{'w1', 'w0'}")
    assert call_form("{'w0', 'w1'}") == call_form(" ({ 'w0' ,\"w1\" })") != call_form("({'w0', 'w1'},)")
