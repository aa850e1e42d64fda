"""The documents say what the code does (issue 51 item 3): help generated from the code, and README, USAGE and the
shipped configs' headers checked against the configs and against docs/RESULTS.md rather than remembered."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from lorapop.cli import main
from lorapop.config import Config, load_config
from lorapop.configlib import field_defaults

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.stem for p in (REPO / "lorapop" / "configs").glob("*.yaml"))


def test_train_help_lists_every_shipped_config(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the help text
    listed = re.search(r"shipped config name \(([^)]*)\)", out).group(1).split(", ")
    assert listed == CONFIGS and "cpu_selection" in listed


def _leaves(cls, obj, loaded, prefix=""):
    """(name, default shown, value load_config yields) per leaf field, through the nested sections."""
    for f, default, value in field_defaults(cls, obj, loaded):
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(default):
            yield from _leaves(type(default), default, value, name + ".")
        else:
            yield name, default, value


def test_help_config_gives_for_every_field_the_default_a_run_loads(capsys):
    """`lorapop train --help-config` against `load_config(None, [])`, field by field. Where validation resolves a
    default (selfplay.teacher_reward: auto), the line shows both, and the resolved one must be what loads."""
    assert main(["train", "--help-config"]) == 0
    lines = {ln.split(" (", 1)[0]: ln for ln in capsys.readouterr().out.splitlines()}
    loaded = load_config(None, [])
    leaves = list(_leaves(Config, Config(), loaded))
    assert len(leaves) == len(lines) > 100
    for name, default, value in leaves:
        shown = repr(default) if default == value else f"{default!r} -> {value!r}"
        assert f", default {shown}): " in lines[name], (name, value, lines[name])
    assert ", default 'auto'): " in lines["engine.dtype"]  # the library's own EngineConfig default is float32
    assert "default 'auto' -> 'adversarial'" in lines["selfplay.teacher_reward"]
