"""`meshplan report`: the plan command's answer as an HTML page and a Markdown file with charts, beside the
sweeps of the global batch and the inter-node bandwidth around the scenario."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from meshplan.argtypes import output_dir, positive_size
from meshplan.commands.common import add_jobs, add_ray, add_scenario, add_space, progress, scenario, space
from meshplan.fileio import write_json
from meshplan.units import GB, MAX_LINK_BYTES_PER_S, MIN_LINK_BYTES_PER_S


def register(sub: Any) -> None:
    rp = sub.add_parser("report", help="write an HTML and a Markdown report with charts")
    add_scenario(rp)
    rp.add_argument("--out", type=output_dir, default="meshplan-report",
                    help="output directory, created if missing (default meshplan-report)")
    add_space(rp)
    rp.add_argument("--no-conditions", action="store_true", help="skip the conditions-of-change sweeps")
    rp.add_argument("--top", type=positive_size, default=None,
                    help="with --json: plans to write to report.json (default: every plan)")
    add_jobs(rp)
    add_ray(rp)
    rp.set_defaults(func=run)


def sweep_values(job: Any, cluster: Any) -> dict[str, list[float]]:
    """The report's two sweeps around the scenario: the global batch from 1/16 (at least one sequence per
    eight GPUs) to 4x, and the inter-node bandwidth from 1/8 to 2x, within the bounds a link may take."""
    from meshplan.search.sweep import geometric

    b = job.global_batch_tokens
    bw = cluster.inter.nic_bytes_per_s / GB
    lo_bw, hi_bw = max(bw / 8, MIN_LINK_BYTES_PER_S / GB), min(bw * 2, MAX_LINK_BYTES_PER_S / GB)
    return {"batch-tokens": geometric(max(job.seq_len * cluster.n_gpus // 8, b / 16), b * 4, 7),
            "inter-node-bandwidth": geometric(lo_bw, hi_bw, 6) if hi_bw > lo_bw else [bw]}


def run(args: argparse.Namespace) -> int:
    from meshplan.commands.plan import analysis_of
    from meshplan.report.html import write_report
    from meshplan.search.sweep import sweep

    out_dir = Path(args.out)
    model, cluster, job = scenario(args)
    with progress(args, "meshplan report").running() as line:
        analysis = analysis_of(args, model, cluster, job, line)
        job = analysis.job  # the stack the recommendation assumes, where none was named
        sweeps = {name: sweep(model, cluster, job, name, values, space=space(args), mfu=args.mfu, workers=args.jobs,
                              progress=line.counter(f"sweep of {name}", "values"))
                  for name, values in sweep_values(job, cluster).items()}
    html_path, md_path = write_report(analysis, sweeps, out_dir)
    if args.json:  # the plan command's JSON beside the report
        from meshplan.report.json import plan_analysis_dict

        out = plan_analysis_dict(analysis, top=args.top)
        out["profile_notes"] = args.profile_notes
        write_json(out_dir / "report.json", out)
        print(f"wrote {html_path}, {md_path} and {out_dir / 'report.json'}")
    else:
        print(f"wrote {html_path} and {md_path}")
    return 0
