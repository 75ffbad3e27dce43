"""Plain-text reports. Memory in binary GiB, traffic in decimal GB, times in s/ms."""

from __future__ import annotations

from meshplan.cost.estimate import Estimate
from meshplan.explain import PlanAnalysis, binding_resource
from meshplan.search.conditions import held_sentence
from meshplan.search.rank import TIE_BAND
from meshplan.units import format_gb, format_gib, format_seconds


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
    return out


def comm_table(est: Estimate) -> list[str]:
    rows = [[e.collective, e.group_name(est.plan.cp), e.link, str(e.group_size), f"{e.count:,}",
             format_gb(e.message_bytes), format_gb(e.bytes_per_gpu), format_seconds(e.time_s),
             format_seconds(e.exposed_s), "yes" if e.overlappable else "no", e.purpose] for e in est.comm]
    return _table(rows, ["collective", "axis", "link", "n", "calls", "message", "per GPU", "time", "exposed",
                         "overlap", "what"])


def memory_lines(est: Estimate) -> list[str]:
    m = est.memory
    out = [f"memory per GPU (stage {m.stage}, binary GiB): peak {format_gib(m.peak_bytes)} of "
           f"{format_gib(m.capacity_bytes)} ({m.peak_bytes / m.capacity_bytes:.0%})"]
    for k, v in m.terms.items():
        if v > 0:
            out.append(f"  {k:<32} {format_gib(v):>12}")
    return out


def estimate_text(est: Estimate) -> str:
    p = est.plan
    lines = [f"meshplan evaluate: {est.model} on {est.cluster} x {est.n_gpus} GPUs, "
             f"{est.global_batch_tokens:,} tokens per step, sequence {est.seq_len} ({est.mode} mode)",
             f"plan: {p.label()}  [{p.to_string()}]  micro-batches per step: {est.n_microbatches}",
             "feasible: " + ("yes" if est.feasible else "NO"), *(f"  - {r}" for r in est.infeasible_reasons), ""]
    lines += memory_lines(est)
    f = est.flops
    other = ("causal", f.model_flop_per_step_causal) if f.convention == "palm" else ("palm", f.model_flop_per_step_palm)
    alt = (f"; in the {other[0]} convention {other[1]:.4g}, MFU {est.mfu * other[1] / f.model_flop_per_step:.1%}"
           if abs(other[1] / f.model_flop_per_step - 1) > 0.05 and est.step_time_s == est.step_time_s else "")
    executed = " (with recomputation)" if f.hardware_flop_per_step > 1.0001 * f.model_flop_per_step else ""
    lines += ["", f"FLOPs per step: {f.model_flop_per_step:.4g} model ({f.convention}{alt}), "
                  f"{f.hardware_flop_per_step:.4g} executed{executed}"]
    if est.step_time_s == est.step_time_s:
        lines.append(f"step time {format_seconds(est.step_time_s)}  MFU {est.mfu:.1%}  HFU {est.hfu:.1%}  "
                     f"{est.tokens_per_s_per_gpu:,.0f} tokens/s per GPU  ({est.compute_source})")
        if est.uncertainty:
            lines.append("  " + est.uncertainty.sentence("the prediction"))
        lines.append("time breakdown (sums to the step):")
        for k, v in est.named_breakdown().items():
            if v > 0:
                lines.append(f"  {k:<40} {format_seconds(v):>10}  {v / est.step_time_s:6.1%}")
        if est.mode == "faithful":
            lines.append("limited by: " + binding_resource(est))
    if est.comm:
        whose = (f" of pipeline stage {est.comm_stage} of {est.plan.pp}, the one the breakdown is told from"
                 if est.plan.pp > 1 else "")
        lines += ["", f"communication per step{whose} (bytes: decimal GB; 'per GPU' = sent by one GPU, all calls):"]
        lines += comm_table(est)
    lines += [f"note: {n}" for n in est.notes]
    return "\n".join(lines)


def timing_cells(e: Estimate) -> list[str]:
    """A ranked table's step, MFU and exposed communication of ``e``; '-' for a plan that was not timed
    (infeasible: NaN times, no ledger)."""
    if e.step_time_s != e.step_time_s:
        return ["-", "-", "-"]
    return [format_seconds(e.step_time_s), f"{e.mfu:.1%}", format_seconds(e.comm_time_s(exposed=True))]


def ranked_table(estimates: list[Estimate], top: int) -> list[str]:
    rows = []
    for i, e in enumerate(estimates[:top], 1):
        p = e.plan
        rows.append([str(i), p.label(), ",".join(p.option_labels()), f"mbs={p.mbs},{p.recompute_label}",
                     str(e.n_microbatches), *timing_cells(e),
                     format_gib(e.memory.peak_bytes), "yes" if e.feasible else "no",
                     "" if e.feasible else e.infeasible_reasons[0][:70]])
    return _table(rows, ["#", "plan", "options", "micro-batch", "m", "step", "MFU", "exposed comm", "peak mem", "fits",
                         "why not"])


def stack_lines(a: PlanAnalysis) -> list[str]:
    """For a job that names no stack: each stack's best plan with its band, fastest first, and which one the
    recommendation assumes."""
    if not a.stacks:
        return []
    from meshplan.stacks import STACK_NAMES

    out = ["Software stacks (none was named: each stack's best plan, searched over what it runs and timed with "
           "its own calibration; fastest first):"]
    for s in a.stacks:
        e = s.best
        if e is None:
            out.append(f"  {s.name:<12} no plan: {s.why_none}")
            continue
        band = f" ({e.uncertainty.low:+.0%} .. {e.uncertainty.high:+.0%})" if e.uncertainty else ""
        out.append(f"  {s.name:<12} {e.plan.label()} [{e.plan.to_string()}]: {format_seconds(e.step_time_s)}{band}, "
                   f"MFU {e.mfu:.1%}, {e.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, peak "
                   f"{format_gib(e.memory.peak_bytes)}")
    name = STACK_NAMES.get(a.job.software, a.job.software)
    out.append(f"The recommendation below assumes {name}: {a.stack_note}. Name a stack (--stack megatron, "
               "torchtitan, deepspeed, ...) for its own answer.")
    return [*out, ""]


def plan_text(a: PlanAnalysis, *, top: int = 10, extra: list[str] | None = None) -> str:
    """The plan command's report; ``extra``: lines after the four questions (time to train, cost, goodput)."""
    r = a.result
    lines = [f"meshplan plan: {a.model.name} on {a.cluster.name}, {a.cluster.n_nodes} "
             f"node{'s' if a.cluster.n_nodes != 1 else ''} x "
             f"{a.cluster.gpus_per_node} GPU{'s' if a.cluster.gpus_per_node != 1 else ''}, "
             f"{a.job.global_batch_tokens:,} tokens per step, sequence "
             f"{a.job.seq_len}, {a.job.optimizer}, {a.job.precision}"
             + (f", stack {a.job.software}" + (" (assumed)" if a.stacks else "") if a.job.software != "generic"
                else "")
             + (", torch.compile" if a.job.compiled else "")
             + (f", CUDA graphs ({a.job.cuda_graph_scope})" if a.job.cuda_graphs else "")
             + (", FP8 attention" if a.job.fp8_attention else "")
             + (", fused grouped expert MLPs" if a.job.fused_grouped_mlp else ""),
             f"searched {r.n_plans + r.n_pruned:,} plans ({r.n_configurations:,} configurations with micro-batch "
             f"sizes and recompute modes) in {r.elapsed_s:.2f} s: {r.n_plans:,} evaluated, {len(r.feasible):,} of "
             f"them feasible (fit in memory and split the batch); {r.n_pruned:,} option variants pruned (provably "
             "outside the tie band, or needing more memory than a default that does not fit)", "",
             *stack_lines(a)]
    for i, q in enumerate(a.questions, 1):
        lines.append(f"{i}. {q.title}")
        lines += [f"   {line}" for line in q.lines]
        if i == 4:
            if a.measurements:
                lines.append("   Measure first:")
                lines += [f"   - {m.what}: {m.why}" for m in a.measurements]
            if a.conditions:
                lines.append("   When to change the plan (computed by re-running the search):")
                lines += [f"   - {c.text}" for c in a.conditions]
            if a.held_ranges:
                lines.append(f"   {held_sentence(a.held_ranges, bool(a.conditions))}")
            elif a.conditions_swept and not a.conditions:
                lines.append("   When to change the plan: no condition could be varied around this scenario.")
            elif not a.conditions_swept and a.result.recommended is not None:
                lines.append("   When to change the plan: not computed (--no-conditions).")
        lines.append("")
    if extra:
        lines += [*extra, ""]
    lines.append(f"Top {min(top, len(r.ranked))} of {len(r.ranked):,} plans, in the ranking's order: first the plans "
                 f"within {TIE_BAND:.0%} of the fastest, by fewer axes and options, then more memory headroom (so "
                 "step times need not ascend); then the others by step time; infeasible plans last, listed with "
                 "reasons in --json:")
    lines += ranked_table(r.ranked, top)
    infeasible = [e for e in r.ranked if not e.feasible]
    if infeasible:
        lines += ["", f"{len(infeasible):,} plan{'s do' if len(infeasible) != 1 else ' does'} not fit; for example:"]
        examples = dict.fromkeys(f"  {e.plan.label()}: {e.infeasible_reasons[0]}" for e in infeasible)
        lines += list(examples)[:3]  # options that do not change the reason would repeat it word for word
    return "\n".join(lines)
