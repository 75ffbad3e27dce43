"""Panels of the page that other packages of meshplan fill, where they are installed: a plan's exports to
a framework's configuration (``meshplan.frameworks``) and the time and cost to train
(``meshplan.economics``). The page shows a panel only where its package is importable and offers what
this module looks for; otherwise the panel stays hidden.

What is looked for (the adapters below are the one place to change if those packages say otherwise):

- ``meshplan.frameworks``: ``FRAMEWORKS`` (names, e.g. torchtitan, megatron, deepspeed) and
  ``export(framework, model, cluster, job, plan) -> str`` (the configuration's text).
- ``meshplan.economics``: ``summary(model, cluster, job, estimate) -> dict`` (JSON-ready: time to train,
  cost, goodput, with units in the keys).
"""

from __future__ import annotations

import importlib
import math
from typing import Any

from meshplan.cost.estimate import Estimate
from meshplan.errors import SpecError


def _module(name: str) -> Any | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and name.startswith(exc.name):
            return None  # the package itself is absent, not one of its imports
        raise


def export_frameworks() -> list[str]:
    """The frameworks a plan can be exported to; empty where ``meshplan.frameworks`` is absent."""
    mod = _module("meshplan.frameworks")
    if mod is None or not callable(getattr(mod, "export", None)):
        return []
    return [str(n) for n in getattr(mod, "FRAMEWORKS", ())]


def exports(b: Any, est: Estimate) -> list[str]:
    """The frameworks ``est``'s plan can be exported to (none for a plan that does not fit)."""
    return export_frameworks() if est.feasible else []


def export(b: Any, est: Estimate, framework: str) -> str:
    """``est``'s plan as ``framework``'s configuration text."""
    names = export_frameworks()
    if framework not in names:
        allowed = ", ".join(names) or "(none: meshplan.frameworks is not installed)"
        raise SpecError("framework", f"must be one of {allowed}; got {framework[:40]!r}")
    mod = _module("meshplan.frameworks")
    text = mod.export(framework, b.model, b.cluster, b.job, est.plan)
    return text if isinstance(text, str) else str(text)


def economics_available() -> bool:
    mod = _module("meshplan.economics")
    return mod is not None and callable(getattr(mod, "summary", None))


def economics(b: Any, est: Estimate) -> dict[str, Any] | None:
    """Time to train, cost and goodput of the recommended plan; None where ``meshplan.economics`` is absent."""
    if not economics_available():
        return None
    out = _module("meshplan.economics").summary(b.model, b.cluster, b.job, est)
    if not isinstance(out, dict):
        return None
    return {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in out.items()}


def available() -> dict[str, Any]:
    """Which optional panels the page shows."""
    return {"exports": export_frameworks(), "economics": economics_available()}
