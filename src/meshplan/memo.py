"""Memoisation keyed by the identity of spec objects.

``functools.lru_cache`` hashes every argument on every call, and a frozen dataclass re-hashes all of its
fields each time: for a model or job spec that costs more than the memoised arithmetic. The search
passes the same spec objects millions of times, so keying them by ``id`` is both exact and cheap. Each
entry keeps references to its specs, so an id cannot be reused by another object while it is cached.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def cache_by_identity(n_specs: int, maxsize: int = 1 << 16, n_unkeyed: int = 0) -> Callable[[F], F]:
    """Memoise a function of positional arguments whose first ``n_specs`` are specs (keyed by identity)
    and the rest hashable values (keyed by value), except the last ``n_unkeyed``: passed through but not
    part of the key, the caller guaranteeing that the keyed arguments determine what is read of them.
    The table is cleared when it reaches ``maxsize``."""

    def decorate(fn: F) -> F:
        table: dict[tuple[Any, ...], tuple[Any, tuple[Any, ...]]] = {}
        key_of = _key_function(n_specs, n_unkeyed)

        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            key = key_of(args)
            hit = table.get(key)
            if hit is not None:
                return hit[0]
            if len(table) >= maxsize:
                table.clear()
            out = fn(*args)
            table[key] = (out, args[:n_specs])
            return out

        wrapper.cache_clear = table.clear  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def _key_function(n_specs: int, n_unkeyed: int) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """The key of an argument tuple: the identities of the first ``n_specs``, then the values of the rest
    but the last ``n_unkeyed``. Written out for the common cases: a search looks keys up millions of times."""
    if n_unkeyed:
        return lambda args: (*map(id, args[:n_specs]), *args[n_specs:len(args) - n_unkeyed])
    if n_specs == 1:
        return lambda args: (id(args[0]), args[1:])
    if n_specs == 2:
        return lambda args: (id(args[0]), id(args[1]), args[2:])
    if n_specs == 3:
        return lambda args: (id(args[0]), id(args[1]), id(args[2]), args[3:])
    if n_specs == 4:
        return lambda args: (id(args[0]), id(args[1]), id(args[2]), id(args[3]), args[4:])
    return lambda args: (*map(id, args[:n_specs]), args[n_specs:])
