"""CVT coverage: centroids saved and reusable, per-teacher/per-student sets, checkpoint round trip."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from lorapop.diagnostics.complexity import program_descriptors
from lorapop.diagnostics.coverage import (CENTROIDS_FILE, COVERAGE_DESCRIPTORS, DEFAULT_BOUNDS, CoverageConfig,
                                          CoverageTracker, generate_centroids, normalise)

SMALL = dict(n_cells=64, kmeans_samples=3000)


def _desc(**kw) -> dict[str, float]:
    d = {k: DEFAULT_BOUNDS[k][0] for k in COVERAGE_DESCRIPTORS}
    d.update(kw)
    return d


def _programs(n: int, seed: int = 0) -> list[dict[str, float]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        body = "\n".join(f"    {'    ' * (i % 3)}if x > {i}:\n    {'    ' * (i % 3)}    x -= {i}"
                         for i in range(int(rng.integers(0, 6))))
        prog = f"def f(x):\n{body}\n    return x\n" if body else "def f(x):\n    return x\n"
        out.append(program_descriptors(prog, [str(list(range(int(rng.integers(0, 40)))))]))
    return out


def test_normalise_bounds_and_clipping():
    assert np.allclose(normalise(_desc()), 0.0)
    hi = {k: DEFAULT_BOUNDS[k][1] * 10 for k in COVERAGE_DESCRIPTORS}
    assert np.allclose(normalise(hi), 1.0)
    mid = {k: sum(DEFAULT_BOUNDS[k]) / 2 for k in COVERAGE_DESCRIPTORS}
    assert np.allclose(normalise(mid), 0.5)
    assert np.allclose(normalise(_desc(loc=float("nan"))), 0.0)
    with pytest.raises(ValueError, match="loc"):
        normalise({k: 1.0 for k in COVERAGE_DESCRIPTORS if k != "loc"})


def test_config_fields_are_documented():
    fields = {f.name: f for f in dataclasses.fields(CoverageConfig)}
    assert fields["n_cells"].default == 512
    for f in fields.values():
        assert f.metadata.get("help"), f.name


def test_default_centroid_generation_is_in_the_unit_cube_and_seeded():
    # Its speed is not asserted here (a timed unit test fails on a loaded machine; speed belongs in bench/).
    c = generate_centroids(CoverageConfig())
    assert c.shape == (512, 5) and (c >= 0).all() and (c <= 1).all()
    assert np.array_equal(generate_centroids(CoverageConfig(**SMALL, seed=3)),
                          generate_centroids(CoverageConfig(**SMALL, seed=3)))


def test_shipped_default_centroids_are_pyribs_generation_and_cells_are_pyribs_lookup():
    import torch
    from ribs.archives import CVTArchive

    from floattol import sum_tol
    from lorapop.diagnostics.coverage import SHIPPED_CENTROIDS, kmeans_centroids

    shipped = np.load(SHIPPED_CENTROIDS)
    assert np.array_equal(generate_centroids(CoverageConfig()), shipped)
    # each centroid is a mean of the ~40 samples of its cell, after 50 rounds: another processor's k-means may round
    # each mean differently, never by more than a sum over all the samples
    fresh = kmeans_centroids(CoverageConfig())
    np.testing.assert_allclose(shipped, fresh, rtol=0, atol=sum_tol(torch.float64, CoverageConfig().kmeans_samples))
    # the cell of a point is the one pyribs' archive gives it: on random points, on the centroids, at the corners
    archive = CVTArchive(solution_dim=0, centroids=shipped, ranges=[(0.0, 1.0)] * len(COVERAGE_DESCRIPTORS))
    tracker = CoverageTracker(CoverageConfig())
    lo = np.array([DEFAULT_BOUNDS[k][0] for k in COVERAGE_DESCRIPTORS])
    hi = np.array([DEFAULT_BOUNDS[k][1] for k in COVERAGE_DESCRIPTORS])
    rng = np.random.default_rng(0)
    points = np.concatenate([rng.random((2000, 5)), shipped[::7], np.zeros((1, 5)), np.ones((1, 5))])
    ours = [tracker.cell_of(dict(zip(COVERAGE_DESCRIPTORS, lo + u * (hi - lo)))) for u in points]
    assert ours == [int(i) for i in archive.index_of(points)]
    assert len(set(ours)) > 400  # the points really spread over the cells


def test_a_default_tracker_never_imports_pyribs():
    """pyribs (with scikit-learn and numba) cost every run ~2.5 s of CPU to import; the default cells need none of it."""
    import subprocess
    import sys

    code = ("import sys\nfrom lorapop.diagnostics.coverage import COVERAGE_DESCRIPTORS, CoverageTracker\n"
            "t = CoverageTracker()\nt.add({k: 3.0 for k in COVERAGE_DESCRIPTORS})\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ribs', 'sklearn', 'numba')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_centroids_saved_in_run_dir_and_reused(tmp_path):
    a = CoverageTracker(CoverageConfig(**SMALL, seed=1), run_dir=tmp_path / "a")
    saved = np.load(tmp_path / "a" / CENTROIDS_FILE)
    assert np.array_equal(saved, a.centroids) and a.n_cells == 64
    # a resumed run finds its own centroids even with another seed in its config
    again = CoverageTracker(CoverageConfig(**SMALL, seed=99), run_dir=tmp_path / "a")
    assert np.array_equal(again.centroids, saved)
    # another run compares with it by loading the file; its run dir gets a copy
    b = CoverageTracker(CoverageConfig(centroids_path=str(tmp_path / "a" / CENTROIDS_FILE), seed=7),
                        run_dir=tmp_path / "b")
    assert np.array_equal(np.load(tmp_path / "b" / CENTROIDS_FILE), saved)
    progs = _programs(40)
    for d in progs:
        a.add(d, "t0", "s0")
        b.add(d, "t9", "s9")
    assert a.coverage() == b.coverage() > 0
    other = CoverageTracker(CoverageConfig(**SMALL, seed=2))
    assert not np.array_equal(other.centroids, saved)


def test_bad_centroid_sources(tmp_path):
    with pytest.raises(FileNotFoundError):
        CoverageTracker(CoverageConfig(centroids_path=str(tmp_path / "missing.npy")))
    np.save(tmp_path / "bad.npy", np.zeros((10, 3)))
    with pytest.raises(ValueError, match="shape"):
        CoverageTracker(CoverageConfig(centroids_path=str(tmp_path / "bad.npy")))


def test_coverage_overall_by_teacher_and_by_student():
    c = np.eye(5)  # 5 cells, one per axis corner: easy to aim at
    tr = CoverageTracker(CoverageConfig(), centroids=np.vstack([c, np.zeros((1, 5))]))
    assert tr.coverage() == 0.0
    lo = _desc()
    at = lambda k: _desc(**{k: DEFAULT_BOUNDS[k][1]})  # noqa: E731
    assert tr.add(lo, "t0", "s0") == 5
    assert tr.add(at("loc"), "t0", "s1") == 2
    tr.add(at("loc"), "t1", "s1")  # same cell again: no new coverage
    tr.add(at("ast_depth"), "t1", None)  # a task nobody faced counts for its teacher only
    assert tr.coverage() == pytest.approx(3 / 6)
    assert tr.coverage_by_teacher() == pytest.approx({"t0": 2 / 6, "t1": 2 / 6})
    assert tr.coverage_by_student() == pytest.approx({"s0": 1 / 6, "s1": 1 / 6})
    m = tr.metrics()
    assert m["coverage"] == tr.coverage() and m["coverage/teacher/t1"] == 2 / 6 and m["coverage/student/s0"] == 1 / 6
    live = tr.metrics(members=["t0", "s1"])
    assert set(live) == {"coverage", "coverage/teacher/t0", "coverage/student/s1"}


def test_state_dict_round_trip_through_json(tmp_path):
    tr = CoverageTracker(CoverageConfig(**SMALL, seed=4), run_dir=tmp_path / "run")
    progs = _programs(60, seed=1)
    for i, d in enumerate(progs[:30]):
        tr.add(d, f"t{i % 2}", f"s{i % 3}")
    before = (tr.coverage(), tr.coverage_by_teacher(), tr.coverage_by_student())
    state = json.loads(json.dumps(tr.state_dict()))
    # a resumed process: different seed and no run dir, so only the state can give the same centroids
    resumed = CoverageTracker(CoverageConfig(**SMALL, seed=123))
    resumed.load_state_dict(state)
    assert (resumed.coverage(), resumed.coverage_by_teacher(), resumed.coverage_by_student()) == before
    for i, d in enumerate(progs[30:]):
        assert resumed.add(d, "t0", "s0") == tr.add(d, "t0", "s0")
    assert resumed.coverage() == tr.coverage() and resumed.n_added == tr.n_added == 60
