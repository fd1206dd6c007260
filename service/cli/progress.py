"""Progress of long CLI work (imports, ``sync``, ``bench``), always on stderr so ``--json`` stdout
stays clean.

    with progress("importing sweep.csv", total=len(records), quiet=quiet) as bar:
        for batch in batches:
            send(batch)
            bar.advance(len(batch))

* On a terminal (stderr is a TTY and TERM is not "dumb"): a ``rich.progress`` bar with the count,
  percentage, rate and time left.
* Otherwise (CI logs, pipes, files): plain lines, one each time another ``percent_step`` % is done
  or ``interval_s`` seconds passed since the last line, whichever comes first, e.g.
  ``importing sweep.csv: 30,000/100,000 runs (30%), 2,410 runs/s, 29 s left``; and one closing
  line ``importing sweep.csv: 100,000 runs in 41.3 s (2,421 runs/s)``.
* ``quiet=True`` (the commands' ``--quiet``): nothing.

Rate = items done / seconds since the start; time left = items left / rate.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, Self, TextIO, TypeVar

import typer

T = TypeVar("T")

#: The ``--quiet`` option of every command that shows progress.
QUIET = typer.Option(False, "--quiet", "-q", help="no progress display on stderr")


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}:{seconds:02d} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d} h"


class Progress:
    """A progress display for one piece of work (module doc). Use as a context manager; call
    :meth:`advance` as items complete. ``total`` None: count and rate only (no bar, no time left).
    """

    def __init__(self, description: str, total: int | None = None, *, unit: str = "runs", quiet: bool = False,
                 stream: TextIO | None = None, interval_s: float = 5.0, percent_step: int = 10):
        self.description = description
        self.total = total
        self.unit = unit
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = interval_s
        self.percent_step = percent_step
        self.done = 0
        self._t0 = 0.0
        self._last_line = 0.0
        self._last_bucket = 0
        self._rich: Any = None
        self._task: Any = None
        self._lock = threading.Lock()

    @property
    def is_terminal(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"

    def __enter__(self) -> Self:
        self._t0 = self._last_line = time.monotonic()
        if self.quiet:
            return self
        if self.is_terminal:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import (
                Progress as RichProgress,
            )

            self._rich = RichProgress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
                TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), TimeElapsedColumn(),
                console=Console(file=self.stream), transient=False)
            self._rich.start()
            self._task = self._rich.add_task(self.description, total=self.total, rate="")
        return self

    def advance(self, n: int = 1) -> None:
        """`n` more items are done (thread-safe)."""
        with self._lock:
            self.update(self.done + n)

    def update(self, done: int, total: int | None = None) -> None:
        """`done` items are done in all (of `total`, when the total became known or changed)."""
        self.done = done
        if total is not None:
            self.total = total
            if self._rich is not None:
                self._rich.update(self._task, total=total)
        if self.quiet:
            return
        now = time.monotonic()
        rate = self.done / (now - self._t0) if now > self._t0 else 0.0
        if self._rich is not None:
            self._rich.update(self._task, completed=self.done, rate=f"{rate:,.0f} {self.unit}/s")
            return
        bucket = (self.done * 100 // self.total) // self.percent_step if self.total else 0
        if self.total and self.done >= self.total:
            return  # the closing line says it
        if bucket > self._last_bucket or now - self._last_line >= self.interval_s:
            self._last_bucket, self._last_line = bucket, now
            self._line(self._status(rate))

    def _status(self, rate: float) -> str:
        if not self.total:
            return f"{self.description}: {self.done:,} {self.unit}, {rate:,.0f} {self.unit}/s"
        left = f", {_duration((self.total - self.done) / rate)} left" if rate > 0 else ""
        return (f"{self.description}: {self.done:,}/{self.total:,} {self.unit} ({self.done * 100 // self.total}%), "
                f"{rate:,.0f} {self.unit}/s{left}")

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.quiet:
            return
        if self._rich is not None:
            self._rich.stop()
            return
        elapsed = time.monotonic() - self._t0
        rate = f" ({self.done / elapsed:,.0f} {self.unit}/s)" if elapsed > 0 else ""
        ended = "stopped after " if exc_type is not None else ""
        self._line(f"{self.description}: {ended}{self.done:,} {self.unit} in {elapsed:.1f} s{rate}")


def track(items: Sequence[T], description: str, *, unit: str = "runs", quiet: bool = False) -> Iterator[T]:
    """Iterate over `items` with a :class:`Progress` that advances after each one."""
    with progress(description, total=len(items), unit=unit, quiet=quiet) as bar:
        for item in items:
            yield item
            bar.advance()


def progress(description: str, total: int | None = None, *, unit: str = "runs", quiet: bool = False) -> Progress:
    """A :class:`Progress` on the current stderr (module doc)."""
    return Progress(description, total, unit=unit, quiet=quiet)
