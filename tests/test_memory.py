"""Resident memory by stage (lorapop/hostmem.py): the stage peaks a run logs add up to the process's peak, and the
CPU KV cache holds in memory what its rows touch, not its capacity, and only during its generate call."""

from __future__ import annotations

import gc
import sys

import pytest
import torch

from test_engine_helpers import tiny_engine
from lorapop import hostmem
from lorapop.engine.base import SamplingParams, TrainSample

MB = 2**10  # kB per MB

linux_peaks = pytest.mark.skipif(not hostmem.PeakWindow().exact,
                                 reason="VmHWM cannot be reset here (not Linux, or /proc/self/clear_refs refused)")


def _touch(mb: int) -> torch.Tensor:
    return torch.ones(mb * 2**18)  # float32: every page written


@linux_peaks
def test_stage_peaks_add_up_to_the_whole_window():
    """An outer window sees the largest of the stages inside it, each stage its own peak; a part opened inside a
    stage (bench/memory.py's windows) does not hide the stage's peak from it."""
    eng = tiny_engine(2)
    gc.collect()  # what earlier tests left for the collector would otherwise be freed inside the window
    hostmem.release_free_memory()
    outer, stages = hostmem.PeakWindow(), hostmem.StagePeaks()
    rss0 = hostmem.proc_status_kb("VmRSS")
    stages.begin("generate")
    eng.generate([eng.chat_prompt("hi")] * 2, [0, 1], SamplingParams(max_new_tokens=4))
    stages.begin("big")
    x = _touch(192)
    inner = hostmem.PeakWindow()  # a part inside the stage: its reset must not lose the 192 MB already reached
    del x
    y = _touch(16)
    inner.close()
    del y
    stages.begin("idle")  # opened after "big" was freed: holds nothing of it
    rss_idle = hostmem.proc_status_kb("VmRSS")
    stages.begin("update")
    p = eng.chat_prompt("a")
    eng.train_step([TrainSample(p, [5, 6, 7], 0, 1.0), TrainSample(p, [8, 9], 1, -1.0)])
    peaks = stages.take()
    whole = outer.close()
    assert list(peaks)[-4:] == ["generate", "big", "idle", "update"]
    assert peaks["big"] * 2**20 >= rss0 + 190 * MB  # the stage's own peak, despite the part's reset
    assert peaks["idle"] * 2**20 < rss_idle + 100 * MB  # and not the next stage's
    # every stage, the one open before the first begin() included: memory resident when the window opened and freed
    # before "generate" began (a collection, a trim) is the window's peak and that first stage's, no later one's
    assert max(peaks.values()) == pytest.approx(whole / 2**20, abs=0.002)
    assert hostmem.peak_kb() >= whole  # the process's peak outlives every reset
    assert hostmem.process_memory()["perf/cpu_memory_peak_gb"] >= peaks["big"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmRSS")
def test_cpu_kv_cache_is_resident_only_where_rows_write_and_only_in_its_call():
    """A page pool of 64 rows x 32768 positions (268 MB for this model) takes memory only for the pages two short
    rows touch, and those pages go back (the pool all zeros again) when generate returns."""
    eng = tiny_engine(2, gen_batch_size=64, max_model_len=32768, kv_cache_gib=1.0)
    dec_bytes = 2 * 2 * 2 * 8 * (32768 * 64 + 16) * 4  # k and v x layers x kv heads x head_dim x positions x float32
    eng.generate([eng.chat_prompt("hi")], [0], SamplingParams(max_new_tokens=2))  # first-call allocations
    seen = {"bytes": sum(t.numel() * t.element_size() for t in eng.kv.cache.k + eng.kv.cache.v)}
    w = hostmem.PeakWindow()
    before = hostmem.proc_status_kb("VmRSS")
    eng.generate([eng.chat_prompt("hi")] * 2, [0, 1], SamplingParams(max_new_tokens=8))
    grew = (w.close() - before) if w.exact else (hostmem.proc_status_kb("VmRSS") - before)
    assert seen["bytes"] == dec_bytes
    assert grew * 1024 < dec_bytes / 8, (grew, dec_bytes)  # torch.zeros would make all of it resident
    k0 = eng.kv.cache.k[0]
    assert hostmem.drop_pages(k0) and not k0.any()  # eager on CPU: its pages went back when the call returned
    assert hostmem.drop_pages(torch.ones(3)) is False  # not a lazily resident tensor: the caller drops it instead
