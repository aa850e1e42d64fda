"""The documents say what the code does: help generated from the code, and README, USAGE and the
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


# --- every figure in the README has a dated source in docs/RESULTS.md ---------------------------------------------
#
# A *figure* is a measured quantity as the README's prose writes it: a number with a decimal point (0.116), a
# percentage (95-99%), or a number with a unit of time, memory, throughput or ratio (26.2 GiB, 18649 tok/s, 3 h,
# 0.985x; "4 x 2", a product, is not a ratio). Ranges (0.02-0.11) count as their two ends. Its source is a line of a
# paragraph or table in a dated section of RESULTS (a heading to the next, with a date in it) holding each of its
# numbers and, for a unit other than x, the unit. Not figures: bare integers (counts and settings such as
# "2 steps", "64 proposals", "rank 16", which the configs table test checks against the YAMLs), anything inside code
# (fenced blocks, `inline code`, link targets), dates, and version numbers and names (torch 2.13.0, Python >= 3.11,
# Qwen2.5-Coder-7B, SmolLM2-135M, 0.5-1.5B): a number glued to a letter, or followed by a second dot, is a name.
# SETTINGS lists the few unit-bearing settings that are hardware or configuration, not measurements.
UNIT = r"%|s|min|h|ms|GiB|GB|MB|tok/s"
NUM = r"\d+(?:\.\d+)?"
FIGURE = re.compile(rf"(?<![\w.\-/+=<>])({NUM})(?:-({NUM}))?(?:(x)\b|\s?({UNIT})(?!\w))?(?![\w.]*\d)(?![\w+]|-\d)")
SETTINGS = {"80 GB": "the GPU size the 7B configs target (a setting, not a measurement)",
            "3.11": "Python >= 3.11, a requirement"}
DATE = re.compile(r"2026-\d\d-\d\d")


def prose(text: str) -> str:
    """The README without code blocks, inline code, link targets and image lines."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced and not line.startswith("!["):
            out.append(line)
    text = "\n".join(out)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"`[^`]*`", "", text)
    return DATE.sub("", text)


def figures(text: str) -> list[tuple[str, list[str], str | None]]:
    """``(figure as written, [its numbers], its unit)`` for each figure in ``text`` (the rule above)."""
    out = []
    for m in FIGURE.finditer(prose(text)):
        lo, hi, ratio, unit = m.groups()
        written = m.group(0).strip()
        if written in SETTINGS or lo in SETTINGS:
            continue
        if ratio or unit or "." in lo or (hi and "." in hi):
            out.append((written, [n for n in (lo, hi) if n], unit))
    return out


def dated_sections(text: str) -> list[str]:
    """docs/RESULTS.md cut at its headings, keeping the sections that carry a date."""
    parts = re.split(r"(?m)^#{2,4} ", text)
    return [p for p in parts if DATE.search(p)]


def test_the_figure_rule_reads_figures_and_skips_names():
    got = figures("decodes 18649 tok/s, 0.116 to 0.221, 95-99% of tasks, 0.985x, about 3 h, peak 26.2 GiB; "
                  "torch 2.13.0, Python >= 3.11, Qwen2.5-Coder-7B, SmolLM2-135M, a 0.5-1.5B model, 2 steps, "
                  "rank 16, `0.42` in code, on 2026-11-25, one 80 GB GPU")
    assert got == [("18649 tok/s", ["18649"], "tok/s"), ("0.116", ["0.116"], None), ("0.221", ["0.221"], None),
                   ("95-99%", ["95", "99"], "%"), ("0.985x", ["0.985"], None), ("3 h", ["3"], "h"),
                   ("26.2 GiB", ["26.2"], "GiB")]
    assert figures("4 x 2 rows, 64 x 8") == []


def test_every_readme_figure_appears_in_a_dated_section_of_results():
    sections = dated_sections((REPO / "docs" / "RESULTS.md").read_text())
    paragraphs = [par for s in sections for par in re.split(r"\n\s*\n", s)]
    missing = []
    for written, numbers, unit in figures((REPO / "README.md").read_text()):
        pats = [re.compile(rf"(?<![\d.]){re.escape(n)}(?![\d]|\.\d)") for n in numbers]
        if unit:
            pats.append(re.compile(rf"(?<![A-Za-z]){re.escape(unit)}(?![A-Za-z])"))
        if not any(all(p.search(par) for p in pats) for par in paragraphs):
            missing.append(written)
    assert not missing, f"README figures with no dated source in docs/RESULTS.md: {missing}"


# --- README, USAGE and the 7B headers against the configs ------------------------------------------------------------


def _config(name: str):
    return load_config(str(REPO / "lorapop" / "configs" / f"{name}.yaml"), [])


def _engine(cfg) -> str:
    return "torch, compiled" if cfg.engine.backend == "torch" and cfg.engine.compile else cfg.engine.backend


def test_readme_configs_table_gives_each_configs_steps_engine_and_budgets():
    text = (REPO / "README.md").read_text()
    table = text[text.index("| config | what it is | steps | engine |"):]
    table = table[:table.index("\n\n")].splitlines()[2:]
    seen = []
    for row in table:
        cells = [c.strip() for c in row.strip("|").split("|")]
        names, steps, engine, tokens, amounts = re.findall(r"`([^`]+)`", cells[0]), *cells[2:]
        for name in names:
            cfg, sp = _config(name), _config(name).selfplay
            assert steps == str(cfg.run.steps), (name, steps)
            assert engine.split(" (")[0] == _engine(cfg), (name, engine)
            assert tokens == f"{sp.propose.max_new_tokens} / {sp.solve.max_new_tokens}", (name, tokens)
            assert amounts == f"{sp.tasks_per_type} x {sp.n_solve}", (name, amounts)
            seen.append(name)
    assert sorted(seen) == CONFIGS  # every shipped config has a row


SEVEN_B = ["1T+1S", "4T+4S", "8T+8S", "single"]


def test_usage_and_readme_say_what_the_7b_configs_are():
    usage = " ".join((REPO / "docs" / "USAGE.md").read_text().split())
    readme = " ".join((REPO / "README.md").read_text().split())
    for name in SEVEN_B:
        cfg = _config(name)
        sp = cfg.selfplay
        assert cfg.engine.backend == "torch" and cfg.engine.compile, name
        assert (f"{sp.propose.max_new_tokens}-token proposals and answers, {sp.tasks_per_type} proposals per type, "
                f"{sp.n_solve} solves per task, {cfg.run.steps} steps") in usage
        assert "through the torch engine, compiled (`engine.backend: torch`, `engine.compile: true`)" in usage
        assert f"`{cfg.engine.backend}` (every shipped config)" in usage
        assert "The 7B configs generate on lorapop's torch engine, compiled (`engine.backend: torch`)" in readme
        assert f"{cfg.run.steps} steps, in runs/4T+4S" in readme and f"{cfg.run.steps} steps each" in readme
    listed = re.search(r"The shipped 7B configs \(([^)]*)\) run Qwen2.5-Coder-7B", usage).group(1)
    assert sorted(listed.replace("`", "").split(", ")) == sorted(SEVEN_B)
    assert sorted(n for n in CONFIGS if _config(n).model.name == "Qwen/Qwen2.5-Coder-7B") == sorted(SEVEN_B)
    for doc in (usage, readme):  # vLLM is one flag away and said to be not yet run on a GPU
        assert "--engine.backend=vllm" in doc and "not yet run on a GPU" in doc


def test_7b_headers_memory_figures_are_the_plans_recorded_in_results():
    """Each 7B YAML's header quotes `lorapop plan` for both backends; RESULTS' dated table records the same."""
    results = (REPO / "docs" / "RESULTS.md").read_text()
    section = results[results.index("## The 7B configs' engine and memory plans"):]
    assert DATE.search(section[:400])
    for name in SEVEN_B:
        header = " ".join(ln.lstrip("# ") for ln in (REPO / "lorapop" / "configs" / f"{name}.yaml").read_text()
                          .splitlines() if ln.startswith("#"))
        m = re.search(r"peak ([\d.]+) GiB generating, ([\d.]+) GiB updating; vLLM at its ([\d.]+) share: ([\d.]+) / "
                      r"([\d.]+) GiB \(fits at ([\d.]+) to ([\d.]+)\)", header)
        assert m, name
        tg, tu, share, vg, vu, lo, hi = m.groups()
        assert float(share) == _config(name).engine.vllm_gpu_memory_utilization
        assert f"| {name} | {tg} | {tu} | {vg} | {vu} | {lo} to {hi} |" in section, name


def test_code_and_docs_cite_no_issue_numbers_or_session_dates():
    """A reader of the repository cannot open an issue tracker's thread: code, configs, scripts, tests and docs give
    the reason itself, never "issue N", and no comment dates itself ("before 2026-11"). History belongs in git;
    measurements carry their dates in docs/RESULTS.md and in the config headers that quote them."""
    issue = re.compile(r"\b[Ii]ssues? #?[0-9]+|\bissue-[0-9]+")
    dated = re.compile(r"\b(?:before|since|until|after) 20[0-9]{2}-[0-9]{2}")
    roots = ["lorapop", "bench", "scripts", "tests", ".ci", "docs"]
    files = [REPO / "README.md"] + [p for r in roots for p in (REPO / r).rglob("*")
                                    if p.suffix in {".py", ".md", ".yaml", ".sh", ""} and p.is_file()
                                    and "data" not in p.relative_to(REPO).parts[:2] and p != Path(__file__)]
    found = [f"{p.relative_to(REPO)}:{n}" for p in files
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             if issue.search(line) or (p.suffix != ".md" and dated.search(line))]
    assert not found, found
