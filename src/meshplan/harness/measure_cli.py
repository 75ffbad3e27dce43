"""``meshplan measure``: the command line of the measurement harness (docs/measure-and-crosscheck.md).

Sub-commands ``gemm``, ``collectives``, ``step`` and ``moe`` run under ``torchrun``: either meshplan starts it
(``--nproc N``: ``python -m torch.distributed.run --standalone --nproc-per-node N -m
meshplan.harness.measure_worker ...`` with an overall timeout), or the user launches
``meshplan.harness.measure_worker`` with torchrun on every node. ``compare`` reads a saved profile and
needs no torch.

This module never imports torch at import time: the CLI imports it on every run.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from meshplan.argtypes import count, positive_float, positive_size, reject_unused
from meshplan.harness.measure.launch import WORKER_MODULE, launch

TORCH_MISSING = "meshplan measure needs the torch extra: pip install torch==2.13.0 && pip install 'meshplan[torch]'"
DEFAULT_TIMEOUT_S = 600.0


def _ops(text: str) -> tuple[str, ...]:
    from meshplan.harness.measure.profile_io import OPS

    ops = tuple(o.strip() for o in text.split(",") if o.strip())
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise argparse.ArgumentTypeError(f"unknown collective {', '.join(bad) or text!r}; choose from {', '.join(OPS)}")
    return ops


def _launch_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("run")
    g.add_argument("--nproc", type=count, default=None, metavar="N",
                   help="start N processes on this machine with torchrun (otherwise: already under torchrun)")
    g.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                   help="process-group backend (default: nccl if CUDA is available, else gloo)")
    g.add_argument("--out", default=None, metavar="FILE",
                   help="write the meshplan.profile/1 file; merges into FILE if it already holds a profile")
    g.add_argument("--timeout", type=positive_float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"collective timeout, and with --nproc the whole run's limit (default {DEFAULT_TIMEOUT_S:g})")


def register(subparsers: Any, add_scenario: Any) -> None:
    """Add ``meshplan measure {gemm,collectives,step,moe,compare}`` to the meshplan CLI."""
    m = subparsers.add_parser("measure", help="measure GEMMs, collectives and a training step with PyTorch "
                                              "(writes a profile for --profile)")
    msub = m.add_subparsers(dest="measure_command", parser_class=type(m),
                            metavar="{gemm,collectives,step,moe,compare}")
    m.set_defaults(func=lambda args: _usage(m))

    g = msub.add_parser("gemm", help="throughput of the GEMM shapes a plan runs (default: a square/skinny sweep)")
    add_scenario(g)
    g.set_defaults(model=None, cluster=None)  # compared with the measured device's model unless --cluster
    g.add_argument("--plan", default=None, help="split the model's GEMMs as this plan does (tp, cp, mbs)")
    g.add_argument("--scale-down", action="store_true", help="use the CPU-sized copy of the model")
    _launch_flags(g)
    g.set_defaults(func=_run, _parser=g)

    c = msub.add_parser("collectives", help="all-gather, reduce-scatter, all-reduce, all-to-all, send/recv "
                                            "bandwidth per mesh axis, fitted to alpha + S·f/busbw")
    c.add_argument("--plan", default=None, help="measure the groups of this plan's mesh axes (default: the world)")
    c.add_argument("--min-bytes", type=positive_size, default=None, metavar="SIZE",
                   help="smallest message (default 1K)")
    c.add_argument("--max-bytes", type=positive_size, default=None, metavar="SIZE",
                   help="largest message (default 64M on a CPU, 1G on a GPU)")
    c.add_argument("--ops", type=_ops, default=None, metavar="OP,OP",
                   help="collectives to sweep (default all five)")
    c.add_argument("--json", action="store_true", help="print the measurements as JSON")
    _launch_flags(c)
    c.set_defaults(func=_run, _parser=c)

    s = msub.add_parser("step", help="a real training step under the plan (FSDP2, TP) with the profiler")
    add_scenario(s)
    s.add_argument("--plan", required=True, help="e.g. dp_shard=2 or tp=2,dp_shard=2 (pp, cp, ep not run)")
    s.add_argument("--scale-down", action="store_true", help="use the CPU-sized copy of the model")
    s.add_argument("--steps", type=count, default=5, help="timed steps after 2 warm-up steps (default 5)")
    s.add_argument("--compare", action="store_true", help="print meshplan's prediction beside the measurement")
    _launch_flags(s)
    s.set_defaults(func=_run, _parser=s)

    e = msub.add_parser("moe", help="expert GEMMs at the shapes a plan produces (one per expert and grouped), "
                                    "the router and the token permutation")
    add_scenario(e)
    e.set_defaults(model=None, cluster=None)
    e.add_argument("--plan", default=None, help="time the expert shapes of this plan (ep, tp, cp, mbs; default: "
                                                "a sweep of 8 experts)")
    e.add_argument("--scale-down", action="store_true", help="use the CPU-sized copy of the model")
    _launch_flags(e)
    e.set_defaults(func=_run, _parser=e)

    k = msub.add_parser("compare", help="predicted against measured for the step in a profile (no torch needed)")
    k.add_argument("--profile", required=True, metavar="FILE", help="a profile written by `measure step --out`")
    k.add_argument("--cluster", default=None, help="predict for this cluster (default: the measured device for "
                                                   "kernels, the cluster the step recorded for a step)")
    k.add_argument("--json", action="store_true")
    k.set_defaults(func=_compare)


def _usage(parser: argparse.ArgumentParser) -> int:
    print("meshplan: error: measure needs a sub-command: gemm, collectives, step, moe or compare", file=sys.stderr)
    return 2


def _compare(args: argparse.Namespace) -> int:
    import json

    from meshplan.errors import SpecError
    from meshplan.harness.measure.compare import comparison, kernel_comparison, kernel_text, predicted_dict
    from meshplan.harness.measure.profile_io import check_profile
    from meshplan.profile import load_profile

    profile = load_profile(args.profile)
    errors = check_profile(profile)
    if errors:
        raise SpecError("profile", f"{args.profile}: " + "; ".join(errors[:4]) + (" ..." if len(errors) > 4 else ""))
    kernels = kernel_comparison(profile, args.cluster)
    if not profile.get("step") and kernels is None:
        print("meshplan: error: the profile holds no step, GEMM or attention measurement; run `meshplan measure "
              "step|gemm ... --out FILE` first", file=sys.stderr)
        return 2
    out: dict[str, Any] = {}
    texts = []
    if kernels is not None:
        accel, krows, note = kernels
        out["kernels"] = {"accelerator": accel.name, "note": note, "rows": [
            {"kernel": r.kernel, "predicted_s": r.predicted_s, "measured_s": r.measured_s} for r in krows]}
        texts.append(kernel_text(krows, accel, note))
    if profile.get("step"):
        try:
            rows, text, notes = comparison(profile, args.cluster)
        except ValueError as exc:
            print(f"meshplan: error: {exc}", file=sys.stderr)
            return 2
        out["step"] = predicted_dict(rows, args.cluster or profile["step"].get("cluster", ""), notes)
        texts.append(text)
    out["notes"] = list(profile.get("notes") or [])
    print(json.dumps(out, indent=2, allow_nan=False) if args.json else "\n\n".join(texts))
    return 0


def check_inputs(args: argparse.Namespace, world_size: int | None) -> None:
    """Raise SpecError (exit 2 in the CLI) for a bad plan or model before any process starts."""
    from meshplan.errors import SpecError
    from meshplan.specs import parse_plan

    plan = getattr(args, "plan", None)
    if plan is not None:
        p = parse_plan(plan, world_size=world_size)
        if args.measure_command not in ("gemm", "moe") and world_size is not None and p.world_size != world_size:
            raise SpecError("plan", f"{plan!r} needs {p.world_size} ranks (pp·dp_replicate·dp_shard·cp·tp); "
                                    f"the run has {world_size}")
    if getattr(args, "model", None) is not None:
        from meshplan.catalog import load_model

        model = load_model(args.model)
        if args.measure_command == "step" and not args.scale_down and _runs_on_cpu(args):
            from meshplan.harness.crosscheck_cli import check_cpu_sized

            check_cpu_sized(model, "step")
    if getattr(args, "cluster", None) is not None:
        from meshplan.catalog import load_cluster

        load_cluster(args.cluster)
    out = getattr(args, "out", None)
    if out:  # before measuring, not when writing the results (the profile and the step's trace beside it)
        path = Path(out)
        if path.is_dir():
            raise SpecError("out", f"{out!r} is a folder; give a file name")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpecError("out", f"cannot create the folder of {out!r}: {exc.strerror}") from None
        if not os.access(path.parent, os.W_OK):
            raise SpecError("out", f"cannot write in the folder of {out!r}")
        from meshplan.harness.measure.profile_io import read_existing

        try:
            read_existing(path)
        except ValueError as exc:
            raise SpecError("out", str(exc)) from None


SCENARIO_USED = {"step": ("model", "cluster", "batch_tokens", "seq_len", "json"),
                 "gemm": ("model", "cluster", "seq_len", "json"),
                 "moe": ("model", "cluster", "seq_len", "json")}
"""The scenario flags each measurement reads (argtypes.reject_unused rejects the others)."""


def _runs_on_cpu(args: argparse.Namespace) -> bool:
    """Whether the measurement will run on CPUs: the gloo backend asked for, or no CUDA device."""
    if args.backend == "gloo":
        return True
    import torch

    return not torch.cuda.is_available()


def _run(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("torch") is None:
        print(TORCH_MISSING, file=sys.stderr)
        return 2
    if args.measure_command in SCENARIO_USED:
        reject_unused(args, args._parser, SCENARIO_USED[args.measure_command], f"measure {args.measure_command}")
    if args.nproc:
        check_inputs(args, args.nproc)
        return launch(args)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        print(f"meshplan: error: measure {args.measure_command} runs under torchrun (RANK and WORLD_SIZE are not "
              "set); pass --nproc N to start N processes here, or launch "
              f"`torchrun ... -m {WORKER_MODULE} {args.measure_command} ...` (docs/measure-and-crosscheck.md)",
              file=sys.stderr)
        return 2
    check_inputs(args, int(os.environ["WORLD_SIZE"]))
    from meshplan.harness.measure.rank import run

    return run(args)


