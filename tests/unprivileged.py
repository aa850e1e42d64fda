"""Run a Python script of this checkout as an ordinary user, to exercise the sandbox's unprivileged path for real
(tests/test_isolation.py, tests/test_verdicts.py, bench/executor.py). A test tool, kept out of the package:
nothing in lorapop runs it.

As root: uid/gid 65534 with every capability gone (``setpriv``, bounding set included, so no exec can bring one
back). The interpreter may live where only root can enter (``/root/.pyenv`` in CI), so a private mount namespace
first binds its prefix and the checkout under a fresh directory that uid can read; Python finds its library from its
own location, so the bound copy works as is. The script runs with ``-S`` (standard library and lorapop only).
As anyone else: the script runs directly, already unprivileged.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NOBODY = 65534
REPO = Path(__file__).resolve().parents[1]


def run(script: str, args: list[str], *, timeout: float) -> subprocess.CompletedProcess:
    """``python -S REPO/script *args`` as an unprivileged user; text output captured."""
    base_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "OMP_NUM_THREADS": "1", "LC_ALL": "C.UTF-8"}
    if os.geteuid() != 0:
        return subprocess.run([sys.executable, "-S", str(REPO / script), *args], capture_output=True, text=True,
                              timeout=timeout, env=dict(base_env, PYTHONPATH=str(REPO)))
    base = os.path.realpath(sys.base_prefix)
    py = os.path.relpath(os.path.realpath(sys.executable), base)
    stage = Path(tempfile.mkdtemp(prefix="lorapop-unpriv-"))
    try:
        os.chmod(stage, 0o755)
        (stage / "py").mkdir()
        (stage / "repo").mkdir()
        drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all", "--", str(stage / "py" / py), "-S", str(stage / "repo" / script), *args]
        binds = 'mount --bind "$1" "$3/py" && mount --bind "$2" "$3/repo" && shift 3 && exec "$@"'
        cmd = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", binds, "sh", base, str(REPO),
               str(stage), *drop]
        # LD_LIBRARY_PATH: an interpreter linked to its own libpython by an absolute RUNPATH under the hidden prefix
        env = dict(base_env, PYTHONPATH=str(stage / "repo"), LD_LIBRARY_PATH=str(stage / "py" / "lib"))
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    finally:
        shutil.rmtree(stage, ignore_errors=True)  # the binds lived in the namespace that ended with the command


def probe_output(script: str, *, timeout: float) -> dict:
    """The JSON object a probe script (tests/verdict_probe.py, tests/channel_probe.py) prints last, run by
    :func:`run` as an unprivileged user, checked to have run in a user namespace; skips the calling test where that
    user may not make one (never as root, whose kernel the CI controls)."""
    import json

    import pytest

    root = os.geteuid() == 0
    if root and shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux)")
    r = run(script, [], timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["uid"] != 0
    if not root and "refused" in out:
        pytest.skip(f"user namespaces unavailable here: {out['refused'][:200]}")
    assert out["protections"]["mechanism"] == "userns", out.get("protections") or out.get("refused")
    return out


def print_probe(probe) -> None:
    """A probe script's main: this checkout importable, then ``probe()``'s result as one line of JSON."""
    import json

    sys.path.insert(0, str(REPO))
    print(json.dumps(probe()))


def probe_executor(out: dict, config):
    """A probe's SandboxExecutor for ``config``, its protections recorded in ``out``; None (with ``out["refused"]``
    saying why) where this user may not isolate programs."""
    from lorapop.executor import SandboxExecutor

    try:
        ex = SandboxExecutor(config)
        out["protections"] = ex.protections
    except RuntimeError as exc:
        out["refused"] = str(exc)
        return None
    return ex
