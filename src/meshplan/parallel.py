"""Run independent, CPU-bound tasks on several cores: the calibration's cross-validation folds, the
conditions-of-change walks and sweep points (each a series of searches), the simulator's refinement of
the leading plans.

Workers are forked where the platform forks safely (Linux, from a single-threaded process), so the
function may be a closure over specs and caches: it reaches the workers by inheritance, not by pickling;
only the items and the results are pickled. Elsewhere, or with one worker, the tasks run in this process,
in order. Results come back in the order of the items either way, so the output does not depend on the
number of workers.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
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


def parallel_map(fn: Callable[[T], R], items: Sequence[T], workers: int | None = None) -> list[R]:
    """``[fn(x) for x in items]``, on up to ``workers`` forked processes (default: every available core).
    ``items`` and the results must pickle; ``fn`` need not. Inside a worker, or in a process that runs other
    threads (which a fork would copy mid-flight), it runs in order."""
    n = min(len(items), available_cores() if workers is None else workers)
    if n <= 1 or sys.platform != "linux" or _task is not None or threading.active_count() > 1:
        return [fn(x) for x in items]
    ctx = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(n, mp_context=ctx, initializer=_adopt, initargs=(fn,)) as pool:
        return list(pool.map(_run, items))


def _adopt(fn: Callable[[Any], Any]) -> None:
    global _task
    _task = fn


def _run(item: Any) -> Any:
    assert _task is not None, "parallel_map worker without its function"
    return _task(item)
