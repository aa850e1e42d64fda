"""Peak resident memory of a `cpu_demo` step, per stage and per part of a stage.

    .venv/bin/python bench/memory.py [--config cpu_demo] [--steps 1] [--keep DIR] [-- --engine.gen_batch_size=32 ...]

Runs the shipped `cpu_demo` config (or ``--config``, a shipped name or a YAML file) for ``--steps`` steps (default
1) in this process and reads Linux's ``VmHWM`` in
windows (lorapop/hostmem.py, ``PeakWindow``): one per stage of the step (the trainer's own stages, loading the run
included as ``start``) and one per part inside them, the engine's methods wrapped here: the KV cache's allocation,
the prefill and decode of generation, the update's forward (``response_logprobs`` under autograd), its chunked
log-softmax (``scoring``, also run again inside backward, where each chunk is checkpointed), the backward and the
optimizer step. Each figure is the whole process's peak resident memory inside that window (everything resident,
the base model included), not what the part added. Resident memory, not timings: figures stand on a shared machine.

Last line: JSON with ``peak_gb`` (the process's peak over the run), ``stage_peaks_gb`` (stage -> GB),
``part_peaks_gb`` ("stage/part" -> GB), ``rss_after_load_gb``, ``s_per_step``, ``plan_gb`` (`lorapop plan --cpu`'s
peak for the same config, its process taken as this one's before the run loaded), ``plan_over_measured``,
``longest_prompt`` and ``longest_update_row`` (tokens: what the plan's ``--prompt-tokens`` stands for); with
``--compare-update R`` also the last generate call's and update's seconds and added peak under each of ``--arms``
(checkpointing one layer in N, glibc's mmap threshold, or the code before the memory fix), interleaved, with each
arm's generate, update and estimated step time over the first arm's (``compare_s``, ``compare_over_ref``,
``compare_added_gb``, ``compare_same_update``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lorapop import hostmem  # noqa: E402
from lorapop.config import load_config, resolve_config_path  # noqa: E402

GB = 2**20  # kB per GB (as perf/cpu_memory_peak_gb counts them)


class Windows:
    """Peak resident memory per label: the label is ``stage`` or ``stage/part``; a part's window closes its stage's
    window for its duration and the stage's reopens after it, so every moment counts under exactly one label."""

    def __init__(self) -> None:
        self.peaks: dict[str, float] = {}
        self.stage, self.parts, self.closed = "start", [], False
        self.win = hostmem.PeakWindow(reset=False)

    def label(self) -> str:
        return "/".join([self.stage, *self.parts[-1:]])

    def _switch(self, change) -> None:
        kb = self.win.close()
        if self.win.raised():
            lab = self.label()
            self.peaks[lab] = max(self.peaks.get(lab, 0.0), round(kb / GB, 3))
        change()
        self.win = hostmem.PeakWindow()

    def begin_stage(self, name: str) -> None:
        self._switch(lambda: setattr(self, "stage", name))

    @contextmanager
    def part(self, name: str):
        self._switch(lambda: self.parts.append(name))
        try:
            yield
        finally:
            self._switch(self.parts.pop)

    def wrap(self, owner, attr: str, name: str) -> None:
        inner = getattr(owner, attr)

        def wrapped(*a, **k):
            if self.closed or (self.parts and self.parts[-1] == name):  # after the run, or re-entered
                return inner(*a, **k)
            with self.part(name):
                return inner(*a, **k)

        setattr(owner, attr, wrapped)

    def close(self) -> None:
        self._switch(lambda: None)
        self.closed = True


def instrument(w: Windows) -> None:
    from lorapop.engine import model_runner, optim, torch_engine, update
    from lorapop.train import logger

    begin = logger.Progress.begin_stage

    def begin_stage(self, step, stage):
        w.begin_stage(stage)
        return begin(self, step, stage)

    logger.Progress.begin_stage = begin_stage
    w.wrap(torch_engine.TorchEngine, "kv_cache", "kv_cache")
    w.wrap(model_runner.ModelRunner, "prefill", "prefill")
    w.wrap(model_runner.ModelRunner, "decode", "decode")
    w.wrap(torch_engine.TorchEngine, "response_logprobs", "forward")
    w.wrap(update, "chunk_scores", "scoring")
    w.wrap(torch.Tensor, "backward", "backward")
    w.wrap(optim.StackedAdamW, "step", "optimizer")


ARM_BEFORE = "before"  # the code before the memory fix: activations kept, the KV cache zeroed at once and kept, a
# 32 MiB mmap threshold (where glibc's dynamic rule ends)


def parse_arm(arm: str) -> tuple[int, int]:
    """``cNtM``: checkpoint one decoder layer in N (0: none), glibc's mmap threshold at M MiB; ``before``: see
    :data:`ARM_BEFORE`. Returns (N, threshold bytes)."""
    if arm == ARM_BEFORE:
        return 0, 32 * 2**20
    try:
        n, m = arm[1:].split("t")
        assert arm[0] == "c"
        return int(n), int(float(m) * 2**20)
    except (ValueError, AssertionError, IndexError):
        raise SystemExit(f"--arms: {arm!r} is not 'before' or cNtM (N layers per checkpoint, 0 none; M MiB)")


def compare_update(engine, samples, gen, times: dict[str, float], rounds: int, arms: list[str], run_arm: str) -> dict:
    """The step's last generate call and its update again under each of ``arms`` (see :func:`parse_arm`), in turn,
    ``rounds`` times, so the machine's load hits all alike: seconds and the peak each adds to the resident memory it
    starts from. Every arm but ``before`` uses the lazily resident KV cache handed back per call. Each arm's step
    time is estimated from the run's own stage times (measured under ``run_arm``'s settings, one of ``arms``),
    generation and the update scaled by the arm's seconds over ``run_arm``'s, and reported over the first arm's. In
    the first round each arm's updated adapters are compared with the first arm's (``compare_same_update``: equal
    bit for bit), the engine's state put back after each."""
    import statistics

    from lorapop.engine import decode

    lazy, per_call = decode.cache_zeros, engine.kv.per_call
    secs = {arm: {"generate": [], "update": []} for arm in arms}
    added = {arm: 0.0 for arm in arms}
    same: dict[str, bool] = {}
    first: list = []
    for r in range(rounds):
        for arm in arms:
            old = arm == ARM_BEFORE
            every, threshold = parse_arm(arm)
            hostmem.map_large_allocations(threshold)
            engine.cfg.gradient_checkpointing = every > 0
            engine.cfg.gradient_checkpointing_every = max(1, every)
            decode.cache_zeros = (lambda shape, dtype, device: torch.zeros(shape, dtype=dtype)) if old else lazy
            engine.kv.per_call = (lambda: False) if old else per_call
            engine.kv.release()
            state = engine.state_dict() if r == 0 else None
            hostmem.release_free_memory()
            before = hostmem.proc_status_kb("VmRSS") or 0
            win = hostmem.PeakWindow()
            t0 = time.perf_counter()
            engine.generate(*gen[0], **gen[1])
            t1 = time.perf_counter()
            engine.train_step(samples)
            secs[arm]["generate"].append(t1 - t0)
            secs[arm]["update"].append(time.perf_counter() - t1)
            added[arm] = max(added[arm], round((win.close() - before) / GB, 3))
            if state is not None:
                after = engine.state_dict()
                now = [*after["lora_A"], *after["lora_B"]]
                first = first or now
                same[arm] = all(torch.equal(a, b) for a, b in zip(first, now))
                engine.load_state_dict(state)
    decode.cache_zeros, engine.kv.per_call = lazy, per_call
    mean = {arm: {k: statistics.fmean(v) for k, v in d.items()} for arm, d in secs.items()}
    gen_s = times.get("propose", 0.0) + times.get("solve", 0.0)
    upd_s = times.get("update", 0.0)
    rest = sum(t for k, t in times.items() if k not in ("propose", "solve", "update"))

    def step(arm: str) -> float:
        return (gen_s * mean[arm]["generate"] / mean[run_arm]["generate"]
                + upd_s * mean[arm]["update"] / mean[run_arm]["update"] + rest)

    ref = arms[0]
    return {"compare_s": {arm: {k: round(v, 2) for k, v in d.items()} for arm, d in mean.items()},
            "compare_added_gb": added, "compare_same_update": same, "compare_ref": ref,
            "compare_over_ref": {arm: {"generate": round(mean[arm]["generate"] / mean[ref]["generate"], 3),
                                       "update": round(mean[arm]["update"] / mean[ref]["update"], 3),
                                       "step": round(step(arm) / step(ref), 3)} for arm in arms[1:]}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="cpu_demo", help="shipped config name or YAML file (default cpu_demo)")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", default=None, metavar="DIR", help="write the run under DIR (kept) instead of a temporary "
                                                                "directory, e.g. to compare two runs' results")
    ap.add_argument("overrides", nargs="*", help="config overrides, e.g. --engine.gradient_checkpointing=false "
                                                  "(after --)")
    ap.add_argument("--compare-update", type=int, default=0, metavar="R",
                    help="after the run: R rounds of the last step's last generate call and update under each of "
                         "--arms, alternating (see compare_update)")
    ap.add_argument("--arms", default=None, metavar="before,c1t1,...",
                    help="the settings --compare-update alternates, the first the reference: 'before' (the code "
                         "before the memory fix) or cNtM (checkpoint one decoder layer in N, 0 none; glibc's mmap "
                         "threshold at M MiB); default: before and the run's own settings")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from lorapop.plan.cpu import plan_cpu
    from lorapop.train.loop import Trainer

    w = Windows()
    instrument(w)
    extra = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = a.keep or tmp
        cfg = load_config(resolve_config_path(a.config), [*a.overrides, f"--run.output_dir={d}", "--run.name=mem",
                                                          "--run.report_to=none", "--run.progress=plain",
                                                          f"--run.steps={a.steps}"])
        process = (hostmem.proc_status_kb("VmRSS") or 0) * 1024  # torch and transformers imported, nothing loaded
        t = Trainer(cfg, Path(d) / "mem")
        batches, prompts, gens, steps = [], [0], [], []
        t.engine.train_step = lambda samples, inner=t.engine.train_step: batches.append(samples) or inner(samples)

        def generate(p, *x, inner=t.engine.generate, **k):
            prompts.append(max(map(len, p)))
            gens.append(((p, *x), k))
            return inner(p, *x, **k)

        t.engine.generate = generate
        t.train_step = lambda step, inner=t.train_step: steps.append(inner(step)) or steps[-1]
        try:
            loaded = (hostmem.proc_status_kb("VmRSS") or 0) / GB
            t0 = time.perf_counter()
            t.run()
            dt = (time.perf_counter() - t0) / a.steps
            w.close()
            peak = hostmem.peak_kb()  # the run's: the comparison below runs the update without checkpointing too
            if a.compare_update and batches:
                times = {k[5:]: v for k, v in steps[-1].items() if k.startswith("time/")}
                e = cfg.engine
                run_arm = f"c{e.gradient_checkpointing_every if e.gradient_checkpointing else 0}" \
                          f"t{hostmem.MAP_LARGE_BYTES / 2**20:g}" if cfg.run.malloc_trim else ARM_BEFORE
                arms = a.arms.split(",") if a.arms else [ARM_BEFORE, run_arm]
                arms += [] if run_arm in arms else [run_arm]
                extra = compare_update(t.engine, batches[-1], gens[-1], times, a.compare_update, arms, run_arm)
        finally:
            t.close()
    planned = plan_cpu(cfg, 64 * 2**30, process_bytes=process)
    stages: dict[str, float] = {}
    for lab, gb in w.peaks.items():
        s = lab.split("/")[0]
        stages[s] = max(stages.get(s, 0.0), gb)
    res = {"peak_gb": round(peak / GB, 3), "stage_peaks_gb": stages,
           "part_peaks_gb": {k: v for k, v in w.peaks.items() if "/" in k}, "rss_after_load_gb": round(loaded, 3),
           "s_per_step": round(dt, 1), "config": a.config, "steps": a.steps, "exact_windows": w.win.exact,
           "plan_gb": round(planned.peak_bytes / 2**30, 3), "plan_stage": planned.peak_stage,
           "longest_prompt": max(prompts), "longest_update_row": max((len(s.prompt_ids) + len(s.completion_ids)
                                                                      for b in batches for s in b), default=0),
           **extra}
    res["plan_over_measured"] = round(res["plan_gb"] / res["peak_gb"], 3)
    width = max(map(len, w.peaks))
    for lab, gb in w.peaks.items():
        print(f"{lab:<{width}}  {gb:6.2f} GB")
    print(f"peak {res['peak_gb']:.2f} GB over {a.steps} step(s), {dt:.0f} s/step")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
