"""Sweep one condition and record the best plan, and the best of each family, at every value."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from meshplan.cost.estimate import Estimate
from meshplan.errors import SpecError
from meshplan.parallel import parallel_map
from meshplan.search.conditions import changed_label, knob, structural_key, unsplit
from meshplan.search.leading import LeadingResult, search_leading
from meshplan.search.search import REFINE_TOP, SearchResult, recent_search, search
from meshplan.search.space import Space
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec
from meshplan.specs._validate import MAX_INT
from meshplan.specs.hardware import MAX_GPUS
from meshplan.specs.model import MAX_LAYERS
from meshplan.units import GB, MAX_LINK_BYTES_PER_S, MIN_LINK_BYTES_PER_S, ascii_float, parse_size


@dataclass(frozen=True, slots=True)
class SweepPoint:
    value: float
    best: Estimate | None
    by_family: dict[str, Estimate]


RANGES = {"batch-tokens": (1.0, float(MAX_INT)), "inter-node-bandwidth": (MIN_LINK_BYTES_PER_S / GB,
                                                                           MAX_LINK_BYTES_PER_S / GB),
          "gpus": (1.0, float(MAX_GPUS)), "seq-len": (1.0, float(1 << 32)), "layers": (1.0, float(MAX_LAYERS))}
"""The values each condition may take, in its own unit (tokens per step, GB/s per GPU, GPUs, tokens,
layers): the bounds of the specs it builds."""


def _shown(v: float) -> str:
    return f"{v:,.0f}" if 1e3 <= v < 1e16 else f"{v:g}"


def check_range(name: str, lo: float, hi: float) -> None:
    """SpecError unless ``lo`` <= ``hi`` lie within condition ``name``'s RANGES."""
    if name not in RANGES:
        raise SpecError("sweep.vary", f"unknown condition {name[:40]!r}; allowed: {', '.join(RANGES)}")
    least, most = RANGES[name]
    if not least <= lo <= hi <= most:
        raise SpecError("sweep.vary", f"{name} takes values from {_shown(least)} to {_shown(most)}; got "
                                      f"{_shown(lo)}..{_shown(hi)}")


def parse_range(text: str) -> tuple[str, float, float]:
    """'batch-tokens=512K..16M' -> ('batch-tokens', 524288, 16777216)."""
    if "=" not in text or ".." not in text:
        raise SpecError("sweep.vary", f"expected NAME=LOW..HIGH (e.g. batch-tokens=512K..16M), got {text[:80]!r}")
    name, rng = text.split("=", 1)
    lo_s, hi_s = rng.split("..", 1)
    try:
        lo, hi = (float(parse_size(v)) if v.strip()[-1:].upper() in "KMG" else ascii_float(v) for v in (lo_s, hi_s))
    except ValueError:
        raise SpecError("sweep.vary", f"bad range {rng[:80]!r}; numbers may end in K, M or G") from None
    check_range(name.strip(), lo, hi)
    if lo == hi:
        raise SpecError("sweep.vary", f"need LOW < HIGH, got {rng[:80]!r}")
    return name.strip(), lo, hi


def geometric(lo: float, hi: float, points: int) -> list[float]:
    if points < 2:
        raise SpecError("sweep.points", f"need at least 2 (LOW and HIGH), got {points}")
    r = (hi / lo) ** (1 / (points - 1))
    return [lo * r**i for i in range(points)]


def sweep(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, name: str, values: list[float], *,
          space: Space | None = None, mfu: float | None = None, workers: int | None = None,
          progress: Callable[[int, int], None] | None = None, exhaustive: bool = False) -> list[SweepPoint]:
    """The best plan, and the best of each family, at each of ``values`` of condition ``name`` (values where
    the scenario cannot be built are left out); the searches run on up to ``workers`` cores (default: all).
    Each point is what ``plan`` would recommend there, with the best plan of each family, found by a search
    for the leading plans (search.leading), or with ``exhaustive`` by the full search, which gives the same."""
    k = knob(model, cluster, job, name)
    if not values or not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
        raise SpecError("sweep.values", "must be a non-empty list of finite numbers")
    check_range(name, min(values), max(values))
    scenarios: dict[float, tuple[ModelSpec, ClusterSpec, JobSpec]] = {}
    for v in (float(round(v)) if k.integer else v for v in values):
        scenario = k.apply(v)  # None where it cannot be built, the specs refusing the value included
        if scenario is not None:  # at the value evaluated: apply rounds to whole sequences or nodes
            scenarios.setdefault(k.read(scenario), scenario)

    def point(item: tuple[float, tuple[ModelSpec, ClusterSpec, JobSpec]]) -> SweepPoint:
        value, scenario = item
        # re-timed as plan re-times its leading plans, so that a sweep point and plan give one step time
        res: SearchResult | LeadingResult | None
        if exhaustive:
            res = search(*scenario, space, mfu=mfu, refine_top=REFINE_TOP, workers=1)
        else:  # the scenario's own value was searched already where report's plan analysis ran
            res = (recent_search(*scenario, space, mfu=mfu, refine_top=REFINE_TOP)
                   or search_leading(*scenario, space, mfu=mfu, refine_top=REFINE_TOP))
        return SweepPoint(value, res.recommended, {f: e for f, e in res.best_by_family().items() if e.feasible})

    return parallel_map(point, sorted(scenarios.items()), workers, done=progress, distributable=True)


def changes(points: list[SweepPoint]) -> list[tuple[float, float, str, str]]:
    """(value before, value after, plan before, plan after) wherever the best plan changes."""
    out = []
    for a, b in itertools.pairwise(points):
        if a.best and b.best and structural_key(unsplit(a.best.plan)) != structural_key(unsplit(b.best.plan)):
            before, after = a.best.plan, b.best.plan  # labelled with the options that differ where degrees match
            out.append((a.value, b.value, changed_label(before, after), changed_label(after, before)))
    return out


def log_ticks(values: list[float]) -> bool:
    """Whether a sweep's values span enough (more than 8x) to plot on a log axis."""
    return len(values) > 1 and values[-1] / values[0] > 8 and all(math.isfinite(v) for v in values)
