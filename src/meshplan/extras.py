"""Optional extras: whether one is installed, checked before any work starts, with the line that installs it.

    plot    matplotlib: sweep --plot, validate --plot, compare --plot, the Markdown report's PNGs
    torch   the PyTorch harness: crosscheck, measure
    web     meshplan serve
"""

from __future__ import annotations

import importlib.util

from meshplan.errors import SpecError


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, extra: str, field: str) -> None:
    """SpecError naming ``field`` (the flag or command that needs it) unless ``module`` is installed."""
    if not installed(module):
        raise SpecError(field, f"needs {module}, which is not installed: pip install 'meshplan[{extra}]'")
