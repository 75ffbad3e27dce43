"""argparse value types shared by every meshplan command: each rejects a bad value with a message that
says what is allowed (argparse then prints one line and exits 2)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from meshplan.units import parse_size


def _checked(text: str, parse: Callable[[str], float], expected: str, ok: Callable[[float], bool],
             bound: str) -> float:
    try:
        v = parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not ok(v):
        raise argparse.ArgumentTypeError(f"must be {bound}, got {text!r}")
    return v


def positive_size(text: str) -> int:
    """A positive whole number, with K/M/G binary suffixes (token batches, message sizes)."""
    return int(_checked(text, parse_size, "a positive integer such as 4194304, 4M or 64K", lambda v: v > 0,
                        "positive"))


def positive_float(text: str) -> float:
    return _checked(text, float, "a number", lambda v: v > 0, "positive")


def fraction(text: str) -> float:
    return _checked(text, float, "a number", lambda v: 0 < v <= 1, "in (0, 1]")


def count(text: str) -> int:
    return int(_checked(text, int, "a whole number", lambda v: v >= 1, "at least 1"))
