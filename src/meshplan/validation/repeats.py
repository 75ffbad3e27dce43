"""Rows that repeat one configuration: how far the measurements themselves spread.

A published table often measures the same configuration more than once: the same model on the same GPUs
with the same layout, micro-batch, precision and sequence length, in another software release, on
another date, with another global batch, or with another FP8 scaling recipe (per-tensor, delayed and
MXFP8 are one precision to meshplan). A model that sees only the configuration cannot tell those
measurements apart, except through what it models (the global batch changes the gradient accumulation).
For each such set of rows the best any rescaling of the model's predictions can do is

    floor = min over k of  sum_i |k · p_i / m_i - 1|

(p_i predicted, m_i measured tokens/s); summed over the sets and divided by their rows, it is the mean
absolute percentage error no model that predicts the configuration, and agrees with this one on how its
repeats differ, can go below on those rows. It is reported beside the model's own error on the same rows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import fields

from meshplan.validation.rows import Scenario

VARYING_JOB_FIELDS = ("global_batch_tokens", "software")
"""JobSpec fields that may differ between repeats: the global batch (the model predicts its effect) and
the software release (what the repeats measure)."""


def config_key(sc: Scenario) -> Hashable:
    """What makes two rows the same configuration: model (its whole spec), accelerator, GPU count, plan
    (recipe settings included) and every job setting but the global batch and the software release."""
    job = tuple((f.name, getattr(sc.job, f.name)) for f in fields(sc.job) if f.name not in VARYING_JOB_FIELDS)
    return sc.model, sc.cluster.accelerator.name, sc.cluster.n_gpus, sc.plan, job


def best_scale_error_sum(pairs: list[tuple[float, float]]) -> float:
    """min over k > 0 of sum |k·p/m - 1| over (measured m, predicted p) pairs. With r = m/p the sum is
    sum |k - r| / r, piecewise linear in k, so its minimum lies at one of the r."""
    ratios = [m / p for m, p in pairs]
    return min(sum(abs(k - r) / r for r in ratios) for k in ratios)


def repeat_floor(entries: Iterable[tuple[str, Hashable, float, float]]) -> dict[str, dict[str, float | int]]:
    """Per source group (and 'all'), over the rows whose configuration repeats: ``rows``,
    ``configurations``, the model's ``mape`` on those rows, and ``floor_mape`` (module docstring).
    ``entries``: (source group, configuration key, measured, predicted tokens/s)."""
    sets: dict[tuple[str, Hashable], list[tuple[float, float]]] = defaultdict(list)
    for group, key, measured, predicted in entries:
        if measured > 0 and predicted > 0:
            sets[(group, key)].append((measured, predicted))
    acc: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0, 0.0])
    for (group, _), pairs in sets.items():
        if len(pairs) < 2:
            continue
        floor = best_scale_error_sum(pairs)
        model = sum(abs(p / m - 1.0) for m, p in pairs)
        for g in (group, "all"):
            a = acc[g]
            a[0] += len(pairs)
            a[1] += 1
            a[2] += model
            a[3] += floor
    return {g: {"rows": int(a[0]), "configurations": int(a[1]), "mape": a[2] / a[0], "floor_mape": a[3] / a[0]}
            for g, a in sorted(acc.items(), key=lambda kv: (kv[0] == "all", kv[0]))}
