"""Config loading: YAML + overrides, strict one-line errors before any model loads, resolved config saved."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lorapop.config import Config, config_to_yaml, load_config
from lorapop.configlib import ConfigError, describe, doc

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "lorapop" / "configs"


def test_defaults_and_overrides_with_yaml_values(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("population: {n_teachers: 3, n_students: 3}\nselfplay: {n_solve: 4}\n")
    cfg = load_config(str(p), ["--selfplay.n_solve=6", "--engine.lr=3e-4", "--selfplay.task_types=[code_o]",
                               "--selfplay.propose.temperature=0.7"])
    assert cfg.population.n_teachers == 3 and cfg.selfplay.n_solve == 6
    assert cfg.engine.lr == pytest.approx(3e-4) and cfg.selfplay.task_types == ["code_o"]
    assert cfg.selfplay.propose.temperature == 0.7
    assert Config().selfplay.task_types == ["code_o", "code_i", "code_f"]  # defaults are not shared mutables


@pytest.mark.parametrize("path", sorted(SHIPPED.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_config_loads_and_roundtrips(path, tmp_path):
    cfg = load_config(str(path))
    out = tmp_path / "config.yaml"
    out.write_text(config_to_yaml(cfg))
    assert load_config(str(out)) == cfg


@pytest.mark.parametrize("overrides, fragment", [
    (["--selfplay.n_sovle=3"], "unknown config key 'selfplay.n_sovle' (did you mean 'n_solve'?)"),
    (["--selfplay.n_solve=abc"], "selfplay.n_solve: expected int, got str 'abc'"),
    (["--engine.lr=fast"], "engine.lr: expected float"),
    (["--population.n_teachers=0", "--population.n_students=0"], "population.n_teachers: must be at least 1"),
    (["--population.n_teachers=2", "--population.n_students=3", "--population.require_equal=true"],
     "population.n_students: must equal"),
    (["--selfplay.teacher_reward=nice"],
     "selfplay.teacher_reward: expected one of 'auto', 'adversarial', 'learnability'"),
    (["--selfplay.tasks_per_type=1"], "selfplay.tasks_per_type: must be >= 2, got 1: TRR++ normalises rewards"),
    (["--selfplay.task_types=[code_x]"], "selfplay.task_types: allowed values are code_o, code_i, code_f"),
    (["--run.steps=0"], "run.steps: must be >= 1"),
    (["--run.probe_min_age=-1"], "run.probe_min_age: must be >= 0, got -1"),
    (["--selfplay.solve.stop=['```']"], "selfplay.solve.stop: '```' needs selfplay.response_prefill: true"),
    (["--selfplay.response_prefill=true", "--selfplay.propose.stop=['```']"], "every proposal needs two or more"),
    (["--selfplay.solve.stop=['']"], "stop: must be a list of non-empty strings"),
    # trained rollouts are scored over the whole vocabulary at their temperature: a nucleus cut is off-policy
    (["--selfplay.solve.top_p=0.95"], "selfplay.solve.top_p: must be 1.0, got 0.95: solve samples are trained"),
    (["--selfplay.propose.top_p=0.9"], "selfplay.propose.top_p: must be 1.0, got 0.9"),
    (["--engine.entropy_coeff=-0.001"], "engine.entropy_coeff: must be >= 0"),
    (["--engine.weight_decay=-0.01"], "engine.weight_decay: must be >= 0"),
    (["selfplay.n_solve=3"], "expected the form --section.key=value"),
    (["--population=3"], "population: expected a section"),
])
def test_bad_config_gives_one_line_naming_the_field(overrides, fragment):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_unequal_population_allowed_when_not_required():
    cfg = load_config(None, ["--population.n_teachers=2", "--population.n_students=3"])  # PFSP draws with replacement
    assert cfg.population.n_members == 5
    cfg = load_config(None, ["--population.require_equal=true"])  # an old config.yaml's key still loads
    assert cfg.population.require_equal


@pytest.mark.parametrize("mode, asked, resolved, warns", [
    ("single", None, "learnability", False), ("population", None, "adversarial", False),
    ("single", "auto", "learnability", False), ("population", "auto", "adversarial", False),
    ("single", "adversarial", "adversarial", True), ("population", "learnability", "learnability", False),
    ("single", "learnability", "learnability", False), ("population", "adversarial", "adversarial", False),
])
def test_teacher_reward_resolves_per_population_mode_and_warns_when_the_agent_is_not_azr(
        mode, asked, resolved, warns, capsys, tmp_path):
    over = [f"--population.mode={mode}"] + ([f"--selfplay.teacher_reward={asked}"] if asked else [])
    cfg = load_config(None, over)
    assert cfg.selfplay.teacher_reward == resolved
    err = capsys.readouterr().err
    assert ("is not AZR" in err) == warns and err.count("\n") == int(warns)  # one line, only when it applies
    out = tmp_path / "config.yaml"
    out.write_text(config_to_yaml(cfg))  # the saved config records the resolved mode, never 'auto'
    assert yaml.safe_load(out.read_text())["selfplay"]["teacher_reward"] == resolved


@pytest.mark.parametrize("name, resolved", [("single", "learnability"), ("cpu_single", "learnability"),
                                            ("cpu_demo", "adversarial"), ("4T+4S", "adversarial")])
def test_shipped_configs_pay_the_single_agent_as_azr_and_the_population_adversarially(name, resolved, capsys):
    assert load_config(str(SHIPPED / f"{name}.yaml")).selfplay.teacher_reward == resolved
    assert "not AZR" not in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted(SHIPPED.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_configs_sample_trained_rollouts_on_policy_and_the_7b_ones_use_azrs_regularizers(path):
    cfg = load_config(str(path))
    assert cfg.selfplay.propose.top_p == cfg.selfplay.solve.top_p == 1.0
    azr = not path.stem.startswith("cpu_")  # the 7B configs: AZR's entropy bonus and AdamW weight decay
    # cpu_selection (the second dynamics design) takes AZR's entropy bonus, not its weight decay
    entropy = 0.001 if azr or path.stem == "cpu_selection" else 0.0
    assert (cfg.engine.entropy_coeff, cfg.engine.weight_decay) == (entropy, 0.01 if azr else 0.0)


def test_malformed_yaml_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("selfplay: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(p))
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize("key, value, message", [
    ("selfplay.propose.max_new_tokens", 0, "selfplay.propose.max_new_tokens: must be >= 1, got 0"),
    ("selfplay.solve.min_new_tokens", 999, "selfplay.solve.min_new_tokens: must be in [0, max_new_tokens], got 999"),
    ("selfplay.n_solve", 0, "selfplay.n_solve: must be >= 1, got 0"),
    ("engine.replicas", 0, "engine.replicas: must be >= 1, got 0"),
    ("engine.kv_cache", "pages", "engine.kv_cache: 'pages' is not one of auto, paged"),
    ("engine.vllm_gpu_memory_utilization", 1.5, "engine.vllm_gpu_memory_utilization: must be in (0, 1), got 1.5"),
    ("executor.timeout_s", -1, "executor.timeout_s: must be > 0, got -1.0"),
    ("executor.ray_actors", 0, "executor.ray_actors: must be >= 1, got 0"),
    ("evolve.quantile_fraction", 0.75, "evolve.quantile_fraction: must be in (0, 0.5], got 0.75"),
    ("evolve.min_rated_matches", 2.5, "evolve.min_rated_matches: expected int, got float 2.5"),
    ("coverage.n_cells", 0, "coverage.n_cells: must be >= 1, got 0"),
])
def test_a_bad_value_is_one_error_the_same_from_yaml_and_from_an_override(key, value, message, tmp_path):
    """Every section, whichever dataclass declares it, refuses a value out of its field's range with one ConfigError
    naming the dotted field, the value and what is allowed, word for word the same for a YAML file and a flag."""
    *sections, name = key.split(".")
    data: dict = {}
    node = data
    for part in sections:
        node = node.setdefault(part, {})
    node[name] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    errors = []
    for args in ((str(path), []), (None, [f"--{key}={value}"])):
        with pytest.raises(ConfigError) as e:
            load_config(*args)
        errors.append(str(e.value))
    assert errors[0] == errors[1] == message


def test_a_section_built_in_code_is_checked_by_the_same_rule():
    """validate() of a section made in code (the engine factory, PBT, the student loop) applies the fields' declared
    ranges: the same ConfigError as a config file gets."""
    from lorapop.engine.base import EngineConfig
    from lorapop.evolve.config import EvolveConfig
    from lorapop.executor.base import ExecutorConfig
    from lorapop.train.student import StudentLoopConfig

    for cfg, message in ((EngineConfig(replicas=0), "engine.replicas: must be >= 1, got 0"),
                         (EvolveConfig(burn_in_period=-1), "evolve.burn_in_period: must be >= 0, got -1"),
                         (ExecutorConfig(ray_num_cpus=-1.0), "executor.ray_num_cpus: must be >= 0, got -1.0"),
                         (StudentLoopConfig(temperature=0.0), "student.temperature: must be > 0, got 0.0")):
        with pytest.raises(ConfigError) as e:
            cfg.validate()
        assert str(e.value) == message


def test_every_field_is_documented():
    lines = describe(Config)
    assert len(lines) > 30
    undocumented = [ln for ln in lines if ln.rstrip().endswith(":")]
    assert undocumented == []


def _train(args, cwd):
    return subprocess.run([sys.executable, "-m", "lorapop.cli", "train", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args, fragment", [
    (["--selfplay.n_solve=abc"], "selfplay.n_solve: expected int"),
    (["--population.n_teachers=0"], "population.n_teachers: must be at least 1"),
    (["no_such_config"], "neither a file nor a shipped config"),
    (["--resume", "nowhere"], "not a run directory"),
])
def test_cli_rejects_bad_input_before_loading_a_model(args, fragment, tmp_path):
    res = _train(args + ["--run.output_dir=" + str(tmp_path)] if "--resume" not in args else args, tmp_path)
    assert res.returncode == 2
    assert fragment in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not any(tmp_path.rglob("config.yaml"))


def test_cli_refuses_existing_run_dir_without_resume(tmp_path):
    (tmp_path / "x" / "checkpoints" / "step_000001").mkdir(parents=True)
    (tmp_path / "x" / "checkpoints" / "step_000001" / "COMPLETE").write_text("1")  # something to resume
    (tmp_path / "x" / "config.yaml").write_text(yaml.safe_dump({}))
    res = _train(["--run.output_dir=" + str(tmp_path), "--run.name=x"], tmp_path)
    assert res.returncode == 2 and "already exists; continue it with --resume" in res.stderr


def test_eval_flags_are_generated_from_every_eval_config_field():
    import dataclasses

    import argparse

    from lorapop.commands.eval import add_arguments, config_from_args
    from lorapop.eval.runner import EvalConfig

    p = argparse.ArgumentParser()
    add_arguments(p)
    flags = set(p._option_string_actions)
    for f in dataclasses.fields(EvalConfig):
        assert "--" + f.name.replace("_", "-") in flags, f.name
    cfg = config_from_args(p.parse_args(["r1", "--limit", "3", "--data", "gsm8k=x.jsonl", "--no-write-run-files",
                                         "--code-timeout-s", "2.5", "--max-new-tokens", "7"]))
    assert (cfg.limit, cfg.data, cfg.write_run_files, cfg.code_timeout_s) == (3, {"gsm8k": "x.jsonl"}, False, 2.5)
    assert cfg.max_new_tokens_code == cfg.max_new_tokens_math == 7 and cfg.benchmarks == EvalConfig().benchmarks


def test_a_new_dataclass_field_is_a_typed_flag_without_cli_code(capsys):
    import argparse
    from dataclasses import dataclass

    from lorapop.configlib import add_arguments, from_args

    @dataclass
    class C:
        time_limit_factor: float = doc(4.0, "multiplier on the reference time")
        prompt: str | None = doc(None, "prompt template")

    p = argparse.ArgumentParser()
    add_arguments(p, C)
    assert from_args(C, p.parse_args(["--time-limit-factor", "1.5"])) == C(1.5, None)
    with pytest.raises(SystemExit):
        p.parse_args(["--time-limit-factor", "fast"])
    assert "time-limit-factor: expected float, got str 'fast'" in capsys.readouterr().err


def test_unknown_eval_flag_suggests_the_nearest(tmp_path):
    res = subprocess.run([sys.executable, "-m", "lorapop.cli", "eval", "--limt", "3"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "did you mean '--limit'?" in res.stderr
