"""Independent work on a Ray cluster: ``--ray [ADDRESS]`` on ``plan``, ``report``, ``sweep``, ``compare`` and
``validate`` (the optional ``ray`` extra: ``pip install 'meshplan[ray]'``).

Where a study outgrows one machine (a calibration's fold and source-group refits, ``validate --cv-refit``,
``--by-source`` and ``--calibrate``; sweeps and comparisons over many scenarios; the conditions of change),
its independent tasks (``parallel.parallel_map(..., distributable=True)``) run as Ray tasks instead of on the
local process pool, which stays the default. Each task runs the same function on the same item as the local
pool would, so the output is identical; only where it runs differs. Inside a task, any further parallel map
runs in order in that task's process.

``--ray`` alone starts a local Ray instance for the command (every core of this machine) and stops it after;
``--ray ADDRESS`` connects to a running cluster (``auto``: the one this machine belongs to, ``ray start``;
``ray://HOST:10001``: a remote one through Ray Client), whose nodes must have meshplan installed at the same
version (and the same catalog), since each task imports it there. Ray itself is imported only when asked.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from meshplan.extras import require
from meshplan.parallel import distributed

EXTRA = "ray"
"""The optional dependency group that installs Ray (pyproject.toml)."""


@contextlib.contextmanager
def on_ray(address: str | None) -> Iterator[None]:
    """Within this block, distributable maps run on Ray: a local instance where ``address`` is empty (started
    here, stopped on the way out), else the cluster at ``address``. ``address`` None: nothing changes.
    SpecError naming --ray, before any work, where Ray is not installed."""
    if address is None:
        yield
        return
    require("ray", EXTRA, "--ray")
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address=address or None, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    try:
        with distributed(ray_map):
            yield
    finally:
        if started:
            ray.shutdown()


def _apply(fn: Callable[[Any], Any], item: Any) -> Any:
    """One task: ``fn(item)``, in a Ray worker."""
    return fn(item)


def ray_map(fn: Callable[[Any], Any], items: Sequence[Any], done: Callable[[int, int], None] | None = None
            ) -> list[Any]:
    """``[fn(x) for x in items]`` as Ray tasks (``fn`` shipped once, by value), results in the order of the
    items; ``done(k, len(items))`` as they come in. A task's exception is raised here as the task raised it
    (a SpecError stays a SpecError); the tasks still running are cancelled."""
    import ray

    remote = ray.remote(_apply)
    fn_ref = ray.put(fn)
    refs = [remote.remote(fn_ref, x) for x in items]
    index = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending, finished = list(refs), 0
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                results[index[ref]] = _get(ray, ref)
                finished += 1
                if done:
                    done(finished, len(refs))
    finally:
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
    return results


def _get(ray: Any, ref: Any) -> Any:
    """``ray.get(ref)``, a task's own exception re-raised as itself rather than wrapped."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            raise cause from None
        raise
