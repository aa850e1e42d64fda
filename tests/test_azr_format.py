"""selfplay.prompt_format: azr and selfplay.reward_reading: AZR's R1 template rendered on
the embedded model's real tokenizer for every task type and role, AZR's anchored format check, a prompt -> reply ->
parse -> sandbox round trip per task type on hand-written well-formed replies, both readings of AZR's teacher
penalties, and the configs that use them."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import yaml

from lorapop.config import load_config
from lorapop.configlib import ConfigError
from lorapop.executor import ExecutorConfig, SandboxExecutor
from lorapop.tasks import (TASK_TYPES, Invalid, Outcome, ParseError, Proposal, Task, identity_task,
                           read_seed_file, student_reward, teacher_reward)
from lorapop.tasks.azr_format import (AZR_BANNED_KEYWORDS, AZR_PREAMBLE, FORMAT_RE, THINK_OPEN, answer_content,
                                      format_ok, r1_prompt, r1_prompt_ids, unwrap)
from lorapop.tasks.formats import AZR as R1
from lorapop.tasks.styles import AZR

CONFIGS = Path(__file__).resolve().parents[1] / "lorapop" / "configs"
GPU_CONFIGS = ["1T+1S", "4T+4S", "8T+8S", "single"]
CPU_CONFIGS = ["cpu_demo", "cpu_single", "cpu_dynamics", "cpu_dynamics_single"]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from lorapop.model import prepare_model

    return AutoTokenizer.from_pretrained(str(prepare_model("embedded")))


@pytest.fixture(scope="module")
def ex():
    e = SandboxExecutor(ExecutorConfig(timeout_s=2.0, require_isolation=os.geteuid() == 0))
    yield e
    e.close()


@pytest.fixture(scope="module")
def seeds(data_dir):
    io = read_seed_file(str(data_dir / "seeds" / "azr_7b_coder_seed_io.jsonl"), "code_o")
    fs = read_seed_file(str(data_dir / "seeds" / "azr_7b_coder_code_f_seed_io.jsonl"), "code_f")
    return io, [t for t in fs if len(t.inputs) == 10]


def _prompt(task_type: str, role: str, seeds) -> tuple[str, list[str]]:
    """The azr prompt of (task type, role) and the strings it must hold."""
    io, fs = seeds
    refs = random.Random(0).sample(io, 6)
    ty = TASK_TYPES[task_type]
    if role == "proposer" and task_type != "code_f":
        must = ["<snippet_0>", "</snippet_5>", refs[5].program, "```python", "```input", "```output",
                ", ".join(AZR_BANNED_KEYWORDS), "### Reference Code Snippets:"]
        return R1.teacher_prompt(AZR, ty, refs), must
    if role == "proposer":
        must = [refs[0].program + "\nf(<|YOUR INPUT WILL BE PLUGGED HERE|>)", "```input", "```message", "10 Inputs"]
        return R1.teacher_prompt(AZR, ty, refs[:1]), must
    if task_type == "code_o":
        t = refs[0]
        return R1.student_prompt(AZR, ty, t), [f"```python\n{t.program}\n```", f"```input\n{t.inputs[0]}\n```",
                                                 "```output"]
    if task_type == "code_i":
        t = refs[0]
        return R1.student_prompt(AZR, ty, t), [f"```python\n{t.program}\n```", f"```output\n{t.outputs[0]}\n```",
                                                 "```input"]
    t = fs[0]
    shown = [f"```input_{i}\n{t.inputs[i]}\n```\n```output_{i}\n{t.outputs[i]}\n```" for i in range(5)]
    return R1.student_prompt(AZR, ty, t), shown + [f"```message\n{t.message}\n```", "```python"]


@pytest.mark.parametrize("task_type", ["code_o", "code_i", "code_f"])
@pytest.mark.parametrize("role", ["proposer", "solver"])
def test_every_azr_prompt_is_the_r1_template_without_chat_tokens(tok, seeds, task_type, role):
    text, must = _prompt(task_type, role, seeds)
    ids = r1_prompt_ids(tok, text)
    decoded = tok.decode(ids)
    assert decoded == r1_prompt(text)
    assert decoded.startswith(AZR_PREAMBLE + " User: ") and decoded.endswith("\nAssistant: <think>")
    special = {tok.convert_tokens_to_ids(t) for t in tok.all_special_tokens}
    assert not special & set(ids), "the R1 template is plain text: no chat special token may appear"
    for s in must:
        assert s in text, f"{task_type} {role} prompt lacks {s!r}"
    if task_type == "code_f" and role == "solver":  # the hidden half stays hidden
        assert "```input_5" not in text
    # the short prompt of the same task goes through the chat template: the two formats really differ
    short = TASK_TYPES[task_type].student_prompt(identity_task(task_type))
    assert short not in text and "User:" not in short


def test_eval_and_selfplay_share_the_r1_sentence():
    from lorapop.eval import prompts as P
    from lorapop.tasks import azr_format

    assert P.AZR_PREAMBLE is azr_format.AZR_PREAMBLE
    assert P.AZR_CODE_RESPONSE_PREFIX == azr_format.AZR_RESPONSE_PREFIX == "Assistant: " + THINK_OPEN
    assert P.AZR_MATH_TEMPLATE.format(input="q") + " <think>" == r1_prompt("q")


# The reply as AZR checks it: the prompt's <think> then the completion. Expected values are AZR's regex
# `<think>.*?</think>\s*<answer>.*?</answer>` under re.match with DOTALL, worked out by hand.
@pytest.mark.parametrize("reply, ok", [
    ("<think>plan</think><answer>x</answer>", True),
    ("<think>line 1\nline 2</think>\n\n  <answer>\n```output\n3\n```\n</answer>", True),  # blocks span lines
    ("<think>a</think> <answer>x</answer> and then some text after", True),  # text after </answer> is allowed
    ("<think>a</think><answer>x</answer><answer>y</answer>", True),  # a second answer after the first: trailing
    ("<think>a <think>b</think> c</think> <answer>x</answer>", True),  # nested think: the lazy match backtracks
    ("<think>a</think><answer>x <answer>y</answer> z</answer>", True),  # nested answer: ends at the first close
    ("<think></think><answer></answer>", True),  # empty blocks
    ("\n <think>a</think><answer>x</answer>", True),  # whitespace before the reply's think is not text
    ("<think>a <answer>x</answer>", False),  # missing </think>
    ("<think>a</think>", False),  # no answer block
    ("<think>a</think><answer>x", False),  # answer never closed (a reply cut at the token cap)
    ("<answer>x</answer><think>a</think>", False),  # answer before the think block
    ("<think>a</think> so: <answer>x</answer>", False),  # text between the blocks
    ("plan</think><answer>x</answer>", False),  # the reply does not start with <think>
    ("<think>a</think><Answer>x</Answer>", False),  # tags are case-sensitive
    ("", False),
])
def test_format_check_is_azrs_anchored_regex(reply, ok):
    assert format_ok(reply) is ok
    assert isinstance(unwrap(reply), ParseError) is not ok
    assert (FORMAT_RE.match(reply.lstrip()) is not None) is ok


def test_linear_format_check_agrees_with_azrs_regex_on_generated_replies():
    """format_ok is a linear rewrite of AZR's regex (which is quadratic in repeats of "</think><answer>"): the two
    agree on ordinary replies and on replies made of the tags, white space of every kind and text in any order."""
    import random

    rng = random.Random(5)
    pieces = ["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "\t", "\x1c", "\x85", "\xa0", "\u2028",
              "\u3000", "x", "<", ">", "</", "think", "answer", "<think", "</answer", "```output\n3\n```", ""]
    replies = ["<think>" + "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14))) for _ in range(20000)]
    replies += ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 10))) for _ in range(5000)]
    replies += ["<think>" + "</think><answer>" * n + tail for n in (1, 50, 400) for tail in ("", "</answer>", "x")]
    replies += [f"<think>step {i}</think>\n<answer>\n```output\n{i}\n```\n</answer>" for i in range(50)]
    for reply in replies:
        assert format_ok(reply) is (FORMAT_RE.match(reply.lstrip()) is not None), repr(reply)


def test_answer_extraction_takes_the_last_answer_block():
    assert answer_content("<think>a</think><answer>1</answer><answer>2</answer>") == "2"
    assert answer_content("<think>a</think><answer>open to the end") == "open to the end"
    assert answer_content("<think>no answer</think>") == ""
    # a reply that echoes the prompt's example before its own answer is read at its own answer
    assert unwrap("<think>e.g. <answer>9</answer>?</think><answer>3</answer>") == "3"


def _reply(think: str, *blocks: tuple[str, str]) -> str:
    """A hand-written well-formed completion (what the model writes after the prompt's <think>)."""
    body = "\n".join(f"```{tag}\n{text}\n```" for tag, text in blocks)
    return f" {think}\n</think>\n<answer>\n{body}\n</answer>"


PROGRAM = "def f(xs, k):\n    out = sorted(xs)\n    return out[-k:][::-1]"


@pytest.mark.parametrize("task_type", ["code_o", "code_i"])
def test_azr_round_trip_program_input_task(tok, ex, task_type):
    ty = TASK_TYPES[task_type]
    prompt = R1.teacher_prompt(AZR, ty, [identity_task(task_type)])
    ids = r1_prompt_ids(tok, prompt)
    completion = _reply("I sort, slice and reverse.", ("python", PROGRAM), ("input", "[5, 1, 4, 2], 2"))
    # what the engine hands the parser: the prompt's <think> then the generated text (here re-tokenized)
    reply = THINK_OPEN + tok.decode(tok(completion, add_special_tokens=False)["input_ids"])
    assert tok.decode(ids).endswith("Assistant: <think>")
    prop = R1.parse_proposal(AZR, ty, reply)
    assert isinstance(prop, Proposal) and prop.program == PROGRAM and prop.inputs == ["[5, 1, 4, 2], 2"]
    task = ty.validate(prop, ex)
    assert isinstance(task, Task) and task.outputs == ["[5, 4]"]
    student = R1.student_prompt(AZR, ty, task)
    assert PROGRAM in student and r1_prompt(student).endswith("Assistant: <think>")
    good = ("output", "[5, 4]") if task_type == "code_o" else ("input", "[4, 5, 0], 2")
    bad = ("output", "[4, 5]") if task_type == "code_o" else ("input", "[1], 1")
    answers = [R1.parse_answer(ty, THINK_OPEN + _reply("work", good)),
               R1.parse_answer(ty, THINK_OPEN + _reply("work", bad)),
               R1.parse_answer(ty, THINK_OPEN + _reply("work", good).replace("</think>", ""))]
    outcomes = ty.check_many(task, answers, ex)
    assert [o.status for o in outcomes] == ["correct", "wrong", "format_error"]
    assert [student_reward(o) for o in outcomes] == [1.0, -0.5, -1.0]
    # the same blocks outside an answer block are a format error under azr, and fine under short
    bare = f"```python\n{PROGRAM}\n```\n```input\n[1], 1\n```"
    assert isinstance(R1.parse_proposal(AZR, ty, THINK_OPEN + "x</think>" + bare), ParseError)
    assert isinstance(ty.parse_proposal(bare), Proposal)


def test_azr_round_trip_code_f(tok, ex):
    ty = TASK_TYPES["code_f"]
    program = "def f(a, b):\n    return a * 2 + b"
    prompt = R1.teacher_prompt(AZR, ty, [Task("code_o", program, ["1, 2"], ["4"])])
    assert program + "\nf(<|YOUR INPUT WILL BE PLUGGED HERE|>)" in r1_prompt(prompt)
    blocks = [("input", f"{i}, {10 - i}") for i in range(10)] + [("message", "double the first, add the second")]
    prop = R1.parse_proposal(AZR, ty, THINK_OPEN + _reply("pick spread inputs", *blocks), program=program)
    assert isinstance(prop, Proposal) and len(prop.inputs) == 10 and prop.message.startswith("double")
    task = ty.validate(prop, ex)
    assert isinstance(task, Task) and task.outputs[:3] == ["10", "11", "12"]
    student = R1.student_prompt(AZR, ty, task)
    assert "```input_4\n4, 6\n```\n```output_4\n14\n```" in student and "5, 5" not in student
    answers = [R1.parse_answer(ty, THINK_OPEN + _reply("a*2+b", ("python", "def f(x, y):\n    return 2 * x + y"))),
               R1.parse_answer(ty, THINK_OPEN + _reply("a+b", ("python", "def f(x, y):\n    return x + y"))),
               R1.parse_answer(ty, THINK_OPEN + "no think close <answer>```python\ndef f(x, y):\n    return 0\n```")]
    assert [o.status for o in ty.check_many(task, answers, ex)] == ["correct", "wrong", "format_error"]


def test_both_readings_of_azrs_teacher_penalties():
    t = identity_task("code_o")

    def pays(reading: str) -> dict[str, float]:
        return {"format": teacher_reward(ParseError("x"), reading=reading),
                "invalid": teacher_reward(Invalid("x"), reading=reading),
                "never": teacher_reward(t, 0.0, "learnability", reading),
                "always": teacher_reward(t, 1.0, "learnability", reading),
                "learnable": teacher_reward(t, 0.25, "learnability", reading),
                "adv_always": teacher_reward(t, 1.0, "adversarial", reading)}

    paper, code = pays("azr_paper"), pays("azr_code")
    assert paper == {"format": -1.0, "invalid": -0.5, "never": 0.0, "always": 0.0, "learnable": 0.75,
                     "adv_always": 0.0}
    assert code == {"format": -1.0, "invalid": -1.0, "never": -0.5, "always": -0.5, "learnable": 0.75,
                    "adv_always": -0.5}
    assert teacher_reward(t, 0.0, "adversarial", "azr_code") == 1.0
    assert teacher_reward(t, 0.25) == teacher_reward(t, 0.25, "adversarial", "azr_paper")  # the default reading
    with pytest.raises(ValueError, match="azr_paper | azr_code"):
        teacher_reward(t, 0.5, reading="paper")
    # the student's rewards are the same in both readings (they take no reading)
    assert [student_reward(Outcome(s)) for s in ("correct", "wrong", "format_error")] == [1.0, -0.5, -1.0]


def test_stage_reward_applies_the_configured_reading():
    from lorapop.engine.base import Completion
    from lorapop.records.members import Member
    from lorapop.train import stages

    teacher, student = Member("t0", 0, "teacher"), Member("s0", 1, "student")
    task = identity_task("code_o")
    c = Completion([1], [2], "x", "eos")
    proposals = [stages.Rollout(teacher, "teacher", "code_o", [1], c, status="valid", task=task, result=task),
                 stages.Rollout(teacher, "teacher", "code_o", [1], c, status="invalid", result=Invalid("no_f"))]
    solved = tuple(stages.Rollout(student, "student", "code_o", [1], c, task=task, status="correct")
                   for _ in range(2))
    jobs = [stages.SolveJob(task, "code_o", student, teacher, solved)]
    for reading, want in (("azr_paper", [0.0, -0.5]), ("azr_code", [-0.5, -1.0])):
        got, _ = stages.reward(proposals, jobs, "learnability", reading)
        assert [r.reward for r in got] == want, reading


def test_azr_format_refuses_the_small_model_layouts():
    with pytest.raises(ConfigError, match="selfplay.response_prefill: must be false with selfplay.prompt_format"):
        load_config(None, ["--selfplay.prompt_format=azr", "--selfplay.response_prefill=true"])
    with pytest.raises(ConfigError, match="selfplay.proposal_style: must be azr"):
        load_config(None, ["--selfplay.prompt_format=azr", "--selfplay.proposal_style=input_first"])
    with pytest.raises(ConfigError, match="selfplay.reward_reading"):
        load_config(None, ["--selfplay.reward_reading=paper"])
    cfg = load_config(None, [])
    assert (cfg.selfplay.prompt_format, cfg.selfplay.reward_reading) == ("short", "azr_paper")


@pytest.mark.parametrize("name", GPU_CONFIGS + CPU_CONFIGS)
def test_the_7b_configs_run_azrs_format_and_the_cpu_configs_the_short_one(name):
    path = CONFIGS / f"{name}.yaml"
    sp = load_config(str(path)).selfplay
    gpu = name in GPU_CONFIGS
    assert sp.prompt_format == ("azr" if gpu else "short")
    assert sp.reward_reading == ("azr_code" if gpu else "azr_paper")
    if gpu:
        header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
        assert "paper's setting" not in header  # no value is called the paper's that it does not state
        assert all(tag in header for tag in ("[paper]", "[AZR code]", "[chosen]"))
        raw = yaml.safe_load(path.read_text())
        assert raw["run"]["steps"] == 200


def test_the_plan_assumes_azrs_longest_prompt_under_the_azr_format():
    from lorapop.plan import AZR_PROMPT_TOKENS, DEFAULT_PROMPT_TOKENS, default_prompt_tokens

    assert default_prompt_tokens(load_config(str(CONFIGS / "4T+4S.yaml"))) == AZR_PROMPT_TOKENS == 6144
    assert default_prompt_tokens(load_config(str(CONFIGS / "cpu_demo.yaml"))) == DEFAULT_PROMPT_TOKENS


def test_stages_read_azr_replies_from_the_think_block(ex):
    """stages.validate under prompt_format azr: the rollout's reply is the prompt's <think> plus the completion; a
    well-formed one becomes a task in the buffer, one without </think> is a format error paid -1."""
    from lorapop.config import SelfPlayConfig
    from lorapop.engine.base import Completion
    from lorapop.records.members import Member
    from lorapop.tasks.buffer import TaskBuffer
    from lorapop.tasks.formats import prompt_format
    from lorapop.train import stages

    sp = SelfPlayConfig(task_types=["code_o"], prompt_format="azr", reward_reading="azr_code")
    sp.validate()
    t0 = Member("t0", 0, "teacher")
    good = _reply("plan", ("python", PROGRAM), ("input", "[3, 9, 1], 1"))
    rollouts = [stages.Rollout(t0, "teacher", "code_o", [1], Completion([1], [2], text, "eos"),
                               prefill=prompt_format(sp.prompt_format).reply_start(""))
                for text in (good, good.replace("</think>", ""))]
    assert rollouts[0].reply.startswith("<think> plan")
    buffers = {"code_o": TaskBuffer("code_o")}
    ctx = stages.StepContext(1, 0, None, ex, sp, buffers)
    got = stages.validate(ctx, rollouts)
    assert [r.status for r in got] == ["valid", "format_error"] and got[0].task.outputs == ["[9]"]
    assert got[1].detail == "no_think_answer" and len(buffers["code_o"]) == 2
    paid, _ = stages.reward(got[1:], [], sp.teacher_reward, sp.reward_reading)
    assert paid[0].reward == -1.0


def test_prompts_stay_inside_the_run_caches_budget(ex):
    """engine.max_model_len less the reply budget bounds every prompt, since the run's KV cache is sized once from
    it: a proposer prompt over the budget drops reference snippets (last first) until it fits, and a proposal whose
    student prompt would be over it is invalid (too_long) and never enters the buffer."""
    from types import SimpleNamespace

    from style_fixtures import ReplayEngine, tokenizer

    from lorapop.config import SelfPlayConfig
    from lorapop.engine.base import Completion
    from lorapop.records.members import Member
    from lorapop.tasks.buffer import TaskBuffer
    from lorapop.tasks.formats import prompt_format
    from lorapop.train import stages

    sp = SelfPlayConfig(task_types=["code_o"], tasks_per_type=2, n_solve=1, n_references=3, prompt_format="azr")
    sp.validate()
    buffers = {"code_o": TaskBuffer("code_o")}
    for k in range(3):
        task = identity_task("code_o")
        task.program = f"def f(x):\n    pad = '{'padding ' * 40}{k}'\n    return x"
        buffers["code_o"].add(task)
    engine = ReplayEngine(tokenizer())
    t0 = Member("t0", 0, "teacher")
    whole = stages.propose(stages.StepContext(1, 0, engine, ex, sp, buffers), [t0])
    assert [tokenizer().decode(r.prompt_ids).count("<snippet_") for r in whole] == [3, 3]
    budget = max(len(r.prompt_ids) for r in whole) - 1
    engine.cfg = SimpleNamespace(max_model_len=sp.propose.max_new_tokens + budget)
    cut = stages.propose(stages.StepContext(1, 0, engine, ex, sp, buffers), [t0])
    assert len(cut) == 2 and all(len(r.prompt_ids) <= budget for r in cut)  # every proposal kept, inside the budget
    assert min(tokenizer().decode(r.prompt_ids).count("<snippet_") for r in cut) in (1, 2)

    good = _reply("plan", ("python", PROGRAM), ("input", "[3, 9, 1], 1"))
    proposal = stages.Rollout(t0, "teacher", "code_o", [1], Completion([1], [2], good, "eos"),
                              prefill=prompt_format(sp.prompt_format).reply_start(""))
    engine.cfg = SimpleNamespace(max_model_len=0)
    (ok,) = stages.validate(stages.StepContext(1, 0, engine, ex, sp, buffers), [proposal])
    from lorapop.tasks.styles import proposal_style

    student = stages._student_prompt_tokens(stages.StepContext(1, 0, engine, ex, sp, buffers), R1,
                                            proposal_style(sp.proposal_style), "code_o", ok.task)
    held = len(buffers["code_o"])
    engine.cfg = SimpleNamespace(max_model_len=sp.solve.max_new_tokens + student - 1)
    (refused,) = stages.validate(stages.StepContext(1, 0, engine, ex, sp, buffers), [proposal])
    assert ok.status == "valid" and refused.status == "invalid" and refused.detail == "too_long"
    assert len(buffers["code_o"]) == held  # the refused task never enters the buffer


def test_a_code_f_teacher_whose_reference_was_dropped_is_parsed_with_the_program_it_was_shown(ex):
    """A buffer program too long for the code_f proposer prompt is dropped to fit the budget; the prompt then shows
    the identity program, and the rollout records that program, so the teacher's reply is parsed against what it
    saw (recording none made every reply a format error, because of another teacher's long task)."""
    from types import SimpleNamespace

    from style_fixtures import ReplayEngine, tokenizer

    from lorapop.config import SelfPlayConfig
    from lorapop.records.members import Member
    from lorapop.tasks.buffer import IDENTITY_PROGRAM, TaskBuffer
    from lorapop.train import stages

    sp = SelfPlayConfig(task_types=["code_f"], tasks_per_type=1, n_solve=1, prompt_format="azr")
    sp.validate()
    long = identity_task("code_o")
    long.program = f"def f(x):\n    pad = '{'padding ' * 400}'\n    return x"
    buffers = {"code_o": TaskBuffer("code_o", seed_identity=False), "code_f": TaskBuffer("code_f")}
    buffers["code_o"].add(long)
    engine = ReplayEngine(tokenizer())
    t0 = Member("t0", 0, "teacher")
    (whole,) = stages.propose(stages.StepContext(1, 0, engine, ex, sp, buffers), [t0])
    assert whole.source_program == long.program
    engine.cfg = SimpleNamespace(max_model_len=sp.propose.max_new_tokens + len(whole.prompt_ids) - 1)
    (cut,) = stages.propose(stages.StepContext(1, 0, engine, ex, sp, buffers), [t0])
    assert "padding" not in tokenizer().decode(cut.prompt_ids) and cut.source_program == IDENTITY_PROGRAM


@pytest.mark.slow
def test_the_engine_generates_after_assistant_think(ex, embedded_model):
    """Proposals and answers through the real engine under prompt_format azr: plain-text R1 prompts, replies read
    from <think>, and too short a reply to close its blocks is a format error by AZR's check."""
    from lorapop.config import SelfPlayConfig
    from lorapop.engine import EngineConfig, TorchEngine
    from lorapop.records.members import Member
    from lorapop.tasks.buffer import TaskBuffer
    from lorapop.train import stages

    model, tok = embedded_model
    engine = TorchEngine(model, tok, 1, EngineConfig(device="cpu", gen_batch_size=8), seed=0)
    try:  # the model is the session's shared fixture: leave it without LoRA layers
        sp = SelfPlayConfig(task_types=["code_o"], tasks_per_type=2, n_solve=2, n_references=1, prompt_format="azr")
        sp.propose.max_new_tokens = sp.solve.max_new_tokens = 6  # fewer than </think><answer></answer> takes
        sp.validate()
        ctx = stages.StepContext(1, 0, engine, ex, sp, {"code_o": TaskBuffer("code_o")})
        props = stages.validate(ctx, stages.propose(ctx, [Member("t0", 0, "teacher")]))
        (job,) = stages.solve(ctx, [stages.SolveJob(identity_task("code_o"), "code_o", Member("s0", 0, "student"),
                                                     None)])
        for r in props + list(job.rollouts):
            text = tok.decode(r.prompt_ids)
            assert text.startswith(AZR_PREAMBLE + " User: ") and text.endswith("\nAssistant: <think>")
            assert "<|im_start|>" not in text and r.prefill == THINK_OPEN and r.reply.startswith(THINK_OPEN)
            assert r.status == "format_error" and r.detail == "no_think_answer"
        assert "<snippet_0>" in tok.decode(props[0].prompt_ids)
        assert "# Task: Deduce the Output" in tok.decode(job.rollouts[0].prompt_ids)
    finally:
        engine.close()


def test_single_yaml_is_the_7b_populations_compare_twin():
    """The 7B baseline a reader runs by hand (single.yaml) is what `lorapop compare 4T+4S` trains beside the
    population: same format, budgets, rewards' reading, seeds and engine; only the population, the teacher reward
    (AZR's learnability) and PBT differ."""
    from lorapop.commands.compare import compare_configs
    from lorapop.configlib import to_dict

    single = to_dict(load_config(str(CONFIGS / "single.yaml")))
    derived = to_dict(compare_configs("4T+4S", [], "x", "out")[1])
    for d in (single, derived):
        d.pop("evolve")
        d["run"].pop("name"), d["run"].pop("output_dir")
        d["population"] = d["population"]["mode"]
    assert single == derived
    assert single["selfplay"]["prompt_format"] == "azr" and single["selfplay"]["teacher_reward"] == "learnability"
