"""Progress for long work (generation, validation, the update, evaluation).

On a terminal a live ``rich`` bar (done of total, rate, time left); elsewhere (CI, a log file) one plain line every
``interval_s`` seconds and one when the work ends, so a long stage is never silent. ``$LORAPOP_PROGRESS`` picks:
``auto`` (default: bar on a TTY, lines otherwise), ``bar``, ``lines`` or ``off``.

    with progress("propose", total=n_rows, unit="rows") as bar:
        ...
        bar.advance(k)

Progress goes to stderr so that stdout stays parseable (benches end with a JSON line). Only one bar is live at a
time: a bar opened while another is live prints lines instead of fighting it for the terminal. A program that
already owns a live display (the trainer's step table) registers itself with :func:`set_host`; bars then report to
it (it draws their line inside its own display) instead of starting a second live display, which rich forbids.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, TextIO

_live_bar = False  # rich cannot draw two live displays at once
_lock = threading.Lock()  # bars may open from several threads (the sandbox's two determinism passes)
_host: "Callable[[Progress | None], None] | None" = None


def set_host(host: "Callable[[Progress | None], None] | None") -> None:
    """Route bars to ``host`` (called with the bar on each update and with ``None`` when it closes); ``None``
    returns to drawing bars directly."""
    global _host
    _host = host


def _fmt_s(s: float) -> str:
    s = max(0, int(round(s)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """A bar or periodic lines for ``total`` units of work; use through :func:`progress`."""

    def __init__(self, desc: str, total: float, unit: str = "rows", mode: str | None = None,
                 interval_s: float = 5.0, stream: TextIO | None = None):
        self.desc, self.total, self.unit = desc, float(max(total, 0)), unit
        self.interval_s = interval_s
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0.0
        self.t0 = time.monotonic()
        self._last_line = self.t0
        self._last_printed: float | None = None  # `done` of the last line printed, so the closing line is not a repeat
        self._rich = None
        self._task = None
        self.mode = self._choose_mode(mode)

    def _choose_mode(self, mode: str | None) -> str:
        mode = (mode or os.environ.get("LORAPOP_PROGRESS", "auto")).lower()
        if mode not in {"auto", "bar", "lines", "off"}:
            mode = "auto"
        if mode == "auto":
            isatty = getattr(self.stream, "isatty", lambda: False)
            mode = "bar" if isatty() and os.environ.get("CI") is None else "lines"
        if mode == "bar" and _host is not None:
            mode = "host"
        return mode

    def __enter__(self) -> "Progress":
        global _live_bar
        with _lock:
            if self.mode == "bar" and _live_bar:
                self.mode = "lines"
            elif self.mode == "bar":
                _live_bar = True
        if self.mode == "bar":
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            self._rich = RichProgress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn(f"{self.unit}"), TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                TextColumn("left"), TimeRemainingColumn(),
                console=Console(file=self.stream), transient=False)
            self._rich.start()
            self._task = self._rich.add_task(self.desc, total=self.total or None, rate="")
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def rate(self) -> float:
        dt = time.monotonic() - self.t0
        return self.done / dt if dt > 0 else 0.0

    def line(self) -> str:
        """``desc: done/total unit (rate unit/s, elapsed, ~left)``."""
        dt = time.monotonic() - self.t0
        r = self.rate()
        left = (self.total - self.done) / r if r > 0 and self.total else None
        tot = f"/{self.total:.0f}" if self.total else ""
        eta = f", ~{_fmt_s(left)} left" if left is not None and self.done < self.total else ""
        return f"{self.desc}: {self.done:.0f}{tot} {self.unit} ({r:.1f} {self.unit}/s, {_fmt_s(dt)}{eta})"

    def advance(self, n: float = 1) -> None:
        self.update(self.done + n)

    def update(self, done: float) -> None:
        self.done = float(done)
        if self.mode == "bar" and self._rich is not None:
            self._rich.update(self._task, completed=self.done, rate=f"{self.rate():.1f}/s")
        elif self.mode == "host" and _host is not None:
            _host(self)
        elif self.mode == "lines":
            now = time.monotonic()
            if now - self._last_line >= self.interval_s:
                self._last_line = now
                self._last_printed = self.done
                print(self.line(), file=self.stream, flush=True)

    def close(self) -> None:
        global _live_bar
        if self._rich is not None:
            self._rich.stop()
            self._rich = None
            with _lock:
                _live_bar = False
        elif self.mode == "host" and _host is not None:
            _host(None)
        elif self.mode == "lines" and time.monotonic() - self.t0 >= self.interval_s \
                and self._last_printed != self.done:
            # A short stage says nothing; a long one ends with its total so a log shows what it did.
            print(self.line(), file=self.stream, flush=True)
        self.mode = "off"


def progress(desc: str, total: float, unit: str = "rows", mode: str | None = None, interval_s: float = 5.0,
             stream: TextIO | None = None) -> Progress:
    """A :class:`Progress` to use as a context manager."""
    return Progress(desc, total, unit=unit, mode=mode, interval_s=interval_s, stream=stream)
