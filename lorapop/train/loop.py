"""The training loop: ``Trainer.run`` reads top to bottom as the named stages of docs/METHOD.md, The step."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorapop.config import Config, config_to_yaml, resolve_teacher_reward
from lorapop.configlib import ConfigError, to_dict
from lorapop.data import resolve_data_file
from lorapop.engine.base import Engine
from lorapop.engine.dtype import resolve_dtype, resolve_lora_compute_dtype
from lorapop.hostmem import StagePeaks, map_large_allocations, process_memory, release_free_memory
from lorapop.faults import fault_point  # the test seam: a no-op unless a kill test names the point
from lorapop.records.rundir import ADAPTERS, ENGINE_STATE, TRAINER_STATE, RunDir, write_json_atomic
from lorapop.records import RunDirError
from lorapop.tasks import TASK_TYPES
from lorapop.tasks.buffer import TaskBuffer
from lorapop.tasks.styles import proposal_style
from lorapop.train import stages
from lorapop.train.logger import MetricsLogger, Progress
from lorapop.train.matchmaking import matchmake
from lorapop.train.metrics import (population_members, sandbox_record, step_metrics, task_records, unisolated_note,
                                   update_coverage)
from lorapop.train.population import Population
from lorapop.train.rating import Ratings

if TYPE_CHECKING:
    from lorapop.diagnostics.coverage import CoverageTracker
    from lorapop.executor.base import Executor

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


def init_plans(cfg: Config) -> list:
    """``population.init_from`` resolved and checked against the run (lorapop/adapters.py): [] when unset."""
    from lorapop.adapters import plan_init
    from lorapop.records.members import initial_members

    p = cfg.population
    return plan_init(p.init_from, initial_members(p.mode, p.n_teachers, p.n_students), rank=cfg.engine.rank,
                     target_modules=list(cfg.engine.target_modules), model_name=cfg.model.name,
                     check_base=p.init_check_base)


class Trainer:
    """A run: ``with Trainer(cfg, run_dir) as t: t.run()``. Leaving the block closes what the Trainer opened (the
    progress display, the logs, and the executor and engine unless they were handed in)."""

    def __init__(self, cfg: Config, run_dir: Path, *, resume: bool = False, engine: Engine | None = None,
                 executor: Executor | None = None):
        self.cfg, self.run_dir, self.resume = cfg, run_dir, resume
        self.stage_peaks = StagePeaks()  # loading the engine and the sandbox count as the stage "start"
        if cfg.run.malloc_trim:
            map_large_allocations()  # large buffers go back to the OS when freed, not into a fragmented heap
        self._owned: list[Any] = []  # closed by close(), last opened first
        self.progress: Progress | None = None
        self.logger: MetricsLogger | None = None
        try:
            self._open(resume, engine, executor)
        except BaseException:
            self.close()
            raise

    def _open(self, resume: bool, engine: Engine | None, executor: Executor | None) -> None:
        cfg, run_dir = self.cfg, self.run_dir
        # a Config built in code (not by load_config) may still say auto; config.yaml records what runs
        cfg.selfplay.teacher_reward = resolve_teacher_reward(cfg.population.mode, cfg.selfplay.teacher_reward)
        self.rundir = RunDir(run_dir)
        if resume and self.rundir.latest_checkpoint() is None:
            raise RunDirError(f"{run_dir}: no complete checkpoint to resume from (prepare_run_dir restarts such a run)")
        if not self.rundir.has_config():
            cfg.engine.dtype = resolve_dtype(cfg.engine.dtype, cfg.engine.device)
            cfg.engine.lora_compute_dtype = resolve_lora_compute_dtype(cfg.engine.lora_compute_dtype,
                                                                       cfg.engine.dtype)
            self.rundir.create(config_to_yaml(cfg))
        self.population = Population.create(cfg.population.mode, cfg.population.n_teachers,
                                            cfg.population.n_students)
        self.ratings = Ratings(cfg.rating.mu, cfg.rating.sigma, cfg.rating.beta, cfg.rating.tau,
                               cfg.rating.draw_probability)
        for m in self.population.members:
            self.ratings.add(m.id)
        self.step = 0
        self._hold_ray(engine is None, executor is None)
        self.evolve_skipped: list = []  # members the last PBT round left out for too few rated matches
        self.init_from: dict[str, dict] = {}  # member id -> where it started (population.init_from), kept in state
        self.executor = executor if executor is not None else self._own(self._make_executor())
        self.sandbox = sandbox_record(self.executor)  # starts a worker: a sandbox that cannot isolate stops here
        self.buffers = self._make_buffers(load_seeds=not resume)
        self.coverage = self._make_coverage()
        fault_point("coverage")
        self.engine = engine if engine is not None else self._own(self._make_engine())
        fault_point("engine")
        notes = self._restore() if resume else self._init_adapters()
        if self.sandbox is not None and not self.sandbox["isolated"]:
            notes = [unisolated_note(self.sandbox), *(notes or [])]
        self.logger = self._own(MetricsLogger(self.rundir, cfg.run.report_to,
                                              purge_step=self.step + 1 if resume else None, config=to_dict(cfg),
                                              project=cfg.run.project, run_name=run_dir.name))
        self.probe_log = self._own(self.rundir.open_probe()) if cfg.run.probe_interval else None
        self.progress = self._own(Progress(cfg.run.progress, cfg.run.steps))
        for line in notes or []:
            self.progress.message(line)

    def _own(self, part: Any) -> Any:
        self._owned.append(part)
        return part

    # ---- construction -------------------------------------------------------------------------------------------
    def _hold_ray(self, make_engine: bool, make_executor: bool) -> None:
        """When the parts this Trainer builds run on Ray, join (or start) it once for all of them, with room for
        every actor they will place, so neither starts a local Ray too small for the other (lorapop/raycluster.py).
        Nothing of Ray is imported otherwise."""
        import os

        e, x = self.cfg.engine, self.cfg.executor
        cpus = 0.0
        if make_engine and e.replicas > 1:
            cpus += e.replicas * max(1, (os.cpu_count() or 1) // e.replicas)
        if make_executor and x.ray:
            cpus += x.ray_actors * x.ray_num_cpus
        if cpus:
            from lorapop.raycluster import RayHold

            self._own(RayHold(e.ray_address, cpus))

    def _make_engine(self) -> Engine:
        from lorapop.engine.factory import make_engine

        return make_engine(self.cfg.model.name, self.cfg.population.n_members, self.cfg.engine, seed=self.cfg.run.seed)

    def _make_executor(self) -> Executor:
        if self.cfg.executor.ray:
            from lorapop.executor.ray_executor import RayExecutor

            return RayExecutor(self.cfg.executor, address=self.cfg.engine.ray_address)
        from lorapop.executor.sandbox import SandboxExecutor

        return SandboxExecutor(self.cfg.executor)

    def _make_buffers(self, load_seeds: bool) -> dict[str, TaskBuffer]:
        """Per-type buffers with the identity seed, plus seed files validated in the sandbox (outputs recomputed).
        A file in AZR's code_f layout (``inputs``/``outputs``/``message``) seeds code_f; the I/O layout seeds
        code_o and code_i. On resume the checkpoint's buffers replace all of this."""
        sp = self.cfg.selfplay
        # A style whose seed file holds its references alone (selection: the identity seed, f(a) on a string, would
        # be shown as `nums = "Hello world"`, against the style's own rules) leaves the identity seed out.
        identity = not (proposal_style(sp.proposal_style).replaces_identity_seed and sp.seed_files and load_seeds)
        buffers = {tt: TaskBuffer(tt, seed_identity=identity, max_tasks=sp.buffer_max_tasks) for tt in sp.task_types}
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
                    buffers[tt].load_seed_file(path, executor=self.executor, task_type=TASK_TYPES[tt])
        return buffers

    def _make_coverage(self) -> CoverageTracker:
        from lorapop.diagnostics.coverage import CoverageTracker

        return CoverageTracker(self.cfg.coverage, run_dir=self.run_dir)

    def _init_adapters(self) -> list[str]:
        """Step 0: members named by ``population.init_from`` take their source's weights (fresh optimizer state, as
        the engine starts). Returns what to tell the user."""
        import torch

        from lorapop.adapters import fit_weights

        lines = []
        for plan in init_plans(self.cfg):
            slot = plan.member.slot
            gen = torch.Generator().manual_seed(stages.step_rng(self.cfg.run.seed, 0, f"init{slot}").getrandbits(63))
            self.engine.set_adapter(slot, fit_weights(plan, self.engine.get_adapter(slot),
                                                      lora_alpha=self.cfg.engine.lora_alpha, generator=gen))
            self.init_from[plan.member.id] = plan.record()
            lines.append(f"init: {plan.member.id} <- {plan.source.label}"
                         + "".join(f"; {n}" for n in plan.notes))
        return lines

    # ---- the loop ------------------------------------------------------------------------------------------------
    def run(self) -> None:
        if self.step == 0:
            if self.probe_log is not None:
                self.stage_peaks.begin("probe")
            self.probe(0)  # the members as they start: each probe curve's first point
        while self.step < self.cfg.run.steps:
            self.train_step(self.step + 1)

    def train_step(self, step: int) -> dict[str, Any]:
        """One step, its stages in order (docs/METHOD.md, "The step"); returns the metrics it logged."""
        cfg, sp, pop = self.cfg, self.cfg.selfplay, self.population
        ctx = stages.StepContext(step, cfg.run.seed, self.engine, self.executor, sp, self.buffers)
        times: dict[str, float] = {}

        def stage(name: str):
            self.progress.begin_stage(step, name)
            self.stage_peaks.begin(name)
            times[name] = time.perf_counter()

        def done(name: str):
            times[name] = time.perf_counter() - times[name]
            fault_point(f"step{step}:{name}")

        stage("matchmake")
        players = tuple(pop.members)  # evolve may replace some; this step's numbers belong to those who played
        teachers = {t.id: t for t in pop.teachers}
        students = {s.id: s for s in pop.students}
        if pop.single:
            pairs = {pop.members[0].id: pop.members[0]}
        else:
            ids = matchmake(list(teachers), list(students), self.ratings.win_probability, sp.pfsp_floor,
                            ctx.rng("matchmake"))
            pairs = {t: students[s] for t, s in ids.items()}
        done("matchmake")

        stage("propose")
        proposals = stages.propose(ctx, list(teachers.values()))
        done("propose")

        stage("validate")
        proposals = stages.validate(ctx, proposals)
        done("validate")

        stage("solve")
        jobs = stages.solve(ctx, stages.solve_jobs(ctx, pairs, teachers, proposals, list(students.values())))
        proposals, jobs = stages.drop_void(ctx, proposals, jobs)
        done("solve")

        stage("reward")
        proposals, jobs = stages.reward(proposals, jobs, sp.teacher_reward, sp.reward_reading)
        done("reward")

        stage("update")
        if cfg.run.malloc_trim:  # generation's freed buffers go back before the update reaches its peak
            release_free_memory()
        batch = stages.update_batch(proposals, jobs, sp.tasks_per_type, ctx.rng("update"))
        # lr 0 (the no-update arm of bench/arms.py): AdamW would leave every weight where it is (its decay is scaled
        # by lr too), so the update is skipped rather than paid for; sampling, rewards and ratings are unchanged
        train_stats = stages.update(self.engine, batch) if cfg.engine.lr > 0 else {}
        if cfg.run.malloc_trim:  # the update's freed activations go back now, not at the step's end
            release_free_memory()
        done("update")

        stage("rate")
        for match in stages.matches(jobs):
            self.ratings.record(match)
        done("rate")

        # before evolve: the probe of step N scores the members that trained at step N, never a child made this step.
        # Its rows reach disk before this step's checkpoint, so a kill in between leaves them past the
        # last checkpoint, where a resume drops them and writes them again.
        if cfg.run.probe_interval and step % cfg.run.probe_interval == 0:
            stage("probe")
            self.probe(step)
            done("probe")

        stage("evolve")
        lineage = self.evolve(step)
        done("evolve")

        stage("coverage")
        rows = task_records(step, jobs)
        update_coverage(self.coverage, rows)
        done("coverage")

        stage("log")
        result = stages.StepResult(step, players, tuple(proposals), tuple(jobs), tuple(batch), train_stats,
                                   tuple(lineage), {k: v for k, v in times.items() if k != "log"},
                                   evolve_skipped=tuple(m.id for m in self.evolve_skipped))
        metrics = step_metrics(result, rows, self.ratings, self.coverage, sp.task_types)
        metrics.update(self.engine.pop_metrics())  # e.g. engine/sync_s under the vllm backend
        metrics.update(self.memory_metrics())
        self.logger.log_tasks(rows)
        self.logger.log_step(step, metrics)
        live = {m.id for m in pop.members}  # members replaced this step were logged above for the last time
        self.ratings.forget(live)
        self.coverage.forget(live)
        self.step = step
        self.write_population()
        done("log")

        if step % cfg.run.save_interval == 0 or step == cfg.run.steps:
            stage("checkpoint")
            self.save_checkpoint()
            self.logger.flush()
            if cfg.run.malloc_trim:  # serialising the state freed hundreds of MB the heap would otherwise keep
                release_free_memory()
            done("checkpoint")
        self.progress.end_step(step, metrics, times)
        return metrics

    def memory_metrics(self) -> dict[str, Any]:
        """verl's ``perf/`` memory figures after the step's work (and, with ``run.malloc_trim``, the C heap's free
        pages handed back first, so ``perf/cpu_memory_used_gb`` is what the run holds, not what malloc kept), and
        the peak resident memory of each stage since the last step's: ``perf/cpu_memory_peak_gb/<stage>``, their
        largest ``perf/cpu_memory_step_peak_gb`` and the first stage that reached it ``perf/cpu_memory_peak_stage``.
        The checkpoint written after a step's metrics counts in the next step's (and loading the run in the first's,
        as ``start``)."""
        peaks = self.stage_peaks.take()
        if self.cfg.run.malloc_trim:
            release_free_memory()
        out: dict[str, Any] = process_memory()
        if peaks:
            top = max(peaks, key=peaks.__getitem__)
            out["perf/cpu_memory_step_peak_gb"], out["perf/cpu_memory_peak_stage"] = peaks[top], top
            out.update({f"perf/cpu_memory_peak_gb/{k}": v for k, v in peaks.items()})
        if str(self.cfg.engine.device).startswith("cuda"):
            import torch

            out["perf/max_memory_allocated_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
            out["perf/max_memory_reserved_gb"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
        return out

    def probe(self, step: int) -> None:
        """The capability probe (lorapop/train/probe.py) after ``step``'s update and before its PBT replacement:
        generation only, with its own seeds, so a run with it trains exactly as one without. At step 0 it also
        writes the noise floor."""
        from lorapop.train.probe import noise_floor, run_probe

        if self.probe_log is None:
            return
        sp, run = self.cfg.selfplay, self.cfg.run
        prefill = proposal_style(sp.proposal_style).answer_prefill(TASK_TYPES["code_o"]) if sp.response_prefill else ""
        rng = stages.step_rng(run.seed, step, "probe")
        members = self.population.students

        def score(who: list) -> list[dict[str, Any]]:
            return run_probe(self.engine, self.executor, who, step, stages.sampling_params(sp.solve),
                             run.probe_samples, prefill, rng, per_level=run.probe_per_level, min_age=run.probe_min_age,
                             style=sp.proposal_style)

        rows = score(members)
        if step == 0:
            replicates = [(m.id, [r for r in rows if r["member"] == m.id]) for m in members]
            if len(members) == 1:  # the single agent: a spread needs two scorings, the second with the next seeds
                replicates.append((members[0].id, score(members)))
            identical = not any(m.id in self.init_from for m in members)
            rows.append(noise_floor(replicates, identical, run.probe_samples))
        self.probe_log.write(*rows)

    # ---- evolve ---------------------------------------------------------------------------------------------------
    def evolve(self, step: int) -> list[dict[str, Any]]:
        """PBT within each role: replace the bottom quantile by children of the top (docs/METHOD.md, "Evolve"). A
        child keeps its slot, gets a new id, its parents' mean mu with the prior sigma, fresh optimizer state, age 0.
        Returns the lineage records of this round's births."""
        import torch

        from lorapop.evolve.pbt import apply_plan, is_evolve_step, plan_replacements, too_few_matches

        self.evolve_skipped = []
        if self.population.single or not is_evolve_step(step, self.cfg.evolve):
            return []
        members = [{"id": m.id, "slot": m.slot, "role": m.role, "fitness": self.ratings.expose(m.id),
                    "n_matches": self.ratings.matches(m.id)} for m in self.population.members]
        self.evolve_skipped = too_few_matches(members, self.cfg.evolve)
        for m in self.evolve_skipped:
            self.progress.message(f"[step {step}] evolve: {m.id} sits this round out ({m.n_matches} rated matches "
                                  f"< evolve.min_rated_matches={self.cfg.evolve.min_rated_matches})")
        gen = torch.Generator().manual_seed(stages.step_rng(self.cfg.run.seed, step, "evolve").getrandbits(63))
        plan = plan_replacements(members, step, self.cfg.evolve, gen)
        if not plan:
            self.progress.message(f"[step {step}] evolve: no replacement this round (no role has 2 members with "
                                  "enough rated matches)")
        parent_mu = {rep.slot: statistics.fmean(self.ratings.mu(p) for p in rep.parents) for rep in plan}
        used = apply_plan(plan, self.engine.get_adapter, self.engine.set_adapter, generator=gen,
                          scaling=self.cfg.engine.lora_alpha / self.cfg.engine.rank)
        born = []
        for rep, params in zip(plan, used):
            self.engine.reset_optimizer(rep.slot)
            child, record = self.population.replace(rep, params, step)
            # the replaced member's rating is logged once more at this step's end, then forgotten (Ratings.forget)
            self.ratings.add(child.id, mu=parent_mu[rep.slot])
            born.append(record)
            self.progress.message(f"[step {step}] evolve: {rep.role} {rep.old_id} replaced by {child.id}, child of "
                                  f"{' and '.join(rep.parents)} by {rep.operator} ({rep.operator_id})"
                                  + (f"; {rep.note}" if rep.note else ""))
        return born

    def write_population(self) -> None:
        self.rundir.write_population(self.step, population_members(self.population, self.ratings, self.step),
                                     self.population.lineage, sandbox=self.sandbox)

    # ---- checkpoint / resume ---------------------------------------------------------------------------------------
    def trainer_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "config": to_dict(self.cfg),
            "population": self.population.state_dict(),
            "ratings": self.ratings.state_dict(),
            "buffers": {k: b.state_dict() for k, b in self.buffers.items()},
            "coverage": self.coverage.state_dict(),
            "init_from": self.init_from,
        }

    def save_checkpoint(self) -> Path:
        import torch

        with self.rundir.new_checkpoint(self.step, keep=self.cfg.run.keep_checkpoints) as tmp:
            for m in self.population.members:
                self.engine.save_adapter(m.slot, tmp / ADAPTERS / m.id)
            torch.save(self.engine.state_dict(), tmp / ENGINE_STATE)
            write_json_atomic(tmp / TRAINER_STATE, self.trainer_state())
        return self.rundir.find_checkpoint(self.step)

    def _restore(self) -> list[str]:
        import torch

        self.rundir.clean_temp()
        latest = self.rundir.find_checkpoint()
        state = self.rundir.read_trainer_state(latest)
        check_compatible(self.cfg, state["config"])
        self.step = int(state["step"])
        self.population = Population.from_state_dict(state["population"])
        self.ratings.load_state_dict(state["ratings"])
        for k, b in self.buffers.items():
            b.load_state_dict(state["buffers"][k])
        self.coverage.load_state_dict(state["coverage"])
        # older versions' checkpoints also hold the global `random` state ("rng"); nothing draws from it
        self.engine.load_state_dict(torch.load(latest / ENGINE_STATE, weights_only=True))
        for m in self.population.members:  # the PEFT files are the source of truth for the weights
            self.engine.load_adapter(m.slot, latest / ADAPTERS / m.id)
        self.init_from = dict(state.get("init_from") or {})
        self.rundir.truncate_logs(self.step)
        self.write_population()
        return []

    # ---- shutdown ----------------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Close everything the Trainer opened, last opened first. Idempotent."""
        while self._owned:
            self._owned.pop().close()

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
