"""The run directory: the one module that knows its layout, writes it (the trainer) and reads it (eval, report).

```
runs/<name>/
  config.yaml          resolved config; written first, with the directory itself, in one rename
  metrics.jsonl        one line per step
  tasks.jsonl          one line per valid task (program, inputs, outputs, its answers and their statuses)
  probe.jsonl          run.probe_interval: one line per (probe step, member, probe task), and step 0's noise floor
  population.json      members (Member fields + rating), lineage
  trackers.json        per run.report_to tracker (wandb, trackio, mlflow): its run id and the last step it took
  coverage_centroids.npy, events.out.tfevents.*   (written by the coverage tracker / TensorBoard)
  checkpoints/step_XXXXXX/   adapters/<member>/ (PEFT), engine_state.pt, trainer_state.json, COMPLETE (last)
  eval.json            `lorapop eval`
  retention.json       `lorapop retention`
  report.html          `lorapop report`
```

Crash consistency, so that every state of a run directory has a way forward:

* the directory is created with its ``config.yaml`` in one rename, so it never exists without its config;
* a checkpoint is written into ``checkpoints/.tmp-step_XXXXXX-<pid>`` and renamed when complete (``COMPLETE`` is
  written last), so a kill leaves the previous checkpoint or the new one, never half of one; temp dirs are removed
  on the next start;
* JSONL lines are fsynced one by one; on resume lines past the checkpoint (and a torn last line) are dropped;
* a directory with no complete checkpoint holds nothing to resume: :meth:`RunDir.clear` empties it (only if
  everything in it is something the trainer writes) and the run starts again from step 0.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from lorapop import faults
from lorapop.records import RunDirError
from lorapop.records.members import AdapterFiles, Member, role_from_id

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
TASKS = "tasks.jsonl"
PROBE = "probe.jsonl"  # run.probe_interval (lorapop/train/probe.py)
POPULATION = "population.json"
EVAL = "eval.json"
RETENTION = "retention.json"  # `lorapop retention` (lorapop/retention/study.py)
REPORT = "report.html"
TRACKERS = "trackers.json"  # lorapop/train/trackers.py
CENTROIDS = "coverage_centroids.npy"
CHECKPOINTS = "checkpoints"
TRAINER_STATE = "trainer_state.json"
ENGINE_STATE = "engine_state.pt"
ADAPTERS = "adapters"
COMPLETE = "COMPLETE"
# Files a reader can show; a directory with none of them is not a run directory.
KNOWN_FILES = (CONFIG, METRICS, TASKS, POPULATION, EVAL)
# Every top-level name a run or a lorapop command writes (the layout above): what :meth:`RunDir.clear` may delete.
RUN_FILES = (CONFIG, METRICS, TASKS, PROBE, POPULATION, TRACKERS, CENTROIDS, CHECKPOINTS, EVAL, RETENTION, REPORT)
STEP_RE = re.compile(r"^step_(\d{6,})$")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=1))


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    return str(x)


class JsonlWriter:
    """Append-only JSONL; each write is flushed and fsynced so a SIGKILL can only tear the line being written."""

    def __init__(self, path: Path):
        self.path = path
        self.fh: TextIO = open(path, "a")

    def write(self, *records: dict[str, Any]) -> None:
        self.fh.write("".join(json.dumps(r, default=_jsonable) + "\n" for r in records))
        self.fh.flush()
        os.fsync(self.fh.fileno())

    def close(self) -> None:
        self.fh.close()


def read_text(path: Path, notes: list[str]) -> str | None:
    """The file's text, None when absent; an unreadable file is noted, never raised."""
    if not path.is_file():
        return None
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError as e:
        notes.append(f"{path.name}: unreadable ({type(e).__name__}: {e}), skipped")
        return None


def iter_jsonl(path: Path, notes: list[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every line that is a JSON object; the others are described in ``notes``."""
    text = read_text(path, notes)
    if text is None:
        return
    lines = text.split("\n")
    ends_clean = text.endswith("\n")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            last = i == len(lines) and not ends_clean
            notes.append(f"{path.name} line {i}: {'truncated' if last else 'not valid JSON'}, skipped")
            continue
        if not isinstance(obj, dict):
            notes.append(f"{path.name} line {i}: not a JSON object, skipped")
            continue
        yield i, obj


def read_json(path: Path, notes: list[str]) -> Any:
    text = read_text(path, notes)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as e:
        notes.append(f"{path.name}: not valid JSON ({e}), skipped")
        return None


def truncate_jsonl(path: Path, max_step: int) -> int:
    """Keep only complete lines with ``step <= max_step`` (a resumed run rewrites the steps after its checkpoint, so
    nothing is counted twice). A torn last line from a kill is dropped too. Returns the number of lines dropped."""
    if not path.exists():
        return 0
    kept, dropped = [], 0
    with open(path, "rb") as fh:
        for raw in fh:
            try:
                rec = json.loads(raw)
                ok = raw.endswith(b"\n") and int(rec.get("step", 0)) <= max_step
            except (ValueError, TypeError, AttributeError):
                ok = False
            if ok:
                kept.append(raw)
            else:
                dropped += 1
    write_text_atomic(path, b"".join(kept).decode())
    return dropped


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


def checkpoint_step(ckpt: Path) -> int:
    m = STEP_RE.match(Path(ckpt).name)
    if not m:
        raise RunDirError(f"{ckpt}: not a checkpoint directory name (step_XXXXXX)")
    return int(m.group(1))


# ---- the run directory ---------------------------------------------------------------------------------------------

class RunDir:
    """One run directory. Writing is the trainer's; every reader (eval, report) goes through here too."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    def file(self, name: str) -> Path:
        return self.path / name

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    def has_config(self) -> bool:
        return (self.path / CONFIG).is_file()

    def is_empty(self) -> bool:
        return not self.path.is_dir() or not any(self.path.iterdir())

    def resumable(self) -> bool:
        """A config and a complete checkpoint: what ``--resume`` continues from."""
        return self.has_config() and self.latest_checkpoint() is not None

    def create(self, config_yaml: str) -> None:
        """Make the directory holding ``config.yaml`` as one rename, so no kill can leave it without its config.
        An existing empty directory is replaced; a non-empty one is an error (see :meth:`clear`)."""
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(f"{self.path}: exists and is not a directory")
        if not self.is_empty():
            raise RunDirError(f"{self.path}: already exists and is not empty")
        parent = self.path.parent
        parent.mkdir(parents=True, exist_ok=True)
        tmp = parent / f".tmp-{self.path.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        write_text_atomic(tmp / CONFIG, config_yaml)
        if self.path.is_dir():
            self.path.rmdir()
        os.replace(tmp, self.path)
        _fsync_dir(parent)

    def clear(self) -> list[str]:
        """Empty a directory that holds nothing resumable (no complete checkpoint), so the run can start again.
        Refuses, deleting nothing, when it holds a complete checkpoint or anything the trainer does not write.
        Returns the names removed."""
        if self.latest_checkpoint() is not None:
            raise RunDirError(f"{self.path}: holds a complete checkpoint; continue it with --resume {self.path}")
        names = sorted(p.name for p in self.path.iterdir())
        foreign = [n for n in names if not _trainer_file(n)]
        if foreign:
            raise RunDirError(f"{self.path}: holds files a run does not write ({', '.join(foreign[:5])}); move them "
                              "away or choose another --run.name")
        for n in names:
            p = self.path / n
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        return names

    # ---- config -------------------------------------------------------------------------------------------------
    def read_config(self) -> dict[str, Any]:
        """The parsed ``config.yaml`` ({} when absent); a file that is not a YAML mapping is an error."""
        p = self.path / CONFIG
        if not p.is_file():
            return {}
        import yaml

        try:
            cfg = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise RunDirError(f"{p}: not valid YAML ({e})") from e
        if cfg is not None and not isinstance(cfg, dict):
            raise RunDirError(f"{p}: not a YAML mapping")
        return cfg or {}

    def model_name(self) -> str:
        """The base model of the run: ``model.name``, else ``embedded``."""
        model = self.read_config().get("model")
        return str((model.get("name") if isinstance(model, dict) else None) or "embedded")

    def is_single(self) -> bool:
        pop = self.read_config().get("population")
        return isinstance(pop, dict) and pop.get("mode") == "single"

    # ---- logs ---------------------------------------------------------------------------------------------------
    def open_metrics(self) -> JsonlWriter:
        return JsonlWriter(self.path / METRICS)

    def open_tasks(self) -> JsonlWriter:
        return JsonlWriter(self.path / TASKS)

    def open_probe(self) -> JsonlWriter:
        return JsonlWriter(self.path / PROBE)

    def truncate_logs(self, step: int) -> None:
        """Drop log lines past ``step`` (what a killed run logged after its last checkpoint)."""
        for name in (METRICS, TASKS, PROBE):
            truncate_jsonl(self.path / name, step)

    def write_population(self, step: int, members: list[dict[str, Any]], lineage: list[dict[str, Any]],
                         sandbox: dict[str, Any] | None = None) -> None:
        """``sandbox``: the executor's protections and whether they isolate (lorapop/executor/sandbox.py)."""
        extra = {"sandbox": sandbox} if sandbox is not None else {}
        write_json_atomic(self.path / POPULATION, {"step": step, "members": members, "lineage": lineage, **extra})

    def write_eval(self, result: dict[str, Any]) -> None:
        write_json_atomic(self.path / EVAL, result)

    def read_trackers(self) -> dict[str, dict[str, Any]]:
        """Per tracker name, what lets ``--resume`` continue its run: its id and the last step it took."""
        state = read_json(self.path / TRACKERS, [])
        return {k: v for k, v in state.items() if isinstance(v, dict)} if isinstance(state, dict) else {}

    def write_trackers(self, state: dict[str, dict[str, Any]]) -> None:
        write_json_atomic(self.path / TRACKERS, state)

    # ---- checkpoints --------------------------------------------------------------------------------------------
    def list_checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.checkpoints.is_dir():
            return []
        found = []
        for p in self.checkpoints.iterdir():
            m = STEP_RE.match(p.name)
            if m and (p / COMPLETE).is_file():  # written last, after trainer_state.json
                found.append((int(m.group(1)), p))
        return [p for _, p in sorted(found)]

    def latest_checkpoint(self) -> Path | None:
        ckpts = self.list_checkpoints()
        return ckpts[-1] if ckpts else None

    def find_checkpoint(self, step: int | None = None) -> Path:
        """The complete checkpoint of ``step``, else the latest one."""
        if not self.path.is_dir():
            raise RunDirError(f"run directory not found: {self.path}")
        found = {checkpoint_step(p): p for p in self.list_checkpoints()}
        if step is not None:
            if step not in found:
                raise RunDirError(f"no checkpoint for step {step} in {self.checkpoints} "
                                  f"(have: {sorted(found) or 'none'})")
            return found[step]
        if not found:
            raise RunDirError(f"no complete checkpoint (step_XXXXXX/COMPLETE) in {self.checkpoints}")
        return found[max(found)]

    def clean_temp(self) -> list[Path]:
        """Remove checkpoint temp dirs left by a process killed mid-write; returns what was removed."""
        removed = []
        if self.checkpoints.is_dir():
            for p in self.checkpoints.iterdir():
                if p.name.startswith(".tmp-"):
                    shutil.rmtree(p, ignore_errors=True)
                    removed.append(p)
        return removed

    @contextmanager
    def new_checkpoint(self, step: int, keep: int = 0) -> Iterator[Path]:
        """Yields a temp directory to fill; on a clean exit it is marked complete and renamed to
        ``step_XXXXXX`` (replacing an older one of that step), then all but the ``keep`` newest are deleted."""
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        final = self.checkpoints / checkpoint_name(step)
        tmp = self.checkpoints / f".tmp-{checkpoint_name(step)}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            yield tmp
            faults.checkpoint_pause()
            (tmp / COMPLETE).write_text(str(step))
            _fsync_dir(tmp)
        except OSError as e:
            # A full disk (or quota) mid-write: the partial copy goes, so the space it took is free again, and the
            # last complete checkpoint was never touched: the run can be resumed once there is room.
            shutil.rmtree(tmp, ignore_errors=True)
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            last = self.latest_checkpoint()
            raise RunDirError(
                f"checkpoint of step {step} not written: {os.strerror(e.errno)} under {self.checkpoints}. "
                + (f"The last complete checkpoint, {last.name}, is intact" if last is not None
                   else "No complete checkpoint exists yet")
                + f"; free some space (run.keep_checkpoints bounds what a run keeps), then `lorapop train --resume "
                  f"{self.path}`") from e
        if final.exists():  # re-running a step after a resume: the new write replaces the old one whole
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(self.checkpoints)
        if keep > 0:
            for old in self.list_checkpoints()[:-keep]:
                shutil.rmtree(old, ignore_errors=True)

    @staticmethod
    def read_trainer_state(ckpt: Path) -> dict[str, Any]:
        try:
            with open(Path(ckpt) / TRAINER_STATE) as fh:
                return json.load(fh)
        except (OSError, ValueError) as e:
            raise RunDirError(f"{Path(ckpt) / TRAINER_STATE}: unreadable ({e})") from e

    def checkpoint_members(self, ckpt: Path) -> list[Member]:
        """The members of a checkpoint (its adapter directories, sorted by id), each with its PEFT adapter's shape.
        Records come from the checkpoint's trainer state, else ``population.json``, else the id's prefix."""
        adir = Path(ckpt) / ADAPTERS
        dirs = sorted(p for p in adir.iterdir() if p.is_dir()) if adir.is_dir() else []
        if not dirs:
            raise RunDirError(f"checkpoint has no adapters: {adir} (expected adapters/<member_id>/ PEFT directories)")
        known = self._member_records(Path(ckpt))
        members = []
        for d in dirs:
            cfg_path = d / "adapter_config.json"
            if not cfg_path.is_file() or not (d / "adapter_model.safetensors").is_file():
                raise RunDirError(f"not a PEFT adapter directory (adapter_config.json + adapter_model.safetensors): "
                                  f"{d}")
            try:
                cfg = json.loads(cfg_path.read_text())
                tm = cfg.get("target_modules") or []
                files = AdapterFiles(d, int(cfg["r"]), float(cfg.get("lora_alpha", cfg["r"])),
                                     [tm] if isinstance(tm, str) else list(tm))
            except (ValueError, KeyError, TypeError) as e:
                raise RunDirError(f"{cfg_path}: not a PEFT adapter config ({type(e).__name__}: {e})") from e
            rec = known.get(d.name)
            if rec is None:
                rec = Member(d.name, -1, role_from_id(d.name) or "unknown")
            members.append(Member(rec.id, rec.slot, rec.role, rec.born_step, rec.parents, rec.operator, files))
        return members

    def _member_records(self, ckpt: Path) -> dict[str, Member]:
        notes: list[str] = []
        sources = []
        state = read_json(ckpt / TRAINER_STATE, notes)
        if isinstance(state, dict):
            sources.append(state.get("population"))
        sources.append(read_json(self.path / POPULATION, notes))
        for pop in sources:
            try:
                return {str(m["id"]): Member.from_json(m) for m in pop["members"]}
            except (KeyError, TypeError, ValueError):
                continue
        return {}


def _trainer_file(name: str) -> bool:
    return (name in RUN_FILES or name.startswith("events.out.tfevents")
            or (name.startswith(".") and ".tmp-" in name))
