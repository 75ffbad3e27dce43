"""``meshplan compare``: several accelerators, cluster sizes or networks in one command, each with the
fastest plan the search finds for it, its step time, tokens/s, time to train, GPU-hours, cost, energy and
goodput (meshplan.economics), and where two options differ by less than the model's error, saying so.

Each scenario is ranked by its fastest plan: the tie band (search.rank.TIE_BAND), which prefers a simpler
plan among near-ties, would otherwise let a simplicity pick on one accelerator reverse an ordering the
comparison asks about. Where the tie band recommends another plan, the row shows it beside the fastest.
"""

from __future__ import annotations

import argparse
import io
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meshplan.cost.estimate import Estimate
from meshplan.economics import Settings, Summary, summarise
from meshplan.economics.flags import settings_from_args
from meshplan.economics.summary import Banded
from meshplan.economics.text import format_duration_s, format_energy_j, format_usd
from meshplan.errors import SpecError
from meshplan.parallel import available_cores, parallel_map
from meshplan.search.search import REFINE_TOP, search
from meshplan.search.space import Space
from meshplan.sim.simulate import refine_fitted
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec
from meshplan.uncertainty import attach_band

SCHEMA = "meshplan.compare/1"
MAX_SCENARIOS = 64
"""The most scenarios one command runs (each is a whole search)."""

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class Scenario:
    """One cluster to compare: an accelerator (or cluster file), a node count and a NIC bandwidth (None: the
    file's or the catalog's)."""

    cluster: str
    nodes: int | None
    inter_node_gb_per_s: float | None

    def label(self, varies: tuple[bool, bool, bool]) -> str:
        """The parts of the scenario that vary across the comparison: 'h200 x 2048 nodes, 25 GB/s'."""
        parts = [self.cluster] if varies[0] or not any(varies) else []
        if varies[1]:
            parts.append(f"{self.nodes} node{'s' if self.nodes != 1 else ''}")
        if varies[2]:
            parts.append(f"{self.inter_node_gb_per_s:g} GB/s")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Row:
    """A scenario's answer: its fastest plan (with its band), the tie band's recommendation where it is
    another plan, and the economics of the fastest; ``error`` where the scenario cannot be built or no plan
    fits."""

    scenario: Scenario
    cluster: ClusterSpec | None
    fastest: Estimate | None
    recommended: Estimate | None
    summary: Summary | None
    error: str | None = None


def scenarios(clusters: list[str], nodes: list[int | None], bandwidths: list[float | None]) -> list[Scenario]:
    """Every combination of the given clusters, node counts and bandwidths, in the order given."""
    out = [Scenario(c, n, b) for c, n, b in itertools.product(clusters, nodes, bandwidths)]
    if len(out) > MAX_SCENARIOS:
        raise SpecError("compare", f"at most {MAX_SCENARIOS} scenarios (clusters x nodes x bandwidths); got {len(out)}")
    return out


def evaluate_scenario(model: ModelSpec, job: JobSpec, scenario: Scenario, *, load: Callable[[Scenario], ClusterSpec],
                      settings_for: Callable[[ClusterSpec], Settings], space: Space | None = None,
                      mfu: float | None = None) -> Row:
    """Search ``scenario`` as ``plan`` does (closed form, the leading plans re-timed by the simulator) and take
    its fastest feasible plan, with its uncertainty band; bad input becomes the row's error."""
    try:
        cluster = load(scenario)
        result = search(model, cluster, job, space, mfu=mfu, refine_top=REFINE_TOP, workers=1)
    except SpecError as exc:
        return Row(scenario, None, None, None, None, error=str(exc))
    if not result.feasible:
        closest = result.ranked[0].infeasible_reasons[0] if result.ranked else "no plan enumerated"
        return Row(scenario, cluster, None, None, None, error=f"no plan fits; the closest: {closest}")

    def banded(e: Estimate) -> Estimate:
        e = e if e.closed_form_step_time_s is not None else refine_fitted(e, cluster.accelerator.name, job.software)
        return attach_band(e, accelerator=cluster.accelerator.name, software=job.software, moe=model.is_moe)

    fastest = banded(fastest_timed(result.feasible, cluster.accelerator.name, job.software))
    rec = result.recommended
    recommended = banded(rec) if rec is not None and rec.plan != fastest.plan else None
    summary = None
    if job.train_tokens is not None:
        summary = summarise(fastest, model, cluster, job, settings_for(cluster))
    return Row(scenario, cluster, fastest, recommended, summary)


def fastest_timed(feasible: list[Estimate], accelerator: str, software: str, candidates: int = REFINE_TOP
                  ) -> Estimate:
    """The fastest plan as the timeline simulator times it, the way ``evaluate`` times a plan alone. A search
    re-times only its leading plans in the tie band's order (REFINE_TOP); the others keep the closed form's
    time, which can be below the simulator's. So the ``candidates`` quickest plans by that time are re-timed
    too, and the quickest re-timed plan is the scenario's: the fastest of the leading plans, timed as
    ``evaluate`` would time it alone."""
    pool = sorted(feasible, key=lambda e: e.step_time_s)
    timed = [e for e in pool if e.closed_form_step_time_s is not None]
    timed += [refine_fitted(e, accelerator, software) for e in
              [e for e in pool if e.closed_form_step_time_s is None][:candidates]]
    return min(timed, key=lambda e: e.step_time_s)


def compare(model: ModelSpec, job: JobSpec, items: list[Scenario], *, load: Callable[[Scenario], ClusterSpec],
            settings_for: Callable[[ClusterSpec], Settings], space: Space | None = None, mfu: float | None = None,
            progress: Progress | None = None, workers: int | None = None) -> list[Row]:
    """Every scenario's row, fastest (most tokens/s) first; scenarios that cannot run last. The scenarios run
    in parallel (``parallel_map`` on up to ``workers`` cores), ``progress(done, total)`` after each batch."""
    def one(s: Scenario) -> Row:
        return evaluate_scenario(model, job, s, load=load, settings_for=settings_for, space=space, mfu=mfu)

    rows: list[Row] = []
    batch = workers or available_cores()
    for i in range(0, len(items), batch):
        rows += parallel_map(one, items[i:i + batch], workers)
        if progress:
            progress(len(rows), len(items))
    return sorted(rows, key=lambda r: -r.fastest.tokens_per_s if r.fastest else 0.0)


def tokens_band(row: Row) -> Banded:
    """The row's tokens/s with the band its step time carries."""
    e = row.fastest
    assert e is not None
    return Banded.with_band(e.tokens_per_s, e.uncertainty, inverse=True)


def within_error(rows: list[Row]) -> list[tuple[int, int]]:
    """Neighbouring rows in the ordering (indices, faster first) whose tokens/s bands overlap: their
    difference is within the model's error (10th-90th percentile of measured against predicted steps)."""
    ok = [i for i, r in enumerate(rows) if r.fastest is not None]
    return [(i, j) for i, j in itertools.pairwise(ok) if tokens_band(rows[i]).overlaps(tokens_band(rows[j]))]


def _varies(rows: list[Row]) -> tuple[bool, bool, bool]:
    return (len({r.scenario.cluster for r in rows}) > 1, len({r.scenario.nodes for r in rows}) > 1,
            len({r.scenario.inter_node_gb_per_s for r in rows}) > 1)


def scale_out_notes(rows: list[Row]) -> list[str]:
    """Where more nodes of the same accelerator and network stop paying off: the time to train (with
    failures) falls by less than the GPUs grow, or grows; and goodput falls."""
    notes = []
    key = lambda r: (r.scenario.cluster, r.scenario.inter_node_gb_per_s)  # noqa: E731
    done = [r for r in rows if r.summary is not None and r.summary.wall_time_s is not None and r.cluster]
    for _, group in itertools.groupby(sorted(done, key=lambda r: (*map(str, key(r)), r.cluster.n_gpus)), key=key):
        g = list(group)
        for a, b in itertools.pairwise(g):
            ta, tb = a.summary.wall_time_s.value, b.summary.wall_time_s.value
            speedup, ideal = ta / tb, b.cluster.n_gpus / a.cluster.n_gpus
            what = (f"{a.scenario.cluster}: {a.cluster.n_gpus:,} -> {b.cluster.n_gpus:,} GPUs "
                    f"({ideal:.2g}x) {'cuts' if speedup > 1 else 'does not cut'} the time to train with failures "
                    f"{'by ' + format(1 - 1 / speedup, '.0%') if speedup > 1 else ''}"
                    f" ({format_duration_s(ta)} -> {format_duration_s(tb)}; {speedup / ideal:.0%} scaling efficiency, "
                    f"goodput {a.summary.goodput.fraction:.1%} -> {b.summary.goodput.fraction:.1%})")
            if speedup <= 1:
                what += ": the larger cluster does not pay off"
            notes.append(what)
    return notes


def _count(v: float) -> str:
    """3.29M, 512K, 950."""
    return f"{v / 1e6:.3g}M" if v >= 1e6 else f"{v / 1e3:.3g}K" if v >= 1e3 else f"{v:.3g}"


def _band_text(b: Banded, fmt: Callable[[float], str]) -> str:
    return fmt(b.value) if b.low == b.high else f"{fmt(b.value)} [{fmt(b.low)}..{fmt(b.high)}]"


def text(model: ModelSpec, job: JobSpec, rows: list[Row]) -> str:
    """The comparison as a table with a note per row and the within-error pairs."""
    varies = _varies(rows)
    tt = f", {job.train_tokens:,} tokens to train" if job.train_tokens else " (no --train-tokens: no time to train)"
    out = [f"meshplan compare: {model.name}, {job.global_batch_tokens:,} tokens per step, sequence {job.seq_len:,}"
           f"{tt}; stack {job.software}. Each row is the fastest plan the search finds for it, ranked by predicted "
           "tokens/s; [ranges] are the model's band (10th-90th percentile of measured against predicted steps).",
           f"{'scenario':<24} {'GPUs':>7} {'step':>22} {'tokens/s':>24} {'time to train':>26} {'GPU-hours':>12} "
           f"{'cost':>9} {'energy':>9} {'goodput':>8}"]
    for r in rows:
        name = r.scenario.label(varies)
        if r.fastest is None:
            out.append(f"{name:<24} {r.error}")
            continue
        e, s = r.fastest, r.summary
        step = Banded.with_band(e.step_time_s, e.uncertainty)
        cols = [f"{name:<24}", f"{e.n_gpus:>7,}", f"{_band_text(step, lambda v: f'{v:.2f}') + ' s':>22}",
                f"{_band_text(tokens_band(r), _count):>24}"]
        if s is not None and s.wall_time_s is not None:
            cols += [f"{_band_text(s.wall_time_s, lambda v: f'{v / 86400:.1f}') + ' d':>26}",
                     f"{_count(s.gpu_hours.value):>12}",
                     f"{format_usd(s.cost_usd.value) if s.cost_usd else '-':>9}",
                     f"{format_energy_j(s.energy_j.value) if s.energy_j else '-':>9}", f"{s.goodput.fraction:>8.1%}"]
        elif s is not None:
            cols += [f"{'no progress':>26}"]
        out.append(" ".join(cols))
    out.append("")
    for r in rows:
        if r.fastest is None:
            continue
        e, rec = r.fastest, r.recommended
        line = f"{r.scenario.label(varies)}: {e.plan.label()} ({e.plan.to_string()}), MFU {e.mfu:.1%}"
        if rec is not None:
            name = rec.plan.label() if rec.plan.label() != e.plan.label() else rec.plan.to_string()
            line += (f"; the tie band's simpler pick, {name}, takes "
                     f"{rec.step_time_s:.2f} s ({rec.step_time_s / e.step_time_s - 1:+.1%})")
        out.append(line)
    for i, j in within_error(rows):
        a, b = rows[i], rows[j]
        gap = a.fastest.tokens_per_s / b.fastest.tokens_per_s - 1
        out.append(f"within the model's error: {a.scenario.label(varies)} ahead of {b.scenario.label(varies)} by "
                   f"{gap:.1%} of tokens/s, but their bands overlap")
    if job.software == "generic" and rows and rows[0].fastest is not None and rows[0].fastest.uncertainty:
        out.append("the bands are those of a stack the calibration has not seen (stack generic); naming the stack "
                   "(--stack megatron, torchtitan, ...) gives the narrower band of its own runs")
    out += scale_out_notes(rows)
    if job.train_tokens and any(r.summary for r in rows):
        s = next(r.summary for r in rows if r.summary)
        out.append(f"time to train: with failures, checkpoints and restarts (days); GPU-hours and cost of that time; "
                   f"energy at board power x PUE {s.settings.pue:.2f}; prices are dated on-demand list prices and vary "
                   "(--price-per-gpu-hour); --json has every assumption's source.")
    return "\n".join(out)


def to_json(model: ModelSpec, job: JobSpec, rows: list[Row]) -> dict[str, Any]:
    """The comparison as JSON: base units named in each key (seconds, bytes, joules, USD, GPU-hours)."""
    from meshplan.report.json import estimate_dict

    return {"schema": SCHEMA, "model": model.name, "global_batch_tokens": job.global_batch_tokens,
            "seq_len": job.seq_len, "train_tokens": job.train_tokens, "software": job.software,
            "order": "tokens_per_s, fastest first (each scenario's fastest plan)",
            "rows": [{"cluster": r.scenario.cluster, "nodes": r.cluster.n_nodes if r.cluster else r.scenario.nodes,
                      "gpus_per_node": r.cluster.gpus_per_node if r.cluster else None,
                      "n_gpus": r.cluster.n_gpus if r.cluster else None,
                      "inter_node_gb_per_s": r.cluster.inter.nic_bytes_per_s / 1e9 if r.cluster else None,
                      "error": r.error,
                      "fastest": estimate_dict(r.fastest) if r.fastest else None,
                      "tokens_per_s": tokens_band(r).to_dict() if r.fastest else None,
                      "tie_band_recommendation": None if r.recommended is None else {
                          "plan": r.recommended.plan.to_string(), "label": r.recommended.plan.label(),
                          "step_time_s": r.recommended.step_time_s, "tokens_per_s": r.recommended.tokens_per_s},
                      "economics": r.summary.to_dict() if r.summary else None} for r in rows],
            "within_error": [{"faster": i, "slower": j} for i, j in within_error(rows)],
            "scale_out": scale_out_notes(rows)}


def chart(rows: list[Row], labels: list[str]) -> bytes:
    """Tokens/s and, where asked, days to train per scenario, each with its band (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [(r, lab) for r, lab in zip(rows, labels, strict=True) if r.fastest is not None]
    timed = [(r, lab) for r, lab in ok if r.summary and r.summary.wall_time_s]
    fig, axes = plt.subplots(1, 2 if timed else 1, figsize=(11 if timed else 6, 0.5 * len(ok) + 1.8), squeeze=False)

    def bars(ax, items, get, xlabel):
        ys = range(len(items))
        vals = [get(r) for r, _ in items]
        ax.barh(list(ys), [v.value for v in vals], color="#4c72b0",
                xerr=[[v.value - v.low for v in vals], [v.high - v.value for v in vals]], capsize=3)
        ax.set_yticks(list(ys), [lab for _, lab in items])
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)

    bars(axes[0][0], ok, lambda r: tokens_band(r).scaled(1e-6), "tokens/s (millions; bars: the model's band)")
    if timed:
        bars(axes[0][1], timed, lambda r: r.summary.wall_time_s.scaled(1 / 86400), "days to train, with failures")
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _split(text: str, parse: Callable[[str], Any], flag: str) -> list[Any]:
    items = [t.strip() for t in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    try:
        return [parse(t) for t in items]
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (in {flag} {text})") from None


def register(sub: Any, add_scenario: Callable[[argparse.ArgumentParser], None],
             make_job: Callable[[argparse.Namespace], JobSpec], default_nodes: int) -> None:
    """Add the ``compare`` subcommand: the scenario flags (``add_scenario``), with --cluster, --nodes and
    --inter-node-bandwidth taking comma-separated lists; ``make_job`` builds the job as the other commands
    do."""
    from meshplan.argtypes import link_gb_per_s, output_file, positive_size

    p = sub.add_parser("compare", conflict_handler="resolve",
                       help="compare accelerators, cluster sizes or networks: fastest plan, time, cost, goodput")
    add_scenario(p)
    g = p.add_argument_group("compared (comma-separated lists; every combination is a row)")
    g.add_argument("--cluster", type=lambda t: _split(t, str, "--cluster"), default=None,
                   help="accelerators or cluster files, e.g. h100-sxm,h200,b200,gb200")
    g.add_argument("--nodes", type=lambda t: _split(t, positive_size, "--nodes"), default=None,
                   help=f"node counts, e.g. 512,1024,2048 (default: the cluster file's, else {default_nodes})")
    g.add_argument("--inter-node-bandwidth", type=lambda t: _split(t, link_gb_per_s, "--inter-node-bandwidth"),
                   default=None, metavar="GB_PER_S", help="NIC bandwidths per GPU per direction, e.g. 25,50")
    p.add_argument("--space", choices=("full", "dp-tp"), default="full")
    p.add_argument("--plot", type=output_file(".png"), default=None, metavar="FILE.png",
                   help="write a chart of tokens/s and days to train (needs matplotlib: pip install 'meshplan[plot]')")
    p.add_argument("--jobs", type=positive_size, default=None, metavar="N",
                   help="CPU cores for the scenarios (each a whole search); default: all available")

    def run(args: argparse.Namespace) -> int:
        from meshplan.catalog import load_cluster, load_model
        from meshplan.fileio import atomic_write_bytes, strict_json

        if args.plot:
            from meshplan.extras import require

            require("matplotlib", "plot", "compare --plot")
        model, job = load_model(args.model), make_job(args)
        items = scenarios(args.cluster or ["h100-sxm"], args.nodes or [None], args.inter_node_bandwidth or [None])

        def load(s: Scenario) -> ClusterSpec:
            return load_cluster(s.cluster, nodes=s.nodes, gpus_per_node=args.gpus_per_node,
                                inter_node_gb_per_s=s.inter_node_gb_per_s, default_nodes=default_nodes)

        for s in items:  # bad names and economics flags fail here, in one line, before any search
            settings_from_args(args, load(s))
        space = Space.dp_tp() if args.space == "dp-tp" else Space()
        from meshplan.progress import Progress

        with Progress(label="meshplan compare").running() as line:
            rows = compare(model, job, items, load=load, settings_for=lambda c: settings_from_args(args, c),
                           space=space, mfu=args.mfu, progress=line.counter("searching", "scenarios"),
                           workers=args.jobs)
        if args.plot:
            varies = _varies(rows)
            atomic_write_bytes(args.plot, chart(rows, [r.scenario.label(varies) for r in rows]))
        print(strict_json(to_json(model, job, rows)) if args.json else text(model, job, rows))
        return 0

    p.set_defaults(func=run)


__all__ = ["Row", "Scenario", "compare", "evaluate_scenario", "register", "scenarios", "text", "to_json",
           "within_error"]
