"""Small validators shared by the spec dataclasses; each raises SpecError naming the field."""

from __future__ import annotations

import math
from collections.abc import Iterable

from meshplan.errors import SpecError

MAX_INT = 1 << 40
"""The largest whole number a spec field takes unless it says otherwise: beyond any real model, cluster or
batch (a trillion tokens per step), and small enough that the arithmetic stays in floating point's range
and the loops over a field's divisors end."""


def _shown(value: object) -> str:
    """A value as an error message quotes it, cut short where it is long (a number of 300 digits)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def positive_int(field: str, value: object, most: int = MAX_INT) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= most:
        raise SpecError(field, f"must be a whole number from 1 to {most:,}, got {_shown(value)}")


def non_negative_int(field: str, value: object, most: int = MAX_INT) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise SpecError(field, f"must be a whole number from 0 to {most:,}, got {_shown(value)}")


def positive_number(field: str, value: object, least: float = 0.0, most: float = math.inf) -> None:
    """A finite number above 0, at least ``least`` and at most ``most`` where they are given (physical
    ranges: a link of under 1 MB/s or a latency of a minute would make every time meaningless)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf \
            or not least <= value <= most:
        bounds = ("a positive finite number" if (least, most) == (0.0, math.inf) else
                  f"a positive number of at most {most:g}" if not least else
                  f"a number from {least:g} to {most:g}" if most < math.inf else f"a number of at least {least:g}")
        raise SpecError(field, f"must be {bounds}, got {_shown(value)}")


def text(field: str, value: object) -> None:
    if not isinstance(value, str):
        raise SpecError(field, f"must be a string, got {_shown(value)}")


def non_negative_number(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise SpecError(field, f"must be a non-negative finite number, got {_shown(value)}")


def fraction(field: str, value: object, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    lo_ok = ok and (value >= 0 if allow_zero else value > 0)
    if not (ok and lo_ok and value <= 1):
        interval = "[0, 1]" if allow_zero else "(0, 1]"
        raise SpecError(field, f"must be a number in {interval}, got {_shown(value)}")


def boolean(field: str, value: object) -> None:
    if not isinstance(value, bool):
        raise SpecError(field, f"must be true or false, got {_shown(value)}")


def one_of(field: str, value: object, allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise SpecError(field, f"must be one of {', '.join(allowed)}; got {_shown(value)}")
