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

Rows that share a *layout* (the same model, GPUs and parallel degrees, sequence and precision) but not
every setting (another release, micro-batch, virtual stages, dispatcher, all-to-all overlap or CUDA-graph
scope) can
disagree by more than the model explains: ``disagreeing_layouts`` sets the ratio of their measurements
against the ratio of their predictions, and lists each layout whose worst pair is more than
``DISAGREEMENT`` apart once the model's own account of their differences is taken out, with what differs
between that pair. A published layout measured twice as fast in one release as in the next is then named,
not averaged into the error of a configuration.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, fields

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


DISAGREEMENT = 1.2
"""A layout's rows disagree where the ratio of two measurements departs from the ratio of their predictions
by more than this factor (20 %): well beyond the spread of exact repeats (their floor is 1.6 % over 54 rows,
README), and beyond what a release changes in the dense rows."""
LAYOUT_PLAN_FIELDS = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep", "etp")
"""The plan fields that make a layout (the parallel degrees); the others (micro-batch, virtual stages,
dispatcher, overlap, recomputation, ...) may differ between the rows of one layout."""


def layout_key(sc: Scenario) -> Hashable:
    """The model, accelerator, GPU count, parallel degrees, sequence length and precision of a row."""
    return (sc.model, sc.cluster.accelerator.name, sc.cluster.n_gpus,
            tuple(getattr(sc.plan, f) for f in LAYOUT_PLAN_FIELDS), sc.job.seq_len, sc.job.precision)


def differences(a: Scenario, b: Scenario) -> list[str]:
    """What differs between two rows of one layout, as 'field: a -> b' (the release, then the plan's and
    the job's settings)."""
    out = [f"release: {a.release or '?'} -> {b.release or '?'}"] if a.release != b.release else []
    for f in fields(a.plan):
        x, y = getattr(a.plan, f.name), getattr(b.plan, f.name)
        if x != y and f.name not in LAYOUT_PLAN_FIELDS:
            out.append(f"{f.name}: {x} -> {y}")
    for f in fields(a.job):
        x, y = getattr(a.job, f.name), getattr(b.job, f.name)
        if x != y and f.name != "software":
            out.append(f"{f.name}: {x} -> {y}")
    return out


@dataclass(frozen=True, slots=True)
class Disagreement:
    """The pair of rows of one layout whose measurements depart most from what the model predicts of them."""

    rows: tuple[int, ...]
    """Every row of the layout."""
    slower_row: int
    faster_row: int
    """The pair: the row measured slower, the one measured faster (tokens/s per GPU)."""
    measured_ratio: float
    """Faster over slower measured tokens/s [dimensionless]."""
    predicted_ratio: float
    """The same two rows' predicted tokens/s, in the same order [dimensionless]."""
    differs: tuple[str, ...]
    """What differs between the pair (``differences``)."""

    @property
    def unexplained(self) -> float:
        """The measured ratio over the predicted one: how much further apart the rows ran than the model
        says their differences make them."""
        return self.measured_ratio / self.predicted_ratio

    def as_dict(self) -> dict[str, object]:
        return {"rows": list(self.rows), "slower_row": self.slower_row, "faster_row": self.faster_row,
                "measured_ratio": self.measured_ratio, "predicted_ratio": self.predicted_ratio,
                "unexplained_ratio": self.unexplained, "differs": list(self.differs)}


def disagreeing_layouts(entries: Iterable[tuple[Scenario, float, float]],
                        threshold: float = DISAGREEMENT) -> list[Disagreement]:
    """The layouts measured more than once whose worst pair of rows departs from the model's ratio by more
    than ``threshold`` (module docstring), worst first. ``entries``: (scenario, measured, predicted
    tokens/s per GPU)."""
    sets: dict[Hashable, list[tuple[Scenario, float, float]]] = defaultdict(list)
    for sc, measured, predicted in entries:
        if measured > 0 and predicted > 0:
            sets[layout_key(sc)].append((sc, measured, predicted))
    out = []
    for members in sets.values():
        worst = None
        for a, b in ((a, b) for a in members for b in members if a[1] < b[1]):
            gap = abs(math.log((b[1] / a[1]) / (b[2] / a[2])))
            if worst is None or gap > worst[0]:
                worst = (gap, a, b)
        if worst is None or worst[0] <= math.log(threshold):
            continue
        _, (slow, ms, ps), (fast, mf, pf) = worst
        out.append(Disagreement(rows=tuple(sorted(sc.row for sc, _, _ in members)), slower_row=slow.row,
                                faster_row=fast.row, measured_ratio=mf / ms, predicted_ratio=pf / ps,
                                differs=tuple(differences(slow, fast))))
    return sorted(out, key=lambda d: -abs(math.log(d.unexplained)))
