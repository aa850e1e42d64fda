"""`lorapop train [CONFIG] [--section.key=value ...] | lorapop train --resume RUN_DIR`: the config (a new run's,
a resumed run's own, or one to start again a run killed before its config was written), the run directory checked
and prepared before anything heavy loads, then the Trainer (lorapop/train/loop.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorapop import faults
from lorapop.configlib import ConfigError

if TYPE_CHECKING:
    from lorapop.config import Config


def shipped_configs() -> list[str]:
    """The names of the configs in lorapop/configs/, read from the directory (so --help lists what ships)."""
    return sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def add_arguments(tr: argparse.ArgumentParser) -> None:
    tr.add_argument("config", nargs="?", help=f"YAML file or shipped config name ({', '.join(shipped_configs())})")
    tr.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last complete checkpoint")
    tr.add_argument("--help-config", action="store_true", help="list every config field (type, default, meaning)")


def help_config() -> str:
    """Every config field with its default as a run gets it: a section's default instance (Config's engine is
    EngineConfig(dtype="auto")), and where validation resolves a value (selfplay.teacher_reward: auto) what it
    resolves to."""
    from lorapop.config import Config, load_config
    from lorapop.configlib import describe

    return "\n".join(describe(Config, obj=Config(), loaded=load_config(None, [])))


def run_config(args: argparse.Namespace) -> "Config":
    """The config ``lorapop train`` runs: the resumed run's own (``--resume`` with a config.yaml), the given one
    named after a directory that has none, or a new run's."""
    from lorapop.config import load_config, resolve_config_path
    from lorapop.configlib import to_dict
    from lorapop.train.loop import check_compatible

    if args.resume and (Path(args.resume) / "config.yaml").is_file():
        cfg = load_run_config(Path(args.resume), args.overrides)
        if args.config:  # a config given beside --resume must describe the same run
            check_compatible(load_config(resolve_config_path(args.config), []), to_dict(cfg))
        return cfg
    if args.resume:  # killed before its config was written (older versions wrote it late): start it again
        return restart_config(Path(args.resume), resolve_config_path(args.config) if args.config else None,
                              args.overrides)
    return load_config(resolve_config_path(args.config) if args.config else None, args.overrides)


def run(args: argparse.Namespace) -> int:
    from lorapop.engine.vllm_engine import VLLMUnavailable, vllm_missing  # light: vllm itself loads on use

    if args.help_config:
        print(help_config())
        return 0
    try:
        cfg = run_config(args)
        if cfg.engine.backend == "vllm":  # before the run directory exists: one clear error, nothing left behind
            missing = vllm_missing()
            if missing:
                raise VLLMUnavailable(f"engine.backend vllm: {missing}; or set --engine.backend=torch")
        run_dir, resume = prepare_run_dir(cfg, resume=bool(args.resume))
    except (ConfigError, FileNotFoundError, VLLMUnavailable) as e:
        print(f"lorapop train: {e}", file=sys.stderr)
        return 2
    from lorapop.executor.base import IsolationError
    from lorapop.records import RunDirError
    from lorapop.train.loop import Trainer

    try:
        with Trainer(cfg, run_dir, resume=resume) as trainer:
            trainer.run()
    except IsolationError as e:  # before any step: says what is missing and names executor.allow_unisolated
        print(f"lorapop train: {e}", file=sys.stderr)
        return 2
    except RunDirError as e:  # e.g. a full disk at checkpoint time: the message says what is intact and what to do
        print(f"lorapop train: {e}", file=sys.stderr)
        return 1
    print(f"run finished: {run_dir}")
    return 0


def prepare_run_dir(cfg: "Config", resume: bool, note: Any = print) -> tuple[Path, bool]:
    """Check the run directory before anything heavy loads; returns (its path, whether to resume from a checkpoint).

    A directory with a complete checkpoint is resumed (``resume``) or refused. Any other directory holds nothing to
    resume (a run killed before its first checkpoint): it is emptied with a one-line ``note`` and, like a new one,
    created with its resolved config.yaml first, so a kill from here on leaves a directory that ``--resume`` takes.
    """
    from lorapop.config import config_to_yaml, resolve_teacher_reward
    from lorapop.engine.dtype import resolve_dtype, resolve_lora_compute_dtype
    from lorapop.executor.base import resolve_hashseeds
    from lorapop.plan import check_on_cuda
    from lorapop.plan.cpu import check_on_cpu
    from lorapop.records import RunDirError
    from lorapop.records.rundir import RunDir
    from lorapop.train.loop import check_compatible, init_plans

    check_on_cuda(cfg)  # on CUDA: refuse, before any weights load, a config whose update cannot fit the GPU
    check_on_cpu(cfg, note)  # on CPU: warn, before any weights load, when the run's peak exceeds the free memory
    rd = RunDir(Path(cfg.run.output_dir) / cfg.run.name)
    if rd.resumable():
        if not resume:
            raise ConfigError(f"run.name: the run directory {rd.path} already exists; continue it with --resume "
                              f"{rd.path} or choose another --run.name")
        check_compatible(cfg, rd.read_trainer_state(rd.latest_checkpoint())["config"])
        return rd.path, True
    init_plans(cfg)  # a source that cannot work stops the run here, before anything is written or loaded
    # Resolved before config.yaml is written, so the run records (and a resume keeps) the dtype it trained in.
    cfg.engine.dtype = resolve_dtype(cfg.engine.dtype, cfg.engine.device)
    cfg.engine.lora_compute_dtype = resolve_lora_compute_dtype(cfg.engine.lora_compute_dtype, cfg.engine.dtype)
    cfg.selfplay.teacher_reward = resolve_teacher_reward(cfg.population.mode, cfg.selfplay.teacher_reward)
    # the hash seeds too: drawn at random for each run, and a resume judges with the seeds the run judged with
    cfg.executor.hashseeds = resolve_hashseeds(cfg.executor)
    try:
        if not rd.is_empty():
            rd.clear()
            note(f"note: {rd.path} held no complete checkpoint (killed before its first save); starting it again "
                 "from step 0")
        rd.create(config_to_yaml(cfg))
    except RunDirError as e:
        raise ConfigError(f"run.name: {e}") from e
    faults.fault_point("run_dir")
    return rd.path, False



def load_run_config(run_dir: Path, overrides: list[str]) -> "Config":
    """The config of an existing run; only run.steps/run.progress/run.report_to (run.tensorboard)/run.save_interval
    and where it runs (engine.replicas, engine.ray_address, executor.ray*, engine.backend, engine.vllm_*) may be
    overridden on resume. A tracker added to run.report_to on resume gets the run's steps so far first
    (lorapop/train/trackers.py)."""
    from lorapop.config import load_config
    from lorapop.records.rundir import RunDir

    if not RunDir(run_dir).has_config():
        raise ConfigError(f"--resume {run_dir}: not a run directory (no config.yaml)")
    # where a run executes does not change what it computes: a checkpoint resumes on any number of replicas. The
    # generation backend and vLLM's memory knobs may change too (a run moved from one vLLM GPU to torch replicas);
    # the weights and the method are the same, only the sampler's random draws differ from then on.
    allowed = ("--run.steps=", "--run.progress=", "--run.tensorboard=", "--run.report_to=", "--run.save_interval=",
               "--engine.replicas=", "--engine.ray_address=", "--executor.ray=", "--executor.ray_actors=",
               "--engine.backend=", "--engine.vllm_gpu_memory_utilization=", "--engine.vllm_kv_cache_gib=",
               "--engine.vllm_enable_sleep_mode=", "--engine.vllm_enforce_eager=")
    for o in overrides:
        if not o.startswith(allowed):
            raise ConfigError(f"override '{o}': on --resume only run.steps, run.save_interval, run.progress, "
                              "run.report_to, run.tensorboard, engine.replicas, engine.ray_address, executor.ray, "
                              "executor.ray_actors, engine.backend and engine.vllm_* may change")
    cfg = load_config(str(run_dir / "config.yaml"), overrides)
    cfg.run.output_dir, cfg.run.name = str(run_dir.parent), run_dir.name
    return cfg


def restart_config(run_dir: Path, config_path: str | None, overrides: list[str]) -> "Config":
    """The config to start again a directory that has no config.yaml (a run killed while starting, made before the
    config was written first): the config given beside ``--resume``, named after the directory."""
    from lorapop.config import load_config

    if not run_dir.is_dir():
        raise ConfigError(f"--resume {run_dir}: not a run directory (no such directory)")
    if config_path is None:
        raise ConfigError(f"--resume {run_dir}: holds nothing to resume and no config.yaml to start it again from; "
                          f"name its config: lorapop train CONFIG --resume {run_dir}")
    cfg = load_config(config_path, overrides)
    cfg.run.output_dir, cfg.run.name = str(run_dir.parent), run_dir.name
    return cfg
