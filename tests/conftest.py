"""Shared fixtures. The real embedded model is loaded once per test session (session scope) because each load
costs seconds on this CPU; tests that use it are marked ``slow`` but still run in CI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# No test may touch the network (the model and dataset hubs are unreachable where the suite runs, and a test that
# passes only online is a bug). Set before any test module imports huggingface_hub, which reads these at import;
# os.environ so that subprocesses (CLI smoke runs, the sandbox, Ray workers) inherit them. Forced, not setdefault:
# a developer's HF_HUB_OFFLINE=0 must not make the suite reach out either.
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ[_var] = "1"

# Under pytest-xdist (scripts/test.sh: 2 workers on 2 cores) every worker and the processes it starts (CLI runs,
# sandbox workers) use one torch thread: two multi-threaded torch jobs on the same cores spin on each other's threads
# and run many times slower, where two one-threaded ones each keep a core. Set before torch is imported.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = "1"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The benchmark and seed data shipped in the package (``lorapop/data``)."""
    from lorapop.data import PACKAGE_DATA_DIR

    assert (PACKAGE_DATA_DIR / "seeds").is_dir(), f"package data missing at {PACKAGE_DATA_DIR}"
    return PACKAGE_DATA_DIR


@pytest.fixture(scope="session")
def embedded_model():
    """(model, tokenizer) of the embedded SmolLM2-135M-Instruct, frozen, fp32, CPU. Do not mutate it."""
    import torch

    torch.manual_seed(0)
    from lorapop.model import load_base_model

    return load_base_model("embedded")


# Longest files first. scripts/test.sh hands each worker a whole file at a time (--dist loadfile) in the order
# collected (--no-loadscope-reorder: xdist's own reorder puts the files with the most tests first, whatever their
# length), so a minute-long file handed out last keeps one worker busy while the other idles (docs/RESULTS.md, "Test
# suite time per processor"). Files are ordered by their seconds in tests/durations.json (a recorded run:
# scripts/test_durations.py); a file not in it goes first, since it may be long and a short file early costs
# nothing. Within a file the order is unchanged.
@pytest.fixture
def many_files():
    """1,100 descriptors held open for the test (select refuses any numbered past 1,023): what a trainer holding an
    engine's and Ray's files looks like; skipped where this process may not hold that many."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip("this process may not hold 1,200 files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = []
    try:
        while len(held) < 1100:
            held.append(os.open("/dev/null", os.O_RDONLY))
        yield held
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def pytest_collection_modifyitems(session, config, items):
    import json

    path = Path(__file__).with_name("durations.json")
    seconds = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        first_seen.setdefault(item.nodeid.split("::")[0], i)

    def key(item):
        f = item.nodeid.split("::")[0]
        return (-seconds.get(f, float("inf")), first_seen[f])

    items.sort(key=key)
