"""Benchmark and seed data shipped in the package (provenance, licences, conversion: README.md here); nothing is
read at import time. Imports nothing of lorapop. :func:`data_dir` (``$LORAPOP_DATA_DIR``, else the package's) is
where ``lorapop eval`` looks for benchmarks and ``selfplay.seed_files`` for seed files."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DATA_DIR = Path(__file__).resolve().parent


def data_dir() -> Path:
    """``$LORAPOP_DATA_DIR`` when set, else the data shipped in the package."""
    env = os.environ.get("LORAPOP_DATA_DIR")
    return Path(env).expanduser() if env else PACKAGE_DATA_DIR


def resolve_data_file(path: str | Path) -> Path | None:
    """``path`` itself when it is a file, else ``data_dir() / path`` when that is; ``None`` when neither is."""
    p = Path(path).expanduser()
    if p.is_file():
        return p
    q = data_dir() / p
    return q if not p.is_absolute() and q.is_file() else None
