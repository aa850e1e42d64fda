"""pass@k: the unbiased estimator against enumeration, the refusals, and `lorapop eval --samples` on the real model."""

from __future__ import annotations

import itertools
import json
from fractions import Fraction

import pytest

from lorapop.cli import main
from lorapop.eval.passk import PassKError, mean_pass_at_k, parse_ks, pass_at_k


def brute_force(n: int, c: int, k: int) -> Fraction:
    """The share of the k-subsets of n answers (c correct) that hold a correct one, by listing them all."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


def test_the_estimator_equals_enumeration_over_all_subsets():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                # the product form multiplies at most n factors, each rounded once: n * 2^-53 relative error,
                # far inside 1e-12
                assert pass_at_k(n, c, k) == pytest.approx(float(brute_force(n, c, k)), abs=1e-12), (n, c, k)
    assert pass_at_k(200, 100, 100) == pytest.approx(1.0)  # C(200, 100) overflows a float; the product does not
    assert mean_pass_at_k(4, [0, 1, 4], 2) == pytest.approx((0 + 0.5 + 1) / 3, abs=1e-12)


def test_k_above_the_sample_count_is_refused_with_what_to_change():
    assert parse_ks("10,1,5", 10) == [1, 5, 10] and parse_ks(None, 6) == [1, 5] and parse_ks(None, 1) == [1]
    with pytest.raises(PassKError, match=r"pass@5 needs at least 5 samples per problem, but --samples is 2"):
        parse_ks("1,5", 2)
    for bad in ("0", "1,x", ""):
        if bad:
            with pytest.raises(PassKError):
                parse_ks(bad, 4)
    with pytest.raises(PassKError):
        pass_at_k(3, 4, 1)


def test_the_cli_refuses_k_above_samples_and_k_without_samples_before_loading_anything(capsys):
    assert main(["eval", "--samples", "2", "--k", "1,5", "--benchmarks", "gsm8k"]) == 2
    err = capsys.readouterr().err
    assert "pass@5 needs at least 5 samples per problem, but --samples is 2" in err, err
    assert main(["eval", "--k", "1", "--benchmarks", "gsm8k"]) == 2
    assert "add --samples N" in capsys.readouterr().err
    assert main(["eval", "--samples", "2", "--temperature", "0", "--benchmarks", "gsm8k"]) == 2
    assert "--temperature" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_with_samples_reports_pass_at_k_for_base_and_members(tmp_path, data_dir, capsys):
    import torch

    from lorapop.config import config_to_yaml, load_config
    from lorapop.engine import EngineConfig, TorchEngine
    from lorapop.eval.mathcheck import score_math
    from lorapop.eval.data import load_benchmark
    from lorapop.model import load_base_model
    from lorapop.records.rundir import ADAPTERS, RunDir
    from lorapop.records.members import Member

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, tok = load_base_model("embedded")
        eng = TorchEngine(model, tok, 1, EngineConfig(rank=4, lora_alpha=8, device="cpu"))
        g = torch.Generator().manual_seed(0)
        eng.set_adapter(0, {n: (a, torch.randn(b.shape, generator=g) * 0.02) for n, (a, b) in eng.get_adapter(0).items()})
        rd = RunDir(tmp_path / "run")
        rd.create(config_to_yaml(load_config(None, ["--population.mode=single", "--engine.rank=4",
                                                    "--engine.lora_alpha=8"])))
        with rd.new_checkpoint(1) as ck:
            eng.save_adapter(0, ck / ADAPTERS / "a0")
        rd.write_population(1, [Member("a0", 0, "agent").to_json()], [])
        eng.close()
        out = tmp_path / "eval.json"
        rc = main(["eval", str(rd.path), "--benchmarks", "mbppplus,gsm8k", "--limit", "2", "--samples", "2",
                       "--temperature", "1.0", "--k", "1,2", "--max-new-tokens", "12", "--device", "cpu",
                       "--data-dir", str(data_dir), "--out", str(out), "--keep-text"])
    finally:
        torch.set_num_threads(threads)
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "pass@2" in text and "2 samples per problem" in text
    res = json.loads(out.read_text())
    assert res["greedy"] is False and res["sampling"]["samples"] == 2 and res["sampling"]["k"] == [1, 2]
    member = res["runs"][0]["members"][0]
    gsm = load_benchmark("gsm8k", data_dir=data_dir, limit=2)[0]
    texts = []
    for entry in [res["base"]["benchmarks"][b] for b in ("mbppplus", "gsm8k")] + \
                 [member["benchmarks"][b] for b in ("mbppplus", "gsm8k")]:
        assert entry["n"] == 2 and entry["samples"] == 2 and len(entry["passed"]) == 4
        correct = entry["correct"]
        assert correct == [sum(entry["passed"][0:2]), sum(entry["passed"][2:4])]
        # exact: both are means of two values from {0, 1/2, 1} computed from the same integers
        assert entry["pass@k"]["1"] == entry["pass@1"] == sum(c / 2 for c in correct) / 2
        assert entry["pass@k"]["2"] == sum(c > 0 for c in correct) / 2
        assert [(d["id"], d["sample"]) for d in entry["details"]][:2] == [(entry["details"][0]["id"], 0),
                                                                         (entry["details"][0]["id"], 1)]
        texts += [d["text"] for d in entry["details"]]
    # each gsm8k answer's verdict is the checker's on its recorded text
    for entry in (res["base"]["benchmarks"]["gsm8k"], member["benchmarks"]["gsm8k"]):
        probs = [p for p in gsm for _ in range(2)]
        assert entry["passed"] == [int(score_math(p.gold, d["text"])["pass"]) for p, d in zip(probs, entry["details"])]
    assert len(set(texts)) > len(texts) // 2  # sampled, not four copies of one greedy answer
    pk = res["runs"][0]["population"]["pass@k"]["2"]["students"]["gsm8k"]
    assert pk["n"] == 1 and pk["mean"] == member["pass@2"]["gsm8k"]
    assert res["base"]["pass@k"]["2"]["gsm8k"] == res["base"]["benchmarks"]["gsm8k"]["pass@k"]["2"]

    # the report shows one evaluation table per k, from the run's own eval.json
    from lorapop.report.html import eval_comparison
    from lorapop.records.run_data import load_run

    section = eval_comparison([load_run(rd.path)])
    assert "pass@k in % from 2 samples per problem" in section
    assert section.count("<table") == 2 and ", pass@1</h3>" in section and ", pass@2</h3>" in section
    assert f"{100 * member['pass@2']['gsm8k']:.1f}" in section
