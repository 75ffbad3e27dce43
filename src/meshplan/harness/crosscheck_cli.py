"""``meshplan crosscheck``: run a plan with PyTorch under a fake process group and compare every collective.

Imported by the CLI on every run, so it never imports torch at import time; the command checks for torch
and says how to install it (exit 2) when it is missing. Exit 1 when a collective or memory term differs
beyond the stated tolerance (docs/measure-and-crosscheck.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable
from typing import Any

from meshplan.argtypes import reject_unused
from meshplan.errors import SpecError

TORCH_MISSING = "meshplan crosscheck needs the torch extra: pip install torch==2.13.0 && pip install 'meshplan[torch]'"
MAX_UNSCALED_PARAMS = 200_000_000  # a larger model needs --scale-down to run on a CPU
DEFAULT_RUN_SEQ_LEN = 64
DEFAULT_MICRO_BATCHES = 2


MAX_CROSSCHECK_WORLD = 4096
"""The largest world size ``crosscheck`` builds (a mesh of that many fake ranks, and degrees such as
dp_shard=4096 that the planner's own plans reach)."""


def register(subparsers: Any, add_scenario: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the ``crosscheck`` subcommand to the meshplan CLI."""
    p = subparsers.add_parser(
        "crosscheck", help="apply a plan with PyTorch (fake process group) and compare collectives and memory")
    add_scenario(p)
    p.add_argument("--plan", required=True, help="plan string, e.g. dp_shard=64 or tp=4,dp_shard=16,recompute=full; "
                                                 "the world size is the product of its degrees")
    p.add_argument("--scale-down", action="store_true",
                   help="run a CPU-sized copy of the model with the same shape ratios")
    p.add_argument("--micro-batches", type=int, default=DEFAULT_MICRO_BATCHES,
                   help=f"micro-batches of gradient accumulation (default {DEFAULT_MICRO_BATCHES})")
    p.set_defaults(func=cmd_crosscheck, _parser=p)


def check_cpu_sized(model: Any, what: str = "run") -> None:
    """SpecError naming the model unless it has at most MAX_UNSCALED_PARAMS parameters (a CPU run of a
    larger one needs --scale-down)."""
    from meshplan.cost.params import param_counts

    n = param_counts(model).total
    if n > MAX_UNSCALED_PARAMS:
        raise SpecError("model", f"{model.name} has {n:,} parameters, too many for a CPU {what}; add --scale-down")


def cmd_crosscheck(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("torch") is None:
        print(TORCH_MISSING, file=sys.stderr)
        return 2
    reject_unused(args, args._parser, ("model", "seq_len", "json"), "crosscheck")
    from meshplan.catalog import load_model
    from meshplan.harness.crosscheck import crosscheck
    from meshplan.harness.reference_model import reference_seq_len, scale_down
    from meshplan.specs import parse_plan

    model = load_model(args.model)
    if args.scale_down:
        model = scale_down(model)
    else:
        check_cpu_sized(model)
    if args.micro_batches < 1:
        raise SpecError("micro_batches", f"must be >= 1; got {args.micro_batches}")
    plan = parse_plan(args.plan)
    if plan.world_size > MAX_CROSSCHECK_WORLD:
        raise SpecError("plan", f"world size {plan.world_size:,} (the product of its degrees); the cross-check "
                                f"builds the plan in one process under a fake process group, up to "
                                f"{MAX_CROSSCHECK_WORLD:,} ranks")
    if args.micro_batches > 64:
        raise SpecError("micro_batches", f"at most 64 on the CPU; got {args.micro_batches}")
    seq_len = args.seq_len or reference_seq_len(model, DEFAULT_RUN_SEQ_LEN)
    result = crosscheck(model, plan, seq_len=seq_len, n_micro=args.micro_batches)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(format_result(result))
    return 0 if result.passed else 1


def _fmt_bytes(x: float) -> str:
    return f"{x:,.0f}"


def format_result(result: Any) -> str:
    """Plain-text table of a CrosscheckResult."""
    lines = [f"crosscheck {result.model}  plan {result.plan}  world {result.world_size}  "
             f"{result.n_micro} micro-batches of {result.mbs}x{result.seq_len} tokens  recompute {result.recompute}",
             f"tolerance: {result.tolerance}", "",
             f"{'collective':<15}{'axis':<14}{'calls pred':>11}{'calls rec':>10}{'bytes pred':>14}"
             f"{'bytes rec':>14}{'padding':>11}  status"]
    for r in result.rows:
        status = ("aux (not modelled)" if not r.modelled else "exact" if r.exact
                  else "explained" if r.ok else "MISMATCH")
        lines.append(f"{r.collective:<15}{r.axis:<14}{r.predicted_count:>11}{r.recorded_count:>10}"
                     f"{_fmt_bytes(r.predicted_bytes):>14}{_fmt_bytes(r.recorded_bytes):>14}"
                     f"{_fmt_bytes(r.padding_bytes):>11}  {status}")
        if r.note:
            lines.append(f"{'':<4}{r.note}")
    lines += ["", f"{'memory (rank 0)':<20}{'predicted':>14}{'recorded':>14}{'padding':>11}  status"]
    for m in result.memory:
        status = "exact" if m.ok and not m.known_bytes_delta else "explained" if m.ok else "MISMATCH"
        lines.append(f"{m.term:<20}{_fmt_bytes(m.predicted_bytes):>14}{_fmt_bytes(m.recorded_bytes):>14}"
                     f"{_fmt_bytes(m.padding_bytes):>11}  {status}")
        if m.note:
            lines.append(f"{'':<4}{m.note}")
    lines += [*result.notes, "", "PASS" if result.passed else "FAIL"]
    return "\n".join(lines)
