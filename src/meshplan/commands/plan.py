"""`meshplan plan`: search every plan, recommend one, answer the four questions and say when to change it."""

from __future__ import annotations

import argparse
from typing import Any

from meshplan.argtypes import positive_size
from meshplan.commands.common import (
    add_jobs,
    add_profile,
    add_ray,
    add_scenario,
    add_space,
    names_no_stack,
    progress,
    scenario,
    space,
)
from meshplan.fileio import strict_json


def register(sub: Any) -> None:
    from meshplan.commands.frameworks import add_flags

    pl = sub.add_parser("plan", help="search every plan, recommend one, say when to change it")
    add_scenario(pl)
    add_space(pl)
    pl.add_argument("--top", type=positive_size, default=None,
                    help="plans to list (text: 10; JSON: every plan, which can be tens of MB on a large cluster)")
    pl.add_argument("--no-conditions", action="store_true", help="skip the conditions-of-change sweeps")
    add_jobs(pl)
    add_ray(pl)
    add_profile(pl)
    add_flags(pl)
    pl.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from meshplan.report.json import plan_analysis_dict
    from meshplan.report.text import plan_text

    model, cluster, job = scenario(args)
    if args.from_ or args.export:  # an existing configuration, or the plan as a framework's settings
        from meshplan.commands.frameworks import plan_frameworks

        return plan_frameworks(args, model, cluster, job)
    with progress(args, "meshplan plan").running() as line:
        analysis = analysis_of(args, model, cluster, job, line)
    econ = economics_of(args, analysis)
    if args.json:
        out = plan_analysis_dict(analysis, top=args.top)
        out["profile_notes"] = args.profile_notes
        out["economics"] = econ.to_dict() if econ else None
        print(strict_json(out))
    else:
        from meshplan.economics import summary_lines

        print("\n".join([*args.profile_notes, plan_text(analysis, top=args.top or 10,
                                                        extra=summary_lines(econ) if econ else [])]))
    return 0


def analysis_of(args: argparse.Namespace, model: Any, cluster: Any, job: Any, line: Any) -> Any:
    """The analysis of plan and report: per stack where none is named (meshplan.stacks), else of the job's."""
    if names_no_stack(args, job):
        from meshplan.stacks import analyse_by_stack

        return analyse_by_stack(model, cluster, job, space=space(args), mfu=args.mfu,
                                with_conditions=not args.no_conditions, progress=line, workers=args.jobs)
    from meshplan.explain import analyse

    return analyse(model, cluster, job, space=space(args), mfu=args.mfu, with_conditions=not args.no_conditions,
                   progress=line, workers=args.jobs)


def economics_of(args: argparse.Namespace, analysis: Any) -> Any:
    """Time to train, cost, energy and goodput of the recommendation, where a token budget is given."""
    if analysis.recommended is None:
        return None
    from meshplan.economics.flags import evaluate_economics

    return evaluate_economics(args, analysis.recommended, analysis.model, analysis.cluster, analysis.job)
