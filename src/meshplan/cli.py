"""The `meshplan` command. A small, frozen set of flags; everything else goes into spec files.

Exit status: 0 success; 1 a check failed (crosscheck/validate thresholds); 2 bad input (one line on
stderr naming the field and what is allowed, no traceback).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from meshplan.argtypes import link_gb_per_s, mfu_fraction, output_dir, output_file, positive_size, whole_in
from meshplan.errors import SpecError
from meshplan.fileio import WriteError, atomic_write_bytes, strict_json, write_json

DEFAULT_MODEL = "seed-70b"
DEFAULT_CLUSTER = "h100-sxm"
DEFAULT_NODES = 8
DEFAULT_BATCH_TOKENS = 4_194_304
DEFAULT_SEQ_LEN = 4096


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse's own status)
        self.exit(2, f"meshplan: error: {message}\n")


def _add_scenario(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scenario (defaults: the worked example)")
    g.add_argument("--model", default=DEFAULT_MODEL, help=f"catalog name or model .toml (default {DEFAULT_MODEL})")
    g.add_argument("--cluster", default=DEFAULT_CLUSTER,
                   help=f"accelerator name (its usual node) or cluster .toml (default {DEFAULT_CLUSTER})")
    g.add_argument("--nodes", type=positive_size, default=None,
                   help=f"nodes (default: the cluster file's, else {DEFAULT_NODES})")
    g.add_argument("--gpus-per-node", type=positive_size, default=None, help="GPUs per node (default: the node's)")
    g.add_argument("--inter-node-bandwidth", type=link_gb_per_s, default=None, metavar="GB_PER_S",
                   help="NIC bandwidth per GPU per direction, decimal GB/s")
    g.add_argument("--batch-tokens", type=positive_size, default=None,
                   help=f"global batch in tokens per step (default {DEFAULT_BATCH_TOKENS:,}; 4M works)")
    g.add_argument("--seq-len", type=positive_size, default=None, help=f"sequence length (default {DEFAULT_SEQ_LEN})")
    g.add_argument("--job", default=None, metavar="FILE",
                   help="job spec .toml (optimizer, precision, reduce_dtype_bytes, compiled, cuda_graphs, "
                        "cuda_graph_scope, fp8_attention, fused_grouped_mlp, flop_convention, ...)")
    g.add_argument("--mfu", type=mfu_fraction, default=None,
                   help="assume this MFU for compute instead of the kernel model")
    g.add_argument("--json", action="store_true", help="write JSON (schema in the README)")
    from meshplan.economics.flags import add_job_flags

    add_job_flags(g)


def _job(args: argparse.Namespace) -> Any:
    from meshplan.catalog import load_job
    from meshplan.economics.flags import job_overrides

    return load_job(args.job, defaults={"global_batch_tokens": DEFAULT_BATCH_TOKENS, "seq_len": DEFAULT_SEQ_LEN},
                    global_batch_tokens=args.batch_tokens, seq_len=args.seq_len, **job_overrides(args))


def _scenario(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from meshplan.catalog import load_cluster, load_model

    model = load_model(args.model)
    cluster = load_cluster(args.cluster, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                           inter_node_gb_per_s=args.inter_node_bandwidth, default_nodes=DEFAULT_NODES)
    args.profile_notes = []
    if getattr(args, "profile", None):
        from meshplan.profile import apply_profile, load_profile

        cluster, args.profile_notes = apply_profile(cluster, load_profile(args.profile))
    return model, cluster, _job(args)


def _add_profile(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="measured profile (meshplan measure --out): its link and GEMM figures replace the catalog's")


def _progress(label: str):
    start = time.perf_counter()

    def report(done: int, total: int) -> None:
        if sys.stderr.isatty() and time.perf_counter() - start > 1.0:
            print(f"\r{label}: {done:,}/{total:,} plans", end="" if done < total else "\n", file=sys.stderr,
                  flush=True)

    return report


def cmd_evaluate(args: argparse.Namespace) -> int:
    from meshplan.cost.simplified import evaluate_simplified
    from meshplan.cost.step import evaluate
    from meshplan.cost.validate import validate_plan
    from meshplan.report.json import estimate_dict
    from meshplan.report.text import estimate_text
    from meshplan.specs import parse_plan
    from meshplan.specs.plan import stack_mismatch

    model, cluster, job = _scenario(args)
    imported = None
    if args.from_:  # an existing framework configuration (meshplan.frameworks)
        from meshplan.frameworks.command import apply_import

        imported, model, cluster, job = apply_import(args, model, cluster, job)
    elif not args.plan:
        raise SpecError("evaluate", "needs --plan PLAN, or --from STACK SOURCE")
    plan = imported.plan if imported else parse_plan(args.plan, world_size=cluster.n_gpus)
    from meshplan.economics.flags import plan_with_job_recompute

    plan = plan_with_job_recompute(plan, job)
    if args.assumptions == "worked-example":
        from meshplan.cost.simplified import unmodelled_settings

        ignored = unmodelled_settings(plan) + (["--trace"] if args.trace else [])
        if ignored:
            raise SpecError("evaluate --assumptions", f"worked-example arithmetic times data parallelism and TP "
                                                      f"only; it has no term for {', '.join(ignored)} (use the "
                                                      "faithful mode)")
        validate_plan(model, cluster, job, plan)
        est = evaluate_simplified(model, cluster, job, plan, mfu=args.mfu if args.mfu is not None else 0.4)
    else:
        est = evaluate(model, cluster, job, plan, mfu=args.mfu)
        if est.feasible or args.trace:
            from meshplan.calibration import compute_params_for
            from meshplan.sim.simulate import refine, simulate

            cp = compute_params_for(cluster.accelerator.name, job.software)
            if args.trace:
                from meshplan.sim.trace import write_trace

                write_trace(est, simulate(est, slowdown=cp.comm_slowdown, step_overhead_s=cp.step_overhead_s),
                            Path(args.trace))
            est = refine(est, slowdown=cp.comm_slowdown, step_overhead_s=cp.step_overhead_s)
        from meshplan.uncertainty import attach_band

        est = attach_band(est, accelerator=cluster.accelerator.name, software=job.software, moe=model.is_moe)
    if job.software != "generic" or job.compiled or job.cuda_graphs or job.fp8_attention or job.fused_grouped_mlp:
        est = replace(est, notes=[*est.notes, f"software stack: {job.software}"
                                  + (", torch.compile'd blocks (job.compiled)" if job.compiled else "")
                                  + (f", CUDA graphs of scope {job.cuda_graph_scope} (job.cuda_graphs)"
                                     if job.cuda_graphs else "")
                                  + (", FP8 attention (job.fp8_attention)" if job.fp8_attention else "")
                                  + (", fused grouped expert MLPs (job.fused_grouped_mlp)"
                                     if job.fused_grouped_mlp else "")])
    if job.precision == "fp8":
        est = replace(est, notes=[*est.notes, "MFU and HFU are against the accelerator's dense FP8 peak"])
    mismatch = stack_mismatch(job.software, plan)
    if mismatch:
        est = replace(est, notes=[*est.notes, mismatch])
    if args.profile_notes:
        est = replace(est, notes=[*est.notes, *args.profile_notes])
    if imported or args.export:
        from meshplan.frameworks.command import evaluated_frameworks

        return evaluated_frameworks(args, est, imported, model, cluster, job)
    from meshplan.economics.flags import evaluate_economics

    econ = evaluate_economics(args, est, model, cluster, job)  # with --train-tokens
    if args.json:
        print(strict_json({**estimate_dict(est), **({"economics": econ.to_dict()} if econ else {})}))
    else:
        from meshplan.economics import summary_lines

        print("\n".join([estimate_text(est), *(summary_lines(econ) if econ else [])]))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from meshplan.explain import analyse
    from meshplan.report.json import plan_analysis_dict
    from meshplan.report.text import plan_text

    model, cluster, job = _scenario(args)
    if args.from_ or args.export:  # an existing configuration, or the plan as a framework's settings
        from meshplan.frameworks.command import cmd_plan_frameworks

        return cmd_plan_frameworks(args, model, cluster, job)
    analysis = analyse(model, cluster, job, space=_space(args), mfu=args.mfu, with_conditions=not args.no_conditions,
                       progress=_progress("searching"), workers=args.jobs)
    if args.json:
        out = plan_analysis_dict(analysis, top=args.top if args.top else None)
        out["profile_notes"] = args.profile_notes
        print(strict_json(out))
    else:
        print("\n".join([*args.profile_notes, plan_text(analysis, top=args.top or 10)]))
    return 0


def _space(args: argparse.Namespace) -> Any:
    from meshplan.search.space import Space

    return Space.dp_tp() if getattr(args, "space", "full") == "dp-tp" else Space()


def cmd_sweep(args: argparse.Namespace) -> int:
    from meshplan.report.json import estimate_dict
    from meshplan.search.sweep import changes, geometric, log_ticks, parse_range, sweep

    if args.plot:
        from meshplan.extras import require

        require("matplotlib", "plot", "sweep --plot")
    model, cluster, job = _scenario(args)
    name, lo, hi = parse_range(args.vary)
    values = geometric(lo, hi, args.points)
    points = sweep(model, cluster, job, name, values, space=_space(args), mfu=args.mfu, workers=args.jobs)
    if not points:
        raise SpecError("sweep.vary", f"none of the {len(values)} values of {name} from {lo:g} to {hi:g} gives a "
                                      "scenario that can be built (whole sequences per step that the batch splits "
                                      "into, whole nodes, layers the model can take, sequences of at least "
                                      "128 tokens that divide the batch): widen the range or add --points")
    if args.plot:
        from meshplan.report.charts import sweep_chart

        atomic_write_bytes(args.plot, sweep_chart(points, xlabel=name, log_x=log_ticks([p.value for p in points])))
    from meshplan.search.conditions import knob
    from meshplan.search.rank import TIE_BAND

    unit = knob(model, cluster, job, name).unit
    if args.json:
        print(strict_json({"schema": "meshplan.sweep/1", "condition": name, "unit": unit, "points": [
            {"value": p.value, "best": estimate_dict(p.best) if p.best else None,
             "best_by_family": {f: {"plan": e.plan.to_string(), "label": e.plan.label(), "step_time_s": e.step_time_s,
                                    "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu} for f, e in p.by_family.items()}}
            for p in points], "changes": [{"from_value": a, "to_value": b, "from_plan": pa, "to_plan": pb}
                                          for a, b, pa, pb in changes(points)]}))
        return 0
    from meshplan.units import format_seconds

    def fmt(v: float) -> str:  # 1,246,970 rather than 1.24697e+06; 12.5 for small values
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"

    print(f"meshplan sweep: {name} from {fmt(lo)} to {fmt(hi)} {unit}, {model.name} on {cluster.n_gpus} x "
          f"{cluster.accelerator.name} (the recommended plan at each value: the simplest within "
          f"{TIE_BAND:.0%} of the fastest)")
    print(f"{'value':>14}  {'recommended plan':<34} {'step':>10} {'MFU':>6} {'tokens/s/GPU':>13}")
    for p in points:
        if p.best:
            print(f"{fmt(p.value):>14}  {p.best.plan.label():<34} {format_seconds(p.best.step_time_s):>10} "
                  f"{p.best.mfu:>6.1%} {p.best.tokens_per_s_per_gpu:>13,.0f}")
        else:
            print(f"{fmt(p.value):>14}  no plan fits")
    for a, b, pa, pb in changes(points):
        print(f"between {fmt(a)} and {fmt(b)}: {pa} -> {pb}")
    outside = [p.value for p in points if not lo * (1 - 1e-9) <= p.value <= hi * (1 + 1e-9)]
    if outside:
        steps = {"gpus": f"whole nodes of {cluster.gpus_per_node}", "batch-tokens": "whole sequences",
                 "layers": "whole layers"}.get(name, "whole units")
        print(f"note: values are as evaluated ({name} moves in {steps}); {', '.join(fmt(v) for v in outside)} "
              f"lie{'s' if len(outside) == 1 else ''} outside {fmt(lo)}..{fmt(hi)}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from meshplan.explain import analyse
    from meshplan.report.html import write_report
    from meshplan.search.sweep import geometric, sweep

    out_dir = Path(args.out)
    model, cluster, job = _scenario(args)
    space = _space(args)
    analysis = analyse(model, cluster, job, space=space, mfu=args.mfu, with_conditions=not args.no_conditions,
                       progress=_progress("searching"), workers=args.jobs)
    b, bw = job.global_batch_tokens, cluster.inter.nic_bytes_per_s / 1e9
    sweeps = {
        "batch-tokens": sweep(model, cluster, job, "batch-tokens", geometric(max(job.seq_len * cluster.n_gpus // 8,
                                                                                   b / 16), b * 4, 7), space=space,
                              mfu=args.mfu, workers=args.jobs),
        "inter-node-bandwidth": sweep(model, cluster, job, "inter-node-bandwidth", geometric(bw / 8, bw * 2, 6),
                                      space=space, mfu=args.mfu, workers=args.jobs),
    }
    html_path, md_path = write_report(analysis, sweeps, out_dir)
    if args.json:  # the plan command's JSON beside the report
        from meshplan.report.json import plan_analysis_dict

        out = plan_analysis_dict(analysis, top=None)
        out["profile_notes"] = args.profile_notes
        write_json(out_dir / "report.json", out)
        print(f"wrote {html_path}, {md_path} and {out_dir / 'report.json'}")
    else:
        print(f"wrote {html_path} and {md_path}")
    return 0


def cmd_catalog(args: argparse.Namespace) -> int:
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


HARNESS_COMMANDS = ("meshplan.harness.crosscheck_cli", "meshplan.harness.measure_cli")


def _register_harness(sub: Any) -> None:
    """Subcommands of the PyTorch harness. Their modules import torch only when a command runs, and
    say how to install the extra when it is missing."""
    import importlib

    for name in HARNESS_COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise
            continue
        module.register(sub, _add_scenario)


def _add_jobs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=positive_size, default=None, metavar="N",
                   help="CPU cores for the independent work (conditions, sweep points, the simulator's "
                        "re-timing of the leading plans); default: all available")


def build_parser() -> argparse.ArgumentParser:
    from meshplan.frameworks.command import add_flags as add_framework_flags
    from meshplan.frameworks.command import register as register_frameworks

    p = _Parser(prog="meshplan", description="Plan how to parallelise transformer training on a GPU cluster.")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    pl = sub.add_parser("plan", help="search every plan, recommend one, say when to change it")
    _add_scenario(pl)
    pl.add_argument("--space", choices=("full", "dp-tp"), default="full",
                    help="full: every parallelism; dp-tp: DDP, FSDP, HSDP and TP x FSDP only")
    pl.add_argument("--top", type=positive_size, default=None, help="plans to list (text: 10; json: all)")
    pl.add_argument("--no-conditions", action="store_true", help="skip the conditions-of-change sweeps")
    _add_jobs(pl)
    _add_profile(pl)
    add_framework_flags(pl)
    pl.set_defaults(func=cmd_plan)
    ev = sub.add_parser("evaluate", help="evaluate one plan")
    _add_scenario(ev)
    ev.add_argument("--plan", default=None, help="e.g. dp_shard=64 or tp=8,dp_shard=8,mbs=1,recompute=full")
    ev.add_argument("--assumptions", choices=("faithful", "worked-example"), default="faithful",
                    help="worked-example: the hand analysis's simplifications (golden figures)")
    ev.add_argument("--trace", type=output_file(".json"), default=None, metavar="FILE.json",
                    help="write the simulated step as Chrome trace JSON (chrome://tracing, Perfetto)")
    _add_profile(ev)
    add_framework_flags(ev)
    ev.set_defaults(func=cmd_evaluate)
    sw = sub.add_parser("sweep", help="vary one condition and show where the best plan changes")
    _add_scenario(sw)
    sw.add_argument("--vary", required=True, metavar="NAME=LOW..HIGH",
                    help="batch-tokens, inter-node-bandwidth, gpus, seq-len or layers, e.g. batch-tokens=512K..16M")
    sw.add_argument("--points", type=whole_in(2, 200), default=9,
                    help="values, geometrically spaced from LOW to HIGH: 2 to 200 (default 9)")
    sw.add_argument("--space", choices=("full", "dp-tp"), default="full")
    sw.add_argument("--plot", type=output_file(".png"), metavar="FILE.png", help="write the sweep chart (PNG)")
    _add_jobs(sw)
    sw.set_defaults(func=cmd_sweep)
    rp = sub.add_parser("report", help="write an HTML and Markdown report with charts")
    _add_scenario(rp)
    rp.add_argument("--out", type=output_dir, default="meshplan-report",
                    help="output directory, created if missing (default meshplan-report)")
    rp.add_argument("--space", choices=("full", "dp-tp"), default="full")
    rp.add_argument("--no-conditions", action="store_true")
    _add_jobs(rp)
    rp.set_defaults(func=cmd_report)
    from meshplan.validation.command import register as register_validate

    register_validate(sub)
    from meshplan.compare import register as register_compare

    register_compare(sub, _add_scenario, _job, DEFAULT_NODES)
    _register_harness(sub)
    register_frameworks(sub, _add_scenario)
    ca = sub.add_parser("catalog", help="list accelerators and models with their sources, or show one")
    ca.add_argument("--model", default=None, metavar="NAME|FILE",
                    help="show this model: its spec, parameter counts (total, active per token, embedding) and sizes")
    ca.add_argument("--cluster", default=None, metavar="NAME|FILE",
                    help="show this accelerator's node or this cluster file: GPUs, links, memory")
    ca.add_argument("--nodes", type=positive_size, default=None,
                    help="with --cluster: nodes (default: the file's, else 1)")
    ca.add_argument("--json", action="store_true", help="JSON in base units (counts, bytes, bytes/s, FLOP/s)")
    ca.set_defaults(func=cmd_catalog)
    return p


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that the work unwinds (workers killed, no partial file)."""


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated


def _fail(message: str, code: int) -> int:
    """One line on stderr (cut to MAX_ERROR_CHARS), and the exit status."""
    line = " ".join(message.split())
    if len(line) > MAX_ERROR_CHARS:
        line = line[:MAX_ERROR_CHARS - 30] + f"... ({len(line):,} characters)"
    print(f"meshplan: {line}", file=sys.stderr)
    return code


MAX_ERROR_CHARS = 2000
"""The longest error line the command prints."""


def main(argv: list[str] | None = None) -> int:
    """Run one command. Exit status: 0 done, 1 a check failed or a file could not be written, 2 bad input,
    130 interrupted (Ctrl-C), 143 terminated (SIGTERM), 70 an internal error (one line; MESHPLAN_DEBUG=1
    shows its traceback)."""
    in_main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, _terminate) if in_main else None
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "command", None):
            args = parser.parse_args(["plan", *(argv or [])])
        return int(args.func(args))
    except SpecError as exc:
        return _fail(f"error: {exc}", 2)
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Terminated:
        return _fail("terminated", 143)
    except WriteError as exc:
        return _fail(f"error: {exc}", 1)
    except OSError as exc:  # a file the checks before the work could not foresee (a read-only file system)
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"error: {where}{exc.strerror or exc}", 1)
    except (RecursionError, MemoryError) as exc:
        return _fail(f"error: the input is too large or nested too deeply ({type(exc).__name__})", 2)
    except Exception as exc:  # a bug: one line, the traceback on request
        if os.environ.get("MESHPLAN_DEBUG"):
            raise
        return _fail(f"internal error: {type(exc).__name__}: {exc} (set MESHPLAN_DEBUG=1 for the traceback, and "
                     "please report it)", 70)
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


if __name__ == "__main__":
    sys.exit(main())
