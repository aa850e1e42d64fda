"""Experiment trackers of ``run.report_to`` beside TensorBoard: wandb, trackio and mlflow, each fed by its own thread.

The main loop puts a step's scalars on every tracker's queue and goes on: nothing in a step waits on a tracker's
network or disk. A tracker's thread makes every call into its library (start, log, finish), so a slow or hung
tracker delays only itself. The queues are drained at checkpoints (bounded wait) and at close.

Each tracker keeps its run id and the last step it took in the run directory (``trackers.json``, via
lorapop/records/rundir.py), so that:

* ``--resume`` continues the same tracker run (wandb: the id lorapop chose, ``resume="allow"``; trackio: the run's
  name with ``resume="must"``, checked against its id; mlflow: the run id), and a resumed run is one run in the
  dashboard;
* every step reaches a tracker once. Steps the killed process had not sent yet (still queued at the kill) are sent
  from metrics.jsonl on resume; steps it had sent past the checkpoint are not sent again when the resumed run
  repeats them. A resumed run repeats what the killed one computed (lorapop/train/loop.py: every stage's seed is
  derived from (seed, step)); only the ``time/*`` values differ, and the tracker keeps the first ones;
* a tracker that fails (network gone, disk full, bad credentials) is reported once and gets nothing more in this
  process; the run goes on, metrics.jsonl stays the record, and a later ``--resume`` sends the tracker the
  checkpointed steps it missed.

Which steps a tracker "took" is what it says itself where it can: wandb's service process buffers its writes, and
dies with the run when the whole process group is SIGKILLed, so for wandb the resumed run asks wandb (online: the
resumed run's step; offline: the history in the killed process's .wandb files) instead of trusting trackers.json.
trackio's writer thread (every 0.5 s) dies with the process, so on local storage its database decides too. mlflow
writes before its call returns, so trackers.json is exact for it (and for trackio on a Space or server).

The config goes in as the run's config: wandb ``config``, trackio ``config``, mlflow params (dotted keys,
``run.steps``; params cannot change in mlflow, so a resume adds only the ones the run lacks).
"""

from __future__ import annotations

import json
import math
import queue
import secrets
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from lorapop.records.rundir import METRICS, RunDir, iter_jsonl

# Seconds the loop waits for the trackers' queues: at a checkpoint (the steps before it are then on record in
# trackers.json) and at close (where the trackers also finish their runs).
CHECKPOINT_FLUSH_S = 30.0
CLOSE_FLUSH_S = 120.0


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The values a tracker can plot: finite numbers, as TensorBoard gets them (``step``/``time`` of a
    metrics.jsonl line are its coordinates, not metrics)."""
    return {k: float(v) for k, v in metrics.items()
            if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)}


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"run": {"steps": 2}}`` -> ``{"run.steps": "2"}`` (mlflow params are flat strings)."""
    out = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v if isinstance(v, str) else json.dumps(v)
    return out


class Backend:
    """One tracker library. ``start`` returns the state to keep in trackers.json (at least ``id``). The defaults
    of ``log``/``close`` drive a wandb-style run object (``run.log(values, step=)``, ``run.finish()``), which
    trackio copies."""

    name = ""
    run: Any = None

    def prepare(self, state: dict[str, Any]) -> dict[str, Any]:
        """The state to save before ``start`` (in the main thread, at once)."""
        return state

    def start(self, state: dict[str, Any], config: dict[str, Any], project: str, run_name: str) -> dict[str, Any]:
        raise NotImplementedError

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()

    def taken(self) -> int | None:
        """After ``start``: the last step the tracker itself holds, where it can tell (None: trust trackers.json)."""
        return None


def wandb_records(path: Path) -> Iterator[Any]:
    """The protobuf ``Record``s of a .wandb file: wandb's LevelDB-style log (a 7-byte header ':W&B', magic,
    version; then 32 KiB blocks of chunks: crc32c (4 bytes), length (2, little endian), type (1 full, 2 first,
    3 middle, 4 last), data). A torn or damaged tail (a killed writer) ends the reading."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    if data[:4] != b":W&B":
        return
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7]) if left >= 7 else (0, 0)
        if kind == 0:  # the rest of a block is padding
            pos += left
            continue
        if pos + 7 + length > len(data):
            return
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = pb.Record()
            try:
                rec.ParseFromString(buf)
            except Exception:
                return
            yield rec


class Wandb(Backend):
    name = "wandb"

    def prepare(self, state):
        # The id is chosen by lorapop and saved before wandb starts, so even a run killed inside wandb.init resumes
        # into the same wandb run. Offline runs (WANDB_MODE=offline) with one id sync into one run.
        return dict(state, id=state.get("id") or secrets.token_hex(4))

    def start(self, state, config, project, run_name):
        import wandb

        self.run = wandb.init(project=project, name=run_name, id=state["id"], resume="allow", config=config,
                              reinit="create_new")
        return state

    def taken(self) -> int | None:
        if not self.run.offline:
            return max(0, self.run.step - 1)  # a resumed run's step is one past the last one wandb holds
        here = Path(self.run.dir).parent  # <WANDB_DIR>/wandb/offline-run-<time>-<id>/files
        earlier = [d for d in here.parent.glob(f"offline-run-*-{self.run.id}") if d != here]
        return max((r.history.step.num for d in earlier for f in d.glob("*.wandb") for r in wandb_records(f)
                    if r.WhichOneof("record_type") == "history"), default=0)


class Trackio(Backend):
    name = "trackio"

    def start(self, state, config, project, run_name):
        import trackio

        if state.get("id"):
            try:
                self.run = trackio.init(project=project, name=state["name"], resume="must", config=config,
                                        embed=False)
            except ValueError as e:
                if "does not exist" not in str(e):
                    raise
                # Its writer thread died with a killed process before the run reached its database: nothing of it
                # exists, so this run starts it (taken() is then 0 and every step so far is sent once).
                self.run = trackio.init(project=project, name=state["name"], resume="never", config=config,
                                        embed=False)
                return dict(state, id=self.run.id, name=self.run.name)
            if self.run.id != state["id"]:  # trackio resumes by name: a later run may have taken it
                raise RuntimeError(f"the trackio run named {state['name']!r} in project {project!r} is another run "
                                   f"now (id {self.run.id}; this run's is {state['id']})")
            return state
        self.run = trackio.init(project=project, name=run_name, resume="never", config=config, embed=False)
        return dict(state, id=self.run.id, name=self.run.name)

    def taken(self) -> int | None:
        if self.run.url is not None:  # a Space or a trackio server: trackers.json is what we know
            return None
        from trackio.sqlite_storage import SQLiteStorage

        # its local database: what its writer thread had written when the last process ended
        return SQLiteStorage.get_max_step_for_run(self.run.project, self.run.name, run_id=self.run.id) or 0


class Mlflow(Backend):
    name = "mlflow"

    def start(self, state, config, project, run_name):
        from mlflow import MlflowClient
        from mlflow.entities import Param

        self.client = MlflowClient()  # MLFLOW_TRACKING_URI, else mlflow's default store
        have: set[str] = set()
        if state.get("id"):
            have = set(self.client.get_run(state["id"]).data.params)
            self.client.update_run(state["id"], status="RUNNING")
        else:
            exp = self.client.get_experiment_by_name(project)
            exp_id = exp.experiment_id if exp else self.client.create_experiment(project)
            state = dict(state, id=self.client.create_run(exp_id, run_name=run_name).info.run_id)
        self.run_id = state["id"]
        params = [Param(k, v[:6000]) for k, v in flatten(config).items() if k not in have]
        for i in range(0, len(params), 100):  # mlflow's batch limits: 100 params, 1000 metrics
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        return state

    def log(self, step, values):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        ms = [Metric(k, v, now, step) for k, v in values.items()]
        for i in range(0, len(ms), 1000):
            self.client.log_batch(self.run_id, metrics=ms[i:i + 1000])

    def close(self):
        self.client.set_terminated(self.run_id)


BACKENDS: dict[str, type[Backend]] = {b.name: b for b in (Wandb, Trackio, Mlflow)}


class _States:
    """trackers.json, shared by the tracker threads (each updates its own entry)."""

    def __init__(self, rundir: RunDir):
        self.rundir, self.lock = rundir, threading.Lock()
        self.data = rundir.read_trackers()

    def get(self, name: str) -> dict[str, Any]:
        with self.lock:
            return dict(self.data.get(name, {}))

    def put(self, name: str, state: dict[str, Any]) -> None:
        with self.lock:
            self.data[name] = dict(state)
            self.rundir.write_trackers(self.data)


class TrackerThread:
    """A backend behind a queue: ``put`` never blocks; the thread starts the backend, logs, and finishes it."""

    def __init__(self, backend: Backend, states: _States, config: dict[str, Any], project: str, run_name: str,
                 report: Callable[[str], None]):
        self.backend, self.states, self.report = backend, states, report
        self.name = backend.name
        self.state = backend.prepare(states.get(self.name))
        self.state.setdefault("last_step", 0)
        states.put(self.name, self.state)
        # steps the tracker already took (before a kill), as trackers.json says until the tracker says otherwise
        self.skip_through = int(self.state["last_step"])
        self.failed = False
        self._pending = 0
        self._cond = threading.Condition()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, args=(config, project, run_name),
                                        name=f"lorapop-{self.name}", daemon=True)
        self._thread.start()

    def put(self, step: int, values: dict[str, float]) -> None:
        if self.failed:
            return
        with self._cond:
            self._pending += 1
        self._queue.put((step, values))

    def _fail(self, what: str, e: BaseException) -> None:
        if not self.failed:
            self.failed = True
            self.report(f"{self.name}: {what} failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                        f"); it gets no more metrics in this process. metrics.jsonl keeps every step, and --resume "
                        f"sends {self.name} the checkpointed steps it missed")

    def _work(self, config: dict[str, Any], project: str, run_name: str) -> None:
        try:
            self.state = self.backend.start(self.state, config, project, run_name)
            taken = self.backend.taken()
            if taken is not None:
                self.skip_through = self.state["last_step"] = taken
            self.states.put(self.name, self.state)
        except Exception as e:
            self._fail("starting its run", e)
        while True:
            item = self._queue.get()
            if item is None:
                break
            step, values = item
            if not self.failed and step > self.skip_through:
                try:
                    self.backend.log(step, values)
                    self.state["last_step"] = step
                    self.states.put(self.name, self.state)
                except Exception as e:
                    self._fail(f"logging step {step}", e)
            with self._cond:
                self._pending -= 1
                self._cond.notify_all()
        if not self.failed:
            try:
                self.backend.close()
            except Exception as e:
                self._fail("finishing its run", e)

    def flush(self, timeout: float) -> bool:
        """Wait until every step put so far is logged (or dropped after a failure); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float) -> bool:
        self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()


def _stderr(text: str) -> None:
    print(f"lorapop: {text}", file=sys.stderr, flush=True)


class Trackers:
    """The trackers of one run: ``log`` fans a step out to each; on start, the metrics.jsonl steps a tracker has
    not taken yet (its run continues from a kill, or it was added on resume) are sent to it first."""

    def __init__(self, rundir: RunDir, names: list[str], config: dict[str, Any], project: str, run_name: str,
                 report: Callable[[str], None] = _stderr):
        self.report = report
        states = _States(rundir)
        self.threads = [TrackerThread(BACKENDS[n](), states, config, project, run_name, report) for n in names]
        if self.threads:
            for _, rec in iter_jsonl(rundir.file(METRICS), []):
                self._put(int(rec.get("step", 0)), scalars(rec))

    def _put(self, step: int, values: dict[str, float]) -> None:
        for t in self.threads:
            t.put(step, values)

    def log(self, step: int, values: dict[str, float]) -> None:
        """``values``: a step's :func:`scalars`."""
        if self.threads:
            self._put(step, values)

    def flush(self, timeout: float = CHECKPOINT_FLUSH_S) -> None:
        end = time.monotonic() + timeout
        for t in self.threads:
            t.flush(max(0.0, end - time.monotonic()))

    def close(self, timeout: float = CLOSE_FLUSH_S) -> None:
        end = time.monotonic() + timeout
        for t in self.threads:
            if not t.close(max(0.0, end - time.monotonic())):
                self.report(f"{t.name}: still sending after {timeout:.0f} s at close; left behind (metrics.jsonl "
                            "keeps every step)")
        self.threads = []
