"""Progress of a long command on the terminal: its phase, a count and an estimate of the time left.

One line on stderr, redrawn at least once a second while the command runs and erased when it ends, and
only when stderr is a terminal (never in a pipe, a file or a test's captured stream) and the user did not
ask for ``--quiet``. The redraw does not wait for the work to report: a timer signal (SIGALRM, on the main
thread of a POSIX process) redraws the line between two steps of the work, so a search that reports its
count only now and then still shows its elapsed time every second. Forked workers inherit no timer.

The estimate of the time left is the phase's own: elapsed / done x (total - done), once a tenth of the
phase or two seconds have passed; a phase with no count shows its elapsed time alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

REDRAW_S = 1.0
"""How often the line is redrawn [s] (the promise to the user is at least every two seconds)."""


def _fmt_s(t: float) -> str:
    if t < 60:
        return f"{t:.0f} s"
    return f"{int(t // 60)} min {int(t % 60):02d} s"


class Progress:
    """The progress line of one command. ``phase(name, total, unit)`` starts a phase; ``update(done,
    total)`` sets its count; ``close()`` erases the line. Does nothing when disabled."""

    def __init__(self, *, enabled: bool | None = None, stream: TextIO | None = None, label: str = "meshplan") -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = _is_terminal(self.stream)
        self.enabled = enabled
        self.label = label
        self.name = ""
        self.unit = ""
        self.done = 0
        self.total: int | None = None
        self.phase_start = self.start = time.monotonic()
        self._shown = 0
        self._timer = False
        self.redraws = 0
        """How many times the line was drawn (a test reads it)."""

    # -- reporting -------------------------------------------------------------------------------------
    def phase(self, name: str, total: int | None = None, unit: str = "") -> None:
        self.name, self.total, self.unit, self.done = name, total, unit, 0
        self.phase_start = time.monotonic()
        self._start_timer()
        self.draw()

    def update(self, done: int, total: int | None = None) -> None:
        self.done = done
        if total is not None:
            self.total = total
        self.draw()

    def counter(self, name: str, unit: str = "") -> Callable[[int, int], None]:
        """A ``progress(done, total)`` callback for the search and the parallel maps: the first call
        starts phase ``name``."""
        started = False

        def report(done: int, total: int) -> None:
            nonlocal started
            if not started:
                self.phase(name, total, unit)
                started = True
            self.update(done, total)

        return report

    @contextlib.contextmanager
    def running(self) -> Iterator[Progress]:
        """The line for the duration of a ``with`` block, erased at its end whatever happens."""
        try:
            yield self
        finally:
            self.close()

    # -- drawing ----------------------------------------------------------------------------------------
    def line(self) -> str:
        now = time.monotonic()
        elapsed = now - self.phase_start
        parts = [f"{self.label}: {self.name}" if self.name else self.label]
        if self.total:
            parts.append(f"{self.done:,}/{self.total:,}{' ' + self.unit if self.unit else ''}")
        parts.append(_fmt_s(now - self.start))
        if self.total and 0 < self.done < self.total and (self.done >= self.total / 10 or elapsed > 2):
            parts.append(f"about {_fmt_s(elapsed / self.done * (self.total - self.done))} left in this phase")
        return ", ".join(parts)

    def draw(self) -> None:
        if not self.enabled:
            return
        text = self.line()
        self._write("\r" + text + " " * max(0, self._shown - len(text)))
        self._shown = len(text)
        self.redraws += 1

    def close(self) -> None:
        self._stop_timer()
        if self.enabled and self._shown:
            self._write("\r" + " " * self._shown + "\r")
            self._shown = 0

    def _write(self, text: str) -> None:
        """Straight to the file descriptor where there is one: the timer's redraw may land while the
        command is itself writing to the stream, and a buffered stream refuses a re-entrant write."""
        try:
            fd = self.stream.fileno()
        except (AttributeError, OSError, ValueError):
            self.stream.write(text)
            self.stream.flush()
            return
        with contextlib.suppress(OSError):
            os.write(fd, text.encode("utf-8", "replace"))

    # -- the timer ----------------------------------------------------------------------------------------
    def _start_timer(self) -> None:
        if not self.enabled or self._timer or not hasattr(signal, "setitimer") \
                or threading.current_thread() is not threading.main_thread():
            return
        signal.signal(signal.SIGALRM, lambda signum, frame: self.draw())
        signal.setitimer(signal.ITIMER_REAL, REDRAW_S, REDRAW_S)
        self._timer = True

    def _stop_timer(self) -> None:
        if self._timer:
            signal.setitimer(signal.ITIMER_REAL, 0, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            self._timer = False


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


QUIET = Progress(enabled=False)
"""A progress line that shows nothing."""
