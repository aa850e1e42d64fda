"""``bench/eval.py --measure-base --results``: a stopped measurement resumes from its per-problem file, and rows
measured under other settings are refused rather than mixed into one figure."""

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("bench_eval", Path(__file__).parents[1] / "bench" / "eval.py")
bench_eval = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_eval)

SETTING = {"template": "azr", "max_new_tokens": 320, "dtype": "bfloat16"}


def _row(i, bench="gsm8k", **over):
    return json.dumps({"benchmark": bench, "id": str(i), "pass": i % 2, "gen_tokens": 10, **SETTING, **over})


def test_done_rows_reads_its_benchmark_and_skips_a_line_cut_by_a_kill(tmp_path, capsys):
    f = tmp_path / "r.jsonl"
    f.write_text("\n".join([_row(0), _row(1), _row(0, bench="mbppplus", template="evalplus"), _row(2)[:25]]) + "\n")
    rows = bench_eval._done_rows(f, "gsm8k", SETTING)
    assert sorted(rows) == ["0", "1"]
    assert rows["1"]["pass"] == 1
    assert "unreadable line skipped" in capsys.readouterr().err
    assert bench_eval._done_rows(tmp_path / "absent.jsonl", "gsm8k", SETTING) == {}
    assert bench_eval._done_rows(None, "gsm8k", SETTING) == {}


@pytest.mark.parametrize("key,value", [("template", "plain"), ("max_new_tokens", 256), ("dtype", "float32")])
def test_done_rows_refuses_rows_measured_under_other_settings(tmp_path, key, value):
    f = tmp_path / "r.jsonl"
    f.write_text(_row(0) + "\n" + _row(1, **{key: value}) + "\n")
    with pytest.raises(SystemExit, match=f"r.jsonl:2: .*{key}"):
        bench_eval._done_rows(f, "gsm8k", SETTING)
