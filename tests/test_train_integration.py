"""Two real self-play steps on the embedded model: the run directory is complete, work is compute matched, PBT
replaces within a role and resets optimizer state and rating sigma; and one real step of the single-agent baseline."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from test_engine_helpers import K_REAL, REAL_LOGIT_SCALE, logprob_atol
from lorapop.config import load_config
from lorapop.train.loop import Trainer

pytestmark = pytest.mark.slow
# one log-prob of the embedded model computed twice (tests/floattol.py, test_engine_helpers)
REAL_LOGPROB_ATOL = logprob_atol(K_REAL, REAL_LOGIT_SCALE)

TINY = ["--selfplay.task_types=[code_o,code_i]", "--selfplay.tasks_per_type=2", "--selfplay.n_solve=2",
        "--selfplay.n_references=1", "--selfplay.propose.max_new_tokens=32", "--selfplay.solve.max_new_tokens=16",
        "--engine.device=cpu", "--run.progress=none", "--run.save_interval=2"]


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_two_population_steps_with_a_pbt_round(tmp_path):
    cfg = load_config(None, TINY + ["--population.n_teachers=2", "--population.n_students=2",
                                    "--evolve.perturbation_interval=2", "--evolve.burn_in_period=1",
                                    "--evolve.min_rated_matches=0",  # tiny steps rate almost nothing
                                    "--evolve.operators={full_gaussian: 1.0}", "--run.steps=2",
                                    f"--run.output_dir={tmp_path}", "--run.name=pop"])
    run = tmp_path / "pop"
    with Trainer(cfg, run) as trainer:
        said: list[str] = []
        trainer.progress.message = said.append  # what the console shows (run.progress=none prints nothing)
        trainer.train_step(1)
        before = {m.slot: trainer.engine.get_adapter(m.slot) for m in trainer.population.members}
        steps_before = trainer.engine.optimizer.step_count.clone()
        assert (steps_before == 1).all()  # one update per member per step
        sigma_prior = cfg.rating.sigma
        trainer.train_step(2)
        trainer.step = 2
        trainer.save_checkpoint()

        lineage = trainer.population.lineage
        assert len(lineage) == 2  # one per role (quantile 0.25 of 2 -> 1)
        assert sorted(rec["role"] for rec in lineage) == ["student", "teacher"]
        for rec in lineage:
            parent = next(m for m in rec["parents"])
            assert parent[0] == rec["replaced"][0] == rec["child"][0]  # same role letter: never across roles
            child = trainer.population.get(rec["child"])
            assert child.slot == rec["slot"] and child.born_step == 2
            # the child's optimizer state was reset after its parents' update of step 2 ...
            assert int(trainer.engine.optimizer.step_count[child.slot]) == 0
            # ... its rating sigma is back to the prior, its mu the parent's
            assert trainer.ratings.sigma(child.id) == pytest.approx(sigma_prior)
            # and its weights differ from what the slot held before (a real mutation happened)
            now = trainer.engine.get_adapter(child.slot)
            assert any(not torch.equal(now[k][0], before[child.slot][k][0]) for k in now)
            # the console names the replaced member, the child, its parent(s) and the operator
            line = (f"{rec['role']} {rec['replaced']} replaced by {rec['child']}, child of "
                    f"{' and '.join(rec['parents'])} by full_gaussian (M4)")
            assert any(line in m for m in said), (line, said)
        # a long run's tables stay the population's size: the replaced members are forgotten once logged
        live = {m.id for m in trainer.population.members}
        assert set(trainer.ratings.ratings) == set(trainer.ratings.n_matches) == live
        assert set(trainer.coverage.by_teacher) | set(trainer.coverage.by_student) <= live
        replaced = [rec["replaced"] for rec in lineage]
        survivors = [m for m in trainer.population.members if m.born_step == 0]
        assert all(int(trainer.engine.optimizer.step_count[m.slot]) == 2 for m in survivors)
        # with too few rated matches (the children have none) the next round replaces nobody and says who sat out
        trainer.cfg.evolve.min_rated_matches = 10 ** 6
        assert trainer.evolve(4) == [] and len(trainer.population.lineage) == 2
        assert {m.id for m in trainer.evolve_skipped} == {m.id for m in trainer.population.members}

    metrics = _lines(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        for key in ("reward", "reward_std", "completions/mean_length", "valid_rate", "format_error_rate",
                    "student/solve_rate", "student/topup_frac", "teacher/reward", "coverage", "time/propose", "time/update",
                    "teacher/zero_adv_group_frac", "student/zero_adv_group_frac", "evolve/too_few_matches"):
            assert key in m, key
        counts = {k: v for k, v in m.items() if k.endswith("/n_samples")}
        assert len(counts) == 4 and set(counts.values()) == {4}  # 2 task types x T = 2: compute matched
    assert metrics[1]["evolve/replacements"] == 2
    assert all(f"trueskill/{r}/mu" in metrics[1] for r in replaced)  # logged at its last step, then forgotten
    for m in metrics:  # verl's names; after run.malloc_trim, resident memory is at most the peak
        assert 0 < m["perf/cpu_memory_used_gb"] <= m["perf/cpu_memory_peak_gb"]
        # each stage's peak; the step's is the largest, named, and never above the run's
        stages = {k.rsplit("/", 1)[1]: v for k, v in m.items() if k.startswith("perf/cpu_memory_peak_gb/")}
        assert {"propose", "solve", "update", "log"} <= set(stages)
        assert m["perf/cpu_memory_step_peak_gb"] == max(stages.values()) <= m["perf/cpu_memory_peak_gb"]
        assert stages[m["perf/cpu_memory_peak_stage"]] == m["perf/cpu_memory_step_peak_gb"]
    assert "start" in {k.rsplit("/", 1)[1] for k in metrics[0] if k.startswith("perf/cpu_memory_peak_gb/")}
    # the update scores what was sampled, at its temperature: on the same weights the mismatch is rounding
    # (float32; a bfloat16 base decodes through another LoRA compute path, so only its presence is checked there)
    dtype = yaml.safe_load((run / "config.yaml").read_text())["engine"]["dtype"]
    for m in metrics:
        # scored tokens exist exactly when some TRR++ group did not tie (a tied group's advantages are all 0)
        scored = min(m["teacher/zero_adv_group_frac"], m["student/zero_adv_group_frac"]) < 1
        assert ("train/logprob_mismatch" in m) == ("train/entropy" in m) == scored
        if scored:
            assert m["train/entropy"] > 0 and m["train/logprob_mismatch"] >= 0
        if scored and dtype == "float32":
            assert m["train/logprob_mismatch"] <= REAL_LOGPROB_ATOL, m["train/logprob_mismatch"]
    assert all(0.0 <= m[f"{r}/zero_adv_group_frac"] <= 1.0 for m in metrics for r in ("teacher", "student"))
    pop = json.loads((run / "population.json").read_text())
    assert pop["step"] == 2 and len(pop["lineage"]) == 2
    assert (run / "config.yaml").is_file() and (run / "coverage_centroids.npy").is_file()
    # engine.dtype defaults to auto; the run records what it resolved to on this CPU
    assert yaml.safe_load((run / "config.yaml").read_text())["engine"]["dtype"] in ("float32", "bfloat16")
    assert any(f.name.startswith("events.out.tfevents") for f in run.iterdir())
    ckpt = run / "checkpoints" / "step_000002"
    for m in trainer.population.members:
        assert (ckpt / "adapters" / m.id / "adapter_config.json").is_file()
        assert (ckpt / "adapters" / m.id / "adapter_model.safetensors").is_file()
    for row in _lines(run / "tasks.jsonl"):
        assert row["proposer"].startswith("t") and row["solver"].startswith("s")
        assert {"ast_depth", "cyclomatic", "loc"} <= set(row["diagnostics"])
        # the raw answers are kept, and the solve rate is theirs
        assert row["answers"] and all(isinstance(a["text"], str) for a in row["answers"])
        assert row["solve_rate"] == sum(a["status"] == "correct" for a in row["answers"]) / len(row["answers"])


def test_one_single_agent_step_matches_population_work(tmp_path):
    cfg = load_config(None, TINY + ["--population.mode=single", "--run.steps=1", f"--run.output_dir={tmp_path}",
                                    "--run.name=single"])
    with Trainer(cfg, tmp_path / "single") as trainer:
        m = trainer.train_step(1)
        # as AZR: T = 2 proposals and T answers per type, 2 types: one teacher's plus one student's 4 samples
        assert m["member/a0/n_samples"] == 8
        assert trainer.cfg.selfplay.teacher_reward == "learnability"  # the baseline is AZR
        assert int(trainer.engine.optimizer.step_count[0]) == 1
        assert trainer.population.lineage == []
    assert trainer._owned == []  # the engine, executor, logs and display were closed on leaving the block
