"""Shared fixtures. The real embedded model is loaded once per test session (session scope) because each load
costs seconds on this CPU; tests that use it are marked ``slow`` but still run in CI."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


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
