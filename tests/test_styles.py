"""A style is one registered value: a style written here, inside the test, with its own one-line
program family, prefill, prompts, parser and validity check, is registered and plays one real self-play step on the
tiny engine; everything the step asked and read is the toy style's. And the registries refuse unknown names at load,
listing the registered ones."""

from __future__ import annotations

import json

import pytest

from test_engine_helpers import tiny_engine
from lorapop.config import load_config
from lorapop.configlib import ConfigError
from lorapop.tasks.base import Invalid, ParseError, Proposal, Task
from lorapop.tasks.styles import STYLES, ProposalStyle, register_style
from lorapop.train.loop import Trainer


class AddStyle(ProposalStyle):
    """The family ``def f(x): return x + K``, K a digit: the teacher's reply picks K (its length mod 10, so any
    text parses) and the input is always 3; an odd K is invalid. It records what it was asked."""
    name = "toy_add"
    types = ("code_o",)
    prefill = "Add K:"

    def __init__(self):
        self.parsed: list[tuple[str, Proposal | ParseError]] = []
        self.verdicts: list[tuple[str, object]] = []

    def proposal_prefill(self, tt):
        return self.prefill

    def teacher_prompt(self, tt, references, rng=None):
        return f"TOY TEACHER: pick K for f(x) = x + K. Seen: {references[0].program!r}"

    def student_prompt(self, tt, task):
        return f"TOY STUDENT: what is f({task.inputs[0]}) for\n{task.program}\nAnswer in an ```output block."

    def parse_proposal(self, tt, text, *, program=None):
        k = len(text) % 10
        got = Proposal(tt.name, f"def f(x):\n    return x + {k}", ["3"])
        self.parsed.append((text, got))
        return got

    def validate_many(self, tt, proposals, executor, **kw):
        out = [Invalid("toy_odd", p.program) if int(p.program[-1]) % 2 else None for p in proposals]
        shared = iter(tt.validate_many([p for p, o in zip(proposals, out) if o is None], executor))
        out = [o if o is not None else next(shared) for o in out]
        self.verdicts += [(p.program, o) for p, o in zip(proposals, out)]
        return out


@pytest.fixture
def toy():
    style = register_style(AddStyle())
    try:
        yield style
    finally:
        STYLES.pop(style.name)


TINY = ["--selfplay.proposal_style=toy_add", "--selfplay.task_types=[code_o]", "--selfplay.tasks_per_type=6",
        "--selfplay.n_solve=1", "--selfplay.n_references=1", "--selfplay.propose.max_new_tokens=12",
        "--selfplay.solve.max_new_tokens=6", "--population.mode=single", "--engine.device=cpu",
        "--selfplay.response_prefill=true", "--run.progress=none", "--run.steps=1", "--run.report_to=none"]


def test_a_style_defined_in_a_test_plays_a_real_step(toy, tmp_path):
    cfg = load_config(None, TINY + [f"--run.output_dir={tmp_path}", "--run.name=toy"])
    engine = tiny_engine(n_adapters=1)
    asked: list[list[int]] = []
    generate = engine.generate

    def recorded(prompts, *a, **kw):  # the real engine generates; this only keeps what it was asked
        asked.extend(prompts)
        return generate(prompts, *a, **kw)

    engine.generate = recorded
    with Trainer(cfg, tmp_path / "toy", engine=engine) as trainer:
        metrics = trainer.train_step(1)
        buffer = [t.program for t in trainer.buffers["code_o"]]
    tok = engine.tokenizer
    texts = [tok.decode(p) for p in asked]
    teacher, student = texts[:6], texts[6:]
    # prompts: the toy teacher prompt with its prefill ending the prompt, then the toy student prompt
    prefill_ids = tok.encode(toy.prefill, add_special_tokens=False)
    assert all("TOY TEACHER" in t for t in teacher) and all(p[-len(prefill_ids):] == prefill_ids for p in asked[:6])
    assert student and all("TOY STUDENT" in t and "TOY TEACHER" not in t for t in student)
    # parses: every reply was read by the toy parser, prefill first, into the toy family
    assert len(toy.parsed) == 6
    for reply, prop in toy.parsed:
        assert reply.startswith(toy.prefill) and prop.program == f"def f(x):\n    return x + {len(reply) % 10}"
    # verdicts: odd K is the toy's invalid, even K a task the sandbox ran; the step counted them so
    assert len(toy.verdicts) == 6
    for program, verdict in toy.verdicts:
        k = int(program[-1])
        if k % 2:
            assert isinstance(verdict, Invalid) and verdict.reason == "toy_odd"
        else:
            assert isinstance(verdict, Task) and verdict.outputs == [str(3 + k)] and program in buffer
    assert metrics["valid_rate"] == sum(isinstance(v, Task) for _, v in toy.verdicts) / 6
    rows = [json.loads(x) for x in (tmp_path / "toy" / "tasks.jsonl").read_text().splitlines()]
    assert {r["program"] for r in rows} == {p for p, v in toy.verdicts if isinstance(v, Task)}


def test_unknown_names_are_refused_at_load_with_the_registered_ones(toy):
    with pytest.raises(ConfigError, match=r"selfplay.proposal_style: unknown name 'toy_ad' \(did you mean "
                                          r"'toy_add'\?\); registered: azr, input_first, expression, selection, "
                                          r"toy_add"):
        load_config(None, ["--selfplay.proposal_style=toy_ad"])
    with pytest.raises(ConfigError, match="selfplay.prompt_format: unknown name 'chat'; registered: short, azr"):
        load_config(None, ["--selfplay.prompt_format=chat"])
    # the AZR format asks in one layout: a registered style is refused under it as before
    with pytest.raises(ConfigError, match="selfplay.proposal_style: must be azr with selfplay.prompt_format: azr"):
        load_config(None, ["--selfplay.prompt_format=azr", "--selfplay.proposal_style=toy_add"])
