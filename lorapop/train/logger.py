"""Per-step logging: ``metrics.jsonl`` (one line per step, TRL-style names), TensorBoard events beside it, and a
live progress display that degrades to plain lines when stdout is not a terminal."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from lorapop.records.rundir import RunDir
from lorapop.train.trackers import scalars


# What the live table and the plain lines show: the solve rate is the matched students' on this step's valid tasks
# (top-ups from the buffer apart, named as such); the tie fractions say whether the rewards gave the update anything
SHOWN = ("valid_rate", "format_error_rate", "student/matched_solve_rate", "student/topup_solve_rate",
         "teacher/reward", "student/reward", "teacher/zero_adv_group_frac", "student/zero_adv_group_frac")


def memory_peak(metrics: dict[str, Any]) -> str:
    """The step's peak resident memory and the stage that reached it, e.g. ``1.83 GB (update)``; "" without them."""
    gb, stage = metrics.get("perf/cpu_memory_step_peak_gb"), metrics.get("perf/cpu_memory_peak_stage")
    return f"{gb:.2f} GB ({stage})" if isinstance(gb, (int, float)) and stage else ""


class Progress:
    """Step, stage, valid rate, solve rates, rewards and time per stage: a rich live table on a terminal, plain
    lines elsewhere (CI logs), nothing with mode 'none'."""

    def __init__(self, mode: str, total_steps: int, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        if mode == "auto":
            mode = "rich" if self.stream.isatty() else "plain"
        self.mode = mode
        self.total = total_steps
        self.live = None
        self.stage_times: dict[str, float] = {}
        self.step = 0
        self.stage = ""
        self.last: dict[str, Any] = {}
        self.work: Any = None  # the lorapop.progress bar of the work in flight, drawn as a row
        if mode == "rich":
            from rich.console import Console
            from rich.live import Live

            self.live = Live(self._render(), console=Console(file=self.stream), refresh_per_second=4)
            self.live.start()
            # Generation, sandbox and update bars (lorapop.progress) draw as a row of this table: rich allows one
            # live display at a time.
            from lorapop import progress as work_progress

            work_progress.set_host(self._on_work)

    def _render(self) -> Any:
        from rich.table import Table

        t = Table(title=f"lorapop  step {self.step}/{self.total}  stage: {self.stage}", expand=False)
        t.add_column("metric")
        t.add_column("value", justify="right")
        for key in SHOWN:
            if key in self.last:
                t.add_row(key, f"{self.last[key]:.3f}")
        if memory_peak(self.last):
            t.add_row("peak memory", memory_peak(self.last))
        for stage, sec in self.stage_times.items():
            t.add_row(f"time/{stage}", f"{sec:.1f}s")
        if self.work is not None:
            t.add_row("working", self.work.line())
        return t

    def _on_work(self, bar: Any) -> None:
        self.work = bar
        if self.live is not None:
            self.live.update(self._render())

    def begin_stage(self, step: int, stage: str) -> None:
        self.step, self.stage = step, stage
        if self.live is not None:
            self.live.update(self._render())
        elif self.mode == "plain":
            print(f"[step {step}/{self.total}] {stage} ...", file=self.stream, flush=True)

    def end_step(self, step: int, metrics: dict[str, Any], stage_times: dict[str, float]) -> None:
        self.last, self.stage_times, self.stage = metrics, stage_times, "done"
        if self.live is not None:
            self.live.update(self._render())
        elif self.mode == "plain":
            parts = [f"{k}={metrics[k]:.3f}" for k in SHOWN if isinstance(metrics.get(k), (int, float))]
            times = " ".join(f"{k}={v:.1f}s" for k, v in stage_times.items())
            mem = f" | peak memory {memory_peak(metrics)}" if memory_peak(metrics) else ""
            print(f"[step {step}/{self.total}] {' '.join(parts)} | {times}{mem}", file=self.stream, flush=True)

    def message(self, text: str) -> None:
        if self.live is not None:
            self.live.console.print(text)
        elif self.mode != "none":
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.live is not None:
            from lorapop import progress as work_progress

            work_progress.set_host(None)
            self.live.stop()
            self.live = None


class MetricsLogger:
    """metrics.jsonl and tasks.jsonl (the record), and the trackers of ``run.report_to``: TensorBoard event files
    beside them, and wandb/trackio/mlflow through :class:`lorapop.train.trackers.Trackers` (each on its own thread,
    so a step never waits on a tracker's network or disk)."""

    def __init__(self, run_dir: RunDir, report_to: list[str] | tuple[str, ...] = ("tensorboard",),
                 purge_step: int | None = None, config: dict[str, Any] | None = None, project: str = "lorapop",
                 run_name: str | None = None):
        self.metrics = run_dir.open_metrics()
        self.tasks = run_dir.open_tasks()
        self.tb = None
        self.trackers = None
        if "tensorboard" in report_to:
            try:
                from torch.utils.tensorboard import SummaryWriter

                # purge_step hides events a killed run wrote past its last checkpoint, so curves are not doubled
                self.tb = SummaryWriter(str(run_dir.path), purge_step=purge_step)
            except ImportError:  # tensorboard is a dependency, but a broken install must not stop training
                self.tb = None
        others = [n for n in report_to if n != "tensorboard"]
        if others:
            from lorapop.train.trackers import Trackers

            self.trackers = Trackers(run_dir, others, config or {}, project, run_name or run_dir.path.name)

    def log_step(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, "time": time.time(), **metrics}
        self.metrics.write(record)
        values = scalars(metrics)  # what TensorBoard and the trackers can plot
        if self.trackers is not None:
            self.trackers.log(step, values)
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()

    def log_tasks(self, records: list[dict[str, Any]]) -> None:
        if records:
            self.tasks.write(*records)

    def flush(self) -> None:
        """At a checkpoint: wait (bounded) until the trackers have taken every step so far."""
        if self.trackers is not None:
            self.trackers.flush()

    def close(self) -> None:
        self.metrics.close()
        self.tasks.close()
        if self.tb is not None:
            self.tb.close()
        if self.trackers is not None:
            self.trackers.close()
            self.trackers = None
