"""The easy-task family and the RL sanity experiment (issue 15, item 1)."""

from __future__ import annotations

import os

import pytest

from lorapop.executor import ExecutorConfig, SandboxExecutor
from lorapop.tasks import TASK_TYPES
from lorapop.tasks.easy import TEMPLATES, easy_tasks, split_tasks


@pytest.fixture(scope="module")
def executor():
    e = SandboxExecutor(ExecutorConfig(timeout_s=2.0, require_isolation=os.geteuid() == 0))
    yield e
    e.close()


def test_easy_tasks_are_deterministic_distinct_and_split_apart():
    a, b = easy_tasks(40, seed=3), easy_tasks(40, seed=3)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
    assert easy_tasks(40, seed=4)[0].to_dict() != a[0].to_dict() or easy_tasks(40, seed=4) != a
    assert len({(t.program, t.inputs[0]) for t in a}) == 40
    train, held = split_tasks(60, 20, seed=0)
    assert not {(t.program, t.inputs[0]) for t in train} & {(t.program, t.inputs[0]) for t in held}
    assert {t.program.split("return")[1].strip()[:3] for t in a} != set()  # several templates drawn
    with pytest.raises(ValueError, match="unknown easy template"):
        easy_tasks(3, 0, templates=["nope"])
    with pytest.raises(ValueError, match="code_o or code_i"):
        easy_tasks(3, 0, task_type="code_f")


@pytest.mark.slow
def test_easy_tasks_pass_the_sandbox_validation_with_the_same_outputs(executor):
    """The outputs computed in-process are the ones the project's own validation computes in the sandbox, and a
    correct answer is judged correct by the task type's checker (so the family is real AZR tasks)."""
    from lorapop.tasks.base import Answer, Proposal

    tasks = easy_tasks(len(TEMPLATES) * 3, seed=1)
    got = TASK_TYPES["code_o"].validate_many([Proposal("code_o", t.program, t.inputs) for t in tasks], executor)
    assert [g.outputs for g in got] == [t.outputs for t in tasks]
    for tt in ("code_o", "code_i"):
        t = easy_tasks(1, seed=2, task_type=tt)[0]
        right = t.outputs[0] if tt == "code_o" else t.inputs[0]
        outs = TASK_TYPES[tt].check_many(t, [Answer(tt, right), Answer(tt, "'definitely wrong'")], executor)
        assert [o.status for o in outs] == ["correct", "wrong"]
