"""engine.replicas and executor.ray on a real local Ray: 2 CPU replicas of the embedded model against the one
in-process engine (rows, a train step, K steps, replicas in sync), a replica killed mid-step, resume across replica
counts, the sandbox on Ray actors. One Ray cluster for the module (its start-up alone takes ~10 s here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

try:
    import ray
except ImportError as e:  # part of the test setup (scripts/setup.sh --test), so a missing one is an error
    raise ImportError("tests/test_replicas.py needs the ray extra: scripts/setup.sh --test "
                      "(or pip install -e '.[test,ray]')") from e

from floattol import assert_close_sums, sum_tol
from test_engine_helpers import K_REAL, K_REAL_GRAD, REAL_LOGIT_SCALE, VOCAB, assert_greedy_agrees
from lorapop.engine.base import Engine, EngineConfig, SamplingParams, TrainSample
from lorapop.engine.replicas import ReplicaError, ReplicatedEngine, deal, split_rows
from lorapop.executor.ray_executor import RayExecutor, cut
from lorapop.executor.sandbox import SandboxExecutor
from lorapop.executor.base import ExecutorConfig

pytestmark = pytest.mark.slow

N_ADAPTERS = 3
# Replicas sum each adapter's gradient over their share of the rows, then across replicas: another order than the one
# engine's (tests/floattol.py; the real model's reduction lengths in test_engine_helpers). Each replica also runs its
# rows in other batch shapes, so greedy rows agree up to a near-tie of the reference's two best logits. Both sides
# run in float64 (engine.dtype float64, the numerical reference), so the identity is checked at about 1e-12 rather
# than under float32 rounding through 30 layers, whose size depends on the processor's GEMM kernels.
DTYPE = torch.float64
GRAD_REL = sum_tol(DTYPE, K_REAL_GRAD)  # relative to the largest entry
REAL_LOGIT_ATOL = sum_tol(DTYPE, K_REAL, REAL_LOGIT_SCALE)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, object_store_memory=256 * 2**20)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def engines(cluster):
    """(the one in-process TorchEngine, a ReplicatedEngine of 2 CPU replicas), same seed, same adapters, float64."""
    from lorapop.engine.torch_engine import TorchEngine
    from lorapop.model import load_base_model

    model, tok = load_base_model("embedded", dtype="float64")
    one = TorchEngine(model, tok, N_ADAPTERS, EngineConfig(device="cpu", gen_batch_size=8, dtype="float64"), seed=3)
    two = ReplicatedEngine("embedded", N_ADAPTERS,
                           EngineConfig(device="cpu", gen_batch_size=8, replicas=2, dtype="float64"), seed=3)
    g = torch.Generator().manual_seed(0)
    for i in range(N_ADAPTERS):  # non-zero B, different per adapter, so every row really depends on its adapter
        w = {n: (a, torch.randn(b.shape, generator=g, dtype=DTYPE) * 0.02) for n, (a, b) in one.get_adapter(i).items()}
        one.set_adapter(i, w)
        two.set_adapter(i, w)
    yield one, two
    two.close()
    one.close()


def _prompts(engine) -> tuple[list[list[int]], list[int]]:
    q = [engine.chat_prompt(t) for t in ("Name a prime number.", "Write a Python list of three colours.",
                                         "What is 7 times 6? Answer briefly.", "Say hello in French.")]
    # a group of 3 rows sharing (adapter, prompt) as n_solve answers do, the base model (-1), every adapter
    return [q[0], q[0], q[0], q[1], q[2], q[3], q[1]], [0, 0, 0, 1, -1, 2, 2]


def test_deal_and_split_keep_prefix_groups_together_and_balance_tokens():
    prompts = [[1] * 50, [1] * 50, [1] * 50, [2] * 10, [3] * 10, [4] * 10, [1] * 50]
    shares = split_rows(prompts, [0, 0, 0, 0, 0, 0, 1], 20, 2)
    assert sorted(k for s in shares for k in s) == list(range(7))
    assert any({0, 1, 2} <= set(s) for s in shares)  # the shared-prefix group is never split
    assert 6 not in next(s for s in shares if 0 in s)  # same prompt, other adapter: another group, balanced away
    assert deal([5, 1, 1, 1, 1, 1], 2) == [[0], [1, 2, 3, 4, 5]]
    assert cut([1, 1, 1, 1], 2) == [(0, 2), (2, 4)] and cut([9, 1], 3)[-1][1] == 2


def test_generation_equals_the_one_engine_row_for_row(engines):
    one, two = engines
    prompts, ids = _prompts(one)
    assert isinstance(two, Engine) and two.replica_info[0]["threads"] == max(1, (os.cpu_count() or 1) // 2)
    assert two.chat_prompt("Say hello in French.") == prompts[5]
    for params, seeds in ((SamplingParams(max_new_tokens=10, greedy=True), None),
                          (SamplingParams(max_new_tokens=10, temperature=1.0), [11, 12, 13, 14, 15, 16, 17])):
        a = one.generate(prompts, ids, params, seeds=seeds)
        b = two.generate(prompts, ids, params, seeds=seeds)
        if seeds is None:
            for p, i, x, y in zip(prompts, ids, b, a):
                assert_greedy_agrees(x.token_ids, y.token_ids, one, p, i, atol=REAL_LOGIT_ATOL)
        else:  # a seeded draw flips only when it lands within rounding of a boundary: exact, as measured
            assert [c.token_ids for c in b] == [c.token_ids for c in a]
            assert [c.text for c in b] == [c.text for c in a]
        # the sampler's log-probs travel back through Ray; each replica computed them in its own batch shapes
        assert all(x.temperature == y.temperature for x, y in zip(b, a))
        lp_atol = REAL_LOGIT_ATOL + sum_tol(torch.float32, VOCAB)
        for x, y in zip(b, a):
            n = min(len(x.token_ids), len(y.token_ids))  # greedy rows may part after a near-tie
            torch.testing.assert_close(torch.tensor(x.logprobs[:n]), torch.tensor(y.logprobs[:n]), rtol=0,
                                       atol=lp_atol)
        assert [c.prompt_ids for c in b] == prompts
    assert len({tuple(c.token_ids) for c in a}) > 2  # rows really differ (adapters, prompts, seeds)


def _assert_same_state(one, two, steps: int):
    """The moments (m ~ g, v ~ g^2) are the tight test of the summed gradients. Weights: Adam divides by
    sqrt(v) + eps, so a coordinate whose gradient is near eps turns float noise into up to lr of movement; all but
    a rare few weights agree to 1e-6 and none is more than one lr per step apart."""
    s1, s2 = one.state_dict(), two.state_dict()
    lr = one.cfg.lr
    diffs = torch.cat([(a - b).abs().flatten() for a, b in zip(s1["lora_A"] + s1["lora_B"],
                                                                s2["lora_A"] + s2["lora_B"])])
    assert diffs.max() <= lr * steps and (diffs > 1e-6).float().mean() < 1e-4, (diffs.max(), (diffs > 1e-6).sum())
    o1, o2 = s1["optimizer"], s2["optimizer"]
    for a, b in zip(o1["exp_avg"], o2["exp_avg"]):  # sums of gradients
        assert_close_sums(b, a, K_REAL_GRAD, scale=float(a.abs().max()))
    for a, b in zip(o1["exp_avg_sq"], o2["exp_avg_sq"]):  # of squares: twice the relative error
        assert_close_sums(b, a, K_REAL_GRAD, scale=2 * float(a.abs().max()))
    assert torch.equal(o1["step"], o2["step"])


def test_train_steps_equal_the_one_engine_and_replicas_stay_identical(engines):
    one, two = engines
    prompts, ids = _prompts(one)
    comps = one.generate(prompts, ids, SamplingParams(max_new_tokens=8, greedy=True))
    train_ids = [a if a >= 0 else 1 for a in ids]  # the base row's sample trains adapter 1
    before = one.get_adapter(0)
    for k, advs in enumerate(([1.0, -0.5, 0.3, 0.8, -1.2, 0.4, -0.9], [-0.2, 0.9, -1.0, 0.1, 0.6, -0.3, 1.1])):
        samples = [TrainSample(p, c.token_ids, a, adv, sampler_logprobs=c.logprobs)  # greedy: temperature 1's
                   for p, c, a, adv in zip(prompts, comps, train_ids, advs)]
        s1, s2 = one.train_step(samples), two.train_step(samples)
        assert s1.keys() == s2.keys() == {0, 1, 2}
        for a in s1:
            assert s2[a]["n_tokens"] == s1[a]["n_tokens"] and s2[a]["n_samples"] == s1[a]["n_samples"]
            # the loss: a mean of log-probabilities times advantages up to 1.3; the norm: of the gradient
            lp_tol = REAL_LOGIT_ATOL + sum_tol(DTYPE, VOCAB)
            assert s2[a]["loss"] == pytest.approx(s1[a]["loss"], rel=0, abs=1.3 * lp_tol)
            assert s2[a]["grad_norm"] == pytest.approx(s1[a]["grad_norm"], rel=GRAD_REL), (k, s1, s2)
            # the replicas' shares merge into the one engine's statistics, token-weighted
            assert (s2[a]["n_scored"], s2[a]["n_compared"]) == (s1[a]["n_scored"], s1[a]["n_compared"]) != (0, 0)
            assert s2[a]["entropy"] == pytest.approx(s1[a]["entropy"], rel=0, abs=lp_tol)
            assert s2[a]["logprob_mismatch"] == pytest.approx(s1[a]["logprob_mismatch"], rel=0, abs=lp_tol)
        if k == 0:
            _assert_same_state(one, two, 1)  # one step: equal within float tolerance
        digests = two.replica_digests()
        assert len(digests) == 2 and digests[0] == digests[1], f"replicas drifted after step {k + 1}"
    _assert_same_state(one, two, 2)
    assert not torch.equal(one.get_adapter(0)[next(iter(before))][1], before[next(iter(before))][1])
    # the replicas' engine metrics reach the trainer as the one engine's do (compile off here: nothing compiled)
    assert two.pop_metrics() == one.pop_metrics() == {"perf/compile_s": 0.0, "perf/graphs": 0, "perf/cuda_graphs": 0,
                                                         "perf/warmups": 0}

    # bad input is refused before any replica sees it, and nothing is lost
    with pytest.raises(IndexError, match="adapter index 7 out of range"):
        two.train_step([TrainSample(prompts[0], [1, 2], 7, 1.0)])
    assert two.replica_digests() == digests


def test_replicas_one_never_imports_ray(tmp_path):
    code = f"""
import sys, types
from lorapop.config import load_config
from lorapop.train.loop import Trainer
from lorapop.engine.base import SamplingParams
cfg = load_config(None, ["--engine.device=cpu", "--engine.replicas=1", "--population.n_teachers=1",
                         "--population.n_students=1"])
t = types.SimpleNamespace(cfg=cfg)
engine, executor = Trainer._make_engine(t), Trainer._make_executor(t)
out = engine.generate([engine.chat_prompt("hi")], [0], SamplingParams(max_new_tokens=2, greedy=True))
assert executor.run("_result = 1 + 1").value == "2"
engine.close(); executor.close()
bad = sorted(m for m in sys.modules if m == "ray" or m.startswith("ray."))
assert not bad, bad
print("ok", type(engine).__name__)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0 and "ok TorchEngine" in res.stdout, res.stdout + res.stderr


def test_without_ray_installed_replicas_and_executor_ray_say_how_to_get_it(monkeypatch):
    from lorapop.raycluster import RayUnavailableError

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as it does without the extra
    with pytest.raises(RayUnavailableError, match=r"pip install -e '\.\[ray\]'"):
        ReplicatedEngine("embedded", 2, EngineConfig(device="cpu", replicas=2))
    with pytest.raises(RayUnavailableError, match="executor.ray"):
        RayExecutor(ExecutorConfig(ray=True))


def test_a_replica_that_cannot_start_says_why(cluster, tmp_path):
    with pytest.raises(ReplicaError, match=r"engine replica \d of 2 could not start \(.*model path not found: "
                                           + str(tmp_path / "nope")):
        ReplicatedEngine(str(tmp_path / "nope"), 1, EngineConfig(device="cpu", replicas=2))
    with pytest.raises(ValueError, match="engine.replicas=2 puts each replica on its own GPU, but the Ray cluster "
                                         "has 0"):
        ReplicatedEngine("embedded", 1, EngineConfig(device="cuda", replicas=2))


def test_a_private_local_ray_starts_with_the_first_user_and_stops_with_the_last(tmp_path):
    code = """
import ray
from lorapop.executor.ray_executor import RayExecutor
from lorapop.executor.base import ExecutorConfig
from lorapop.raycluster import RayHold
assert not ray.is_initialized()
hold = RayHold(None, 1)  # as a Trainer holds it for its engine and executor
ex = RayExecutor(ExecutorConfig(ray=True, ray_actors=1, n_workers=1))
assert ex.run("_result = 2 + 3").value == "5"
ex.close()
assert ray.is_initialized()  # the hold still uses it
hold.close()
assert not ray.is_initialized()
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout + res.stderr[-3000:]


def test_executor_on_ray_actors_matches_the_local_sandbox(cluster):
    codes = ["_result = sorted({3, 1, 2})", "_result = 1 / 0", "while True: pass",
             "import socket\ns = socket.socket()\ns.connect(('1.1.1.1', 53))",
             "_result = open('/etc/passwd').read()", "_result = hash('abc')", "x = 2 ** 10\n_result = x"]
    cfg = ExecutorConfig(timeout_s=1.0, n_workers=1, ray=True, ray_actors=2)
    with SandboxExecutor(ExecutorConfig(timeout_s=1.0, n_workers=1)) as local, RayExecutor(cfg) as remote:
        assert remote.protections == local.protections
        want = local.run_many(codes, hashseed=5)
        got = remote.run_many(codes, hashseed=5)
        assert [(r.status, r.value) for r in got] == [(r.status, r.value) for r in want]
        assert [r.status for r in got[:3]] == ["ok", "error", "timeout"]
        assert got[3].status == "error" and got[4].status == "error"  # no network, no host files, as locally
        assert remote.run("_result = 6 * 7").value == "42"
        assert remote.run("_result = 'x' * 50", max_result_chars=20).status == "output_limit"
        # a check's rounds: single runs from several threads, spread over the actors
        from lorapop.tasks.common import run_rounds

        rounds = run_rounds(remote, ["_result = 7", "_result = 8"], 3, 0.025)
        assert {c: [r.value for r in rs] for c, rs in rounds.items()} == {"_result = 7": ["7"] * 3,
                                                                          "_result = 8": ["8"] * 3}
    with pytest.raises(RuntimeError, match="closed"):
        remote.run("_result = 1")


TINY = [
    "--population.n_teachers=2", "--population.n_students=2",
    "--selfplay.task_types=[code_o]", "--selfplay.tasks_per_type=2", "--selfplay.n_solve=2",
    "--selfplay.n_references=1", "--selfplay.propose.max_new_tokens=24", "--selfplay.solve.max_new_tokens=12",
    "--engine.device=cpu", "--engine.gen_batch_size=8", "--evolve.perturbation_interval=3",
    "--evolve.burn_in_period=1", "--evolve.min_rated_matches=0",  # tiny steps rate almost nothing; PBT at step 3
    "--run.save_interval=1", "--run.keep_checkpoints=0", "--run.progress=plain",
    "--run.tensorboard=false",
]


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def _assert_engine_is_checkpoint(trainer, ckpt: Path) -> None:
    """The live engine holds exactly what the checkpoint saved: adapters (PEFT files) and AdamW state."""
    from safetensors.torch import load_file

    for m in trainer.population.members:
        saved = load_file(str(ckpt / "adapters" / m.id / "adapter_model.safetensors"))
        for name, (a, b) in trainer.engine.get_adapter(m.slot).items():
            assert torch.equal(saved[f"base_model.model.{name}.lora_A.weight"], a)
            assert torch.equal(saved[f"base_model.model.{name}.lora_B.weight"], b)
    saved = torch.load(ckpt / "engine_state.pt", weights_only=True)["optimizer"]
    live = trainer.engine.state_dict()["optimizer"]
    assert all(torch.equal(x, y) for x, y in zip(saved["exp_avg"] + saved["exp_avg_sq"],
                                                  live["exp_avg"] + live["exp_avg_sq"]))
    assert torch.equal(saved["step"], live["step"])


def test_replica_killed_mid_step_then_resumed_with_one_then_two_replicas(cluster, tmp_path, monkeypatch):
    from lorapop.config import load_config
    from lorapop.commands.train import load_run_config, prepare_run_dir
    from lorapop.train.loop import Trainer

    cfg = load_config(None, TINY + ["--run.steps=2", "--engine.replicas=2", f"--run.output_dir={tmp_path}",
                                    "--run.name=r"])
    run, _ = prepare_run_dir(cfg, resume=False)
    ckpts = run / "checkpoints"
    with Trainer(cfg, run) as t:
        assert type(t.engine).__name__ == "ReplicatedEngine" and t.engine.n_replicas == 2
        t.train_step(1)
        engine, real_train_step = t.engine, t.engine.train_step

        def kill_replica_1_then_train_step(samples):
            # Replica 1 is confirmed dead before the step's calls go out, so its call fails and replica 0 is left in
            # the all-reduce. (Killing it after the calls went out raced: on this tiny model replica 1 could finish
            # its step before the kill landed, and the death then surfaced in a later call.)
            ray.kill(engine.actors[1])
            for _ in range(300):
                try:
                    ray.get(engine.actors[1].info.remote(), timeout=10)
                    time.sleep(0.1)
                except ray.exceptions.RayActorError:
                    break
            else:
                raise AssertionError("replica 1 still answers after ray.kill")
            return real_train_step(samples)

        monkeypatch.setattr(engine, "train_step", kill_replica_1_then_train_step)
        with pytest.raises(ReplicaError, match=r"replica 1 of 2 died during train_step.*resume the run from its "
                                               r"last checkpoint"):
            t.train_step(2)
        with pytest.raises(ReplicaError, match="closed"):
            engine.generate([[1, 2]], [0])
    assert _steps(run / "metrics.jsonl") == [1]
    assert [c.name for c in ckpts.iterdir()] == ["step_000001"]

    # resumed on the one in-process engine (and the sandbox on Ray actors): checkpoint 1 exactly, then step 2
    with Trainer(load_run_config(run, ["--engine.replicas=1", "--executor.ray=true"]), run, resume=True) as t:
        assert type(t.engine).__name__ == "TorchEngine" and type(t.executor).__name__ == "RayExecutor"
        assert t.step == 1
        _assert_engine_is_checkpoint(t, ckpts / "step_000001")
        t.run()
    assert _steps(run / "metrics.jsonl") == [1, 2]

    # and back on 2 replicas: checkpoint 2 on both, one more step with a PBT round (children broadcast), in sync
    with Trainer(load_run_config(run, ["--engine.replicas=2", "--run.steps=3"]), run, resume=True) as t:
        assert t.engine.n_replicas == 2 and t.step == 2
        _assert_engine_is_checkpoint(t, ckpts / "step_000002")
        t.run()
        assert any(rec["step"] == 3 for rec in t.population.lineage)
        d = t.engine.replica_digests()
        assert d[0] == d[1]
    assert _steps(run / "metrics.jsonl") == [1, 2, 3]
    assert [c.name for c in sorted(ckpts.iterdir())] == [f"step_00000{k}" for k in (1, 2, 3)]
    assert "engine.replicas" not in __import__("lorapop.train.loop", fromlist=["COMPAT_FIELDS"]).COMPAT_FIELDS
