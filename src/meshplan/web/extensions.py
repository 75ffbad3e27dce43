"""Panels of the page that other packages of meshplan fill, where they are installed: a plan's export to a
framework's settings (``meshplan.frameworks``) and the time and cost to train (``meshplan.economics``). The
page shows a panel only where its package is importable and offers what this module uses; otherwise the
panel stays hidden and the rest of the page is unchanged.

What is used (these adapters are the one place to change if those packages change):

- ``meshplan.frameworks.common.STACKS`` (torchtitan, megatron, deepspeed) and
  ``meshplan.frameworks.export(stack, model, cluster, job, plan) -> Export`` (its ``text``, ``format`` and
  ``assumptions``), with ``meshplan.frameworks.stack_job(stack, job)``: as ``meshplan export`` does, the
  plan is evaluated on the framework's stack before it is exported.
- ``meshplan.economics``: ``summarise(estimate, model, cluster, job, train_tokens=) -> Summary`` (its
  ``to_dict()``) and ``summary_lines(summary)``: time to train, GPU-hours, cost, energy and goodput with the
  prediction's band, for the scenario's ``train_tokens`` (or the job's).
"""

from __future__ import annotations

import importlib
from typing import Any

from meshplan.cost.estimate import Estimate
from meshplan.errors import SpecError


def _module(name: str) -> Any | None:
    """``name`` imported, or None where its package is not installed."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and name.startswith(exc.name):
            return None  # the package itself is absent, not one of its imports
        raise


def export_frameworks() -> list[str]:
    """The frameworks a plan can be exported to; empty where ``meshplan.frameworks`` is absent."""
    common, frameworks = _module("meshplan.frameworks.common"), _module("meshplan.frameworks")
    if common is None or frameworks is None or not callable(getattr(frameworks, "export", None)):
        return []
    return [str(n) for n in getattr(common, "STACKS", ())]


def exports(b: Any, est: Estimate) -> list[str]:
    """The frameworks ``est``'s plan can be exported to (none for a plan that does not fit)."""
    return export_frameworks() if est.feasible else []


def export(b: Any, plan: Any, framework: str) -> dict[str, Any]:
    """``plan`` evaluated on ``framework``'s stack and written as its settings: ``{"framework", "plan", "format",
    "text", "assumptions"}``. SpecError where the plan does not fit or the framework cannot run it."""
    from meshplan.cost.step import evaluate

    names = export_frameworks()
    if framework not in names:
        allowed = ", ".join(names) or "(none: meshplan.frameworks is not installed)"
        raise SpecError("framework", f"must be one of {allowed}; got {framework[:40]!r}")
    frameworks = _module("meshplan.frameworks")
    job = frameworks.stack_job(framework, b.job) if callable(getattr(frameworks, "stack_job", None)) else b.job
    est = evaluate(b.model, b.cluster, job, plan)
    if not est.feasible:
        raise SpecError("plan", f"the plan does not fit: {'; '.join(est.infeasible_reasons)}")
    ex = frameworks.export(framework, b.model, b.cluster, job, est.plan)
    return {"framework": framework, "plan": est.plan.to_string(), "format": str(getattr(ex, "format", "")),
            "text": str(getattr(ex, "text", ex)), "assumptions": [str(a) for a in getattr(ex, "assumptions", ())]}


def economics_available() -> bool:
    mod = _module("meshplan.economics")
    return mod is not None and callable(getattr(mod, "summarise", None))


def economics(b: Any, est: Estimate, train_tokens: int | None) -> dict[str, Any] | None:
    """Time to train, cost, energy and goodput of the recommended plan for ``train_tokens`` (else the job's):
    ``{"lines", "summary"}``, or ``{"needs": "train_tokens"}`` where neither gives a token budget; None where
    ``meshplan.economics`` is absent."""
    if not economics_available():
        return None
    tokens = train_tokens or getattr(b.job, "train_tokens", None)
    if not tokens:
        return {"needs": "train_tokens"}
    mod = _module("meshplan.economics")
    s = mod.summarise(est, b.model, b.cluster, b.job, train_tokens=tokens)
    lines = mod.summary_lines(s) if callable(getattr(mod, "summary_lines", None)) else []
    return {"lines": [str(x) for x in lines], "summary": s.to_dict() if callable(getattr(s, "to_dict", None))
            else None}


def available() -> dict[str, Any]:
    """Which optional panels the page shows."""
    return {"exports": export_frameworks(), "economics": economics_available()}
