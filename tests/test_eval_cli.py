"""`lorapop eval` end to end with the real embedded model, real PEFT adapter dirs, the real sandbox (tiny limits)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from lorapop.cli import main
from lorapop.eval import load_benchmark
from lorapop.records import RunDirError
from lorapop.records.rundir import RunDir

pytestmark = pytest.mark.slow


def _write_run(root: Path, engine, slots: dict[str, int], roles: dict[str, str], mode: str, step: int = 3) -> Path:
    """A run directory as the trainer writes it (through lorapop.records.rundir), with the engine's adapters."""
    from lorapop.config import config_to_yaml, load_config
    from lorapop.records.rundir import ADAPTERS, RunDir
    from lorapop.records.members import Member

    rd = RunDir(root)
    rd.create(config_to_yaml(load_config(None, [f"--population.mode={mode}", "--engine.rank=4",
                                                "--engine.lora_alpha=8"])))
    with rd.new_checkpoint(step) as tmp:
        for mid, slot in slots.items():
            engine.save_adapter(slot, tmp / ADAPTERS / mid)
    rd.write_population(step, [Member(m, s, roles[m]).to_json() for m, s in slots.items()], [])
    return root


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: on a CPU shared with other jobs, two threads run this model several times slower."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import torch

    from lorapop.engine import EngineConfig, TorchEngine
    from lorapop.model import load_base_model

    model, tok = load_base_model("embedded")  # a private copy: the engine injects layers into it
    eng = TorchEngine(model, tok, 3, EngineConfig(rank=4, lora_alpha=8, device="cpu"))
    g = torch.Generator().manual_seed(0)
    for i in range(3):
        w = eng.get_adapter(i)
        eng.set_adapter(i, {n: (a, torch.randn(b.shape, generator=g) * 0.02) for n, (a, b) in w.items()})
    root = tmp_path_factory.mktemp("runs")
    pop = _write_run(root / "pop", eng, {"t0": 0, "s0": 1}, {"t0": "teacher", "s0": "student"}, "population")
    single = _write_run(root / "single", eng, {"a0": 2}, {"a0": "agent"}, "single")
    (root / "empty" / "checkpoints" / "step_000001").mkdir(parents=True)
    (root / "empty" / "checkpoints" / "step_000001" / "COMPLETE").write_text("1")
    eng.close()
    return {"pop": pop, "single": single, "empty": root / "empty", "root": root}


def test_discovery(runs):
    ck = RunDir(runs["pop"]).find_checkpoint()
    assert ck.name == "step_000003"
    ms = RunDir(runs["pop"]).checkpoint_members(ck)
    assert [(m.id, m.role, m.rank) for m in ms] == [("s0", "student", 4), ("t0", "teacher", 4)]
    with pytest.raises(RunDirError, match="no checkpoint for step 7"):
        RunDir(runs["pop"]).find_checkpoint(7)
    with pytest.raises(RunDirError, match=r"checkpoint has no adapters: .*empty.*step_000001.*adapters"):
        RunDir(runs["empty"]).checkpoint_members(RunDir(runs["empty"]).find_checkpoint())


def test_eval_one_batched_pass_per_benchmark(runs, data_dir, capsys, monkeypatch):
    from lorapop.engine.torch_engine import TorchEngine

    calls = []
    orig = TorchEngine.generate

    def counting(self, prompts, adapter_ids, params=None, seeds=None):
        calls.append(sorted(set(adapter_ids)) + [len(prompts)])
        return orig(self, prompts, adapter_ids, params, seeds)

    monkeypatch.setattr(TorchEngine, "generate", counting)
    out = runs["root"] / "combined.json"
    rc = main(["eval", str(runs["pop"]), str(runs["single"]), "--benchmarks", "mbppplus,gsm8k", "--limit", "2",
                   "--max-new-tokens", "12", "--out", str(out), "--data-dir", str(data_dir), "--device", "cpu",
                   "--keep-text"])
    text = capsys.readouterr().out
    assert rc == 0, text
    # base (-1) and all three members of both runs share one generate call per benchmark
    assert calls == [[-1, 0, 1, 2, 2 * 4], [-1, 0, 1, 2, 2 * 4]]
    res = json.loads(out.read_text())
    assert res["baseline"] == str(runs["single"]) and res["benchmarks"] == ["mbppplus", "gsm8k"]
    pop = next(r for r in res["runs"] if r["run_dir"] == str(runs["pop"]))
    # every recorded verdict agrees with judging the recorded text again, independently of the eval pipeline
    from lorapop.eval.code import extract_solution
    from lorapop.eval.harness import CodeJudge, make_executor
    from lorapop.eval.mathcheck import score_math
    from lorapop.eval.prompts import EVALPLUS_RESPONSE_PREFIX

    probs = {b: load_benchmark(b, data_dir=data_dir, limit=2)[0] for b in ("mbppplus", "gsm8k")}
    ex = make_executor(2)
    try:
        judge = CodeJudge(ex)
        for m in pop["members"]:
            for b in ("mbppplus", "gsm8k"):
                e = m["benchmarks"][b]
                texts = [d["text"] for d in e["details"]]
                if b == "gsm8k":
                    again = [int(score_math(p.gold, t)["pass"]) for p, t in zip(probs[b], texts)]
                else:
                    progs = [extract_solution(EVALPLUS_RESPONSE_PREFIX + "\n```python\n" + t, p.gold["entry_point"])
                             for p, t in zip(probs[b], texts)]
                    again = [int(v["pass"]) for v in judge.judge(probs[b], progs)]
                assert e["passed"] == again and e["n"] == 2 and e["gen_tokens"] > 0, (m["id"], b)
                assert [d["id"] for d in e["details"]] == [p.id for p in probs[b]]
    finally:
        ex.close()
    assert res["templates"]["code"]["name"] == "evalplus" and res["templates"]["math"]["name"] == "azr"
    assert res["prompt_examples"]["gsm8k"].startswith("A conversation between User and Assistant.")
    stats = pop["population"]["all"]["gsm8k"]
    vals = [m["scores"]["gsm8k"] for m in pop["members"]]
    assert (stats["min"], stats["max"], stats["n"]) == (min(vals), max(vals), 2)
    assert pop["population"]["students"]["gsm8k"]["n"] == 1
    assert "aggregate" in res["base"]["scores"] and "aggregate" in text and "mbppplus" in text
    for r in (runs["pop"], runs["single"]):
        one = json.loads((r / "eval.json").read_text())
        assert len(one["runs"]) == 1 and one["runs"][0]["run_dir"] == str(r)


def test_eval_bad_inputs(runs, data_dir, tmp_path, capsys):
    rc = main(["eval", str(runs["pop"]), "--benchmarks", "mbppplus,bogus"])
    assert rc == 2 and "bogus" in capsys.readouterr().err
    rc = main(["eval", str(runs["empty"]), "--benchmarks", "gsm8k", "--limit", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "checkpoint has no adapters" in err and "step_000001" in err
    # a malformed line is skipped with a warning in eval.json; a missing file fails only its benchmark
    lines = (data_dir / "math" / "gsm8k.jsonl").read_text().splitlines()[:2]
    bad = tmp_path / "gsm8k.jsonl"
    bad.write_text(lines[0] + "\n{not json\n" + lines[1] + "\n")
    out = tmp_path / "e.json"
    rc = main(["eval", str(runs["single"]), "--benchmarks", "gsm8k,aime24", "--data", f"gsm8k={bad}",
                   "--data", f"aime24={tmp_path / 'nope.jsonl'}", "--max-new-tokens", "4", "--out", str(out),
                   "--device", "cpu"])
    res = json.loads(out.read_text())
    assert rc == 1  # one benchmark failed, the other ran
    assert res["n_problems"] == {"gsm8k": 2} and "aime24" in res["errors"] and "nope.jsonl" in res["errors"]["aime24"]
    assert any(f"{bad}:2:" in w for w in res["warnings"])


def test_base_only_eval(data_dir, tmp_path, capsys):
    out = tmp_path / "base.json"
    rc = main(["eval", "--benchmarks", "gsm8k", "--limit", "2", "--max-new-tokens", "4", "--out", str(out),
                   "--data-dir", str(data_dir), "--device", "cpu", "--prompt", "plain"])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["runs"] == [] and res["base"]["benchmarks"]["gsm8k"]["n"] == 2
    assert res["templates"] == {"math": {"name": "plain", "instruction": res["templates"]["math"]["instruction"],
                                         "chat_template": True, "system_prompt": None}}
    assert res["prompt_examples"]["gsm8k"].startswith("<|im_start|>user\n") and res["skipped"] == []
    assert "base model only" in capsys.readouterr().out


def test_default_benchmarks_skip_missing_data_in_one_line(tmp_path, capsys):
    # a data dir with one benchmark file: that one runs, the others are named in one line
    (tmp_path / "math").mkdir()
    (tmp_path / "math" / "aime24.jsonl").write_text('{"id": 0, "problem": "What is 1+1?", "answer": "2"}\n')
    out = tmp_path / "e.json"
    t = time.monotonic()
    rc = main(["eval", "--data-dir", str(tmp_path), "--max-new-tokens", "2", "--out", str(out), "--device", "cpu"])
    text = capsys.readouterr().out
    assert rc == 0 and json.loads(out.read_text())["benchmarks"] == ["aime24"]
    skipped = [line for line in text.splitlines() if line.startswith("skipped ")]
    assert len(skipped) == 1 and "humanevalplus" in skipped[0] and "--data NAME=PATH" in skipped[0]
    assert time.monotonic() - t < 120  # no hub retries (they cost ~46 s before)
