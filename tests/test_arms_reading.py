"""bench/arms.py's reading of saved tasks: the shape of each proposed selection and the counts per window that
docs/RESULTS.md cites (fabricated tasks.jsonl rows, so every count is known)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_arms_reading", ROOT / "bench" / "arms.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_shapes():
    shape = _bench().shape_of
    cases = {"nums": "copy", "7": "copy", "nums[0]": "index", "nums[-1]": "index", "max(nums)": "aggregate",
             "len(nums)": "aggregate", "sorted(nums)[1]": "sorted_or_slice", "max(nums[1:])": "sorted_or_slice",
             "nums[0] if nums[0] > 4 else nums[1]": "conditional", "nums[0] + max(nums)": "arithmetic",
             "nums[len(nums) // 2]": "arithmetic", "nums[nums[0]]": "other"}
    for expr, want in cases.items():
        assert shape(f"def f(nums):\n    return {expr}") == want, expr
    assert shape("def f(nums) return") == "unparsable"


def test_reading_counts_per_window(tmp_path):
    def task(step, expr, inp, type_, answers):
        return {"step": step, "type": type_, "program": f"def f(nums):\n    return {expr}", "inputs": [inp],
                "outputs": ["x"], "answers": [{"text": t, "status": s} for t, s in answers]}

    rows = [task(1, "max(nums)", "[3, 5]", "code_o", [("```output\n3\n```", "wrong"), ("```output\n5\n```",
                                                                                     "correct")]),
            task(2, "nums[0] + 1", "[4, 1, 2]", "code_i", [("```input\n[1", "format_error")]),
            task(3, "max(nums)", "[1, 2]", "code_o", [("```output\n7\n```", "wrong")]),
            task(9, "sorted(nums)[1]", "[9, 8, 7]", "code_o", [("```output\n9\n```", "wrong")])]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = _bench().reading(tmp_path)
    first, last = r["first_third"], r["last_third"]
    assert first["steps"] == [1, 3] and last["steps"] == [7, 9]
    assert first["tasks"] == 3 and first["by_type"] == {"code_o": 2, "code_i": 1}
    assert first["shapes"] == {"aggregate": 2, "arithmetic": 1} and first["list_lengths"] == {"2": 2, "3": 1}
    assert first["level1_copies"] == 2 and first["distinct_programs"] == 2
    assert first["answers"] == {"code_o": {"wrong": 2, "correct": 1}, "code_i": {"format_error": 1}}
    assert first["code_o_wrong_first_element"] == [1, 2]  # "3" for [3, 5]; "7" is not 1
    assert last["shapes"] == {"sorted_or_slice": 1} and last["code_o_wrong_first_element"] == [1, 1]
