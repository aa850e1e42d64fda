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
