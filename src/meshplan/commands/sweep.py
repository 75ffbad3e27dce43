"""`meshplan sweep`: vary one condition of the scenario and show the recommended plan at each value."""

from __future__ import annotations

import argparse
from typing import Any

from meshplan.argtypes import output_file, whole_in
from meshplan.commands.common import (
    add_jobs,
    add_ray,
    add_scenario,
    add_space,
    names_no_stack,
    progress,
    scenario,
    space,
)
from meshplan.errors import SpecError
from meshplan.fileio import atomic_write_bytes, strict_json


def register(sub: Any) -> None:
    sw = sub.add_parser("sweep", help="vary one condition and show where the best plan changes")
    add_scenario(sw)
    sw.add_argument("--vary", required=True, metavar="NAME=LOW..HIGH",
                    help="batch-tokens, inter-node-bandwidth, gpus, seq-len or layers, e.g. batch-tokens=512K..16M")
    sw.add_argument("--points", type=whole_in(2, 200), default=9,
                    help="values, geometrically spaced from LOW to HIGH: 2 to 200 (default 9)")
    add_space(sw)
    sw.add_argument("--plot", type=output_file(".png"), metavar="FILE.png",
                    help="write the sweep chart (PNG; needs matplotlib: pip install 'meshplan[plot]')")
    add_jobs(sw)
    add_ray(sw)
    sw.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from meshplan.search.conditions import knob
    from meshplan.search.sweep import geometric, log_ticks, parse_range, sweep

    if args.plot:
        from meshplan.extras import require

        require("matplotlib", "plot", "sweep --plot")
    model, cluster, job = scenario(args)
    name, lo, hi = parse_range(args.vary)
    values = geometric(lo, hi, args.points)
    note = ""
    with progress(args, "meshplan sweep").running() as line:
        if names_no_stack(args, job):
            from meshplan.stacks import with_assumed_stack

            job, note = with_assumed_stack(model, cluster, job, space(args), mfu=args.mfu, workers=args.jobs,
                                           progress=line)
        points = sweep(model, cluster, job, name, values, space=space(args), mfu=args.mfu, workers=args.jobs,
                       progress=line.counter(f"searching at each value of {name}", "values"))
    if not points:
        raise SpecError("sweep.vary", f"none of the {len(values)} values of {name} from {lo:g} to {hi:g} gives a "
                                      "scenario that can be built (whole sequences per step that the batch splits "
                                      "into, whole nodes, layers the model can take, sequences of at least "
                                      "128 tokens that divide the batch): widen the range or add --points")
    if args.plot:
        from meshplan.report.charts import sweep_chart

        atomic_write_bytes(args.plot, sweep_chart(points, xlabel=name, log_x=log_ticks([p.value for p in points])))
    unit = knob(model, cluster, job, name).unit
    if args.json:
        print(strict_json({**_json(name, unit, points), "software": job.software, "stack_note": note}))
    else:
        print(_text(name, unit, lo, hi, points, model, cluster) + (f"\nsearched on {note}" if note else ""))
    return 0


def _json(name: str, unit: str, points: list[Any]) -> dict[str, Any]:
    from meshplan.report.json import estimate_dict
    from meshplan.search.sweep import changes

    return {"schema": "meshplan.sweep/1", "condition": name, "unit": unit, "points": [
        {"value": p.value, "best": estimate_dict(p.best) if p.best else None,
         "best_by_family": {f: {"plan": e.plan.to_string(), "label": e.plan.label(), "step_time_s": e.step_time_s,
                                "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu} for f, e in p.by_family.items()}}
        for p in points], "changes": [{"from_value": a, "to_value": b, "from_plan": pa, "to_plan": pb}
                                      for a, b, pa, pb in changes(points)]}


def _fmt(v: float) -> str:
    """1,246,970 rather than 1.24697e+06; 12.5 for small values."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _text(name: str, unit: str, lo: float, hi: float, points: list[Any], model: Any, cluster: Any) -> str:
    from meshplan.search.rank import TIE_BAND
    from meshplan.search.sweep import changes
    from meshplan.units import format_seconds

    out = [f"meshplan sweep: {name} from {_fmt(lo)} to {_fmt(hi)} {unit}, {model.name} on {cluster.n_gpus} x "
           f"{cluster.accelerator.name} (the recommended plan at each value: the simplest within "
           f"{TIE_BAND:.0%} of the fastest)",
           f"{'value':>14}  {'recommended plan':<34} {'step':>10} {'MFU':>6} {'tokens/s/GPU':>13}"]
    for p in points:
        if p.best:
            out.append(f"{_fmt(p.value):>14}  {p.best.plan.label():<34} {format_seconds(p.best.step_time_s):>10} "
                       f"{p.best.mfu:>6.1%} {p.best.tokens_per_s_per_gpu:>13,.0f}")
        else:
            out.append(f"{_fmt(p.value):>14}  no plan fits")
    moves = changes(points)
    out += [f"between {_fmt(a)} and {_fmt(b)}: {pa} -> {pb}" for a, b, pa, pb in moves]
    if moves:
        out.append(f"note: every change of the recommended plan is listed, near-ties within the {TIE_BAND:.0%} tie "
                   "band too; `meshplan plan` names a condition of change only where another plan is more than the "
                   "tie band faster, or the recommendation stops fitting")
    outside = [p.value for p in points if not lo * (1 - 1e-9) <= p.value <= hi * (1 + 1e-9)]
    if outside:
        steps = {"gpus": f"whole nodes of {cluster.gpus_per_node}", "batch-tokens": "whole sequences",
                 "layers": "whole layers"}.get(name, "whole units")
        out.append(f"note: values are as evaluated ({name} moves in {steps}); {', '.join(_fmt(v) for v in outside)} "
                   f"lie{'s' if len(outside) == 1 else ''} outside {_fmt(lo)}..{_fmt(hi)}")
    return "\n".join(out)
