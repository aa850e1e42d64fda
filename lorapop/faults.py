"""The test seam: fault injection for the kill and crash-consistency tests, and nothing else. Production code marks
the points a test may kill it at with :func:`fault_point` and the checkpoint write a test may stretch with
:func:`checkpoint_pause`; both do nothing unless the environment variables below are set (only tests set them).

``LORAPOP_TEST_KILL_AT=<point>``: SIGKILL the process (its group, when it leads one) on reaching ``<point>``: "run_dir",
"coverage", "engine", or "step<N>:<stage>". ``LORAPOP_TEST_CHECKPOINT_PAUSE_S=<s>``: sleep inside a checkpoint
write, after the adapters are on disk and before the rename.
"""

from __future__ import annotations

import os
import signal
import time

PAUSE_ENV = "LORAPOP_TEST_CHECKPOINT_PAUSE_S"
KILL_ENV = "LORAPOP_TEST_KILL_AT"


def fault_point(name: str) -> None:
    """Die here, like a SIGKILL would, when ``$LORAPOP_TEST_KILL_AT`` names this point."""
    if os.environ.get(KILL_ENV) != name:
        return
    # the whole group when we lead it (the CLI under a test), so the sandbox workers die with us as they would
    if os.getpgid(0) == os.getpid():
        os.killpg(0, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def checkpoint_pause() -> None:
    """Sleep ``$LORAPOP_TEST_CHECKPOINT_PAUSE_S`` seconds (a kill test's window inside a checkpoint write)."""
    pause = float(os.environ.get(PAUSE_ENV, "0") or 0)
    if pause > 0:
        time.sleep(pause)
