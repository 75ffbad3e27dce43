"""Unit constants and the only formatting helpers for numbers shown to a user.

Inside meshplan every quantity is in base units: bytes, seconds, FLOP, FLOP/s, bytes/s, tokens.
Conversion happens only at the edges: the catalog loader (input) and the report (output).

Convention (formulas.md §0):
- memory capacities and footprints are binary: GiB = 2**30 bytes;
- bandwidth and traffic are decimal: GB = 10**9 bytes, GB/s per direction, per GPU.
"""

from __future__ import annotations

import math

KiB = 2**10
MiB = 2**20
GiB = 2**30

KB = 10**3
MB = 10**6
GB = 10**9
TB = 10**12

TERA = 10**12
PETA = 10**15
MICRO = 1e-6

MIN_LINK_BYTES_PER_S = 1e6
"""The slowest link rate meshplan takes (1 MB/s: --inter-node-bandwidth, a profile's measured bus bandwidth);
below it collective times overflow rather than mean anything."""
MAX_LINK_BYTES_PER_S = 1e14
"""The fastest link rate meshplan takes (100 TB/s per GPU per direction, some hundred times NVLink 5)."""

Bytes = float
Seconds = float
Flop = float


def format_gib(n_bytes: float) -> str:
    """Memory footprint in binary GiB, e.g. ``'17.5 GiB'``."""
    return f"{n_bytes / GiB:,.1f} GiB"


def format_gb(n_bytes: float) -> str:
    """Traffic in decimal units (GB or TB), e.g. ``'413 GB'``."""
    if abs(n_bytes) >= TB:
        return f"{n_bytes / TB:.2f} TB"
    if abs(n_bytes) >= GB:
        return f"{n_bytes / GB:.3g} GB"
    return f"{n_bytes / MB:.3g} MB"


def format_seconds(t_s: float) -> str:
    if t_s >= 1.0:
        return f"{t_s:.2f} s"
    if t_s >= 1e-3:
        return f"{t_s * 1e3:.1f} ms"
    return f"{t_s * 1e6:.0f} us"


def format_tokens(n: float) -> str:
    """Token counts as a user writes them: 4194304 -> '4M', 1572864 -> '1.5M'."""
    for div, suffix in ((2**30, "G"), (2**20, "M"), (2**10, "K")):
        if n >= div:
            v = n / div
            return f"{v:.3g}{suffix}"
    return f"{n:.0f}"


def ascii_int(text: str) -> int:
    """``int(text)`` for plain ASCII digits only (an optional sign, no underscores, at most 40 digits):
    Python's int() also reads other scripts' digits ('٨' is 8) and '1_000', which a spec or a flag should
    not. ValueError otherwise."""
    body = text.strip()
    digits = body[1:] if body[:1] in "+-" else body
    if not digits or not digits.isascii() or not digits.isdigit() or len(digits) > 40:
        raise ValueError(f"not a plain whole number: {text!r}")
    return int(body)


def ascii_float(text: str) -> float:
    """``float(text)`` for an ASCII decimal number ('12.5', '1e3'; not 'nan', 'inf' nor other scripts'
    digits), finite. ValueError otherwise."""
    body = text.strip()
    if not body or not body.isascii() or len(body) > 60 or not any(c.isdigit() for c in body) \
            or any(c.isalpha() and c not in "eE" for c in body) or "_" in body:
        raise ValueError(f"not a plain number: {text!r}")
    value = float(body)
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {text!r}")
    return value


def parse_size(text: str) -> int:
    """Parse '4M', '512K', '4194304', '1.5M' (binary multiples, as token batches are quoted)."""
    t = text.strip().upper()
    mult = 1
    for suffix, m in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if t.endswith(suffix):
            mult, t = m, t[:-1]
            break
    value = ascii_float(t) * mult
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    if value != int(value):
        raise ValueError(f"{text!r} is not a whole number")
    return int(value)


_DECIMAL_SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12, "P": 10**15}


def parse_token_count(text: str) -> int:
    """Parse a token budget as datasets are quoted, in decimal multiples: '15.6T' (15.6 x 10^12), '2B',
    '300M', '1e12', '15600000000000'. Batch sizes are binary (``parse_size``: '4M' = 4,194,304); a
    dataset's '15.6T tokens' is decimal."""
    from decimal import Decimal, InvalidOperation

    t = text.strip().upper().replace("_", "").replace(",", "")
    mult = 1
    if t and t[-1] in _DECIMAL_SUFFIXES:
        mult, t = _DECIMAL_SUFFIXES[t[-1]], t[:-1]
    try:
        value = Decimal(t) * mult
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a number") from None
    if not value.is_finite():
        raise ValueError(f"{text!r} is not a finite number")
    if value != value.to_integral_value():
        raise ValueError(f"{text!r} is not a whole number of tokens")
    return int(value)

