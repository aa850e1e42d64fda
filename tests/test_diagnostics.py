"""Program descriptors: exact values on small programs, and no exception on junk."""

from __future__ import annotations

import pytest

from lorapop.diagnostics.complexity import DESCRIPTOR_KEYS, input_size, program_descriptors

IDENTITY = "def f(x):\n    return x\n"
BRANCHY = """
def f(a, b):
    # a comment line is not code

    for i in range(a):
        if i % 2 and b:
            b += i
    return b
"""


def test_identity_program_values():
    d = program_descriptors(IDENTITY, ["1"])
    assert set(d) == set(DESCRIPTOR_KEYS)
    # Module > FunctionDef > Return > Name > Load
    assert d["ast_depth"] == 5
    assert d["cyclomatic"] == 1
    assert d["loc"] == 2
    assert d["n_node_types"] == 6  # Module FunctionDef arguments arg Return Name (Load is not counted)
    assert d["input_size"] == 1 and d["n_inputs"] == 1 and d["parse_ok"] == 1.0
    assert all(isinstance(v, float) for v in d.values())


def test_branchy_program_values():
    d = program_descriptors(BRANCHY, ["3, 4"])
    assert d["cyclomatic"] == 4  # 1 + for + if + `and`
    assert d["loc"] == 5  # blank and comment-only lines excluded
    assert d["ast_depth"] > program_descriptors(IDENTITY, [])["ast_depth"]
    assert d["n_node_types"] > 6


def test_cyclomatic_counts_methods_closures_and_module_branches():
    prog = """
class C:
    def m(self, a):
        if a:
            return 1
        return 2

def f(x):
    def g(y):
        return y if y else 0
    return g(x)

_r = [v for v in range(3) if v]
"""
    # m: 2, f: 1, g: 2 (closure), module body: comprehension `for` + `if` = 2
    assert program_descriptors(prog, [])["cyclomatic"] == 7


def test_input_size_is_canonical():
    assert input_size(["[1,2,3],  'ab'"]) == input_size(['[1, 2, 3], "ab"']) == len(repr(([1, 2, 3], "ab")))
    assert input_size(["1", "22"]) == 3
    # not a literal: counted by its stripped text length rather than rejected
    assert input_size(["  foo(1) "]) == len("foo(1)")


@pytest.mark.parametrize("program", ["def f(:\n  pass", "x = 1\0", "(" * 300 + ")" * 300, "", None, 12,
                                     "\ufeff\x00\xff", "def f(x):\n\treturn x\n        return 2"])
def test_junk_never_raises(program):
    d = program_descriptors(program, ["[1, 2", None, 3])  # junk inputs too
    assert set(d) == set(DESCRIPTOR_KEYS)
    if d["parse_ok"] == 0.0:
        assert d["ast_depth"] == d["cyclomatic"] == d["loc"] == d["n_node_types"] == 0.0
    assert d["n_inputs"] == 3


def test_deeply_nested_but_valid_program():
    body = "x"
    for _ in range(60):
        body = f"[{body}]"
    d = program_descriptors(f"def f(x):\n    return {body}\n", [])
    assert d["parse_ok"] == 1.0 and d["ast_depth"] > 60
