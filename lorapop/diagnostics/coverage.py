"""Coverage of program space: a CVT archive over normalised program descriptors (docs/METHOD.md, Diagnostics).

Every valid task lands in one cell of a Centroidal Voronoi Tessellation of the unit cube over
`COVERAGE_DESCRIPTORS` (AST depth, cyclomatic complexity, lines of code, distinct node types, input size). Coverage is
the fraction of cells ever filled: overall, by the tasks each teacher proposed, and by the tasks each student faced.

Normalisation is linear with fixed bounds and clipping (`DEFAULT_BOUNDS`, documented there), never fitted to the data,
so two runs with the same bounds and the same centroids file give comparable numbers.

The centroids are pyribs' k-means CVT (shipped for the default settings); a cell is the nearest centroid, the lookup
pyribs' `CVTArchive.index_of` does, computed here with numpy. The filled-cell sets are kept here because an archive
stores one elite per cell and has no notion of "which teacher filled this cell".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterable
from typing import Any

import numpy as np

from lorapop.configlib import doc

COVERAGE_DESCRIPTORS: tuple[str, ...] = ("ast_depth", "cyclomatic", "loc", "n_node_types", "input_size")
CENTROIDS_FILE = "coverage_centroids.npy"

# (low, high) per descriptor, in the units of `program_descriptors`. Values outside are clipped to the edge cell.
# Chosen to span what short single-function programs from small models produce: `def f(x): return x` sits at the low
# corner (depth 5, cc 1, 2 lines, ~6 node types); a 40-line function with nested loops and branches at the high one.
DEFAULT_BOUNDS: dict[str, tuple[float, float]] = {
    "ast_depth": (2.0, 20.0),
    "cyclomatic": (1.0, 20.0),
    "loc": (1.0, 40.0),
    "n_node_types": (4.0, 48.0),
    "input_size": (0.0, 160.0),  # characters of the inputs' canonical reprs, summed (see complexity.input_size)
}


@dataclass
class CoverageConfig:
    n_cells: int = doc(512, "number of CVT cells (k-means centroids) when generating", ge=1)
    centroids_path: str | None = doc(
        None, "load centroids from this .npy ((n_cells, 5) array in the unit cube) instead of generating them; pass "
              "another run's coverage_centroids.npy to make coverage numbers comparable")
    seed: int = doc(0, "seed of the centroid generation (samples and k-means)")
    kmeans_samples: int = doc(
        20_000, "uniform samples clustered into centroids; 20k samples x 50 iterations takes ~0.3 s on one core, "
                "pyribs' default 100k takes several seconds for a barely more uniform CVT", ge=1)
    kmeans_max_iter: int = doc(50, "k-means iterations when generating centroids", ge=1)
    bounds: dict[str, tuple[float, float]] = doc(
        DEFAULT_BOUNDS, "descriptor -> (low, high) for linear normalisation to [0, 1] with clipping; keys are "
                        "ast_depth, cyclomatic, loc, n_node_types, input_size")


def normalise(descriptors: dict[str, float], bounds: dict[str, Any] | None = None) -> np.ndarray:
    """The descriptors as a point of the unit cube, in `COVERAGE_DESCRIPTORS` order. NaN counts as the low edge."""
    bounds = bounds or DEFAULT_BOUNDS
    missing = [k for k in COVERAGE_DESCRIPTORS if k not in descriptors]
    if missing:
        raise ValueError(f"descriptors lack {missing}; expected the keys of program_descriptors()")
    x = np.array([float(descriptors[k]) for k in COVERAGE_DESCRIPTORS], dtype=np.float64)
    lo = np.array([float(bounds.get(k, DEFAULT_BOUNDS[k])[0]) for k in COVERAGE_DESCRIPTORS])
    hi = np.array([float(bounds.get(k, DEFAULT_BOUNDS[k])[1]) for k in COVERAGE_DESCRIPTORS])
    x = np.nan_to_num(x, nan=-np.inf)
    return np.clip((x - lo) / np.maximum(hi - lo, 1e-12), 0.0, 1.0)


# Centroids of the default generation settings, made once by pyribs (:func:`kmeans_centroids`) and shipped: every
# run and every CLI process used to import pyribs (with scikit-learn and numba, ~2.5 s of CPU) and re-run the same
# seeded k-means; the suite starts dozens of such processes. Shipped, the default cells are also the same bits on
# every processor. tests/test_coverage.py checks the file against a fresh generation.
SHIPPED_CENTROIDS = Path(__file__).resolve().parents[1] / "data" / "coverage" / "cvt_n512_seed0_s20000_i50.npy"


def kmeans_centroids(config: CoverageConfig) -> np.ndarray:
    """pyribs' k-means CVT centroids for ``config`` (its cells, seed, samples and iterations)."""
    from ribs.archives import k_means_centroids

    centroids, _ = k_means_centroids(
        centroids=config.n_cells, ranges=[(0.0, 1.0)] * len(COVERAGE_DESCRIPTORS), samples=config.kmeans_samples,
        seed=config.seed, k_means_kwargs={"max_iter": config.kmeans_max_iter})
    return np.asarray(centroids, dtype=np.float64)


def generate_centroids(config: CoverageConfig) -> np.ndarray:
    """The centroids ``config`` generates: the shipped file for the default settings, else :func:`kmeans_centroids`."""
    if _generation(config) == _generation(CoverageConfig()):
        return np.load(SHIPPED_CENTROIDS)
    return kmeans_centroids(config)


def _generation(config: CoverageConfig) -> tuple[int, int, int, int]:
    return config.n_cells, config.seed, config.kmeans_samples, config.kmeans_max_iter


def _save_npy_atomic(path: Path, arr: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as fh:
        np.save(fh, arr)
    os.replace(tmp, path)


def _check_centroids(c: np.ndarray, source: str) -> np.ndarray:
    c = np.asarray(c, dtype=np.float64)
    if c.ndim != 2 or c.shape[1] != len(COVERAGE_DESCRIPTORS) or c.shape[0] < 1 or not np.isfinite(c).all():
        raise ValueError(f"centroids from {source} must be a finite (n_cells, {len(COVERAGE_DESCRIPTORS)}) array, "
                         f"got shape {c.shape}")
    return c


class CoverageTracker:
    """Filled CVT cells overall, per teacher and per student.

    Centroids come from, in order: the `centroids` argument; `config.centroids_path`; `run_dir/coverage_centroids.npy`
    when it exists (a resumed run); otherwise they are generated from `config.seed`. Whatever their source, they are
    written to `run_dir/coverage_centroids.npy` when `run_dir` is given, so every run directory holds its own.
    """

    def __init__(self, config: CoverageConfig | None = None, run_dir: str | Path | None = None,
                 centroids: np.ndarray | None = None) -> None:
        self.config = config or CoverageConfig()
        run_file = Path(run_dir) / CENTROIDS_FILE if run_dir is not None else None
        if centroids is not None:
            c = _check_centroids(centroids, "the centroids argument")
        elif self.config.centroids_path:
            p = Path(self.config.centroids_path)
            if not p.is_file():
                raise FileNotFoundError(f"coverage centroids file not found: {p}")
            c = _check_centroids(np.load(p), str(p))
        elif run_file is not None and run_file.is_file():
            c = _check_centroids(np.load(run_file), str(run_file))
        else:
            c = generate_centroids(self.config)
        if run_file is not None and not (run_file.is_file() and np.array_equal(np.load(run_file), c)):
            _save_npy_atomic(run_file, c)
        self._set_centroids(c)
        self.filled: set[int] = set()
        self.by_teacher: dict[str, set[int]] = {}
        self.by_student: dict[str, set[int]] = {}
        self.n_added = 0

    def _set_centroids(self, c: np.ndarray) -> None:
        self.centroids = c

    @property
    def n_cells(self) -> int:
        return int(self.centroids.shape[0])

    def cell_of(self, descriptors: dict[str, float]) -> int:
        # The nearest centroid, as pyribs' CVTArchive.index_of finds it (tests/test_coverage.py compares them): a
        # brute-force argmin over 512 x 5 is microseconds, without importing pyribs into every process.
        x = normalise(descriptors, self.config.bounds)
        return int(np.argmin(((self.centroids - x) ** 2).sum(axis=1)))

    def add(self, descriptors: dict[str, float], teacher_id: str | None = None, student_id: str | None = None) -> int:
        """Record one valid task; returns its cell. A task faced by several students is added once per student."""
        cell = self.cell_of(descriptors)
        self.filled.add(cell)
        if teacher_id is not None:
            self.by_teacher.setdefault(str(teacher_id), set()).add(cell)
        if student_id is not None:
            self.by_student.setdefault(str(student_id), set()).add(cell)
        self.n_added += 1
        return cell

    def forget(self, keep: set[str]) -> None:
        """Drop the per-member cells of members not in ``keep`` (the live ones; their series ended when they were
        replaced). The run's own ``filled`` cells stay."""
        self.by_teacher = {k: v for k, v in self.by_teacher.items() if k in keep}
        self.by_student = {k: v for k, v in self.by_student.items() if k in keep}

    def coverage(self) -> float:
        return len(self.filled) / self.n_cells

    def coverage_by_teacher(self) -> dict[str, float]:
        return {k: len(v) / self.n_cells for k, v in sorted(self.by_teacher.items())}

    def coverage_by_student(self) -> dict[str, float]:
        return {k: len(v) / self.n_cells for k, v in sorted(self.by_student.items())}

    def metrics(self, members: Iterable[str] | None = None) -> dict[str, float]:
        """The `coverage*` keys of metrics.jsonl (docs/ARCHITECTURE.md). Pass the live member ids as `members` so a
        replaced member's series ends where it died instead of being logged flat forever."""
        keep = None if members is None else {str(m) for m in members}
        out = {"coverage": self.coverage()}
        out.update({f"coverage/teacher/{k}": v for k, v in self.coverage_by_teacher().items()
                    if keep is None or k in keep})
        out.update({f"coverage/student/{k}": v for k, v in self.coverage_by_student().items()
                    if keep is None or k in keep})
        return out

    def state_dict(self) -> dict[str, Any]:
        """JSON-able. Holds the centroids too, so a resumed run needs no side file to reproduce its numbers."""
        return {
            "version": 1,
            "centroids": self.centroids.tolist(),
            "bounds": {k: list(v) for k, v in self.config.bounds.items()},
            "filled": sorted(self.filled),
            "by_teacher": {k: sorted(v) for k, v in self.by_teacher.items()},
            "by_student": {k: sorted(v) for k, v in self.by_student.items()},
            "n_added": self.n_added,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        c = _check_centroids(np.asarray(state["centroids"], dtype=np.float64), "state_dict")
        if not np.array_equal(c, self.centroids):
            self._set_centroids(c)
        if "bounds" in state:
            self.config.bounds = {k: tuple(v) for k, v in state["bounds"].items()}
        n = self.n_cells
        cells = lambda xs: {int(i) for i in xs if 0 <= int(i) < n}  # noqa: E731
        self.filled = cells(state.get("filled", []))
        self.by_teacher = {k: cells(v) for k, v in state.get("by_teacher", {}).items()}
        self.by_student = {k: cells(v) for k, v in state.get("by_student", {}).items()}
        self.n_added = int(state.get("n_added", 0))
