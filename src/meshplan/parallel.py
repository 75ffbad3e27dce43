"""Run independent, CPU-bound tasks on several cores: the calibration's cross-validation folds, the
conditions-of-change walks and sweep points (each a series of searches), the simulator's refinement of
the leading plans.

Workers are forked where the platform forks safely (Linux, from a single-threaded process), so the
function may be a closure over specs and caches: it reaches the workers by inheritance, not by pickling;
only the items and the results are pickled. Elsewhere, or with one worker, the tasks run in this process,
in order. Results come back in the order of the items either way, so the output does not depend on the
number of workers.

Workers never outlive their parent: each asks the kernel for SIGKILL when the process that forked it dies
(prctl PR_SET_PDEATHSIG, Linux), whatever ends it (SIGKILL, a crash, a timeout's kill), and the parent
kills them itself when the map ends with an error or an interrupt. Workers ignore SIGINT: Ctrl-C reaches
every process of the terminal's group, and the parent alone answers it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_task: Callable[[Any], Any] | None = None
"""The function of the pool this worker process belongs to (set by _adopt at the worker's start)."""


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal a process receives when its parent dies (linux/prctl.h)."""


def parallel_map(fn: Callable[[T], R], items: Sequence[T], workers: int | None = None,
                 done: Callable[[int, int], None] | None = None) -> list[R]:
    """``[fn(x) for x in items]``, on up to ``workers`` forked processes (default: every available core).
    ``items`` and the results must pickle; ``fn`` need not. Inside a worker, or in a process that runs other
    threads (which a fork would copy mid-flight), it runs in order. ``done(k, len(items))`` is called in this
    process as the first k results are in."""
    n = min(len(items), available_cores() if workers is None else workers)
    if n <= 1 or sys.platform != "linux" or _task is not None or threading.active_count() > 1:
        out = []
        for x in items:
            out.append(fn(x))
            if done:
                done(len(out), len(items))
        return out
    ctx = multiprocessing.get_context("fork")
    pool = concurrent.futures.ProcessPoolExecutor(n, mp_context=ctx, initializer=_adopt, initargs=(fn, os.getpid()))
    try:
        results = []
        for r in pool.map(_run, items):
            results.append(r)
            if done:
                done(len(results), len(items))
    except BaseException:  # an error in a task, Ctrl-C, a SIGTERM turned exception: end the workers now
        _kill_workers(pool)
        raise
    pool.shutdown()
    return results


def _kill_workers(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Kill ``pool``'s workers at once rather than wait for their tasks (shutdown(wait=True) would)."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this worker when its parent dies; exit at once if it already has."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


def _adopt(fn: Callable[[Any], Any], parent_pid: int) -> None:
    global _task
    _task = fn
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent(parent_pid)


def _run(item: Any) -> Any:
    assert _task is not None, "parallel_map worker without its function"
    return _task(item)
