"""The command line of the framework exports and imports: ``meshplan export``, and ``--export`` / ``--from`` on
``plan`` and ``evaluate`` (meshplan.cli adds them through ``register`` and ``add_flags``)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from meshplan.errors import SpecError
from meshplan.fileio import strict_json
from meshplan.frameworks.common import FORMATS, STACKS, VERSIONS, Export, Imported
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan

_SOFTWARE = {"torchtitan": "torchtitan", "megatron": "megatron"}
"""The meshplan software stack (JobSpec.software) each framework's plans are timed as; DeepSpeed has none of its
own (its plans are searched as 'generic', with ZeRO among the shardings)."""


def export(stack: str, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, fmt: str | None = None
           ) -> Export:
    """``plan`` as ``stack``'s settings in format ``fmt`` (the stack's first format by default); SpecError naming
    what the framework lacks where it cannot run the plan."""
    if stack not in STACKS:
        raise SpecError("export", f"unknown framework {stack!r}; allowed: {', '.join(STACKS)}")
    fmt = fmt or FORMATS[stack][0]
    if fmt not in FORMATS[stack]:
        raise SpecError("export --format", f"{stack} exports as {', '.join(FORMATS[stack])}; got {fmt!r}")
    module = _module(stack)
    return module.export(model, cluster, job, plan, fmt)


def read(stack: str, source: str, *, world_size: int | None, n_layers: int | None = None) -> Imported:
    """An existing configuration of ``stack`` (a file, or the command line as text) as a plan and a job."""
    if stack not in STACKS:
        raise SpecError("from", f"unknown framework {stack!r}; allowed: {', '.join(STACKS)}")
    module = _module(stack)
    if stack == "torchtitan":
        return module.read(source, world_size=world_size, n_layers=n_layers)
    return module.read(source, world_size=world_size)


def _module(stack: str) -> Any:
    import importlib

    return importlib.import_module(f"meshplan.frameworks.{stack}")


def stack_job(stack: str, job: JobSpec) -> JobSpec:
    """The job as the framework runs it: a job that names no stack is timed on the framework's."""
    if job.software == "generic" and stack in _SOFTWARE:
        return replace(job, software=_SOFTWARE[stack])
    return job


def add_flags(p: argparse.ArgumentParser, *, imports: bool = True) -> None:
    """--export STACK [--format F] [--out FILE], and --from STACK SOURCE, on plan and evaluate."""
    g = p.add_argument_group("frameworks (docs/frameworks.md)")
    g.add_argument("--export", choices=STACKS, default=None, metavar="STACK",
                   help=f"print the plan as the settings of {', '.join(STACKS)}: a launch script by default")
    g.add_argument("--format", default=None, metavar="FORMAT",
                   help="with --export: " + "; ".join(f"{s}: {', '.join(f)}" for s, f in FORMATS.items()))
    g.add_argument("--out", default=None, metavar="FILE", help="with --export: write the settings to FILE")
    if imports:
        g.add_argument("--from", dest="from_", nargs=2, default=None, metavar=("STACK", "SOURCE"),
                       help="read an existing configuration: torchtitan (its command line, as text or a file), "
                            "megatron (a launch script or file of pretrain_gpt.py arguments), deepspeed "
                            "(ds_config.json, or a Megatron-DeepSpeed launch script)")


def write_export(args: argparse.Namespace, ex: Export) -> str | None:
    """Write ``ex`` to --out (returning a line saying so), or return None for the caller to print it."""
    if not args.out:
        return None
    from meshplan.fileio import atomic_write_text

    atomic_write_text(args.out, ex.text)
    return f"wrote the {ex.stack} settings ({ex.format}) to {args.out}"


def apply_import(args: argparse.Namespace, model: ModelSpec, cluster: ClusterSpec, job: JobSpec
                 ) -> tuple[Imported, ModelSpec, ClusterSpec, JobSpec]:
    """The scenario of ``--from STACK SOURCE``: its plan, and the model, GPUs and job it names (the command
    line's --model and --nodes win where given)."""
    stack, source = args.from_
    given_model = args.model != "seed-70b"  # meshplan.cli.DEFAULT_MODEL: the configuration's model wins over it
    imported = read(stack, source, world_size=cluster.n_gpus, n_layers=model.n_layers)
    if not given_model and imported.model_spec is not None:
        model = imported.model_spec
    elif not given_model and imported.model is not None:
        from meshplan.catalog import load_model

        model = load_model(imported.model)
    world = imported.world_size
    if world and world != cluster.n_gpus:
        if args.nodes is not None or world % cluster.gpus_per_node:
            raise SpecError("from", f"the configuration runs on {world} GPUs; the cluster has {cluster.n_gpus} "
                                    f"({cluster.n_nodes} x {cluster.gpus_per_node})")
        cluster = replace(cluster, n_nodes=world // cluster.gpus_per_node)
    fields = dict(imported.job)
    seqs = fields.pop("global_batch_seqs", None)
    if seqs is not None and "global_batch_tokens" not in fields:
        fields["global_batch_tokens"] = int(seqs) * int(fields.get("seq_len", job.seq_len))  # type: ignore[call-overload]
    try:
        job = replace(job, **fields)  # type: ignore[arg-type]
    except TypeError as exc:
        raise SpecError("from", str(exc)) from None
    return imported, model, cluster, job


def import_notes(imported: Imported) -> list[str]:
    out = [f"read from {imported.stack}: {imported.plan.to_string()}", *list(imported.notes)]
    if imported.unsupported:
        out.append("settings read and not modelled: " + "; ".join(imported.unsupported))
    return out


def export_first(stack: str, ranked: list, model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                 fmt: str | None) -> tuple[Any, Export, list[str]]:
    """The best of ``ranked`` (feasible estimates, best first) that ``stack`` runs, its export, and why the ones
    before it were refused."""
    refused: list[str] = []
    for est in ranked:
        if not est.feasible:
            break
        try:
            return est, export(stack, model, cluster, job, est.plan, fmt), refused
        except SpecError as exc:
            if exc.field != f"export.{stack}":
                raise
            refused.append(f"{est.plan.label()}: {exc.message}")
    raise SpecError(f"export.{stack}", "no plan that fits runs on it" + (f"; the best was refused: {refused[0]}"
                                                                          if refused else ""))


def cmd_export(args: argparse.Namespace) -> int:
    """meshplan export STACK --plan PLAN: the plan (evaluated, so that its micro-batch and recomputation are
    chosen) as the framework's settings."""
    from meshplan.cli import _scenario
    from meshplan.cost.step import evaluate
    from meshplan.specs import parse_plan

    model, cluster, job = _scenario(args)
    job = stack_job(args.stack, job)
    est = evaluate(model, cluster, job, parse_plan(args.plan, world_size=cluster.n_gpus))
    if est.plan.mbs is not None and est.plan.recompute is not None:
        ex = export(args.stack, model, cluster, job, est.plan, args.format)  # what the framework lacks comes first
    if not est.feasible:
        raise SpecError("export", f"the plan does not fit: {'; '.join(est.infeasible_reasons)}")
    line = write_export(args, ex)
    print(line if line else ex.text, end="\n" if line else "")
    return 0


def cmd_plan_frameworks(args: argparse.Namespace, model: ModelSpec, cluster: ClusterSpec, job: JobSpec) -> int:
    """plan --from and/or --export: what meshplan would change in an existing configuration, and the
    recommendation as a framework's settings."""
    from meshplan.search.search import REFINE_TOP, search
    from meshplan.search.space import Space

    imported, current = None, None
    if args.from_:
        imported, model, cluster, job = apply_import(args, model, cluster, job)
        current = _evaluate(model, cluster, job, imported.plan)
    stack = args.export or (imported.stack if imported else None)
    if args.export:
        job = stack_job(args.export, job)
    result = search(model, cluster, job, Space.dp_tp() if args.space == "dp-tp" else Space(), mfu=args.mfu,
                    refine_top=REFINE_TOP, workers=args.jobs)  # ranked as meshplan plan ranks them
    if not result.feasible:
        raise SpecError("plan", "no plan fits this scenario (meshplan plan lists why)")
    best, ex, refused = (result.ranked[0], None, [])
    if stack is not None and (args.export or imported):
        try:
            best, ex, refused = export_first(stack, result.ranked, model, cluster, job, args.format)
        except SpecError:
            if args.export:
                raise
    if best.closed_form_step_time_s is None and best is not result.ranked[0]:  # past the simulator's re-timing
        best = _evaluate(model, cluster, job, best.plan)
    overall = result.ranked[0]
    lines = _comparison(imported, current, best, overall, refused, stack) if imported else []
    if args.json:
        print(strict_json(_json(imported, current, best, ex, lines)))
        return 0
    written = write_export(args, ex) if (ex and args.export) else None
    text = "\n".join(lines + ([written] if written else []))
    if ex and args.export and not written:
        head = [] if imported else [_headline(best, overall, refused, args.export)]
        text = "\n".join([*([text, ""] if text else []), *head, ex.text.rstrip("\n")])
    elif not args.export and not imported:
        text = "nothing to do"
    print(text)
    return 0


def _headline(best: Any, overall: Any, refused: list[str], stack: str) -> str:
    """The comment line above a plan --export: which plan, and what meshplan predicts for it."""
    from meshplan.units import format_gib, format_seconds

    which = "the recommendation" if best is overall else f"the fastest plan {stack} runs (the recommendation, " \
        f"{overall.plan.label()}, does not: {refused[0].split(': ', 1)[-1] if refused else ''})"
    return (f"# meshplan plan: {which}; predicted {format_seconds(best.step_time_s)} a step, MFU {best.mfu:.1%}, "
            f"peak {format_gib(best.memory.peak_bytes)} of {format_gib(best.memory.capacity_bytes)} per GPU")


def _evaluate(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan) -> Any:
    from meshplan.calibration import compute_params_for
    from meshplan.cost.step import evaluate
    from meshplan.sim.simulate import refine

    est = evaluate(model, cluster, job, plan)
    if est.feasible:
        cp = compute_params_for(cluster.accelerator.name, job.software)
        est = refine(est, slowdown=cp.comm_slowdown, step_overhead_s=cp.step_overhead_s)
    return est


def _comparison(imported: Imported, current: Any, best: Any, overall: Any, refused: list[str],
                stack: str | None) -> list[str]:
    from meshplan.units import format_gib, format_seconds

    def summary(e: Any) -> str:
        if not e.feasible:
            return f"does not fit ({'; '.join(e.infeasible_reasons)})"
        return (f"{format_seconds(e.step_time_s)} a step, MFU {e.mfu:.1%}, peak {format_gib(e.memory.peak_bytes)} of "
                f"{format_gib(e.memory.capacity_bytes)}")

    out = [f"your {imported.stack} configuration: {current.plan.label()} [{current.plan.to_string()}]",
           f"  predicted: {summary(current)}"]
    out += [f"  note: {n}" for n in imported.notes]
    if imported.unsupported:
        out.append("  settings read and not modelled: " + "; ".join(imported.unsupported))
    out.append(f"meshplan would run: {best.plan.label()} [{best.plan.to_string()}]"
               + (f" (the fastest plan {stack} runs)" if best is not overall else ""))
    out.append(f"  predicted: {summary(best)}")
    if current.feasible:
        ratio = current.step_time_s / best.step_time_s
        out.append(f"  change: {ratio:.2f}x the throughput ({format_seconds(current.step_time_s - best.step_time_s)} "
                   f"less a step)" if ratio >= 1 else f"  change: none faster ({ratio:.2f}x)")
    else:
        out.append("  change: your configuration does not fit; this one does")
    out += [f"  {line}" for line in _changes(current.plan, best.plan)]
    if best is not overall:
        out.append(f"  the overall recommendation, {overall.plan.label()}, does not run on {stack}: "
                   f"{refused[0].split(': ', 1)[-1]}" if refused else "")
    return [line for line in out if line]


def _changes(a: Plan, b: Plan) -> list[str]:
    """The settings that differ, as 'key: old -> new'."""
    from dataclasses import fields

    out = []
    for f in fields(Plan):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if x != y:
            out.append(f"{f.name}: {x} -> {y}")
    return out


def _json(imported: Imported | None, current: Any, best: Any, ex: Export | None, lines: list[str]) -> dict:
    from meshplan.report.json import estimate_dict

    out: dict[str, Any] = {"schema": "meshplan.frameworks/1", "recommended": estimate_dict(best)}
    if imported is not None:
        out["imported"] = {"stack": imported.stack, "estimate": estimate_dict(current),
                           "unsupported": list(imported.unsupported), "notes": list(imported.notes),
                           "changes": _changes(current.plan, best.plan)}
    if ex is not None:
        out["export"] = {"stack": ex.stack, "format": ex.format, "text": ex.text, "args": list(ex.args),
                         "assumptions": list(ex.assumptions), "version": VERSIONS[ex.stack]}
    return out


def register(sub: Any, add_scenario: Any) -> None:
    """The ``export`` subcommand."""
    p = sub.add_parser("export", help="a plan as the settings of torchtitan, Megatron-LM / Megatron-Bridge or "
                                      "DeepSpeed")
    p.add_argument("stack", choices=STACKS, help="the framework")
    add_scenario(p)
    p.add_argument("--plan", required=True, help="e.g. tp=4,pp=16,sharding=megatron (mbs and recompute left out "
                                                 "are chosen by evaluate)")
    p.add_argument("--format", default=None, help="; ".join(f"{s}: {', '.join(f)}" for s, f in FORMATS.items()))
    p.add_argument("--out", default=None, metavar="FILE", help="write the settings to FILE")
    p.set_defaults(func=cmd_export)


def evaluated_frameworks(args: argparse.Namespace, est: Any, imported: Imported | None, model: ModelSpec,
                         cluster: ClusterSpec, job: JobSpec) -> int:
    """evaluate --from / --export: the estimate with what was read (and not modelled) in its notes, and the
    evaluated plan as the framework's settings (alone on stdout, or to --out beside the estimate)."""
    from meshplan.report.json import estimate_dict
    from meshplan.report.text import estimate_text

    if imported is not None:
        est = replace(est, notes=[*est.notes, *import_notes(imported)])
    ex = export(args.export, model, cluster, job, est.plan, args.format) if args.export else None
    if args.json:
        out = estimate_dict(est)
        if ex is not None:
            out["export"] = {"stack": ex.stack, "format": ex.format, "text": ex.text, "args": list(ex.args),
                             "assumptions": list(ex.assumptions), "version": VERSIONS[ex.stack]}
        print(strict_json(out))
        return 0
    if ex is not None and not args.out:
        print(ex.text, end="")
        return 0
    written = write_export(args, ex) if ex is not None else None
    print(estimate_text(est) + (f"\n{written}" if written else ""))
    return 0
