"""`meshplan evaluate`: one plan's memory, step time, MFU and every collective; or the worked example's
simplified arithmetic (--assumptions worked-example); or an existing framework configuration (--from)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from meshplan.argtypes import output_file
from meshplan.commands.common import add_profile, add_scenario, scenario
from meshplan.errors import SpecError
from meshplan.fileio import strict_json


def register(sub: Any) -> None:
    from meshplan.commands.frameworks import add_flags

    ev = sub.add_parser("evaluate", help="evaluate one plan")
    add_scenario(ev)
    ev.add_argument("--plan", default=None, help="e.g. dp_shard=64 or tp=8,dp_shard=8,mbs=1,recompute=full")
    ev.add_argument("--assumptions", choices=("faithful", "worked-example"), default="faithful",
                    help="worked-example: the hand analysis's simplifications (golden figures)")
    ev.add_argument("--trace", type=output_file(".json"), default=None, metavar="FILE.json",
                    help="write the simulated step as Chrome trace JSON (chrome://tracing, Perfetto)")
    add_profile(ev)
    add_flags(ev)
    ev.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from meshplan.economics.flags import plan_with_job_recompute

    model, cluster, job = scenario(args)
    imported = None
    if args.from_:  # an existing framework configuration (meshplan.frameworks)
        from meshplan.commands.frameworks import apply_import

        imported, model, cluster, job = apply_import(args, model, cluster, job)
    elif not args.plan:
        raise SpecError("evaluate", "needs --plan PLAN, or --from STACK SOURCE")
    if imported:
        plan = imported.plan
    else:
        from meshplan.specs import parse_plan

        plan = parse_plan(args.plan, world_size=cluster.n_gpus)
    plan = plan_with_job_recompute(plan, job)
    if args.assumptions == "worked-example":
        est = _worked_example(args, model, cluster, job, plan)
    else:
        est = _faithful(args, model, cluster, job, plan)
    est = replace(est, notes=[*est.notes, *_notes(job, plan), *args.profile_notes])
    if imported or args.export:
        from meshplan.commands.frameworks import evaluated_frameworks

        return evaluated_frameworks(args, est, imported, model, cluster, job)
    _print(args, est, model, cluster, job)
    return 0


def _worked_example(args: argparse.Namespace, model: Any, cluster: Any, job: Any, plan: Any) -> Any:
    """The hand analysis's arithmetic (6·N FLOPs at an assumed MFU, ring traffic at the NIC rate)."""
    from meshplan.cost.simplified import evaluate_simplified, unmodelled_settings
    from meshplan.cost.validate import validate_plan

    ignored = unmodelled_settings(plan) + (["--trace"] if args.trace else [])
    if ignored:
        raise SpecError("evaluate --assumptions", f"worked-example arithmetic times data parallelism and TP only; it "
                                                  f"has no term for {', '.join(ignored)} (use the faithful mode)")
    validate_plan(model, cluster, job, plan)
    return evaluate_simplified(model, cluster, job, plan, mfu=args.mfu if args.mfu is not None else 0.4)


def _faithful(args: argparse.Namespace, model: Any, cluster: Any, job: Any, plan: Any) -> Any:
    """The cost model, re-timed by the timeline simulator where the plan fits (and --trace written), with
    the uncertainty band of the accelerator and stack."""
    from meshplan.calibration import compute_params_for
    from meshplan.cost.step import evaluate
    from meshplan.sim.simulate import refine, simulate
    from meshplan.uncertainty import attach_band

    est = evaluate(model, cluster, job, plan, mfu=args.mfu)
    if est.feasible or args.trace:
        cp = compute_params_for(cluster.accelerator.name, job.software)
        if args.trace:
            from meshplan.sim.trace import write_trace

            write_trace(est, simulate(est, slowdown=cp.comm_slowdown, step_overhead_s=cp.step_overhead_s),
                        Path(args.trace))
        est = refine(est, slowdown=cp.comm_slowdown, step_overhead_s=cp.step_overhead_s)
    return attach_band(est, accelerator=cluster.accelerator.name, software=job.software, moe=model.is_moe)


def _notes(job: Any, plan: Any) -> list[str]:
    """What the job names that the figures assume, and what the plan runs that its stack does not offer."""
    from meshplan.specs.plan import stack_mismatch

    out = []
    if job.software != "generic" or job.compiled or job.cuda_graphs or job.fp8_attention or job.fused_grouped_mlp:
        out.append(f"software stack: {job.software}"
                   + (", torch.compile'd blocks (job.compiled)" if job.compiled else "")
                   + (f", CUDA graphs of scope {job.cuda_graph_scope} (job.cuda_graphs)" if job.cuda_graphs else "")
                   + (", FP8 attention (job.fp8_attention)" if job.fp8_attention else "")
                   + (", fused grouped expert MLPs (job.fused_grouped_mlp)" if job.fused_grouped_mlp else ""))
    if job.precision == "fp8":
        out.append("MFU and HFU are against the accelerator's dense FP8 peak")
    mismatch = stack_mismatch(job.software, plan)
    from meshplan.search.space import async_tp_offered

    if plan.async_tp and not async_tp_offered(job, plan):
        out.append("torchtitan runs async TP only with its model compiled (job.compiled, --compile.enable): "
                   "the figures assume it runs")
    return out + ([mismatch] if mismatch else [])


def _print(args: argparse.Namespace, est: Any, model: Any, cluster: Any, job: Any) -> None:
    from meshplan.economics.flags import evaluate_economics
    from meshplan.report.json import estimate_dict
    from meshplan.report.text import estimate_text

    econ = evaluate_economics(args, est, model, cluster, job)  # with --train-tokens
    if args.json:
        print(strict_json({**estimate_dict(est), **({"economics": econ.to_dict()} if econ else {})}))
    else:
        from meshplan.economics import summary_lines

        print("\n".join([estimate_text(est), *(summary_lines(econ) if econ else [])]))
