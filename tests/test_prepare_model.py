"""`lorapop prepare-model`: a local directory is checked and described; a hub id comes from the
Hugging Face cache when it is there and, with the hub unreachable (tests/conftest.py forces HF_HUB_OFFLINE=1), fails
at once with an error naming HF_HUB_OFFLINE and the local-path alternative. The download itself needs the network,
which no test has; it is `huggingface_hub.snapshot_download`, called as the cached case calls it."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from lorapop.cli import main
from lorapop.model import prepare_model

pytestmark = pytest.mark.slow  # runs the CLI on the embedded model's files


@pytest.fixture(scope="module")
def embedded_dir() -> Path:
    return prepare_model("embedded")


def _params(path: Path) -> int:
    from safetensors import safe_open

    n = 0
    for f in path.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as st:
            n += sum(st.get_tensor(k).numel() for k in st.keys())
    return n


def test_local_directory_is_checked_and_described(embedded_dir, capsys):
    assert main(["prepare-model", str(embedded_dir)]) == 0
    out = capsys.readouterr().out.strip()
    size = sum(f.stat().st_size for f in embedded_dir.rglob("*") if f.is_file())
    assert out == (f"model ready: {embedded_dir} (llama, {_params(embedded_dir) / 1e6:.0f}M parameters in 1 weight "
                   f"file, {size / 1e9:.2f} GB)")


def test_a_truncated_weight_file_or_a_missing_tokenizer_is_refused(embedded_dir, tmp_path, capsys):
    bad = tmp_path / "m"
    shutil.copytree(embedded_dir, bad)
    weights = next(bad.glob("*.safetensors"))
    with open(weights, "r+b") as fh:
        fh.truncate(weights.stat().st_size // 2)
    assert main(["prepare-model", str(bad)]) == 2
    assert f"weight file {weights} is unreadable" in capsys.readouterr().err
    for f in bad.glob("tokenizer*"):
        f.unlink()
    assert main(["prepare-model", str(bad)]) == 2
    assert f"{bad} does not load" in capsys.readouterr().err


def test_hub_id_offline_and_not_cached_fails_at_once_naming_the_alternatives(monkeypatch, tmp_path, capsys):
    import huggingface_hub.constants as hf

    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(tmp_path))  # an empty cache, whatever this machine holds
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    t0 = time.monotonic()
    assert main(["prepare-model", "Qwen/Qwen2.5-Coder-7B"]) == 2
    assert time.monotonic() - t0 < 30  # "at once": the hub client alone retries for about a minute
    err = capsys.readouterr().err
    assert "cannot download 'Qwen/Qwen2.5-Coder-7B': HF_HUB_OFFLINE is set" in err
    assert "lorapop prepare-model DIR" in err and "--model.name=DIR" in err


def test_hub_id_already_in_the_hf_cache_is_ready_offline(embedded_dir, monkeypatch, tmp_path, capsys):
    """The Hugging Face cache's own layout (refs/main names the snapshot; files link to blobs), filled with the
    embedded model's files: what a finished `snapshot_download` leaves."""
    import huggingface_hub.constants as hf

    repo = tmp_path / "models--someorg--small-model"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for i, f in enumerate(sorted(p for p in embedded_dir.iterdir() if p.is_file())):
        blob = repo / "blobs" / f"blob{i}"
        shutil.copy(f, blob)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(tmp_path))
    assert main(["prepare-model", "someorg/small-model"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"model ready: {snap} (llama, ") and "1 weight file" in out
