"""The repository carries everything it reads: no file of the package, tests, benches or scripts may refer to a
``shared`` directory beside the checkout (a user who clones lorapop has none)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# "../shared", "parents[2] / 'shared'", "LORAPOP_SHARED_DATA": every way the old layout was reached.
FORBIDDEN = re.compile(r"\.\./shared|/\s*[\"']shared[\"']|LORAPOP_SHARED")


def _files():
    for top in ("lorapop", "tests", "bench", "scripts", ".ci"):
        for p in (REPO / top).rglob("*"):
            if p.is_file() and p.suffix in {".py", ".sh", ".yaml", ".yml", ".toml", ".md", ".cfg", ""}:
                yield p
    yield REPO / "pyproject.toml"
    yield REPO / "README.md"


def test_no_file_refers_to_a_shared_directory_beside_the_checkout():
    me = Path(__file__).resolve()
    offenders = []
    for p in _files():
        if p.resolve() == me:
            continue
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if FORBIDDEN.search(line):
                offenders.append(f"{p.relative_to(REPO)}:{i}: {line.strip()}")
    assert not offenders, "files refer to ../shared:\n" + "\n".join(offenders)


def test_the_forbidden_pattern_catches_the_old_layouts():
    for line in ['DATA = Path(__file__).parents[2] / "shared" / "data"', "see ../shared/data/seeds",
                 'os.environ.get("LORAPOP_SHARED_DATA")']:
        assert FORBIDDEN.search(line), line
    assert not FORBIDDEN.search("the shared base model")


def test_every_shipped_data_file_is_in_the_package_and_listed_in_its_provenance():
    from lorapop.data import PACKAGE_DATA_DIR

    readme = (PACKAGE_DATA_DIR / "README.md").read_text()
    files = sorted(p.relative_to(PACKAGE_DATA_DIR).as_posix() for p in PACKAGE_DATA_DIR.rglob("*.jsonl"))
    assert len(files) >= 10
    for f in files:
        assert f"`{f}`" in readme, f"{f} has no provenance line in lorapop/data/README.md"
    # setuptools must ship them (package-data globs), or a non-editable install has no data.
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"data/*/*.jsonl"' in pyproject and '"data/README.md"' in pyproject


def test_seed_files_resolve_relative_to_the_package_data(tmp_path, monkeypatch):
    from lorapop.data import resolve_data_file

    assert resolve_data_file("seeds/azr_7b_coder_seed_io.jsonl").is_file()
    assert resolve_data_file("seeds/nope.jsonl") is None
    own = tmp_path / "x.jsonl"
    own.write_text("{}\n")
    assert resolve_data_file(own) == own
    monkeypatch.setenv("LORAPOP_DATA_DIR", str(tmp_path))
    assert resolve_data_file("x.jsonl") == own
