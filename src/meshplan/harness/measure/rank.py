"""What every rank of ``meshplan measure {gemm,collectives,step}`` runs under torchrun: join the process
group (collective timeout ``--timeout``), measure, and on rank 0 write the profile (``--out``) and print
the summary. A rank that fails prints one line ``meshplan: error: rank R: ...`` (the traceback too with
``MESHPLAN_DEBUG=1``), records it for the launcher (harness.measure.launch) and returns 1 (2 for bad input).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from meshplan.errors import SpecError
from meshplan.harness.measure.launch import ERRDIR_ENV

_MAX_LINE = 400


FAULT_ENV = "MESHPLAN_MEASURE_FAULT"


def run(args: argparse.Namespace) -> int:
    """Measure ``args.measure_command`` on this rank; the exit status."""
    import torch.distributed as dist

    from meshplan.harness.measure.dist import NotUnderTorchrun, init

    ctx = None
    try:
        ctx = init(args.backend, timeout_s=args.timeout)
        _dispatch(args, ctx)
    except Exception as exc:  # one line per failing rank, not a traceback per rank
        rank = ctx.rank if ctx is not None else int(os.environ.get("RANK", "-1"))
        code = 2 if isinstance(exc, ValueError | SpecError | NotUnderTorchrun) else 1
        line = (f"{type(exc).__name__}: {exc}".strip().splitlines() or [type(exc).__name__])[0][:_MAX_LINE]
        sys.stderr.write(f"meshplan: error: rank {rank}: {line}\n")  # one write: ranks share the stream
        sys.stderr.flush()
        if os.environ.get("MESHPLAN_DEBUG"):
            traceback.print_exc()
        errdir = os.environ.get(ERRDIR_ENV)
        if errdir:
            Path(errdir, f"rank{rank}.txt").write_text(f"{code}\n{line}\n")
        return code
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def _inject_fault(ctx: Any) -> None:
    """``MESHPLAN_MEASURE_FAULT=raise@R`` or ``hang@R`` (R a rank or ``all``) makes rank R fail or stall
    before measuring: how the tests check that a failed or stuck rank ends the run with one clear line."""
    fault = os.environ.get(FAULT_ENV)
    if not fault:
        return
    kind, _, where = fault.partition("@")
    if where not in ("all", str(ctx.rank)):
        return
    if kind == "raise":
        raise RuntimeError(f"fault injected by {FAULT_ENV}={fault}")
    if kind == "hang":
        import time

        time.sleep(3600)


def _progress(ctx: Any, sub: str):
    def say(msg: str) -> None:
        if ctx.is_main:
            print(f"[measure {sub}] {msg}", file=sys.stderr, flush=True)

    return say


def _dispatch(args: argparse.Namespace, ctx: Any) -> int:
    from meshplan.harness.measure.profile_io import new_profile, write_profile

    profile = new_profile(device=ctx.device_name, backend=ctx.backend, world_size=ctx.world_size,
                          nproc_per_node=ctx.local_world_size)
    say = _progress(ctx, args.measure_command)
    say(f"{ctx.world_size} ranks ({ctx.n_nodes} node(s) x {ctx.local_world_size}), backend {ctx.backend}, "
        f"device {ctx.device_name}")
    _inject_fault(ctx)
    measure = {"gemm": _gemm, "collectives": _collectives, "step": _step, "moe": _moe}[args.measure_command]
    summary = measure(args, ctx, profile, say)
    if not ctx.is_main:
        return 0
    if args.out:
        written = write_profile(args.out, profile)
        if args.measure_command == "step":
            summary = _after_step(args, written, summary)
            write_profile(args.out, {**profile, "step": written["step"]})
    elif args.measure_command == "step":
        summary = _after_step(args, profile, summary)
    if getattr(args, "json", False):
        print(json.dumps({k: profile[k] for k in ("device", "backend", "world_size", "nproc_per_node", "gemm",
                                                  "gemm_best_flop_per_s", "attention", "collectives", "collective_fits",
                                                  "step", "moe", "notes")}, indent=2))
    else:
        print(summary)
        for note in profile["notes"]:
            print(f"note: {note}")
    if args.out:
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


# --- gemm -------------------------------------------------------------------------------------------

def _model_spec(args: argparse.Namespace):
    from meshplan.catalog import load_model
    from meshplan.commands.common import DEFAULT_MODEL

    spec = load_model(args.model or DEFAULT_MODEL)
    if getattr(args, "scale_down", False):
        from meshplan.harness.reference_model import scale_down

        spec = scale_down(spec)
    return spec


def _seq_len(args: argparse.Namespace, spec: Any) -> int:
    from meshplan.commands.common import DEFAULT_SEQ_LEN

    if args.seq_len:
        return args.seq_len
    if args.scale_down:
        from meshplan.harness.reference_model import reference_seq_len

        return reference_seq_len(spec, 256)
    return DEFAULT_SEQ_LEN


def _gemm(args: argparse.Namespace, ctx: Any, profile: dict, say) -> str:
    import torch.distributed as dist

    from meshplan.harness.measure.attention import time_attention
    from meshplan.harness.measure.gemm import fp8_supported, time_gemm
    from meshplan.harness.measure.profile_io import best_bf16_flop_per_s
    from meshplan.harness.measure.shapes import default_gemm_shapes, plan_attention_shape, plan_gemm_shapes
    from meshplan.specs import parse_plan

    gpu = ctx.device.type == "cuda"
    if args.plan:
        spec = _model_spec(args)
        plan = parse_plan(args.plan, world_size=ctx.world_size)
        seq = _seq_len(args, spec)
        shapes = plan_gemm_shapes(spec, plan, seq_len=seq)
        profile["notes"].append(f"gemm: shapes of {spec.name} under {plan.to_string()} at S={seq} "
                                f"(T = mbs·S/cp = {shapes[0].m} tokens)")
    else:
        shapes = default_gemm_shapes(gpu=gpu)
    dtypes = ["bf16"]
    ok, why = fp8_supported(ctx.device)
    if ok:
        dtypes.append("fp8")
    else:
        profile["notes"].append(why)
    attention = None
    if args.plan:
        try:
            attention = plan_attention_shape(spec, plan, seq_len=seq)
        except ValueError as exc:
            profile["notes"].append(f"attention not timed: {exc}")
    results = []
    todo = [(s, d) for s in shapes for d in dtypes]
    for i, (shape, dtype) in enumerate(todo):
        dist.barrier()
        r = time_gemm(shape, dtype, ctx.device, budget_s=0.3 if gpu else 0.5)
        results.append(r)
        say(f"{i + 1}/{len(todo)} {shape.name} [{shape.m}x{shape.k}]x[{shape.k}x{shape.n}] {dtype}: "
            f"{r.timing.median_s * 1e3:.3f} ms, {r.flop_per_s / 1e12:.3g} TFLOP/s")
    attn = []
    if attention is not None:
        dist.barrier()
        a = time_attention(attention, ctx.device, budget_s=0.3 if gpu else 0.5)
        attn.append(a.as_profile_entry())
        say(f"attention b={attention.b} s={attention.s} heads={attention.heads} d={attention.head_dim}: forward "
            f"{a.fwd.median_s * 1e3:.3f} ms, forward+backward {a.fwd_bwd.median_s * 1e3:.3f} ms")
    medians = [r.timing.median_s for r in results]
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, medians)
    spread = max((max(m[i] for m in everyone) - min(m[i] for m in everyone)) / min(m[i] for m in everyone)
                 for i in range(len(medians))) if medians else 0.0
    profile["gemm"] = [r.as_profile_entry() for r in results]
    profile["gemm_best_flop_per_s"] = best_bf16_flop_per_s(profile["gemm"])
    profile["attention"] = attn
    profile["notes"].append(f"gemm: rank 0's timings, all {ctx.world_size} ranks measuring at once; the ranks' "
                            f"medians differ by at most {spread:.0%}")
    lines = [f"GEMM throughput on {ctx.device_name} (rank 0 of {ctx.world_size}; median, p10-p90):",
             f"  {'shape':<14}{'m':>7}{'n':>8}{'k':>7} {'dtype':<5}{'median':>11}{'p10-p90':>20}{'TFLOP/s':>10}"]
    for r in results:
        t = r.timing
        lines.append(f"  {r.shape.name:<14}{r.shape.m:>7}{r.shape.n:>8}{r.shape.k:>7} {r.dtype:<5}"
                     f"{t.median_s * 1e3:>9.3f}ms{t.p10_s * 1e3:>9.3f}-{t.p90_s * 1e3:.3f}ms"
                     f"{r.flop_per_s / 1e12:>10.3g}")
    for a in attn:
        lines.append(f"  attention b={a['b']} s={a['s']} heads={a['heads']} d={a['head_dim']} (causal, bf16): forward "
                     f"{a['fwd_median_s'] * 1e3:.3f} ms ({a['fwd_flop_per_s'] / 1e12:.3g} TFLOP/s), forward+backward "
                     f"{a['fwd_bwd_median_s'] * 1e3:.3f} ms ({a['fwd_bwd_flop_per_s'] / 1e12:.3g} TFLOP/s)")
    if gpu:
        from meshplan.harness.measure.compare import kernel_comparison, kernel_text

        accel, rows, note = kernel_comparison(profile, args.cluster)
        lines += ["", kernel_text(rows, accel, note)]
    return "\n".join(lines)


# --- moe --------------------------------------------------------------------------------------------

def _moe_shapes(args: argparse.Namespace, ctx: Any, profile: dict) -> tuple[list[Any], Any]:
    """The expert GEMM shapes and the routing shape to time: the plan's (with a sweep of tokens per expert
    around it), or a default sweep."""
    from meshplan.harness.measure.shapes import (
        RoutingShape,
        default_expert_shapes,
        plan_expert_shapes,
        plan_routing_shape,
    )
    from meshplan.specs import parse_plan

    if not args.plan:
        shapes = default_expert_shapes(gpu=ctx.device.type == "cuda")
        return shapes, RoutingShape(tokens=4096 if ctx.device.type == "cuda" else 512, hidden=shapes[0].k,
                                    top_k=8, n_experts=64)
    spec = _model_spec(args)
    plan = parse_plan(args.plan, world_size=ctx.world_size)
    seq = _seq_len(args, spec)
    shapes = plan_expert_shapes(spec, plan, seq_len=seq)
    routing = plan_routing_shape(spec, plan, seq_len=seq)
    profile["notes"].append(f"moe: expert GEMMs of {spec.name} under {plan.to_string()} at S={seq}: "
                            f"{shapes[0].groups} experts per rank, {routing.tokens} tokens routed per rank, the "
                            "plan's tokens per expert and 1/8 to 2 times it")
    return shapes, routing


def _moe(args: argparse.Namespace, ctx: Any, profile: dict, say) -> str:
    import torch.distributed as dist

    from meshplan.harness.measure.moe import (
        grouped_supported,
        reference_gemm,
        time_expert_gemm,
        time_passes,
        time_reference,
    )

    budget = 0.2 if ctx.device.type == "cuda" else 0.25
    shapes, routing = _moe_shapes(args, ctx, profile)
    kernels = ["per_expert"]
    ok, why = grouped_supported(shapes[0], ctx.device)
    if ok:
        kernels.append("grouped")
    else:
        profile["notes"].append(why)
    profile["notes"].append("moe: BF16 expert GEMMs only (FP8 grouped GEMMs not measured)")
    ref_shape = reference_gemm(ctx.device)
    dist.barrier()
    ref = time_reference(ref_shape, ctx.device, budget_s=budget)
    ref_rate = ref_shape.flop / ref.median_s
    say(f"reference dense GEMM {ref_shape.m}^3 bf16: {ref_rate / 1e12:.3g} TFLOP/s")
    results = []
    todo = [(s, k) for s in shapes for k in kernels]
    for i, (shape, kernel) in enumerate(todo):
        dist.barrier()
        r = time_expert_gemm(shape, kernel, ctx.device, budget_s=budget)
        results.append(r)
        say(f"{i + 1}/{len(todo)} {shape.name} {kernel} {shape.groups} x [{shape.m}x{shape.k}]x[{shape.k}x{shape.n}]: "
            f"{r.timing.median_s * 1e3:.3f} ms, {r.flop_per_s / ref_rate:.0%} of the reference")
    dist.barrier()
    passes = time_passes(routing, ctx.device, budget_s=budget)
    for p in passes:
        say(f"{p.name} {routing.tokens} tokens x top-{routing.top_k}: {p.timing.median_s * 1e3:.3f} ms, "
            f"{p.bytes_moved / p.timing.median_s / 1e9:.3g} GB/s")
    profile["moe"] = {"reference_gemm": {"m": ref_shape.m, "n": ref_shape.n, "k": ref_shape.k, "dtype": "bf16",
                                         "median_s": ref.median_s, "flop_per_s": ref_rate},
                      "expert_gemm": [r.as_profile_entry(ref_rate) for r in results],
                      "passes": [p.as_profile_entry() for p in passes]}
    profile["notes"].append(f"moe: rank 0's timings, all {ctx.world_size} ranks measuring at once")
    return _moe_summary(args, ctx, profile, results, passes, routing)


def _moe_summary(args: argparse.Namespace, ctx: Any, profile: dict, results: list[Any], passes: list[Any],
                 routing: Any) -> str:
    ref = profile["moe"]["reference_gemm"]
    lines = [f"MoE kernels on {ctx.device_name} (rank 0 of {ctx.world_size}; median); reference dense GEMM "
             f"{ref['m']}^3 bf16 at {ref['flop_per_s'] / 1e12:.3g} TFLOP/s:",
             f"  {'gemm':<11}{'kernel':<11}{'experts':>8}{'m':>7}{'n':>7}{'k':>7}{'median':>11}{'TFLOP/s':>9}"
             f"{'of ref':>8}"]
    for r in results:
        s = r.shape
        lines.append(f"  {s.name:<11}{r.kernel:<11}{s.groups:>8}{s.m:>7}{s.n:>7}{s.k:>7}"
                     f"{r.timing.median_s * 1e3:>9.3f}ms{r.flop_per_s / 1e12:>9.3g}"
                     f"{r.flop_per_s / ref['flop_per_s']:>8.0%}")
    lines.append(f"  memory-bound passes, {routing.tokens} tokens, hidden {routing.hidden}, top-{routing.top_k} of "
                 f"{routing.n_experts} (bytes as meshplan counts them):")
    for p in passes:
        lines.append(f"  {p.name:<11}{p.bytes_moved / 1e6:>10.2f} MB{p.timing.median_s * 1e3:>11.3f} ms"
                     f"{p.bytes_moved / p.timing.median_s / 1e9:>9.3g} GB/s")
    if ctx.device.type == "cuda":
        from meshplan.harness.measure.compare import kernel_comparison, kernel_text

        found = kernel_comparison({**profile, "gemm": [], "attention": []}, args.cluster)
        if found is not None:
            accel, rows, note = found
            lines += ["", kernel_text(rows, accel, note)]
    return "\n".join(lines)


# --- collectives ------------------------------------------------------------------------------------

def _collectives(args: argparse.Namespace, ctx: Any, profile: dict, say) -> str:
    from meshplan.harness.measure.collectives import OPS, default_sizes, measure_point, profile_fits
    from meshplan.harness.measure.dist import axis_groups
    from meshplan.specs import parse_plan

    gpu = ctx.device.type == "cuda"
    plan = parse_plan(args.plan, world_size=ctx.world_size) if args.plan else None
    groups = axis_groups(ctx, plan)
    if not groups:
        raise ValueError("nothing to measure: every mesh axis has one rank (run with 2 or more processes)")
    sizes = default_sizes(gpu=gpu, min_bytes=args.min_bytes, max_bytes=args.max_bytes)
    ops = args.ops or OPS
    points = []
    total = len(groups) * len(ops) * len(sizes)
    for g in groups:
        say(f"axis {g.axis}: {g.size} ranks, {g.link} ({g.ranks_per_node} per node)")
        for op in ops:
            for s in sizes:
                p = measure_point(op, g, s, ctx, budget_s=0.2 if gpu else 0.25, max_reps=200 if gpu else 50)
                points.append(p)
                say(f"{len(points)}/{total} {g.axis} {op} {p.message_bytes:>11,d} B: "
                    f"{p.timing.median_s * 1e6:9.1f} us  busbw {p.busbw_bytes_per_s / 1e9:.3g} GB/s")
    fits, notes = profile_fits(points)
    profile["collectives"] = [p.as_profile_entry() for p in points]
    profile["collective_fits"] = fits
    profile["notes"] += notes
    lines = [f"collectives on {ctx.world_size} x {ctx.device_name} ({ctx.backend}); busbw in GB/s by message size:"]
    header = "".join(f"{_short(s):>9}" for s in sizes)
    lines.append(f"  {'axis':<12}{'op':<16}{'n':>3} {'link':<11}{header}")
    for g in groups:
        for op in ops:
            row = [p for p in points if p.axis == g.axis and p.op == op]
            cells = "".join(f"{p.busbw_bytes_per_s / 1e9:>9.3g}" for p in row)
            lines.append(f"  {g.axis:<12}{op:<16}{g.size:>3} {g.link:<11}{cells}")
    lines.append("fits t = alpha + S·f(op, n)/busbw (profile collective_fits):")
    for key, fit in sorted(fits.items()):
        lines.append(f"  {key:<28} alpha {fit['alpha_s'] * 1e6:8.1f} us   busbw "
                     f"{fit['busbw_bytes_per_s'] / 1e9:8.3g} GB/s   ({fit['group_size']} ranks, "
                     f"{fit['n_points']} sizes)")
    return "\n".join(lines)


def _short(n: int) -> str:
    for div, suffix in ((2**30, "G"), (2**20, "M"), (2**10, "K")):
        if n >= div:
            return f"{n / div:.3g}{suffix}"
    return str(n)


# --- step -------------------------------------------------------------------------------------------

def _step(args: argparse.Namespace, ctx: Any, profile: dict, say) -> str:
    from meshplan.harness.measure.step import StepConfig, run_step
    from meshplan.specs import parse_plan

    spec = _model_spec(args)
    plan = parse_plan(args.plan, world_size=ctx.world_size)
    seq = _seq_len(args, spec)
    mbs = plan.mbs or 1
    per_micro = plan.dp * mbs * seq
    n_micro = 1
    if args.batch_tokens:
        if args.batch_tokens % per_micro:
            raise ValueError(f"--batch-tokens {args.batch_tokens} is not a multiple of dp·mbs·seq_len = {per_micro}")
        n_micro = args.batch_tokens // per_micro
    trace = Path(args.out).with_suffix(".trace.json") if args.out else None
    cfg = StepConfig(spec=spec, plan=plan, seq_len=seq, mbs=mbs, n_microbatches=n_micro, n_steps=args.steps,
                     trace_path=trace)
    say(f"{spec.name}, plan {plan.to_string()}, S={seq}, mbs={mbs}, {n_micro} micro-batch(es) per step")
    step = run_step(cfg, ctx, progress=say)
    if step is None:
        return ""
    step["cluster"] = args.cluster
    step["scaled_down"] = bool(args.scale_down)
    profile["step"] = step
    if ctx.device.type == "cpu":
        profile["notes"].append("step: param_dtype bf16 on the CPU too (CPU BF16 GEMMs and gloo BF16 collectives "
                                "work in torch 2.13); peak memory is ru_maxrss, not tensor bytes")
    if trace is None:
        profile["notes"].append("step: no --out, so no trace was written")
    return ""


def _after_step(args: argparse.Namespace, profile: dict, _summary: str) -> str:
    """Fill MFU and the prediction into the step section; the summary (with the comparison if asked)."""
    from meshplan.harness.measure.compare import comparison, measured_mfu, predict, predicted_dict

    step = profile["step"]
    est, cluster, _ = predict(profile, args.cluster)
    mfu, how = measured_mfu(step, est, cluster, str(profile["device"]))
    step["mfu"] = mfu
    step["mfu_note"] = how
    step["model_flop_per_step"] = est.flops.model_flop_per_step
    rows, text, notes = comparison(profile, args.cluster)
    step["predicted"] = predicted_dict(rows, args.cluster, notes)
    t = step["step_time_s"]
    spread = step["rank_step_time_spread"]
    peaks = step["peak_memory_bytes_per_rank"]
    lines = [f"training step of {step['model']} under {step['plan']} ({profile['world_size']} x {profile['device']}):",
             f"  step time      {t * 1e3:.1f} ms median (p10 {step['step_time_p10_s'] * 1e3:.1f}, "
             f"p90 {step['step_time_p90_s'] * 1e3:.1f}) over {step['n_steps']} steps",
             f"  tokens/s       {step['tokens_per_s']:,.0f} ({step['global_batch_tokens']:,} tokens per step)",
             f"  MFU            {'null' if mfu is None else f'{mfu:.1%}'} ({how})",
             f"  rank spread    {spread['spread_frac']:.1%} of the step (rank medians "
             f"{spread['min_s'] * 1e3:.1f}-{spread['max_s'] * 1e3:.1f} ms)",
             f"  peak memory    {max(peaks) / 2**20:.0f} MiB max over ranks "
             f"({step['peak_memory_source'].split(':')[0]})",
             "  exposed comm   " + (", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in
                                            step["exposed_comm_s_by_collective"].items()) or "none")]
    if step.get("kernel_time_s_by_kind"):
        k = step["kernel_time_s_by_kind"]
        kinds = ", ".join(f"{kind} {v * 1e3:.1f} ms" for kind, v in k.items() if kind != "busy")
        lines.append(f"  GPU kernels    {kinds}; busy {k['busy'] * 1e3:.1f} ms (rank 0, profiled step)")
    if step.get("trace"):
        lines.append(f"  trace          {step['trace']} (rank 0, chrome://tracing or ui.perfetto.dev)")
    if args.compare:
        lines += ["", text]
    return "\n".join(lines)
