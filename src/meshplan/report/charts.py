"""Charts for reports (matplotlib, an optional dependency: ``pip install 'meshplan[plot]'``). Each
function returns PNG bytes."""

from __future__ import annotations

import io

from meshplan.cost.estimate import Estimate
from meshplan.errors import SpecError
from meshplan.report.chartdata import SWEEP_AXES
from meshplan.search.rank import TIE_BAND
from meshplan.search.space import FAMILY_NAMES
from meshplan.search.sweep import SweepPoint, changes
from meshplan.units import GiB


def _plt():
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise SpecError("report", "charts need matplotlib: pip install 'meshplan[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    # "tight" grows the canvas to hold a legend drawn outside the axes
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


def _stacked(rows: list[tuple[str, dict[str, float]]], xlabel: str, title: str,
             limit: tuple[float, str] | None = None) -> bytes:
    """Horizontal bars of stacked terms, one per row; ``limit``: a vertical line (value, its legend label)."""
    plt = _plt()
    keys: list[str] = []
    for _, d in rows:
        for k, v in d.items():
            if v > 0 and k not in keys:
                keys.append(k)
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(rows) + 1.8))
    left = [0.0] * len(rows)
    cmap = plt.get_cmap("tab20")
    for i, k in enumerate(keys):
        vals = [d.get(k, 0.0) for _, d in rows]
        ax.barh(range(len(rows)), vals, left=left, label=k, color=cmap(i % 20))
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_yticks(range(len(rows)), [name for name, _ in rows], fontsize=8)
    ax.invert_yaxis()
    if limit is not None:
        ax.axvline(limit[0], color="black", lw=1.2, ls="--", label=limit[1])
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    if keys or limit is not None:  # nothing stacked (no plan was timed) and no line: no legend to draw
        # beside the axes, not over the bars it names
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return _png(fig)


def _names(estimates: list[Estimate], labels: list[str] | None) -> list[str]:
    return labels if labels is not None else [e.plan.label() for e in estimates]


def step_breakdown_chart(estimates: list[Estimate], labels: list[str] | None = None) -> bytes:
    """``labels`` name the bars (default: each plan's label, which two plans that differ only in their
    options share)."""
    rows = [(n, e.named_breakdown()) for n, e in zip(_names(estimates, labels), estimates, strict=True)
            if e.time_breakdown]
    return _stacked(rows, "seconds per step", "Where the step time goes (stacked terms sum to the step)")


def memory_chart(estimates: list[Estimate], labels: list[str] | None = None) -> bytes:
    """The peak memory of each plan's most loaded stage by term, against the GPU's HBM capacity (the
    plans of one report share their cluster; the line is the first plan's)."""
    rows = [(n, {k: v / GiB for k, v in e.memory.terms.items()})
            for n, e in zip(_names(estimates, labels), estimates, strict=True)]
    limit = None
    if estimates:
        cap = estimates[0].memory.capacity_bytes / GiB
        limit = (cap, f"HBM capacity ({cap:.1f} GiB)")
    return _stacked(rows, "GiB per GPU (most loaded stage)", "Memory per GPU by term", limit)


def sweep_chart(points: list[SweepPoint], *, xlabel: str, log_x: bool) -> bytes:
    """``xlabel``: a condition's name (SWEEP_AXES gives its title) or a title."""
    xlabel = SWEEP_AXES.get(xlabel, xlabel)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    families = sorted({f for p in points for f in p.by_family})
    for f in families:
        xs = [p.value for p in points if f in p.by_family]
        ys = [p.by_family[f].tokens_per_s_per_gpu for p in points if f in p.by_family]
        ax.plot(xs, ys, marker="o", ms=3, label=f"best {FAMILY_NAMES.get(f, f)} plan")
    best_x = [p.value for p in points if p.best]
    best_y = [p.best.tokens_per_s_per_gpu for p in points if p.best]
    ax.plot(best_x, best_y, "k--", lw=1, label="recommended")
    for before, after, _, label in changes(points):  # the changes the sweep's text lists, as it names them
        x = (before * after) ** 0.5
        ax.axvline(x, color="grey", lw=0.6, ls=":")
        # near the top of the axes whatever the y-range (data units put it off the chart when y starts far
        # above 0)
        ax.text(x, 0.98, label, fontsize=6, rotation=90, va="top", transform=ax.get_xaxis_transform())
    if log_x:
        ax.set_xscale("log")
    ax.set(xlabel=xlabel, ylabel="predicted tokens/s per GPU",
           title=f"The recommended plan and each family's (the simplest within {TIE_BAND:.0%} of the fastest)")
    ax.legend(fontsize=7)
    return _png(fig)
