"""Small validators shared by the spec dataclasses; each raises SpecError naming the field."""

from __future__ import annotations

import math
from collections.abc import Iterable

from meshplan.errors import SpecError


def positive_int(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(field, f"must be a positive integer, got {value!r}")


def non_negative_int(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(field, f"must be a non-negative integer, got {value!r}")


def positive_number(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise SpecError(field, f"must be a positive finite number, got {value!r}")


def non_negative_number(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise SpecError(field, f"must be a non-negative finite number, got {value!r}")


def fraction(field: str, value: object, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    lo_ok = ok and (value >= 0 if allow_zero else value > 0)
    if not (ok and lo_ok and value <= 1):
        interval = "[0, 1]" if allow_zero else "(0, 1]"
        raise SpecError(field, f"must be a number in {interval}, got {value!r}")


def boolean(field: str, value: object) -> None:
    if not isinstance(value, bool):
        raise SpecError(field, f"must be true or false, got {value!r}")


def one_of(field: str, value: object, allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise SpecError(field, f"must be one of {', '.join(allowed)}; got {value!r}")
