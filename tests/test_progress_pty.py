"""On a terminal, a long command shows its progress at least every two seconds until it ends: the largest
scenario of the README (Llama 3.1 405B on 16,384 H100) run with its stderr on a pseudo-terminal, as a user
sees it; off a terminal it writes no progress at all."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

import pytest

ARGV = ["plan", "--model", "llama-3.1-405b", "--nodes", "2048", "--batch-tokens", "16M", "--seq-len", "8192"]
PROMISE_S = 2.0
"""The longest a user waits between two redraws of the progress line [s] (meshplan.progress.REDRAW_S is 1)."""


def _run_on_a_terminal(argv: list[str]) -> tuple[list[tuple[float, bytes]], float, int, bytes]:
    """Run ``meshplan ARGV`` with stderr on a pty: (time and bytes of each read of the terminal, the run's
    wall time, its exit status, its stdout)."""
    master, slave = pty.openpty()
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "meshplan.cli", *argv], stdout=subprocess.PIPE,
                            stderr=slave, stdin=subprocess.DEVNULL, close_fds=True)
    os.close(slave)
    reads: list[tuple[float, bytes]] = []
    stdout = b""
    out_fd = proc.stdout.fileno()
    watching = {master, out_fd}
    try:
        while watching:
            ready, _, _ = select.select(list(watching), [], [], 0.5)
            for fd in ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # EIO: the child closed the terminal
                    chunk = b""
                if not chunk:
                    watching.discard(fd)
                elif fd == master:
                    reads.append((time.monotonic() - start, chunk))
                else:
                    stdout += chunk
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return reads, time.monotonic() - start, proc.wait(), stdout


@pytest.mark.slow
def test_progress_is_redrawn_at_least_every_two_seconds_until_the_end() -> None:
    reads, wall_s, status, stdout = _run_on_a_terminal(ARGV)
    assert status == 0 and b"Recommended:" in stdout
    draws = [t for t, chunk in reads if b"\r" in chunk]
    assert draws, "no progress line on the terminal"
    text = b"".join(chunk for _, chunk in reads).decode("utf-8", "replace")
    assert "searching" in text and "conditions of change" in text, text[-400:]
    gaps = [b - a for a, b in zip([0.0, *draws], [*draws, wall_s], strict=True)]
    worst = max(range(len(gaps)), key=gaps.__getitem__)
    # the first gap includes the interpreter's start and imports; every later one is the redraw's
    assert gaps[worst] <= PROMISE_S + (1.0 if worst == 0 else 0.0), \
        f"{gaps[worst]:.2f} s without a redraw, ending at {([*draws, wall_s])[worst]:.1f} s of {wall_s:.1f} s"
    assert text.endswith("\r"), "the progress line is erased at the end"


def test_no_progress_off_a_terminal() -> None:
    done = subprocess.run([sys.executable, "-m", "meshplan.cli", "plan", "--model", "llama-3-8b", "--nodes", "1",
                           "--no-conditions", "--stack", "megatron"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "\r" not in done.stderr and done.stderr == "", done.stderr[-300:]
