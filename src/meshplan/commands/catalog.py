"""`meshplan catalog`: the accelerators and models meshplan knows, with their sources, or one of them (or a
spec file) in full."""

from __future__ import annotations

import argparse
from typing import Any

from meshplan.argtypes import positive_size
from meshplan.fileio import strict_json


def register(sub: Any) -> None:
    ca = sub.add_parser("catalog", help="list accelerators and models with their sources, or show one")
    ca.add_argument("--model", default=None, metavar="NAME|FILE",
                    help="show this model: its spec, parameter counts (total, active per token, embedding) and sizes")
    ca.add_argument("--cluster", default=None, metavar="NAME|FILE",
                    help="show this accelerator's node or this cluster file: GPUs, links, memory")
    ca.add_argument("--nodes", type=positive_size, default=None,
                    help="with --cluster: nodes (default: the file's, else 1)")
    ca.add_argument("--json", action="store_true", help="JSON in base units (counts, bytes, bytes/s, FLOP/s)")
    ca.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from meshplan.report import catalog as cat

    if args.model or args.cluster:
        from meshplan.catalog import load_cluster, load_model

        model = load_model(args.model) if args.model else None
        cluster = load_cluster(args.cluster, nodes=args.nodes, default_nodes=1) if args.cluster else None
        if args.json:
            print(strict_json({"model": cat.model_summary(model) if model else None,
                               "cluster": cat.cluster_summary(cluster) if cluster else None}))
        else:
            print("\n\n".join(t for t in (cat.model_text(model) if model else "",
                                           cat.cluster_text(cluster) if cluster else "") if t))
        return 0
    listing = cat.listing()
    print(strict_json(listing) if args.json else cat.listing_text(listing))
    return 0
