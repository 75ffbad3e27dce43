"""Exceptions raised for user errors.

- :class:`SpecError` -- a spec, plan string, catalog entry or spec file is invalid. It names the
  field and what is allowed. The CLI prints its message on one line and exits with status 2.

Infeasible plans are *not* errors: they are returned as estimates with ``feasible=False`` and a
list of reasons.
"""

from __future__ import annotations


class SpecError(ValueError):
    """A user-supplied value is invalid. ``field`` names it; the message says what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self) -> tuple[type[SpecError], tuple[str, str]]:
        """Pickled as its two arguments, so that it crosses from a worker process (parallel.parallel_map)."""
        return type(self), (self.field, self.message)
