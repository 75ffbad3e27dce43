"""Run independent, CPU-bound tasks on several cores: the calibration's cross-validation folds, the
conditions-of-change walks and sweep points (each a series of searches), the simulator's refinement of
the leading plans.

Workers are forked where the platform forks safely (Linux, from a single-threaded process), so the
function may be a closure over specs and caches: it reaches the workers by inheritance, not by pickling;
only the items and the results are pickled. Elsewhere, or with one worker, the tasks run in this process,
in order. Results come back in the order of the items either way, so the output does not depend on the
number of workers.

A map marked ``distributable`` (the conditions' walks, sweep points, compared scenarios, the calibration's
folds: each a series of searches or a fit) goes instead to the mapper ``distributed`` installs, for the
duration of a command: meshplan.distributed hands such items to a Ray cluster (``--ray``). The local pool
stays the default.

Workers never outlive their parent: each asks the kernel for SIGKILL when the process that forked it dies
(prctl PR_SET_PDEATHSIG, Linux), whatever ends it (SIGKILL, a crash, a timeout's kill), and the parent
kills them itself when the map ends with an error or an interrupt. Workers ignore SIGINT: Ctrl-C reaches
every process of the terminal's group, and the parent alone answers it.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_task: Callable[[Any], Any] | None = None
"""The function of the pool this worker process belongs to (set in the worker as it starts)."""

Mapper = Callable[[Callable[[Any], Any], Sequence[Any], "Callable[[int, int], None] | None"], list[Any]]
"""``mapper(fn, items, done)``: ``[fn(x) for x in items]`` elsewhere (a Ray cluster), in the order of the items,
calling ``done(k, len(items))`` here as results come in."""

_mapper: Mapper | None = None
"""Where distributable maps go while ``distributed`` is in force (None: the local pool)."""


@contextlib.contextmanager
def distributed(mapper: Mapper) -> Iterator[None]:
    """Within this block, ``parallel_map(..., distributable=True)`` in this process hands its items to
    ``mapper`` (meshplan.distributed) instead of forking local workers."""
    global _mapper
    previous, _mapper = _mapper, mapper
    try:
        yield
    finally:
        _mapper = previous


def distributing() -> bool:
    """Whether distributable maps go to a ``distributed`` mapper now (in this process, not in a worker)."""
    return _mapper is not None and _task is None

PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal a process receives when its parent dies (linux/prctl.h)."""


class WorkerDied(RuntimeError):
    """A worker process ended without answering (killed by the kernel for memory, or crashed)."""


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def parallel_map(fn: Callable[[T], R], items: Sequence[T], workers: int | None = None,
                 done: Callable[[int, int], None] | None = None, *, distributable: bool = False) -> list[R]:
    """``[fn(x) for x in items]``, on up to ``workers`` forked processes (default: every available core).
    ``items`` and the results must pickle; ``fn`` need not. Inside a worker, or in a process that runs other
    threads (which a fork would copy mid-flight), it runs in order. ``done(k, len(items))`` is called in this
    process once before the first (k = 0, so that a progress line shows the phase from its start) and each
    time a result is in (k of them). An exception in a task is raised here, after the workers
    are ended. ``distributable``: while ``distributed`` is in force, the items go to its mapper instead
    (``fn`` must then pickle too, by value where it is a closure: Ray's cloudpickle does)."""
    if done and items:
        done(0, len(items))
    if distributable and distributing() and items:
        assert _mapper is not None
        return _mapper(fn, items, done)
    n = min(len(items), available_cores() if workers is None else workers)
    if n <= 1 or sys.platform != "linux" or _task is not None or threading.active_count() > 1:
        out = []
        for x in items:
            out.append(fn(x))
            if done:
                done(len(out), len(items))
        return out
    ctx = multiprocessing.get_context("fork")
    procs, conns = [], []
    try:
        for _ in range(n):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(fn, child_end, os.getpid()), daemon=True)
            proc.start()
            child_end.close()
            procs.append(proc)
            conns.append(parent_end)
        return _dispatch(items, procs, conns, done)
    finally:  # done, failed or interrupted: no worker outlives the map
        for proc in procs:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                if proc.is_alive():
                    proc.kill()
        for proc in procs:
            with contextlib.suppress(OSError, ValueError, AssertionError):
                proc.join(timeout=5)
        for conn in conns:
            conn.close()


def _dispatch(items: Sequence[Any], procs: list[Any], conns: list[Connection],
              done: Callable[[int, int], None] | None) -> list[Any]:
    """Hand out the items one at a time to whichever worker is free; collect the results in order."""
    results: list[Any] = [None] * len(items)
    todo = iter(range(len(items)))
    busy: dict[Connection, int] = {}
    for conn in conns:
        i = next(todo, None)
        if i is not None:
            conn.send((i, items[i]))
            busy[conn] = i
    finished = 0
    while busy:
        for conn in wait(list(busy)):
            try:
                i, ok, value = conn.recv()
            except (EOFError, OSError):
                proc = procs[conns.index(conn)]
                proc.join(timeout=1)
                raise WorkerDied(f"a worker process ended without answering (exit code {proc.exitcode}; "
                                 "out of memory?)") from None
            if not ok:
                raise value
            results[i] = value
            finished += 1
            del busy[conn]
            if done:
                done(finished, len(items))
            nxt = next(todo, None)
            if nxt is not None:
                conn.send((nxt, items[nxt]))
                busy[conn] = nxt
    for conn in conns:
        conn.send(None)  # no more work
    return results


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this worker when its parent dies; exit at once if it already has."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


def _serve(fn: Callable[[Any], Any], conn: Connection, parent_pid: int) -> None:
    """A worker: take (index, item), answer (index, True, fn(item)) or (index, False, the exception)."""
    global _task
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent answers it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)  # the parent's progress line is the parent's
    _die_with_parent(parent_pid)
    _task = fn
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        i, item = job
        try:
            answer = (i, True, fn(item))
        except Exception as exc:  # raised in the parent, as it would have been in order
            answer = (i, False, exc)
        try:
            conn.send(answer)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            conn.send((i, False, RuntimeError(f"{type(answer[2]).__name__} could not be sent back: {exc}")))
