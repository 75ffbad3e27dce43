"""A bounded pool of worker processes for the searches of ``meshplan serve``.

Searches are CPU-bound pure Python: in the server's own process they would hold the interpreter and
stall every other request. Here each task runs in one of ``size`` long-lived worker processes (spawned,
so they share nothing with the server's threads; their caches stay warm between tasks). A task that
runs past its time limit has its process killed and replaced, so one user's long search frees its slot
at the limit; a worker that dies is replaced too. At most ``max_waiting`` tasks wait for a slot; beyond
that the pool refuses at once (the app answers 503), so a burst cannot queue unbounded work.

Standard library only; the app (web.app) awaits :meth:`Pool.run` from its event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import multiprocessing
import os
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from meshplan.errors import SpecError

log = logging.getLogger("meshplan.web")


class PoolBusy(Exception):
    """Every worker is busy and the waiting line is full."""


class TaskTimeout(Exception):
    """A task ran past its time limit (its worker was killed and replaced)."""


class TaskFailed(Exception):
    """A task raised an unexpected exception (logged with its trace in the worker) or its worker died."""


def _worker_main(conn: Connection, parent_pid: int) -> None:
    """A worker's loop: receive (handler name, args), answer ('ok', result), ('spec', (field, message)) for
    bad input, or ('error', trace) for anything else; stop on None. The worker dies with the server, however
    the server ends (parallel's PR_SET_PDEATHSIG), and leaves Ctrl-C to it."""
    import signal

    from meshplan.parallel import _die_with_parent
    from meshplan.web.compute import HANDLERS

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        if msg is None:
            return
        name, args = msg
        try:
            reply: tuple[str, Any] = ("ok", HANDLERS[name](*args))
        except SpecError as exc:
            reply = ("spec", (exc.field, exc.message))
        except Exception:  # reported to the server's log, never to the client
            reply = ("error", traceback.format_exc())
        try:
            conn.send(reply)
        except (OSError, ValueError):
            return


@dataclass(slots=True)
class _Worker:
    process: multiprocessing.process.BaseProcess
    conn: Connection
    tasks: int = 0


class Pool:
    """``size`` worker processes; ``run`` one task at a time on each.

    ``max_tasks``: a worker is replaced after this many tasks (its caches grow with every scenario)."""

    def __init__(self, size: int, *, max_waiting: int = 64, max_tasks: int = 200) -> None:
        if size < 1:
            raise SpecError("serve.workers", f"must be at least 1, got {size}")
        self.size, self.max_waiting, self.max_tasks = size, max_waiting, max_tasks
        self._ctx = multiprocessing.get_context("spawn")
        self._idle: asyncio.Queue[_Worker] | None = None
        self._waiting = 0
        self._running = 0
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=size + 1,
                                                              thread_name_prefix="meshplan-pool")
        self._workers: list[_Worker] = []
        self._closing = False
        self._pending: set[asyncio.Future[None]] = set()

    def _spawn(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker_main, args=(child, os.getpid()), daemon=True, name="meshplan-search")
        proc.start()
        child.close()
        w = _Worker(proc, parent)
        self._workers.append(w)
        return w

    def _retire(self, w: _Worker, *, kill: bool) -> None:
        with contextlib.suppress(ValueError):
            self._workers.remove(w)
        if kill:
            w.process.kill()
        else:
            with contextlib.suppress(OSError, ValueError):
                w.conn.send(None)
        w.process.join(timeout=5)
        if w.process.is_alive():
            w.process.kill()
            w.process.join(timeout=5)
        w.conn.close()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._idle = asyncio.Queue()
        workers = await asyncio.gather(*(loop.run_in_executor(self._threads, self._spawn)
                                         for _ in range(self.size)))
        for w in workers:
            self._idle.put_nowait(w)

    async def close(self) -> None:
        self._closing = True
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self._threads, lambda w=w: self._retire(w, kill=False))
                               for w in list(self._workers)))
        self._threads.shutdown(wait=False)

    @property
    def load(self) -> dict[str, int]:
        return {"workers": self.size, "running": self._running, "waiting": self._waiting}

    @staticmethod
    def _exchange(w: _Worker, msg: tuple[str, tuple[Any, ...]], timeout_s: float) -> tuple[str, Any] | None:
        """Send a task and wait for its answer; None past ``timeout_s``. Runs in a thread."""
        w.conn.send(msg)
        if not w.conn.poll(timeout_s):
            return None
        return w.conn.recv()

    async def run(self, name: str, args: tuple[Any, ...], timeout_s: float) -> Any:
        """The result of ``compute.HANDLERS[name](*args)`` in a worker. Raises SpecError for bad input,
        PoolBusy, TaskTimeout or TaskFailed."""
        assert self._idle is not None, "Pool.start was not awaited"
        if self._idle.empty() and self._waiting >= self.max_waiting:
            raise PoolBusy()
        self._waiting += 1
        try:
            w = await self._idle.get()
        finally:
            self._waiting -= 1
        loop = asyncio.get_running_loop()
        self._running += 1
        t0 = time.perf_counter()
        try:
            reply = await loop.run_in_executor(self._threads, self._exchange, w, (name, args), timeout_s)
        except asyncio.CancelledError:  # nobody waits for the answer any more (or the server is stopping)
            self._running -= 1
            self._abandon(w)
            raise
        except (EOFError, OSError) as exc:  # the worker died (killed by the system, out of memory)
            reply = ("died", repr(exc))
        self._running -= 1
        w.tasks += 1
        if reply is None or reply[0] == "died" or w.tasks >= self.max_tasks:
            await self._replace(w, kill=reply is None or reply[0] == "died")
        else:
            self._idle.put_nowait(w)
        if reply is None:
            log.warning("%s ran past its %.0f s limit; its worker was replaced", name, timeout_s)
            raise TaskTimeout()
        kind, value = reply
        log.info("%s answered in %.2f s (%s)", name, time.perf_counter() - t0, kind)
        if kind == "ok":
            return value
        if kind == "spec":
            raise SpecError(*value)
        log.error("%s failed in a worker: %s", name, value)
        raise TaskFailed("the computation failed; the server's log has the details")

    async def _replace(self, w: _Worker, *, kill: bool) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._threads, lambda: self._retire(w, kill=kill))
        if self._closing:
            return
        fresh = await loop.run_in_executor(self._threads, self._spawn)
        assert self._idle is not None
        if self._closing:
            await loop.run_in_executor(self._threads, lambda: self._retire(fresh, kill=True))
        else:
            self._idle.put_nowait(fresh)

    def _abandon(self, w: _Worker) -> None:
        """A task nobody waits for: its worker is killed (the computation stops at once) and replaced."""
        if self._closing:
            self._threads.submit(self._retire, w, kill=True)
            return
        task = asyncio.ensure_future(self._replace(w, kill=True))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
