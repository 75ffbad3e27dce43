"""The cheap pass of the conditions of change: at one value of a condition, whether the leading plans of the
base search (the candidates) leave the recommendation in place, with as few evaluations as that needs.

The walk (``search.conditions``) asks three things at a value: can any candidate be built there, does any
fit, and is a candidate of another layout more than the tie band faster than the recommendation (or, where
the recommendation does not fit, does another fit at all). Evaluating every candidate answers them, and
``screen(..., exhaustive=True)`` does so. The default answers them identically with fewer evaluations:

- the recommendation itself is evaluated there (the walk needs it anyway); if it fits, a candidate changes
  the answer only if its step time ``t`` satisfies ``mine >= MIN_GAIN * t``, so the candidates are taken in
  order of their lower bound (``cost.bounds.step_time_lower_bound_s``, never above the step time) and
  evaluated within a cutoff just above ``mine / MIN_GAIN`` (``cost.step.evaluate_within``, which returns the
  estimate ``evaluate`` would, or proves the plan slower than the cutoff) until one qualifies or the bound
  passes the cutoff;
- where the recommendation fits and is one of the candidates, some candidate fits;
- otherwise the candidates are evaluated in full, in order, until one of another layout fits.

``tests/test_conditions_reuse.py`` compares both ways, and the conditions with full searches, on a set of
scenarios.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from meshplan.cost.estimate import Estimate
from meshplan.cost.validate import validate_plan
from meshplan.errors import SpecError
from meshplan.search.rank import TIE_BAND
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan

MIN_GAIN = 1.0 + TIE_BAND
"""A different plan counts as a change only when it beats the recommended plan at the same condition by more
than the ranking's tie band (or the recommended plan no longer fits there): near-ties are not conditions."""

CUTOFF_MARGIN = 1e-9
"""The cutoff's margin above ``mine / MIN_GAIN``: a plan at or above it cannot satisfy
``mine >= MIN_GAIN * t`` in floating point, so every plan that can is evaluated exactly."""


@dataclass(frozen=True, slots=True)
class Screen:
    """What the walk needs to know at one value."""

    built: bool
    """Some candidate can be built there."""
    fits: bool
    """Some candidate fits there."""
    changed: bool
    """A candidate of another layout than the recommendation's fits and is more than the tie band faster than
    the recommendation, or the recommendation does not fit (or cannot be built) there while it does."""


def changed(mine: Estimate | None, others: list[Estimate]) -> bool:
    """Whether ``others`` (fitting plans of another layout) change the recommendation ``mine`` (None where it
    cannot be built)."""
    if not others:
        return False
    fastest = min(e.step_time_s for e in others)
    return mine is None or not mine.feasible or mine.step_time_s >= MIN_GAIN * fastest


def screen(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plans: list[Plan], mine: Estimate | None,
           mine_plan: Plan | None, key: Callable[[Plan], str], mine_key: str, *, mfu: float | None = None,
           exhaustive: bool = False) -> Screen:
    """The walk's questions at a scenario: ``plans`` are the candidates re-sized to it, ``mine`` the
    recommendation's closed-form estimate there (of ``mine_plan``; None where it cannot be built), ``key`` a
    plan's layout, ``mine_key`` the recommendation's. ``exhaustive``: evaluate every candidate (the
    definition the default reproduces)."""
    from meshplan.cost.step import evaluate

    valid = [p for p in plans if _valid(model, cluster, job, p)]
    if not valid:
        return Screen(False, False, False)
    mine_fits = mine is not None and mine.feasible
    if exhaustive or mfu is not None or (mine_fits and mine_plan not in valid):  # (an assumed MFU rescales
        # compute per plan: no bound)
        fitting = [e for e in (evaluate(model, cluster, job, p, mfu=mfu) for p in valid) if e.feasible]
        return Screen(True, bool(fitting), changed(mine, [e for e in fitting if key(e.plan) != mine_key]))
    if mine_fits:  # and among the candidates, so one fits
        assert mine is not None
        return Screen(True, True, _faster_other(model, cluster, job, valid, mine, key, mine_key))
    fits = False  # the recommendation does not fit: any other layout that fits is a change
    for p in valid:
        est = evaluate(model, cluster, job, p)
        if est.feasible:
            fits = True
            if key(est.plan) != mine_key:
                return Screen(True, True, True)
    return Screen(True, fits, False)


def _valid(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan) -> bool:
    try:
        validate_plan(model, cluster, job, plan)
    except SpecError:
        return False
    return True


def _faster_other(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plans: list[Plan], mine: Estimate,
                  key: Callable[[Plan], str], mine_key: str) -> bool:
    """Whether a plan of ``plans`` of another layout than ``mine_key`` fits and takes a step ``t`` with
    ``mine >= MIN_GAIN * t``: by lower bound, each evaluated within a cutoff just above the threshold."""
    from meshplan.calibration import compute_params_for
    from meshplan.cost.bounds import step_time_lower_bound_s
    from meshplan.cost.step import evaluate_within

    compute = compute_params_for(cluster.accelerator.name, job.software)
    cutoff = mine.step_time_s / MIN_GAIN * (1.0 + CUTOFF_MARGIN)
    bounds = sorted((step_time_lower_bound_s(model, cluster, job, p, compute), i) for i, p in enumerate(plans))
    for bound, i in bounds:
        if bound >= cutoff:
            return False
        est = evaluate_within(model, cluster, job, plans[i], cutoff_s=cutoff, compute=compute)
        if (est is not None and est.feasible and est.step_time_s < cutoff and key(est.plan) != mine_key
                and mine.step_time_s >= MIN_GAIN * est.step_time_s):
            return True
    return False
