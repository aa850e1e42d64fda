"""selfplay.proposal_style: expression (the cpu_dynamics configs): the shipped seed file, the prompt and prefill, the
parse of a reply that starts inside the program, and the refusal without response_prefill."""

from __future__ import annotations

import json

import pytest

from lorapop.tasks import TASK_TYPES
from lorapop.tasks.base import ParseError, Proposal
from lorapop.tasks.expression_family import SEED_FILE, seed_rows
from lorapop.tasks.styles import AZR, EXPRESSION


def test_shipped_seed_file_is_the_generated_one(data_dir):
    rows = [json.loads(line) for line in (data_dir / SEED_FILE).read_text().splitlines()]
    assert rows == seed_rows()
    assert len({r["snippet"] for r in rows}) == len(rows) == 24


def test_prompt_prefill_and_parse():
    code_o = TASK_TYPES["code_o"]
    from lorapop.tasks.base import Task

    ref = Task(type="code_o", program="def f(x):\n    return x * 2 + 1", inputs=["4"], outputs=["9"])
    prompt = EXPRESSION.teacher_prompt(code_o, [ref])
    assert "single return expression" in prompt and "```python\nx = 4\ndef f(x):\n    return x * 2 + 1\n```" in prompt
    assert "9" not in prompt.split("Reference 1:")[1]  # references go without their outputs
    prefill = EXPRESSION.proposal_prefill(code_o)
    assert prefill == "```python\nx = " and prompt.endswith("then f.")
    got = EXPRESSION.parse_proposal(code_o, prefill + "7\ndef f(x):\n    return (x + 2) % 5\n```")
    assert isinstance(got, Proposal)
    assert got.program == "def f(x):\n    return (x + 2) % 5" and got.inputs == ["7"] and got.type == "code_o"
    # the same reply read as another style has no input block; a block without the input line is a format error
    assert isinstance(AZR.parse_proposal(code_o, prefill + "7\ndef f(x):\n    return x\n```"), ParseError)
    for bad in ("```python\ndef f(x):\n    return x\n```", prefill + "7\n```", prefill + "7\ndef f(x):\n    return x"):
        got = EXPRESSION.parse_proposal(code_o, bad)
        assert isinstance(got, ParseError), bad


def test_expression_style_needs_prefill():
    from lorapop.config import load_config
    from lorapop.configlib import ConfigError

    with pytest.raises(ConfigError, match="response_prefill"):
        load_config(None, ["--selfplay.proposal_style=expression", "--selfplay.response_prefill=false"])
    cfg = load_config("lorapop/configs/cpu_dynamics.yaml", [])
    assert cfg.selfplay.proposal_style == "expression" and cfg.selfplay.task_types == ["code_o"]
    # code_f keeps its own layout under a style that lays out code_o and code_i
    code_f = TASK_TYPES["code_f"]
    assert EXPRESSION.proposal_prefill(code_f) == code_f.proposal_prefill and EXPRESSION.seed_files == (SEED_FILE,)
