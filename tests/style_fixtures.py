"""What the proposal styles and prompt formats do, recorded per shipped config: the prompts the
stages render for a fixed seed (teacher prompts per task type, student prompts of fixed tasks, the probe's prompts)
and the parse, validity and answer verdicts over a fixed sample of the saved ``tasks.jsonl`` files of
``docs/results/``. ``tests/test_style_fixtures.py`` compares :func:`record` with ``tests/fixtures/styles/``, which
were written by this module before styles and formats became registered values; ``python tests/style_fixtures.py``
rewrites them (only ever on purpose: a change of behaviour is what the test is there to catch).

The stages run for real (stages.propose, validate, solve and the trainer's probe) on the real tokenizer and chat
template and the real sandbox. The engine only replays replies given in advance: generation is not what is
recorded, and replayed text makes the verdicts the same on every processor. The saved tasks become replies in
every layout a style reads (program then input, input then program, the one-block ``x = `` and ``nums = `` layouts,
code_f's inputs and message), each bare and inside AZR's think/answer blocks, so every config reads every layout.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import gzip
import hashlib
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "styles"
RESULTS = REPO / "docs" / "results"
# every shipped config, and the defaults (style azr under the short format, which no shipped config uses)
CASES = ["default"] + sorted(p.stem for p in (REPO / "lorapop" / "configs").glob("*.yaml"))
ROWS_PER_TYPE = 2      # saved tasks per file and task type: the first and the middle one
ANSWERS_PER_ROW = 3    # saved answers per task: the first distinct texts
CODE_F_ROWS = 8        # saved tasks that also become code_f proposals (10 inputs each: the slowest replies)
VARIANT_EVERY = 6     # every this many saved tasks also comes bent (see variants)


@functools.lru_cache(maxsize=1)
def tokenizer():
    from transformers import AutoTokenizer

    from lorapop.model import prepare_model

    return AutoTokenizer.from_pretrained(str(prepare_model("embedded")))


class ReplayEngine:
    """The prompt side of the engine Protocol (the real tokenizer and chat template); ``generate`` records the
    prompts it is given and answers each with the next of ``replies`` (then the empty text)."""

    def __init__(self, tok, replies=()):
        self.tokenizer, self.replies, self.prompts = tok, list(replies), []

    def chat_prompt(self, user_message: str, system: str | None = None) -> list[int]:
        from lorapop.engine.base import chat_prompt_ids

        return chat_prompt_ids(self.tokenizer, user_message, system)

    def generate(self, prompts, adapter_ids, params=None, seeds=None):
        from lorapop.engine.base import Completion

        self.prompts += [list(p) for p in prompts]
        return [Completion(list(p), [], self.replies.pop(0) if self.replies else "", "eos") for p in prompts]


def rendered(ids: list[int]) -> dict:
    """A prompt as its ids' digest and its text (the text alone could hide a tokenisation change)."""
    return {"sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16], "text": tokenizer().decode(ids)}


@functools.lru_cache(maxsize=1)
def saved_rows() -> list[dict]:
    """The fixed sample of saved tasks: per tasks.jsonl file and task type, the first and the middle row."""
    out = []
    for path in sorted(RESULTS.rglob("tasks.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            rows = [json.loads(x) for x in fh if x.strip()]
        for tt in sorted({r["type"] for r in rows}):
            mine = [r for r in rows if r["type"] == tt]
            for i in sorted({0, len(mine) // 2})[:ROWS_PER_TYPE]:
                r = mine[i]
                out.append({"k": len(out), "id": f"{path.parent.relative_to(RESULTS).as_posix()}#{tt}{i}", "type": tt,
                            "program": r["program"], "inputs": r["inputs"], "outputs": r["outputs"],
                            "answers": list(dict.fromkeys(a["text"] for a in r.get("answers", [])))[:ANSWERS_PER_ROW]})
    return out


def think(text: str) -> str:
    return f"<think>\nI write the blocks.\n</think>\n<answer>\n{text}\n</answer>"


def code_f_inputs(first: str) -> list[str]:
    """Ten distinct inputs of the saved input's kind (a list of ints or an int), the saved one first."""
    try:
        kind = type(ast.literal_eval(first))
    except (ValueError, SyntaxError):
        kind = int
    more = [repr([k, (3 * k) % 10]) if kind is list else str(k) for k in range(12)]
    return list(dict.fromkeys([first] + more))[:10]


def variants(row: dict) -> dict[str, tuple[str, str]]:
    """The saved task as written, and (for the first rows) bent the ways the one-block styles refuse: a body of
    two statements, a None output, an input ten times longer (over a short answer budget)."""
    prog, inp = row["program"], row["inputs"][0]
    out = {"": (prog, inp)}
    if row["k"] % VARIANT_EVERY == 0:
        head, _, body = prog.partition("\n")
        out["/two_lines"] = (f"{head}\n    y = 1\n{body}", inp)
        out["/none"] = (f"{head}\n    return None", inp)
        out["/long"] = (prog, repr(ast.literal_eval(inp) * 10) if inp.startswith("[") else inp * 10)
    return out


def proposal_replies(row: dict, task_type: str) -> list[tuple[str, str, str | None]]:
    """(layout, reply, the code_f program) for one saved task and its variants, bare and in AZR's blocks."""
    if task_type == "code_f":
        return _replies(row["program"], row["inputs"][0], task_type, "")
    return [r for tag, (prog, inp) in variants(row).items() for r in _replies(prog, inp, task_type, tag)]


def _replies(prog: str, inp: str, task_type: str, tag: str) -> list[tuple[str, str, str | None]]:
    if task_type == "code_f":
        blocks = "\n".join(f"```input\n{x}\n```" for x in code_f_inputs(inp)) + "\n```message\nlook closely\n```"
        layouts = {"inputs_message": blocks}
    else:
        layouts = {"program_input": f"```python\n{prog}\n```\n```input\n{inp}\n```",
                   "input_program": f"```input\n{inp}\n```\n```python\n{prog}\n```",
                   "x_block": f"```python\nx = {inp}\n{prog}\n```",
                   "nums_block": f"```python\nnums = {inp}\n{prog}\n```"}
    out = []
    for name, text in layouts.items():
        src = prog if task_type == "code_f" else None
        out += [(name + tag, text, src), (f"think/{name}{tag}", think(text), src)]
    return out


def load(case: str):
    from lorapop.config import load_config

    return load_config(None if case == "default" else REPO / "lorapop" / "configs" / f"{case}.yaml", [])


def buffers(cfg):
    """The trainer's own buffers (identity seed, seed files), without the sandbox pass over the seed files."""
    from lorapop.train.loop import Trainer

    return Trainer._make_buffers(SimpleNamespace(cfg=cfg, executor=None), True)


def record(case: str, executor) -> dict:
    from lorapop.engine.base import Completion
    from lorapop.records.members import Member
    from lorapop.tasks import Task
    from lorapop.train import stages
    from lorapop.train.loop import Trainer

    cfg = load(case)
    sp = cfg.selfplay
    # a fixed seed, few prompts per stage: two proposals per type from two references, one answer per task
    small = dataclasses.replace(sp, tasks_per_type=2, n_references=2, n_solve=1)
    teacher, student = Member("t0", 0, "teacher"), Member("s0", 1, "student")
    out: dict = {"case": case, "proposal_style": sp.proposal_style, "prompt_format": sp.prompt_format,
                 "response_prefill": sp.response_prefill, "task_types": list(sp.task_types)}

    engine = ReplayEngine(tokenizer())
    ctx = stages.StepContext(1, 0, engine, executor, small, buffers(cfg))
    out["teacher_prompts"] = [{"type": r.task_type, "prefill": r.prefill, **rendered(r.prompt_ids)}
                              for r in stages.propose(ctx, [teacher])]

    rows = saved_rows()
    fixed = {tt: ctx.buffers[tt].tasks[:2] + [Task(r["type"], r["program"], r["inputs"], r["outputs"])
                                              for r in rows if r["type"] == tt][:1] for tt in sp.task_types}
    jobs = [stages.SolveJob(t, tt, student, None) for tt in sp.task_types for t in fixed[tt]]
    solved = stages.solve(ctx, jobs)
    out["student_prompts"] = [{"type": j.task_type, "program": j.task.program, "prefill": j.rollouts[0].prefill,
                               **rendered(j.rollouts[0].prompt_ids)} for j in solved]
    prefill = {j.task_type: j.rollouts[0].prefill for j in solved}

    probe_cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, probe_per_level=2, probe_samples=1))
    probe_engine, probe_rows = ReplayEngine(tokenizer()), []
    Trainer.probe(SimpleNamespace(cfg=probe_cfg, engine=probe_engine, executor=executor, init_from={},
                                  population=SimpleNamespace(students=[student]),
                                  probe_log=SimpleNamespace(write=lambda *r: probe_rows.extend(r))), 0)
    n = len(probe_engine.prompts) // 2  # the single student is scored twice at step 0: the first scoring
    out["probe_prompts"] = [rendered(p) for p in probe_engine.prompts[:n]]

    # proposals: every layout of every sampled saved task, read and validated as this config does
    props, keys = [], []
    kinds = [t for t in sp.task_types if t != "code_f"]
    for k, row in enumerate(rows):
        types = [row["type"] if row["type"] in kinds else kinds[0]] if kinds else []
        if "code_f" in sp.task_types and k < CODE_F_ROWS:
            types.append("code_f")
        for tt in types:
            for layout, text, src in proposal_replies(row, tt):
                props.append(stages.Rollout(teacher, "teacher", tt, [], Completion([], [], text, "eos"),
                                            source_program=src))
                keys.append(f"{row['id']} {tt} {layout}")
    vctx = stages.StepContext(1, 0, engine, executor, sp, buffers(cfg))
    out["proposals"] = {key: [r.status, r.detail, r.task.outputs if r.task is not None else None]
                        for key, r in zip(keys, stages.validate(vctx, props))}

    # answers: each sampled saved answer, bare and in AZR's blocks, read and checked as this config does
    jobs, replies, keys = [], [], []
    for row in rows:
        if row["type"] not in sp.task_types:
            continue
        task = Task(row["type"], row["program"], row["inputs"], row["outputs"])
        pre = prefill[row["type"]]
        for a, text in enumerate(row["answers"]):
            for variant, reply in (("bare", text), ("think", think(text))):
                jobs.append(stages.SolveJob(task, row["type"], student, None))
                replies.append(reply[len(pre):] if reply.startswith(pre) else reply)
                keys.append(f"{row['id']} a{a} {variant}")
    actx = stages.StepContext(1, 0, ReplayEngine(tokenizer(), replies), executor, small, buffers(cfg))
    out["answers"] = {key: [j.rollouts[0].status, j.rollouts[0].detail]
                      for key, j in zip(keys, stages.solve(actx, jobs))}
    return out


def fixture_path(case: str) -> Path:
    return FIXTURES / f"{case}.json.gz"


def read_fixture(case: str) -> dict:
    with gzip.open(fixture_path(case), "rt", encoding="utf-8") as fh:
        return json.load(fh)


def make_executor():
    # a generous timeout: no recorded program comes near it, and a loaded machine must not turn a verdict into one
    from lorapop.executor.sandbox import SandboxExecutor
    from lorapop.executor.base import ExecutorConfig

    return SandboxExecutor(ExecutorConfig(timeout_s=10.0, require_isolation=os.geteuid() == 0))


def main(cases: list[str]) -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    ex = make_executor()
    try:
        for case in cases or CASES:
            got = record(case, ex)
            # mtime 0: the same record gives the same bytes
            with open(fixture_path(case), "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as fh:
                fh.write(json.dumps(got, indent=1, sort_keys=True).encode())
            print(case, fixture_path(case).stat().st_size, "bytes")
    finally:
        ex.close()


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main(sys.argv[1:])
