"""Shared fixtures. The real embedded model is loaded once per test session (session scope) because each load
costs seconds on this CPU; tests that use it are marked ``slow`` but still run in CI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """`../shared/data` beside the checkout (where CI puts it), or $LORAPOP_SHARED_DATA."""
    env = os.environ.get("LORAPOP_SHARED_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    d = shared_data_dir()
    if not d.is_dir():
        pytest.fail(f"benchmark/seed data not found at {d} (set LORAPOP_SHARED_DATA)")
    return d


@pytest.fixture(scope="session")
def embedded_model():
    """(model, tokenizer) of the embedded SmolLM2-135M-Instruct, frozen, fp32, CPU. Do not mutate it."""
    import torch

    torch.manual_seed(0)
    from lorapop.model import load_base_model

    return load_base_model("embedded")
