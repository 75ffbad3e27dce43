"""Small validators shared by the spec dataclasses; each raises SpecError naming the field."""

from __future__ import annotations

import math
from collections.abc import Iterable

from meshplan.errors import SpecError
from meshplan.units import ascii_float, ascii_int  # noqa: F401  (re-exported: the one reading of numbers)

MAX_INT = 1 << 40
"""The largest whole number a spec field takes unless it says otherwise: beyond any real model, cluster or
batch (a trillion tokens per step), and small enough that the arithmetic stays in floating point's range
and the loops over a field's divisors end."""


def _shown(value: object) -> str:
    """A value as an error message quotes it, cut short where it is long (a number of 300 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"a whole number of about {int(value.bit_length() * 0.30103) + 1:,} digits"
    try:
        text = repr(value)
    except ValueError:  # an object whose repr fails (Python's limit on int-to-text conversion)
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def _finite(value: object) -> bool:
    """A number (not a bool) that converts to a finite float (a 400-digit int does not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


MAX_FLOP_PER_S = 1e18
"""The fastest accelerator a spec may describe (1 EFLOP/s per GPU, some sixty times a B300's dense FP4)."""
MAX_BYTES = float(2**50)
"""The most memory a spec may give a GPU or a host (1 PiB)."""
MAX_BYTES_PER_S = 1e15
"""The fastest memory or link a spec may give (1 PB/s per GPU; HBM is a few TB/s, links a few hundred GB/s)."""
MIN_EFFICIENCY = 1e-6
"""The lowest efficiency (a fraction of a peak) a spec, profile or calibration may give: a millionth. A
profile measured on a CPU for a GPU's plan reaches about 1e-5 of the GPU's peak; lower values describe no
kernel or link, and turn every time into a number of hundreds of digits."""
MAX_MESSAGE_CHARS = 400
"""The longest a value or a list of names is quoted in an error message (a 50 MB file of unknown keys
gets a line, not 39 MB)."""


def shown_list(names: Iterable[object], most: int = 12) -> str:
    """``names`` joined by commas, at most ``most`` of them and MAX_MESSAGE_CHARS characters, with how many
    were left out."""
    names = [str(n) for n in names]
    out: list[str] = []
    for n in names[:most]:
        if sum(len(o) + 2 for o in out) + len(n) > MAX_MESSAGE_CHARS:
            break
        out.append(n if len(n) <= 60 else n[:40] + "...")
    rest = len(names) - len(out)
    return ", ".join(out) + (f" and {rest:,} more" if rest else "")


def instance(field: str, value: object, cls: type, what: str) -> None:
    """``value`` is a ``cls`` (``what`` names it for the message)."""
    if not isinstance(value, cls):
        raise SpecError(field, f"must be {what}, got {_shown(value)} ({type(value).__name__})")


def positive_int(field: str, value: object, most: int = MAX_INT) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= most:
        raise SpecError(field, f"must be a whole number from 1 to {most:,}, got {_shown(value)}")


def non_negative_int(field: str, value: object, most: int = MAX_INT) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise SpecError(field, f"must be a whole number from 0 to {most:,}, got {_shown(value)}")


def positive_number(field: str, value: object, least: float = 0.0, most: float = math.inf) -> None:
    """A finite number above 0, at least ``least`` and at most ``most`` where they are given (physical
    ranges: a link of under 1 MB/s or a latency of a minute would make every time meaningless)."""
    if not _finite(value) or value <= 0 or not least <= value <= most:  # type: ignore[operator]
        bounds = ("a positive finite number" if (least, most) == (0.0, math.inf) else
                  f"a positive number of at most {most:g}" if not least else
                  f"a number from {least:g} to {most:g}" if most < math.inf else f"a number of at least {least:g}")
        raise SpecError(field, f"must be {bounds}, got {_shown(value)}")


def text(field: str, value: object) -> None:
    if not isinstance(value, str):
        raise SpecError(field, f"must be a string, got {_shown(value)}")


def non_negative_number(field: str, value: object, most: float = math.inf) -> None:
    if not _finite(value) or not 0 <= value <= most:  # type: ignore[operator]
        bound = f" of at most {most:g}" if most < math.inf else ""
        raise SpecError(field, f"must be a non-negative finite number{bound}, got {_shown(value)}")


def fraction(field: str, value: object, *, allow_zero: bool = False, least: float = 0.0) -> None:
    """A number in (0, 1] ([0, 1] with ``allow_zero``), at least ``least`` where given (an efficiency:
    MIN_EFFICIENCY)."""
    ok = _finite(value)
    lo_ok = ok and (value >= 0 if allow_zero else value > 0) and value >= least
    if not (ok and lo_ok and value <= 1):
        interval = f"[{least:g}, 1]" if least else "[0, 1]" if allow_zero else "(0, 1]"
        raise SpecError(field, f"must be a number in {interval}, got {_shown(value)}")


def efficiency(field: str, value: object) -> None:
    """A fraction of a peak that a kernel or link reaches: MIN_EFFICIENCY to 1."""
    fraction(field, value, least=MIN_EFFICIENCY)


def boolean(field: str, value: object) -> None:
    if not isinstance(value, bool):
        raise SpecError(field, f"must be true or false, got {_shown(value)}")


def one_of(field: str, value: object, allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise SpecError(field, f"must be one of {', '.join(allowed)}; got {_shown(value)}")
