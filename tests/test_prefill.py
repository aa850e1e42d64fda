"""selfplay.response_prefill: the assistant turn starts with the opening of the reply's first block; the parser
reads prefill + completion, with the real sandbox and the real embedded model's tokenizer."""

from __future__ import annotations

import os

import pytest

from lorapop.config import SelfPlayConfig
from lorapop.engine.base import Completion
from lorapop.executor import ExecutorConfig, SandboxExecutor
from lorapop.tasks import TASK_TYPES, Task
from lorapop.tasks.buffer import TaskBuffer
from lorapop.tasks.formats import prompt_format
from lorapop.train import stages
from lorapop.records.members import Member


@pytest.fixture(scope="module")
def executor():
    e = SandboxExecutor(ExecutorConfig(timeout_s=1.0, require_isolation=os.geteuid() == 0))
    yield e
    e.close()


def test_every_task_type_prefills_the_block_its_parser_needs_first():
    assert {n: (t.proposal_prefill, t.answer_prefill) for n, t in TASK_TYPES.items()} == {
        "code_o": ("```python\n", "```output\n"), "code_i": ("```python\n", "```input\n"),
        "code_f": ("```input\n", "```python\n")}


def test_validate_reads_prefill_plus_completion(executor):
    t0 = Member("t0", 0, "teacher")
    text = "def f(a):\n    return a + 1\n```\n```input\n3\n```"
    with_prefill = stages.Rollout(t0, "teacher", "code_o", [1], Completion([1], [2], text, "eos"),
                                  prefill="```python\n")
    without = stages.Rollout(t0, "teacher", "code_o", [1], Completion([1], [2], text, "eos"))
    buffers = {"code_o": TaskBuffer("code_o")}
    ctx = stages.StepContext(1, 0, None, executor, SelfPlayConfig(task_types=["code_o"]), buffers)
    got = stages.validate(ctx, [with_prefill, without])
    assert got[0].status == "valid" and got[0].task.outputs == ["4"]
    assert got[1].status == "format_error"  # the same text is not a proposal on its own
    assert len(buffers["code_o"]) == 2  # the identity seed and the new task


@pytest.mark.slow
def test_prefill_ends_the_prompt_and_answers_are_checked_with_it(executor, embedded_model):
    from lorapop.engine import EngineConfig, TorchEngine

    model, tok = embedded_model
    engine = TorchEngine(model, tok, 1, EngineConfig(device="cpu", gen_batch_size=8), seed=0)
    try:  # the model is the session's shared fixture: leave it without LoRA layers
        base = engine.chat_prompt("hi")
        ids = prompt_format("short").prompt_ids(engine, "hi", "```output\n")
        assert ids[:len(base)] == base and tok.decode(ids[len(base):]) == "```output\n"
        assert prompt_format("short").prompt_ids(engine, "hi", "") == base
        task = Task(type="code_o", program="def f(a):\n    return a", inputs=["'x'"], outputs=["'x'"])
        s0 = Member("s0", 0, "student")
        sp = SelfPlayConfig(task_types=["code_o"], n_solve=2, response_prefill=True)
        sp.solve.max_new_tokens = 4
        ctx = stages.StepContext(1, 0, engine, executor, sp, {"code_o": TaskBuffer("code_o")})
        (job,) = stages.solve(ctx, [stages.SolveJob(task, "code_o", s0, None)])
        for r in job.rollouts:
            assert r.prefill == "```output\n" and r.prompt_ids[-len(ids) + len(base):] == ids[len(base):]
            # 4 tokens cannot close the block, so parsing prefill + text finds it unclosed rather than missing
            assert r.status == "format_error" and r.detail == "unclosed_fence"
    finally:
        engine.close()


@pytest.mark.slow
def test_solve_stop_ends_answers_at_their_block_close(executor, embedded_model):
    """cpu_demo's solve.stop ['```']: answers end where their prefilled block closes (no tokens after it to
    generate or train on), and are parsed and checked exactly as before."""
    from lorapop.engine import EngineConfig, TorchEngine
    from lorapop.tasks.easy import easy_tasks

    model, tok = embedded_model
    engine = TorchEngine(model, tok, 1, EngineConfig(device="cpu", gen_batch_size=16), seed=0)
    try:
        tasks = easy_tasks(8, seed=0, templates=["first", "identity", "const", "index"])
        s0 = Member("s0", 0, "student")
        sp = SelfPlayConfig(task_types=["code_o"], n_solve=2, response_prefill=True)
        sp.solve.max_new_tokens, sp.solve.temperature, sp.solve.stop = 48, 0.3, ["```"]
        sp.validate()
        ctx = stages.StepContext(1, 0, engine, executor, sp, {"code_o": TaskBuffer("code_o")})
        jobs = stages.solve(ctx, [stages.SolveJob(t, "code_o", s0, None) for t in tasks])
        rollouts = [r for j in jobs for r in j.rollouts]
        stopped = [r for r in rollouts if r.completion.finish_reason == "stop"]
        assert len(stopped) >= len(rollouts) // 2  # the base closes its block on most easy tasks
        for r in stopped:
            assert r.completion.text.endswith("```") and r.completion.text.count("```") == 1
            assert len(r.completion.token_ids) < 48 and r.status != "format_error"
        for r in rollouts:
            if r.completion.finish_reason != "stop":  # never closed: runs to the cap or EOS, as before
                assert "```" not in r.completion.text
        assert any(r.status == "correct" for r in stopped)
    finally:
        engine.close()
