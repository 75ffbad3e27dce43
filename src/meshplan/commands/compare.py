"""`meshplan compare`: several accelerators, cluster sizes or networks in one command, each with its fastest
plan, time to train, cost, energy and goodput (meshplan.compare)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from meshplan.commands.common import DEFAULT_NODES, add_ray, add_scenario, names_no_stack, progress
from meshplan.commands.common import job as make_job
from meshplan.compare import Scenario, chart, compare, scenarios, text, to_json, varies
from meshplan.economics.flags import settings_from_args
from meshplan.search.space import Space
from meshplan.specs import ClusterSpec


def _split(text: str, parse: Callable[[str], Any], flag: str) -> list[Any]:
    items = [t.strip() for t in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    try:
        return [parse(t) for t in items]
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (in {flag} {text})") from None


def register(sub: Any) -> None:
    """Add the ``compare`` subcommand: the scenario flags, with --cluster, --nodes and --inter-node-bandwidth
    taking comma-separated lists."""
    default_nodes = DEFAULT_NODES
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
    add_ray(p)

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
        note = ""
        with progress(args, "meshplan compare").running() as line:
            if names_no_stack(args, job):  # one stack for every row: the one plan assumes for the first
                from meshplan.stacks import with_assumed_stack

                job, note = with_assumed_stack(model, load(items[0]), job, space, mfu=args.mfu, workers=args.jobs,
                                               progress=line)
            rows = compare(model, job, items, load=load, settings_for=lambda c: settings_from_args(args, c),
                           space=space, mfu=args.mfu, progress=line.counter("searching", "scenarios"),
                           workers=args.jobs)
        if args.plot:
            varying = varies(rows)
            atomic_write_bytes(args.plot, chart(rows, [r.scenario.label(varying) for r in rows]))
        if args.json:
            print(strict_json({**to_json(model, job, rows), "stack_note": note}))
        else:
            print(text(model, job, rows) + (f"\nevery row searched on {note}" if note else ""))
        return 0

    p.set_defaults(func=run)


