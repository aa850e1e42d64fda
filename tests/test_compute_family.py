"""The registered learning experiment's task families (lorapop/tasks/compute_family.py) and its held-out split."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from lorapop.tasks.base import Task
from lorapop.tasks.compute_family import (COMPUTE, FAMILIES, PAGE, WORDS, compute_tasks, family_of, heldout_arg,
                                          on_page, read_answer, shown_values)

ROOT = Path(__file__).resolve().parents[1]


def test_compute_answers_are_never_on_the_page_and_every_family_is_drawn():
    tasks = compute_tasks(120, 0, COMPUTE, heldout=True)
    assert {family_of(t.program) for t in tasks} == set(COMPUTE)
    assert not any(on_page(t.outputs[0], t.program, t.inputs[0]) for t in tasks)
    page = compute_tasks(50, 0, PAGE, heldout=True)
    assert all(on_page(t.outputs[0], t.program, t.inputs[0]) for t in page)
    assert all(t.outputs[0] in shown_values(t) for t in page)
    with pytest.raises(ValueError, match="unknown compute families"):
        compute_tasks(3, 0, ["nope"], heldout=True)
    assert len({w for w in WORDS if w == w[::-1]}) == 0  # a palindrome's reverse would be on the page


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_heldout_arguments_never_occur_in_training(seed):
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("bench_learns_cf", ROOT / "bench" / "learns.py")
    learns = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(learns)
    _, _, train, held, overlap = learns.draw(seed, learns.COMPUTE_SETTING)
    assert overlap["input"] == overlap["program_and_input"] == 0
    assert len(held) == 96 + 48 and len(train) == 256
    assert all(not heldout_arg(seed, t.inputs[0]) for t in train) and all(heldout_arg(seed, t.inputs[0]) for t in held)
    assert sum(heldout_arg(seed, repr(w)) for w in WORDS) == len(WORDS) // 3


def test_page_answers_read_as_right_other_shown_other_or_unreadable():
    t = Task(type="code_o", program="def f(nums):\n    return nums[2]", inputs=["[4, 7, 1, 9]"], outputs=["1"])
    assert shown_values(t) == ["4", "7", "1", "9", "2"]
    assert read_answer(t, "```output\n1\n```") == "right"
    assert read_answer(t, "```output\n9\n```") == "other_shown"
    assert read_answer(t, "```output\n2\n```") == "other_shown"  # the program's index is shown too
    assert read_answer(t, "```output\n5\n```") == "other"
    assert read_answer(t, "```output\nnums\n```") == "unreadable"
    assert read_answer(t, "no block") == "unreadable"
    assert set(FAMILIES) == set(COMPUTE) | set(PAGE)
