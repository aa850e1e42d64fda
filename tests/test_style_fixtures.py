"""Behaviour unchanged: for every shipped config (and the defaults), the prompts the stages render
for a fixed seed and the parse, validity and answer verdicts over the saved tasks of docs/results/ are the ones
recorded in tests/fixtures/styles/ before proposal styles and prompt formats became registered values
(tests/style_fixtures.py says what is recorded and how)."""

from __future__ import annotations

import json

import pytest

from style_fixtures import CASES, fixture_path, load, make_executor, read_fixture, record
from lorapop.configlib import to_dict


def groups() -> dict[str, list[str]]:
    """Configs whose selfplay settings are the same record the same thing (the teacher reward, which follows the
    population mode, plays no part in what is recorded): record each once."""
    out: dict[str, list[str]] = {}
    for case in CASES:
        sp = to_dict(load(case).selfplay)
        sp.pop("teacher_reward")
        key = json.dumps(sp, sort_keys=True)
        out.setdefault(key, []).append(case)
    return out


@pytest.fixture(scope="module")
def executor():
    e = make_executor()
    yield e
    e.close()


@pytest.mark.parametrize("cases", list(groups().values()), ids=lambda c: "+".join(c))
def test_prompts_and_verdicts_match_the_recorded_ones(cases, executor):
    got = record(cases[0], executor)
    for case in cases:
        # a config changed on purpose is recorded again: python tests/style_fixtures.py CASE
        assert fixture_path(case).is_file(), f"no fixture for {case}: run python tests/style_fixtures.py {case}"
        want = read_fixture(case)
        for part in ("teacher_prompts", "student_prompts", "probe_prompts", "proposals", "answers"):
            g, w = got[part], want[part]
            if isinstance(g, dict):  # verdicts by reply: name the replies whose verdict changed
                changed = {k: (g.get(k), w.get(k)) for k in sorted(set(g) | set(w)) if g.get(k) != w.get(k)}
                assert not changed, f"{case}: {part} changed (now, recorded): {list(changed.items())[:5]}"
            assert g == w, f"{case}: {part} changed"
        got_meta = {k: v for k, v in got.items() if k not in ("case",) and not isinstance(v, (list, dict))}
        assert got_meta == {k: want[k] for k in got_meta}, case
