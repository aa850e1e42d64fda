"""The training loop: ``Trainer.run`` reads top to bottom as the named stages of SPEC section 3."""

from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from lorapop.config import Config, config_to_yaml
from lorapop.configlib import ConfigError, to_dict
from lorapop.data import resolve_data_file
from lorapop.engine.dtype import resolve_dtype
from lorapop.train import checkpoint as ckpt
from lorapop.train import stages
from lorapop.train.logger import MetricsLogger, Progress
from lorapop.train.matchmaking import matchmake
from lorapop.train.population import Population
from lorapop.train.rating import Ratings

# Config fields a checkpoint must agree on to be resumed: they fix the shapes and meaning of the saved state.
COMPAT_FIELDS = ("model.name", "population.mode", "population.n_teachers", "population.n_students", "engine.rank",
                 "engine.lora_alpha", "engine.target_modules", "selfplay.task_types")


def _get(d: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        d = d[part]
    return d


def check_compatible(cfg: Config, ckpt_cfg: dict) -> None:
    mine = to_dict(cfg)
    for field in COMPAT_FIELDS:
        a, b = _get(mine, field), _get(ckpt_cfg, field)
        if cfg.population.mode == "single" and field.startswith("population.n_"):
            continue
        if a != b:
            raise ConfigError(f"{field}: the checkpoint was made with {b!r}, this config says {a!r}; "
                              "resume with the run's own config.yaml or start a new run")


def prepare_run_dir(cfg: Config, resume: bool) -> Path:
    """Check the run directory before anything heavy loads."""
    run_dir = Path(cfg.run.output_dir) / cfg.run.name
    if resume:  # load_run_config has already checked that config.yaml is there
        latest = ckpt.latest_checkpoint(run_dir / "checkpoints")
        if latest is not None:
            check_compatible(cfg, ckpt.read_trainer_state(latest)["config"])
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(f"run.name: the run directory {run_dir} already exists; continue it with --resume "
                          f"{run_dir} or choose another --run.name")
    return run_dir


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path, *, resume: bool = False, engine: Any = None,
                 executor: Any = None):
        self.cfg, self.run_dir, self.resume = cfg, run_dir, resume
        # Resolved before config.yaml is written, so the run records (and a resume keeps) the dtype it trained in.
        cfg.engine.dtype = resolve_dtype(cfg.engine.dtype, cfg.engine.device)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.population = Population.create(cfg.population.mode, cfg.population.n_teachers,
                                            cfg.population.n_students)
        self.ratings = Ratings(cfg.rating.mu, cfg.rating.sigma, cfg.rating.beta, cfg.rating.tau,
                               cfg.rating.draw_probability)
        for m in self.population.members:
            self.ratings.add(m.id)
        self.step = 0
        self.executor = executor if executor is not None else self._make_executor()
        self.buffers = self._make_buffers(load_seeds=not resume)
        self.coverage = self._make_coverage()
        self.engine = engine if engine is not None else self._make_engine()
        if resume:
            self._restore()
        else:
            (run_dir / "config.yaml").write_text(config_to_yaml(cfg))
        self.logger = MetricsLogger(run_dir, cfg.run.tensorboard, purge_step=self.step + 1 if resume else None)
        self.progress = Progress(cfg.run.progress, cfg.run.steps)

    # ---- construction -------------------------------------------------------------------------------------------
    def _make_engine(self) -> Any:
        from lorapop.engine.torch_engine import TorchEngine

        return TorchEngine.from_config(self.cfg.model.name, self.cfg.population.n_members, self.cfg.engine,
                                       seed=self.cfg.run.seed)

    def _make_executor(self) -> Any:
        from lorapop.executor.sandbox import SandboxExecutor

        return SandboxExecutor(self.cfg.executor)

    def _make_buffers(self, load_seeds: bool) -> dict[str, Any]:
        """Per-type buffers with the identity seed, plus seed files validated in the sandbox (outputs recomputed).
        A file in AZR's code_f layout (``inputs``/``outputs``/``message``) seeds code_f; the I/O layout seeds
        code_o and code_i. On resume the checkpoint's buffers replace all of this."""
        from lorapop.tasks.buffer import TaskBuffer

        buffers = {tt: TaskBuffer(tt) for tt in self.cfg.selfplay.task_types}
        for name in self.cfg.selfplay.seed_files if load_seeds else []:
            path = resolve_data_file(name)
            if path is None:
                raise ConfigError(f"selfplay.seed_files: no such file {name} (a path, or one relative to "
                                  f"lorapop's data directory such as seeds/azr_7b_coder_seed_io.jsonl)")
            with open(path) as fh:
                first = json.loads(fh.readline() or "{}")
            wanted = ("code_f",) if "inputs" in first else ("code_o", "code_i")
            for tt in wanted:
                if tt in buffers:
                    buffers[tt].load_seed_file(path, executor=self.executor)
        return buffers

    def _make_coverage(self) -> Any:
        from lorapop.diagnostics.coverage import CoverageTracker

        return CoverageTracker(self.cfg.coverage, run_dir=self.run_dir)

    # ---- the loop ------------------------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            while self.step < self.cfg.run.steps:
                self.train_step(self.step + 1)
        finally:
            self.progress.close()
            self.logger.close()

    def train_step(self, step: int) -> dict[str, Any]:
        cfg, sp, seed = self.cfg, self.cfg.selfplay, self.cfg.run.seed
        times: dict[str, float] = {}
        pop = self.population

        def stage(name: str):
            self.progress.begin_stage(step, name)
            times[name] = time.perf_counter()

        def done(name: str):
            times[name] = time.perf_counter() - times[name]

        stage("matchmake")
        players = list(pop.members)  # evolve may replace some; this step's numbers belong to those who played
        teachers = {t.id: t for t in pop.teachers}
        students = {s.id: s for s in pop.students}
        if pop.single:
            pairs = {pop.members[0].id: pop.members[0]}
        else:
            ids = matchmake(list(teachers), list(students), self.ratings.quality, sp.pfsp_floor,
                            stages.step_rng(seed, step, "matchmake"))
            pairs = {t: students[s] for t, s in ids.items()}
        done("matchmake")

        stage("propose")
        proposals = stages.propose(self.engine, list(teachers.values()), self.buffers, sp.task_types,
                                   sp.tasks_per_type, sp.n_references, sp.propose, stages.step_rng(seed, step, "propose"))
        done("propose")

        stage("validate")
        valid = stages.validate(proposals, self.executor, self.buffers, step)
        done("validate")

        stage("solve")
        jobs = stages.solve_jobs(pairs, teachers, valid, self.buffers, sp.task_types, sp.tasks_per_type,
                                 stages.step_rng(seed, step, "jobs"))
        stages.solve(self.engine, jobs, self.executor, sp.n_solve, sp.solve, stages.step_rng(seed, step, "solve"))
        done("solve")

        stage("reward")
        stages.reward(proposals, jobs, sp.teacher_reward)
        done("reward")

        stage("update")
        batch = stages.update_batch(proposals, jobs, pop.single, sp.tasks_per_type,
                                    stages.step_rng(seed, step, "update"))
        train_stats = stages.update(self.engine, batch)
        done("update")

        stage("rate")
        for match in stages.matches(jobs):
            self.ratings.record(match)
        done("rate")

        stage("evolve")
        lineage = self.evolve(step)
        done("evolve")

        stage("log")
        rows = self.task_records(step, jobs)  # first: it feeds the coverage archive the metrics read
        metrics = self.step_metrics(step, players, proposals, jobs, batch, train_stats, lineage, rows)
        metrics.update({f"time/{k}": v for k, v in times.items() if k != "log"})
        self.logger.log_tasks(rows)
        self.logger.log_step(step, metrics)
        self.step = step
        ckpt.write_json_atomic(self.run_dir / "population.json", self.population_json())
        done("log")

        if step % cfg.run.save_interval == 0 or step == cfg.run.steps:
            stage("checkpoint")
            self.save_checkpoint()
            done("checkpoint")
        self.progress.end_step(step, metrics, times)
        return metrics

    # ---- evolve ---------------------------------------------------------------------------------------------------
    def evolve(self, step: int) -> list[dict[str, Any]]:
        """PBT within each role: replace the bottom quantile by children of the top (SPEC section 3 step 8). A child
        keeps its slot, gets a new id, its parents' mean mu with the prior sigma, fresh optimizer state, age 0."""
        import torch

        from lorapop.evolve.pbt import apply_plan, is_evolve_step, plan_replacements

        if self.population.single or not is_evolve_step(step, self.cfg.evolve):
            return []
        members = [{"id": m.id, "slot": m.slot, "role": m.role, "fitness": self.ratings.expose(m.id)}
                   for m in self.population.members]
        gen = torch.Generator().manual_seed(stages.step_rng(self.cfg.run.seed, step, "evolve").getrandbits(63))
        plan = plan_replacements(members, step, self.cfg.evolve, gen)
        parent_mu = {rep.slot: statistics.fmean(self.ratings.mu(p) for p in rep.parents) for rep in plan}
        records = apply_plan(plan, self.engine.get_adapter, self.engine.set_adapter, generator=gen,
                             scaling=self.cfg.engine.lora_alpha / self.cfg.engine.rank)
        born = []
        for rep, record in zip(plan, records):
            self.engine.reset_optimizer(rep.slot)
            child = self.population.replace(rep.slot, record, step)
            # the replaced member's rating stays on record (logs, report); matchmaking only sees live members
            self.ratings.add(child.id, mu=parent_mu[rep.slot])
            born.append(self.population.lineage[-1])
            self.progress.message(f"[step {step}] evolve: {rep.old_id} -> {child.id} ({rep.operator} of "
                                  f"{', '.join(rep.parents)})")
        return born

    # ---- logging ----------------------------------------------------------------------------------------------------
    def step_metrics(self, step: int, players: list[Any], proposals: list[stages.Rollout],
                     jobs: list[stages.SolveJob],
                     batch: list[stages.Rollout], train_stats: dict[int, dict[str, float]],
                     lineage: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any]:
        from lorapop.train.metrics import compute_step_metrics

        return compute_step_metrics(self, step, players, proposals, jobs, batch, train_stats, lineage, rows)

    def task_records(self, step: int, jobs: list[stages.SolveJob]) -> list[dict[str, Any]]:
        from lorapop.train.metrics import task_records

        return task_records(self, step, jobs)

    def population_json(self) -> dict[str, Any]:
        members = []
        for m in self.population.members:
            members.append({"id": m.id, "slot": m.slot, "role": m.role, "mu": self.ratings.mu(m.id),
                            "sigma": self.ratings.sigma(m.id), "expose": self.ratings.expose(m.id),
                            "age": m.age(self.step), "born_step": m.born_step, "parents": m.parents,
                            "operator": m.operator})
        return {"step": self.step, "members": members, "lineage": self.population.lineage}

    # ---- checkpoint / resume ---------------------------------------------------------------------------------------
    def trainer_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "config": to_dict(self.cfg),
            "population": self.population.state_dict(),
            "ratings": self.ratings.state_dict(),
            "buffers": {k: b.state_dict() for k, b in self.buffers.items()},
            "coverage": self.coverage.state_dict(),
            "rng": {"python": _py_rng_state()},
        }

    def save_checkpoint(self) -> Path:
        slots = {m.id: m.slot for m in self.population.members}
        return ckpt.save_checkpoint(self.run_dir / "checkpoints", self.step, self.engine, slots, self.trainer_state(),
                                    keep=self.cfg.run.keep_checkpoints)

    def _restore(self) -> None:
        import torch

        root = self.run_dir / "checkpoints"
        ckpt.clean_temp(root)
        latest = ckpt.latest_checkpoint(root)
        if latest is None:  # killed before the first checkpoint: start over, dropping partial logs
            self.step = 0
        else:
            state = ckpt.read_trainer_state(latest)
            check_compatible(self.cfg, state["config"])
            self.step = int(state["step"])
            self.population = Population.from_state_dict(state["population"])
            self.ratings.load_state_dict(state["ratings"])
            for k, b in self.buffers.items():
                b.load_state_dict(state["buffers"][k])
            self.coverage.load_state_dict(state["coverage"])
            _set_py_rng_state(state["rng"]["python"])
            self.engine.load_state_dict(torch.load(latest / "engine_state.pt", weights_only=True))
            for m in self.population.members:  # the PEFT files are the source of truth for the weights
                self.engine.load_adapter(m.slot, latest / "adapters" / m.id)
        for name in ("metrics.jsonl", "tasks.jsonl"):
            ckpt.truncate_jsonl(self.run_dir / name, self.step)
        ckpt.write_json_atomic(self.run_dir / "population.json", self.population_json())

    def close(self) -> None:
        close = getattr(self.executor, "close", None)
        if callable(close):
            close()


def _py_rng_state() -> Any:
    v, state, gauss = random.getstate()
    return [v, list(state), gauss]


def _set_py_rng_state(s: Any) -> None:
    random.setstate((s[0], tuple(s[1]), s[2]))


def load_run_config(run_dir: Path, overrides: list[str]) -> Config:
    """The config of an existing run; only run.steps/run.progress/run.tensorboard may be overridden on resume."""
    from lorapop.config import load_config

    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"--resume {run_dir}: not a run directory (no config.yaml)")
    allowed = ("--run.steps=", "--run.progress=", "--run.tensorboard=", "--run.save_interval=")
    for o in overrides:
        if not o.startswith(allowed):
            raise ConfigError(f"override '{o}': on --resume only run.steps, run.save_interval, run.progress and "
                              "run.tensorboard may change")
    cfg = load_config(str(run_dir / "config.yaml"), overrides)
    cfg.run.output_dir, cfg.run.name = str(run_dir.parent), run_dir.name
    return cfg
