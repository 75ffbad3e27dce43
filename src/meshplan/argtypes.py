"""argparse value types shared by every meshplan command: each rejects a bad value with a message that
says what is allowed (argparse then prints one line and exits 2)."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

from meshplan.units import GB, MAX_LINK_BYTES_PER_S, MIN_LINK_BYTES_PER_S, ascii_float, ascii_int, parse_size


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
    return _checked(text, ascii_float, "a number", lambda v: 0 < v < math.inf, "positive and finite")


def link_gb_per_s(text: str) -> float:
    """A link's bandwidth in decimal GB/s: from MIN_LINK_BYTES_PER_S (1 MB/s) to MAX_LINK_BYTES_PER_S (100 TB/s)."""
    lo, hi = MIN_LINK_BYTES_PER_S / GB, MAX_LINK_BYTES_PER_S / GB
    return _checked(text, ascii_float, "a number of GB/s", lambda v: lo <= v <= hi, f"between {lo:g} and {hi:g}")


def mfu_fraction(text: str) -> float:
    """An assumed MFU: from 0.1 % to 100 %."""
    return _checked(text, ascii_float, "a number", lambda v: 1e-3 <= v <= 1, "in [0.001, 1]")


def count(text: str) -> int:
    return int(_checked(text, ascii_int, "a whole number", lambda v: v >= 1, "at least 1"))


def whole_in(lo: int, hi: int) -> Callable[[str], int]:
    """A whole number from ``lo`` to ``hi``."""
    def check(text: str) -> int:
        return int(_checked(text, ascii_int, "a whole number", lambda v: lo <= v <= hi, f"from {lo} to {hi}"))
    return check


def output_file(*suffixes: str) -> Callable[[str], str]:
    """A file the command will write, checked before any work: its folder exists, it is not a folder, and
    its name ends in one of ``suffixes`` (the formats the command writes)."""

    def check(text: str) -> str:
        path = Path(text)
        if suffixes and path.suffix.lower() not in suffixes:
            raise argparse.ArgumentTypeError(f"the file must end in {', '.join(suffixes)}, got {text!r}")
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file name")
        if not path.parent.is_dir():
            raise argparse.ArgumentTypeError(f"folder {str(path.parent)!r} does not exist")
        if not os.access(path if path.exists() else path.parent, os.W_OK):
            raise argparse.ArgumentTypeError(f"{text!r} cannot be written (permission denied)")
        return text

    return check


def output_dir(text: str) -> str:
    """A folder the command will create if missing, checked before any work: it, or the nearest part of its
    path that exists, is a folder."""
    if not text:
        raise argparse.ArgumentTypeError("expected a folder name, got ''")
    path = Path(text)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: {str(existing)!r} is a file, not a folder")
    if existing is not None and not os.access(existing, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: {str(existing)!r} cannot be written (permission denied)")
    return text


def reject_unused(args: argparse.Namespace, parser: argparse.ArgumentParser, used: tuple[str, ...],
                  command: str) -> None:
    """Exit 2 (argparse's error) naming each scenario flag that ``command`` would ignore: one given a value
    other than its default whose destination is not in ``used``. The scenario group is shared by every
    command, but a measurement or a cross-check reads only part of it, and a silently ignored
    ``--cluster nope`` or ``--mfu`` reads as if it had been applied."""
    group = next((g for g in parser._action_groups if g.title and g.title.startswith("scenario")), None)
    ignored = [a.option_strings[0] for a in (group._group_actions if group else [])
               if a.dest not in used and getattr(args, a.dest, a.default) != a.default]
    if ignored:
        parser.error(f"{command} does not use {', '.join(ignored)} (it reads only "
                     f"{', '.join('--' + u.replace('_', '-') for u in used)})")
