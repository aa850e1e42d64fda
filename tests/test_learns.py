"""The easy-task family and the RL sanity experiment (issue 15, item 1)."""

from __future__ import annotations

import os

import pytest

from lorapop.executor import ExecutorConfig, SandboxExecutor
from lorapop.tasks import TASK_TYPES
from lorapop.tasks.easy import TEMPLATES, easy_tasks, split_tasks

# bench/learns.py's "solve" setting, smaller (docs/RESULTS.md, "Evidence that it learns")
LEARN_STEPS, LEARN_LR, LEARN_TASKS = 4, 1e-3, 8


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


def test_shipped_easy_seed_file_is_the_generated_one():
    """lorapop/data/seeds/easy_seed_io.jsonl is what ``python -m lorapop.tasks.easy`` writes, and it reads as seed
    tasks of both program-input types (a template edit without regenerating the file fails here)."""
    import json

    from lorapop.data import PACKAGE_DATA_DIR
    from lorapop.tasks.buffer import read_seed_file
    from lorapop.tasks.easy import SEED_FILE, seed_rows

    path = PACKAGE_DATA_DIR / SEED_FILE
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert rows == seed_rows() and len(rows) == 64
    for tt in ("code_o", "code_i"):
        tasks = read_seed_file(path, tt)
        assert len(tasks) == 64 and {t.type for t in tasks} == {tt}
        assert tasks[0].program == rows[0]["snippet"] and tasks[0].outputs == [rows[0]["output"]]


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


@pytest.mark.slow
def test_student_loop_learns_where_the_lr0_control_does_not(executor):
    """bench/learns.py's "solve" setting at a test's size: a few steps on 8 easy tasks, then the same 8 tasks
    re-answered with fresh sampling seeds. The trained adapter solves more of them than the lr-0 control; the
    control stays exactly the base (same seeds, same answers); the trained adapter's deltas moved and the control's
    did not. Fails if the advantage sign, the loss mask or the learning rate reaching the adapter were wrong (each
    leaves the trained arm at or below the control). Generalisation to unseen tasks is the bench's job
    (docs/RESULTS.md)."""
    from lorapop.engine import EngineConfig, TorchEngine
    from lorapop.model import load_base_model
    import torch

    from lorapop.train.student import StudentLoopConfig, sanity_experiment

    torch.set_num_threads(1)  # as the bench; on a shared CPU one thread is faster

    model, tok = load_base_model("embedded")  # a private copy: the engine injects layers into it
    eng = TorchEngine(model, tok, 2, EngineConfig(rank=8, lora_alpha=16, device="cpu", gen_batch_size=64))
    try:
        # the templates the base solves 25-60% of the time (lorapop/tasks/easy.py): 8 tasks drawn from all 13 had
        # every group of the first step tied at reward -0.5, which leaves nothing to learn in 4 steps
        pool = easy_tasks(LEARN_TASKS, seed=0, templates=["first", "identity", "const", "index", "mul", "max"])
        cfg = StudentLoopConfig(steps=LEARN_STEPS, tasks_per_step=LEARN_TASKS, n_samples=4, lr=LEARN_LR,
                                max_new_tokens=16, temperature=0.3, eval_temperature=0.3, eval_samples=4, seed=0,
                                response_prefill=True)
        r = sanity_experiment(eng, executor, cfg, train_tasks=pool, heldout={"train": pool})
        assert r.control == r.before  # lr 0: not one answer changed
        assert all(float(b.abs().max()) == 0.0 for _, b in eng.get_adapter(1).values())
        assert any(float(b.abs().max()) > 0.0 for _, b in eng.get_adapter(0).values())
        assert r.trained["train"].solve_rate > r.control["train"].solve_rate, r.to_json()
        assert len(r.curve) == LEARN_STEPS and set(r.curve[0]) == {"trained", "control"}
    finally:
        eng.close()
