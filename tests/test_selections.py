"""selfplay.proposal_style: selection (the cpu_selection config): the shipped seed file, the prompts and
prefills of code_o and code_i, the parse of a reply that starts inside the list, the style's validity checks (one
return line, output not None, the answer within the solve budget), the config's refusal without response_prefill,
and the probe's held-out selection tasks."""

from __future__ import annotations

import json
import os

import pytest

from lorapop.executor import ExecutorConfig, SandboxExecutor
from lorapop.tasks import TASK_TYPES
from lorapop.tasks.base import Invalid, ParseError, Proposal, Task
from lorapop.tasks.shown import answer_tokens
from lorapop.tasks.selection_family import (LEVELS, SEED_FILE, SEED_LEVELS, SELECTION_PREFILL, 
                                            check_shape, seed_rows)
from lorapop.tasks.styles import AZR, SELECTION


@pytest.fixture(scope="module")
def ex():
    e = SandboxExecutor(ExecutorConfig(timeout_s=1.0, require_isolation=os.geteuid() == 0))
    yield e
    e.close()


def words(text: str) -> int:
    """A stand-in token counter for the budget checks (the validate stage passes the model's tokenizer)."""
    return len(text.replace(",", " ,").split())


def test_shipped_seed_file_is_the_generated_one(data_dir):
    rows = [json.loads(line) for line in (data_dir / SEED_FILE).read_text().splitlines()]
    assert rows == seed_rows(levels=SEED_LEVELS) and SEED_LEVELS == (1,)
    assert len({r["snippet"] for r in rows}) == len(rows) == len(LEVELS[1]) == 8
    # the shipped levels are the first rows of all three levels' (the probe holds out all 24 programs and lists)
    assert seed_rows()[:len(rows)] == rows and len(seed_rows()) == sum(len(v) for v in LEVELS.values()) == 24
    for r in rows:  # every reference obeys the style's own static rules
        assert check_shape(r["snippet"], r["input"]) is None, r


def test_prompts_and_prefills_of_both_types():
    ref = Task(type="code_o", program="def f(nums):\n    return sorted(nums)[-2]", inputs=["[4, 1, 7]"], outputs=["4"])
    for name in ("code_o", "code_i"):
        ty = TASK_TYPES[name]
        prompt = SELECTION.teacher_prompt(ty, [ref])
        assert "```python\nnums = [4, 1, 7]\ndef f(nums):\n    return sorted(nums)[-2]\n```" in prompt
        assert "Reference 1:" in prompt and prompt.endswith("then f.") and ty.goal in prompt
        assert "\n4\n" not in prompt  # references go without their outputs
        assert SELECTION.proposal_prefill(ty) == SELECTION_PREFILL == "```python\nnums = ["
    task = Task(type="code_i", program=ref.program, inputs=ref.inputs, outputs=ref.outputs)
    code_i, code_o = TASK_TYPES["code_i"], TASK_TYPES["code_o"]
    # code_i's answer is a list: its reply starts inside it; the other styles keep the plain block opening
    assert SELECTION.answer_prefill(code_i) == "```input\n[" and AZR.answer_prefill(code_i) == "```input\n"
    assert SELECTION.answer_prefill(code_o) == "```output\n"
    prompt = SELECTION.student_prompt(code_i, task)
    assert "list nums" in prompt and "Output: 4" in prompt and "[4, 1, 7]" not in prompt  # the input stays hidden
    assert "f([4, 1, 7])" in SELECTION.student_prompt(code_o, task)
    got = code_i.parse_answer("```input\n[" + "4, 9]\n```")
    assert got.text == "[4, 9]"


def test_parse_a_reply_started_inside_the_list():
    code_i = TASK_TYPES["code_i"]
    got = SELECTION.parse_proposal(code_i, SELECTION_PREFILL + "3, 8, 1]\ndef f(nums):\n    return max(nums[1:])\n```")
    assert isinstance(got, Proposal) and got.type == "code_i"
    assert got.program == "def f(nums):\n    return max(nums[1:])" and got.inputs == ["[3, 8, 1]"]
    for bad in ("```python\nx = 3\ndef f(x):\n    return x\n```", SELECTION_PREFILL + "1]\n```",
                SELECTION_PREFILL + "1]\ndef f(nums):\n    return nums[0]"):
        assert isinstance(SELECTION.parse_proposal(code_i, bad), ParseError), bad


@pytest.mark.parametrize("program, inp, reason", [
    ("def f(nums):\n    return nums[0]", "3", "input_not_int_list"),
    ("def f(nums):\n    return nums[0]", "[1, 'a']", "input_not_int_list"),
    ("def f(nums):\n    return nums[0]", "[]", "input_not_int_list"),
    ("def f(nums, k):\n    return nums[k]", "[1, 2]", "not_one_param"),
    ("def f(nums):\n    y = nums[0]\n    return y", "[1, 2]", "not_one_return"),
    ("def f(nums):\n    nums.sort()", "[1, 2]", "not_one_return"),
    ("def f(nums):\n    return", "[1, 2]", "not_one_return"),
])
def test_static_shape_reasons(program, inp, reason):
    bad = check_shape(program, inp)
    assert isinstance(bad, Invalid) and bad.reason == reason and bad.detail


def test_validation_in_the_sandbox(ex):
    props = [Proposal("code_o", "def f(nums):\n    return sorted(nums)[-2]", ["[4, 1, 7]"]),
             Proposal("code_o", "def f(nums):\n    return nums.sort()", ["[4, 1, 7]"]),
             Proposal("code_o", "def f(nums):\n    return nums * 4", ["[4, 1, 7]"]),
             Proposal("code_o", "def f(nums):\n    y = 1\n    return y", ["[4, 1, 7]"]),
             Proposal("code_o", "def f(nums):\n    return nums[9]", ["[4, 1, 7]"])]
    code_o, code_i = TASK_TYPES["code_o"], TASK_TYPES["code_i"]
    got = SELECTION.validate_many(code_o, props, ex, count_tokens=words, answer_budget=8)
    assert isinstance(got[0], Task) and got[0].outputs == ["4"]
    assert [g.reason for g in got[1:]] == ["output_none", "answer_over_budget", "not_one_return", "runtime_error"]
    assert "max_new_tokens 8" in got[2].detail
    # code_i's answer is the input: a long list is over budget there, though its output is one int
    long_in = [Proposal("code_i", "def f(nums):\n    return nums[0]", ["[1, 2, 3, 4, 5, 6, 7, 8]"])]
    assert SELECTION.validate_many(code_i, long_in, ex, count_tokens=words, answer_budget=8)[0].reason == \
        "answer_over_budget"
    assert isinstance(SELECTION.validate_many(code_o, long_in, ex, count_tokens=words, answer_budget=8)[0], Task)
    # the style's rules are the style's: another style (and code_f under this one) has the shared checks only
    assert isinstance(AZR.validate_many(code_o, props[3:4], ex, count_tokens=words, answer_budget=8)[0], Task)
    assert SELECTION.validate_many(code_o, props[3:4], ex)[0].reason == "not_one_return"


def test_budget_counts_the_closing_fence():
    assert answer_tokens("5", words) == words("5\n```") == 2


def test_selection_style_needs_prefill_and_config_loads():
    from lorapop.config import load_config
    from lorapop.configlib import ConfigError

    with pytest.raises(ConfigError, match="response_prefill"):
        load_config(None, ["--selfplay.proposal_style=selection", "--selfplay.response_prefill=false"])
    cfg = load_config("lorapop/configs/cpu_selection.yaml", [])
    sp = cfg.selfplay
    assert sp.proposal_style == "selection" and sp.task_types == ["code_o", "code_i"]
    assert sp.seed_files == [SEED_FILE] and sp.propose.top_p == sp.solve.top_p == 1.0
    # the answer temperature stays in the range the design leaves to the gate (0.3-0.7)
    assert 0.3 <= sp.solve.temperature <= 0.7 and cfg.engine.entropy_coeff > 0 and cfg.run.probe_interval > 0
    # one block, so the proposal may stop at its closing fence (refused for the two-block styles)
    with pytest.raises(ConfigError, match="propose.stop"):
        load_config("lorapop/configs/cpu_selection.yaml", ["--selfplay.proposal_style=input_first"])


def test_probe_selection_tasks_are_held_out():
    from lorapop.train.probe import probe_tasks

    tasks = probe_tasks(style="selection")
    assert [t.program for _, t in tasks] == [t.program for _, t in probe_tasks(style="selection")]
    assert sorted({level for level, _ in tasks}) == [1, 2, 3] and len(tasks) == 90
    rows = seed_rows()
    seeds, lists = {r["snippet"] for r in rows}, {r["input"] for r in rows}
    assert not seeds & {t.program for _, t in tasks} and not lists & {t.inputs[0] for _, t in tasks}
    for _, t in tasks:
        assert check_shape(t.program, t.inputs[0]) is None and t.outputs[0] != "None"
    # the expression probe is unchanged by default
    assert all(t.program.startswith("def f(x):") for _, t in probe_tasks())


def test_seed_answers_fit_the_config_budget_with_the_real_tokenizer():
    from lorapop.config import load_config
    from lorapop.model import prepare_model

    transformers = pytest.importorskip("transformers")
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(prepare_model("embedded")))
    except Exception as exc:  # noqa: BLE001 - no local copy of the embedded model
        pytest.skip(f"tokenizer unavailable: {exc}")
    budget = load_config("lorapop/configs/cpu_selection.yaml", []).selfplay.solve.max_new_tokens
    count = lambda s: len(tok.encode(s, add_special_tokens=False))  # noqa: E731
    for r in seed_rows():
        assert answer_tokens(r["output"], count) <= budget and answer_tokens(r["input"], count) <= budget, r


def test_validate_stage_passes_the_engines_token_counter_and_the_solve_budget(ex):
    """stages.validate counts the answer with the engine's own tokenizer against selfplay.solve's max_new_tokens."""
    from types import SimpleNamespace

    from lorapop.config import load_config
    from lorapop.engine.base import Completion
    from lorapop.records.members import Member
    from lorapop.tasks.buffer import TaskBuffer
    from lorapop.train.stages import Rollout, StepContext, validate

    class Tok:
        def encode(self, text, add_special_tokens=False):
            return list(text)  # one token per character

    sp = load_config("lorapop/configs/cpu_selection.yaml", []).selfplay
    t0 = Member("t0", 0, "teacher")
    # code_i's answer is the list: "[1, 2]\n```" is 10 characters, "[1, 2, 3, 4, 5, 6]\n```" 22 > the budget of 20
    replies = [SELECTION_PREFILL + "1, 2]\ndef f(nums):\n    return nums[0]\n```",
               SELECTION_PREFILL + "1, 2, 3, 4, 5, 6]\ndef f(nums):\n    return nums[0]\n```"]
    rollouts = [Rollout(t0, "teacher", "code_i", [], Completion([], [], r, "eos")) for r in replies]
    ctx = StepContext(0, 0, SimpleNamespace(tokenizer=Tok()), ex, sp, {"code_i": TaskBuffer("code_i")})
    got = validate(ctx, rollouts)
    assert sp.solve.max_new_tokens == 20
    assert [r.status for r in got] == ["valid", "invalid"] and got[1].detail == "answer_over_budget"
    assert "22 tokens > selfplay.solve.max_new_tokens 20" in got[1].result.detail
