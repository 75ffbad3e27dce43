"""Explanations built from estimates: why a plan wins, what the others lack, what to measure first,
and the worked example's four questions answered for any scenario. Pure data; report/ renders it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from meshplan.cost.batch import batch_split_reasons
from meshplan.cost.estimate import Estimate
from meshplan.cost.offload import offload_offered
from meshplan.cost.simplified import evaluate_simplified
from meshplan.cost.stage_time import HOST_BOUND, OFFLOAD
from meshplan.cost.step import evaluate
from meshplan.cost.validate import without_unsplit_sp
from meshplan.errors import SpecError
from meshplan.search.conditions import Condition, HeldRange, find_conditions
from meshplan.search.rank import TIE_BAND
from meshplan.search.search import REFINE_TOP, SearchResult, search
from meshplan.search.space import FAMILY_NAMES, Space, family
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan
from meshplan.units import GB, format_gb, format_gib, format_seconds

CANDIDATES = 40
"""Leading plans of the base search that the conditions-of-change walk re-evaluates at each value."""



def dominant_terms(est: Estimate, n: int = 3) -> list[tuple[str, float]]:
    """The largest terms of the step-time breakdown [s], largest first."""
    return sorted(((k, v) for k, v in est.named_breakdown().items() if v > 0), key=lambda kv: -kv[1])[:n]


def binding_resource(est: Estimate) -> str:
    """One line: what limits this plan (compute, a link, the bubble, or memory)."""
    terms = dominant_terms(est, 5)
    step = est.step_time_s
    comp = est.time_breakdown.get("compute", 0.0) + est.time_breakdown.get("recompute", 0.0)
    exposed = sum(v for k, v in est.time_breakdown.items() if k.startswith("exposed"))
    contention = est.time_breakdown.get("comm contention", 0.0)
    parts = [f"compute {comp / step:.0%} of the step"]
    if est.time_breakdown.get("recompute", 0.0) > 0:
        parts.append(f"of which recomputation {est.time_breakdown['recompute'] / step:.0%}")
    if exposed > 0.005 * step:
        worst = max((kv for kv in terms if kv[0].startswith("exposed")), key=lambda kv: kv[1], default=None)
        parts.append(f"exposed communication {exposed / step:.0%}" + (f" (mostly {worst[0][8:]})" if worst else ""))
    if contention > 0.005 * step:  # hidden traffic slowing the compute that hides it
        parts.append(f"compute slowed by the traffic it hides {contention / step:.0%}")
    if est.time_breakdown.get("pipeline bubble", 0.0) > 0.005 * step:
        parts.append(f"pipeline bubble {est.time_breakdown['pipeline bubble'] / step:.0%}")
    if est.time_breakdown.get(HOST_BOUND, 0.0) > 0.005 * step:
        parts.append(f"MoE layers waiting for the host's kernel launches {est.time_breakdown[HOST_BOUND] / step:.0%}")
    if est.plan.offload_layers:
        parts.append(f"activations of {est.plan.offload_layers} layers offloaded to host memory"
                     + (f", waiting on the copies {est.time_breakdown[OFFLOAD] / step:.0%}"
                        if est.time_breakdown.get(OFFLOAD, 0.0) > 0.005 * step else ""))
    parts.append(f"memory {format_gib(est.memory.peak_bytes)} of {format_gib(est.memory.capacity_bytes)}")
    return "; ".join(parts)


def why_not(est: Estimate, best: Estimate) -> str:
    """One line with numbers: what a losing plan lacks against the best."""
    if not est.feasible:
        return est.infeasible_reasons[0]
    gap = est.step_time_s / best.step_time_s - 1.0
    head = f"{gap:+.1%} step time ({format_seconds(est.step_time_s)} vs {format_seconds(best.step_time_s)})"
    if gap < 0.0005:  # as fast or faster: only the tie band (or simplicity) put the best ahead
        return head + ", within the tie band, where the plan with fewer axes and options wins"
    diffs = []
    for key in set(est.time_breakdown) | set(best.time_breakdown):
        d = est.time_breakdown.get(key, 0.0) - best.time_breakdown.get(key, 0.0)
        diffs.append((d, key))
    d, key = max(diffs)
    gap_s = est.step_time_s - best.step_time_s
    lead = "most of the gap is" if d <= gap_s * 1.0001 else "the largest difference is"  # others offset it
    return f"{head}; {lead} {est.breakdown_name(key)} (+{format_seconds(d)})"


@dataclass(frozen=True, slots=True)
class Measurement:
    what: str
    why: str


WINDOW_WORDS = {"forward": "forward", "backward": "backward", "first_forward": "the first micro-batch's forward",
                "last_backward": "the last micro-batch's backward", "attention": "attention",
                "pipeline": "the pipeline's", "other_microbatch": "another micro-batch's"}
"""CommEntry.window in words."""


def measure_first(best: Estimate, conditions: list[Condition]) -> list[Measurement]:
    """What to measure first on the real cluster, and what each result would change."""
    out = [Measurement(
        "tokens/s and MFU of the recommended plan on a few steps",
        f"the prediction is {best.tokens_per_s_per_gpu:,.0f} tokens/s per GPU (MFU {best.mfu:.1%}, "
        f"{best.compute_source}); a lower measured MFU with the same exposed communication points at kernel "
        "efficiency, which scales every plan alike and rarely changes the ranking")]
    comm = sorted(best.comm, key=lambda e: -e.time_s)
    if comm:
        top = comm[0]
        slack = ""
        if top.overlappable and top.time_s > 0:
            hidden = top.time_s - top.exposed_s
            slack = (f"; {format_seconds(hidden)} of its {format_seconds(top.time_s)} per step is hidden behind "
                     f"{WINDOW_WORDS.get(top.window, top.window)} compute")
        bw = [c for c in conditions if c.condition == "inter_node_bandwidth" and c.direction == "below"]
        change = (f"; if it is below the equivalent of {bw[0].value:.3g} GB/s per GPU, {bw[0].plan} becomes best"
                  if bw and top.link == "inter_node" else "")
        out.append(Measurement(
            f"{top.collective} bus bandwidth on the {top.group_name(best.plan.cp)} group ({top.group_size} GPUs, "
            f"{top.link}) at "
            f"{format_gb(top.message_bytes)} messages (meshplan measure collectives)",
            f"it is the longest collective of the step: {format_gb(top.bytes_per_gpu)} per GPU{slack}{change}"))
    if best.plan.world_size > 1:
        out.append(Measurement(
            "a profiler trace of one step: exposed NCCL time per collective and the per-rank step-time spread",
            f"the model predicts {format_seconds(best.comm_time_s(exposed=True))} of exposed communication per "
            "step; a spread between ranks above a few percent means stragglers (a slow node or NIC) that no plan "
            "fixes"))
    host = best.time_breakdown.get(HOST_BOUND, 0.0)
    if host > 0.005 * best.step_time_s:
        out.append(Measurement(
            "the host's launch time per MoE layer: in a profiler trace, the GPU idle between a MoE layer's "
            "kernels while the CPU launches them",
            f"the model charges {format_seconds(host)} per step ({host / best.step_time_s:.0%}) for the GPU waiting "
            "on the host (a calibrated launch time per MoE layer); CUDA graphs with a static expert capacity "
            "(job.cuda_graphs) or a larger micro-batch hide it, and a faster host CPU shortens it"))
    if best.plan.offload_layers:
        out.append(Measurement(
            "host-to-device copy bandwidth per GPU with every GPU of the node copying at once (pinned memory, "
            "both directions), and a profiler trace of the offloaded layers",
            f"the plan offloads {best.plan.offload_layers} layers' activations to host memory; the model takes "
            "the node spec's host_gb_per_s and charges "
            f"{format_seconds(best.time_breakdown.get(OFFLOAD, 0.0))} per step for copies the layers' compute does "
            "not hide; a slower link means more waiting, or recomputation instead"))
    saves = best.plan.recompute not in (None, "none") or bool(best.plan.offload_layers)
    out.append(Measurement(
        "peak memory per rank (torch.cuda.max_memory_allocated)",
        f"predicted {format_gib(best.memory.peak_bytes)} of {format_gib(best.memory.capacity_bytes)}; "
        + ("with more headroom a larger micro-batch or less recomputation would be faster" if saves else
           "it recomputes and offloads nothing: a peak above the prediction leaves less room than planned, "
           "one well below leaves room for a larger micro-batch")))
    return out


@dataclass(slots=True)
class Question:
    title: str
    lines: list[str] = field(default_factory=list)
    estimates: dict[str, Estimate] = field(default_factory=dict)


@dataclass(slots=True)
class PlanAnalysis:
    """The answer to a planning question: the search, the recommendation and its reasons."""

    model: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    result: SearchResult
    conditions: list[Condition]
    measurements: list[Measurement]
    questions: list[Question]
    mode: str
    simplified: dict[str, Estimate] = field(default_factory=dict)
    recommended: Estimate | None = None
    """The search's recommendation with its uncertainty band."""
    conditions_swept: bool = False
    """Whether the conditions of change were computed (an empty ``conditions`` then means none found)."""
    held_ranges: list[HeldRange] = field(default_factory=list)
    """Per condition, the range checked around the scenario over which the recommendation holds."""


@dataclass(slots=True)
class _Scenario:
    """What every question of one analysis evaluates against, and the simplified (worked-example)
    estimates the questions collect, in the order they add them."""

    model: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    mfu: float | None
    simplified: dict[str, Estimate] = field(default_factory=dict)

    @property
    def simple_mfu(self) -> float:
        """The MFU the simplified arithmetic assumes: the given one, else 40 %."""
        return self.mfu if self.mfu is not None else 0.4

    def timed(self, plan: Plan, job: JobSpec | None = None) -> Estimate | None:
        return _try(self.model, self.cluster, job or self.job, plan, self.mfu)

    def simplify(self, plan: Plan, job: JobSpec | None = None) -> Estimate:
        return evaluate_simplified(self.model, self.cluster, job or self.job, plan, mfu=self.simple_mfu)


def _try(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, mfu: float | None) -> Estimate | None:
    """``plan`` evaluated and, where it fits, re-timed by the simulator (as the search's top plans are)."""
    from meshplan.sim.simulate import refine_fitted

    try:
        est = evaluate(model, cluster, job, plan, mfu=mfu)
    except SpecError:
        return None
    return refine_fitted(est, cluster.accelerator.name, job.software)


def _why_fsdp_differs(full: Estimate, simple: Estimate, n_nodes: int, seq_len: int) -> str:
    """Why the worked example's figures for full sharding differ from the prediction's."""
    reasons = []
    ratio = full.flops.model_flop_per_step / simple.flops.model_flop_per_step
    if ratio > 1.1:  # long sequences: attention's score and value products, which 6·N leaves out
        reasons.append(f"the model FLOPs count attention's score and value products, which 6·N leaves out "
                       f"({ratio:.1f}x the simplified FLOPs at sequence length {seq_len:,})")
    sends = full.comm_time_s() > 0
    if sends:
        reasons += ["each micro-batch re-gathers every unit (FSDP2 reshards after forward and after backward)",
                    "gradients are reduce-scattered in fp32 (reduce_dtype)"]
    reasons.append("the exact parameter count is used")
    if sends:
        reasons.append("a ring across nodes drives every NIC of a node at once, so each GPU's NIC carries only its "
                       "share of the traffic" if n_nodes > 1 else "on one node the traffic runs over NVLink, not "
                       "the NIC")
    return ", ".join(reasons[:-1]) + (", and " if len(reasons) > 1 else "") + reasons[-1]


def _fsdp_traffic(est: Estimate) -> tuple[float, float, float, float]:
    """(bytes per GPU, inter-node bytes per GPU, time, exposed) of the data-parallel collectives."""
    dp = [e for e in est.comm if e.axis in ("dp_shard", "dp_replicate", "edp")]
    return (sum(e.bytes_per_gpu for e in dp), sum(e.inter_node_bytes_per_gpu for e in dp),
            sum(e.time_s for e in dp), sum(e.exposed_s for e in dp))


def analyse(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, *, space: Space | None = None,
            mfu: float | None = None, with_conditions: bool = True, progress=None,
            workers: int | None = None) -> PlanAnalysis:
    """Search, recommend, and answer the worked example's four questions for this scenario (the simulator's
    re-timing and the conditions of change on up to ``workers`` cores, default all)."""
    space = space or Space()
    result = search(model, cluster, job, space, mfu=mfu, progress=progress, refine_top=REFINE_TOP, workers=workers)
    sc = _Scenario(model, cluster, job, mfu)
    n = cluster.n_gpus
    ddp = sc.timed(Plan(dp_replicate=n))
    full = sc.timed(Plan(dp_shard=n))
    # why full sharding cannot split the batch (then its step is timed for a batch it does not run)
    unsplit_batch = batch_split_reasons(job, full.plan)[0] if full else []
    questions = [memory_question(sc, ddp, full, unsplit_batch), fsdp_question(sc, full, unsplit_batch),
                 tp_question(sc, full, unsplit_batch)]
    q4, best = recommendation_question(sc, result)
    conditions: list[Condition] = []
    held: list[HeldRange] = []
    if with_conditions and best is not None:
        conditions, held = _conditions_of_change(sc, result, best, space, workers)
    measurements = measure_first(best, conditions) if best else []
    questions.append(q4)
    return PlanAnalysis(model=model, cluster=cluster, job=job, result=result, conditions=conditions,
                        measurements=measurements, questions=questions, mode="faithful", simplified=sc.simplified,
                        recommended=best, conditions_swept=with_conditions and best is not None,
                        held_ranges=held)


def memory_question(sc: _Scenario, ddp: Estimate | None, full: Estimate | None, unsplit_batch: list[str]
                    ) -> Question:
    """Question 1: can DDP fit, and what does full sharding leave (``ddp`` and ``full``: those plans over
    every GPU, None where they cannot be built; ``unsplit_batch``: why full sharding cannot split the batch)?"""
    q1 = Question("Memory: can DDP fit, and what does full sharding leave?")
    n = sc.cluster.n_gpus
    if ddp:
        q1.estimates["ddp"] = ddp
        sc.simplified["ddp"] = sc.simplify(Plan(dp_replicate=n))
        verdict = "does not fit" if not ddp.feasible else "fits"
        buckets = ddp.memory.terms.get("ddp_gradient_buckets", 0.0)
        q1.lines.append(f"DDP (a full replica per GPU) {verdict}: model states alone are "
                        f"{format_gib(ddp.memory.static_bytes)} per GPU against {format_gib(ddp.memory.capacity_bytes)}"
                        f" (simplified: 16 B x parameters = {sc.simplified['ddp'].memory.static_bytes / GB:,.0f} GB)"
                        + (f", and PyTorch's DDP keeps its gradient buckets, a second copy of the gradients, beside "
                           f"them: {format_gib(buckets)} more" if buckets else "") + ".")
    if full:
        q1.estimates["fsdp"] = full
        sc.simplified["fsdp"] = sc.simplify(Plan(dp_shard=n))
        q1.lines.append(
            (f"Fully sharded over {n} GPUs" if n > 1 else "On one GPU (nothing to shard over)")
            + f": model states {format_gib(full.memory.static_bytes)} per GPU "
            f"(simplified: {sc.simplified['fsdp'].memory.static_bytes / GB:.1f} GB); with "
            f"micro-batch {full.plan.mbs} and recompute={full.plan.recompute_label}, activations add "
            f"{format_gib(full.memory.activation_bytes)}, transient buffers (gathered FSDP units, logits) "
            f"{format_gib(full.memory.transient_bytes)} and runtime overheads {format_gib(full.memory.runtime_bytes)}"
            f": peak {format_gib(full.memory.peak_bytes)} of {format_gib(full.memory.capacity_bytes)}.")
        if not full.feasible:
            shown = ("Its memory above is for one sequence per GPU, as if it could; no step is predicted for it"
                     if unsplit_batch else
                     "Its figures are for the least-memory choice, as if it could")
            q1.lines.append("Full sharding cannot run here: " + "; ".join(full.infeasible_reasons) + f". {shown}.")
        if full.plan.recompute != "none":
            line = _recomputation_needed(sc, full)
            if line:
                q1.lines.append(line)
    return q1


def _recomputation_needed(sc: _Scenario, full: Estimate) -> str:
    """Where full sharding recomputes: that without it even one sequence per micro-batch does not fit,
    what recomputing costs, and what offloading the activations instead would (where the search offers
    it); empty where one sequence fits without recomputation."""
    n = sc.cluster.n_gpus
    bare = sc.timed(Plan(dp_shard=n, mbs=1, recompute="none"))
    if bare is None or bare.memory.peak_bytes <= bare.memory.capacity_bytes:
        return ""
    line = (f"Without recomputation even one sequence per micro-batch needs "
            f"{format_gib(bare.memory.activation_bytes)} of activations (peak "
            f"{format_gib(bare.memory.peak_bytes)}): activation checkpointing is required, "
            + (f"and it costs {full.time_breakdown.get('recompute', 0.0) / full.step_time_s:.0%} of the "
               "step" if full.feasible else "and not enough"))
    # Megatron can offload activations to host memory instead (as the search offers it)
    off = (sc.timed(Plan(dp_shard=n, offload_layers=None))
           if offload_offered(sc.cluster, sc.job, Plan(dp_shard=n)) else None)
    if off is not None and off.feasible and off.plan.offload_layers:
        line += (f"; offloading the activations of {off.plan.offload_layers} layers to host memory "
                 f"instead (micro-batch {off.plan.mbs}) gives a step of {format_seconds(off.step_time_s)}, "
                 f"{off.step_time_s / full.step_time_s - 1:+.0%} against recomputing")
    return line + "."


def fsdp_question(sc: _Scenario, full: Estimate | None, unsplit_batch: list[str]) -> Question:
    """Question 2: full sharding's step time and traffic, simplified and predicted, and at a quarter of the
    batch: is its communication hidden?"""
    q2 = Question("Step time and FSDP communication: is it hidden?")
    if not full:
        return q2
    n = sc.cluster.n_gpus
    s = sc.simplified["fsdp"]
    s_bytes = sum(e.bytes_per_gpu for e in s.comm)
    s_time = sum(e.time_s for e in s.comm)
    q2.lines.append(f"Simplified: {s.flops.model_flop_per_step:.3g} FLOPs per step, "
                    f"{format_seconds(s.step_time_s)} "
                    f"at {sc.simple_mfu:.0%} MFU; FSDP moves {format_gb(s_bytes)} per GPU, "
                    f"{format_seconds(s_time)}"
                    + (f" at {s_bytes / s_time / GB:.0f} GB/s ({s.comm[0].link})." if s_time > 0 else "."))
    b, inter, t, exp = _fsdp_traffic(full)
    if unsplit_batch:  # no figures for a batch it does not run
        q2.lines.append(f"Predicted: none; full sharding over {n} GPUs cannot run this batch "
                        f"({unsplit_batch[0]}).")
    else:
        q2.lines.append(
            ("Predicted" if full.feasible else "As if it fitted (it does not: question 1), predicted")
            + f" ({full.compute_source}): {full.flops.model_flop_per_step:.3g} model FLOPs "
            f"({full.flops.convention} convention), step {format_seconds(full.step_time_s)}, MFU {full.mfu:.1%}; "
            f"FSDP sends {format_gb(b)} per GPU per step over {full.n_microbatches} micro-batch"
            f"{'es' if full.n_microbatches != 1 else ''}, of which "
            f"{format_gb(inter)} crosses the NIC; {format_seconds(t)} of collectives, "
            f"{format_seconds(exp)} exposed ({(1 - exp / t) if t else 1:.0%} hidden).")
        q2.lines.append("Why the figures differ: " + _why_fsdp_differs(full, s, sc.cluster.n_nodes, sc.job.seq_len)
                        + ".")
    _quarter_batch(sc, q2, s_time)
    q2.estimates["fsdp"] = full
    return q2


def _quarter_batch(sc: _Scenario, q2: Question, simplified_traffic_s: float) -> None:
    """Full sharding at a quarter of the batch, in whole sequences per GPU (one at least), added to ``q2``;
    nothing where that is not smaller."""
    n, job = sc.cluster.n_gpus, sc.job
    per_gpu = max(1, job.global_batch_tokens // 4 // (job.seq_len * n))
    small = replace(job, global_batch_tokens=per_gpu * job.seq_len * n)
    e_small = sc.timed(Plan(dp_shard=n), small) if small.global_batch_tokens < job.global_batch_tokens else None
    if not e_small:
        return
    q2.estimates["fsdp_quarter_batch"] = e_small
    s_small = sc.simplify(Plan(dp_shard=n), small)
    sc.simplified["fsdp_quarter_batch"] = s_small
    _, _, t2, exp2 = _fsdp_traffic(e_small)
    q2.lines.append(
        f"At a {small.global_batch_tokens:,}-token batch: simplified step "
        f"{format_seconds(s_small.step_time_s)} "
        f"with the same {format_seconds(simplified_traffic_s)} of traffic; predicted step "
        f"{format_seconds(e_small.step_time_s)}{'' if e_small.feasible else ' as if it fitted'}, "
        f"{format_seconds(t2)} of FSDP collectives, "
        f"{format_seconds(exp2)} exposed.")


def tp_question(sc: _Scenario, full: Estimate | None, unsplit_batch: list[str]) -> Question:
    """Question 3: tensor parallelism over each node's GPUs times data parallelism across nodes, its traffic
    per axis, simplified and predicted, against full sharding."""
    model, n, g = sc.model, sc.cluster.n_gpus, sc.cluster.gpus_per_node
    q3 = Question(f"The 2-D alternative: TP={g} inside each node x data parallel across nodes")
    if not (n % g == 0 and model.n_heads % g == 0 and (model.is_mla or model.n_kv_heads % g == 0) and n > g):
        why = ("the cluster is a single node: there is no data parallelism across nodes to pair it with"
               if n <= g else f"TP={g} does not divide the GPU count {n}" if n % g
               else f"TP={g} does not divide this model's {model.n_heads} attention heads" if model.n_heads % g
               else f"TP={g} does not divide this model's {model.n_kv_heads} KV heads")
        q3.lines.append(f"Not applicable: {why}.")
        return q3
    # without sequence parallelism where the sequence does not split over the node, as the search runs it
    tp_plan = without_unsplit_sp(Plan(tp=g, dp_shard=n // g), sc.job.seq_len)
    tp = sc.timed(tp_plan)
    if not tp:
        return q3
    q3.estimates["tp"] = tp
    s = sc.simplify(tp_plan)
    sc.simplified["tp"] = s
    q3.lines += _tp_traffic_lines(s, tp)
    q3.lines.append(f"Step {format_seconds(tp.step_time_s)} (MFU {tp.mfu:.1%}) against "
                    + ("n/a for full sharding; " if not full
                       else "full sharding, which cannot run this batch; " if unsplit_batch
                       else f"{format_seconds(full.step_time_s)} for full sharding"
                       + ("" if full.feasible else " as if it fitted (it does not)") + "; ")
                    + ("feasible." if tp.feasible else "infeasible: " + "; ".join(tp.infeasible_reasons)))
    return q3


def _tp_traffic_lines(simple: Estimate, tp: Estimate) -> list[str]:
    """The TP x data-parallel plan's traffic per axis: simplified (``simple``), then predicted per axis and
    link (``tp``)."""
    lines = []
    for axis in dict.fromkeys(e.axis for e in simple.comm):
        es = [e for e in simple.comm if e.axis == axis]
        extra = (f"; {format_gb(es[0].message_bytes)} per all-reduce, "
                 f"{format_gb(es[0].bytes_per_gpu / es[0].count)} sent per GPU per all-reduce"
                 if axis == "tp" else "")
        lines.append(f"Simplified {axis} ({es[0].link}): {format_gb(sum(e.bytes_per_gpu for e in es))} per "
                     f"GPU, {format_seconds(sum(e.time_s for e in es))}{extra}")
    by_axis: dict[tuple[str, str], list] = {}
    for e in tp.comm:
        by_axis.setdefault((e.axis, e.link), []).append(e)
    for (axis, link), es in by_axis.items():
        lines.append(
            f"Predicted {axis} ({link}, {es[0].group_size} GPUs): "
            f"{format_gb(sum(e.bytes_per_gpu for e in es))} per "
            f"GPU in {sum(e.count for e in es):,} calls, {format_seconds(sum(e.time_s for e in es))}, "
            f"{format_seconds(sum(e.exposed_s for e in es))} exposed.")
    return lines


def recommendation_question(sc: _Scenario, result: SearchResult) -> tuple[Question, Estimate | None]:
    """Question 4 (without the conditions of change): the recommended plan with its uncertainty band, why,
    the runner-up, the best plan of each other family and the faster plans within the tie band. Returns it
    and the recommendation with its band (None where no plan fits)."""
    q4 = Question("Recommendation, what to measure first, and when to change it")
    best = result.recommended
    if best is None:
        q4.lines.append("No plan in the searched space fits; the closest is: "
                        + (result.ranked[0].infeasible_reasons[0] if result.ranked else "no plan enumerated"))
        return q4, None
    q4.estimates["recommended"] = best
    from meshplan.uncertainty import attach_band

    best = attach_band(best, accelerator=sc.cluster.accelerator.name, software=sc.job.software,
                       moe=sc.model.is_moe)
    b = best.uncertainty
    band = f" ({b.low:+.0%} .. {b.high:+.0%})" if b else ""
    q4.lines.append(f"Recommended: {best.plan.label()} ({best.plan.to_string()}): step "
                    f"{format_seconds(best.step_time_s)}{band}, MFU {best.mfu:.1%}"
                    f"{' (of the FP8 peak)' if sc.job.precision == 'fp8' else ''}, "
                    f"{best.tokens_per_s_per_gpu:,.0f} tokens/s per GPU.")
    if b:
        q4.lines.append(f"Uncertainty: {b.sentence('such predictions')}.")
    q4.lines.append("Why: " + binding_resource(best) + ".")
    runner = next((e for e in result.feasible[1:]), None)
    if runner:
        gap = runner.step_time_s / best.step_time_s - 1
        q4.lines.append(f"Runner-up: {runner.plan.label()} ({runner.plan.to_string()}), "
                        + ("the same step time" if abs(gap) < 5e-4 else f"{gap:+.1%} step time"
                           + (" (faster, but within the tie band)" if gap < 0 else "")) + ".")
    q4.lines += _other_families(sc.model, result, best)
    q4.lines += _faster_within_the_band(result, best)
    return q4, best


def _other_families(model: ModelSpec, result: SearchResult, best: Estimate) -> list[str]:
    """The best plan of each other family, and what it lacks against ``best``."""
    lines = []
    for fam, e in result.best_by_family().items():
        if e is best or family(best.plan) == fam:
            continue
        # a plan's family is its most distinctive axis, expert parallelism first: name what the others lack
        name = FAMILY_NAMES[fam] + (" plan without expert parallelism" if model.is_moe and fam != "ep" else " plan")
        line = f"Best {name} {e.plan.label()}: {why_not(e, best)}"
        quickest = min((x for x in result.feasible if family(x.plan) == fam), key=lambda x: x.step_time_s,
                       default=e)
        if e.feasible and quickest.step_time_s < e.step_time_s:  # ranked below it within the tie band
            line += (f" (its fastest, {quickest.plan.to_string()}, takes {format_seconds(quickest.step_time_s)}; "
                     "within the tie band the plan with fewer options ranks first)")
        lines.append(line + ".")
    return lines


def _faster_within_the_band(result: SearchResult, best: Estimate) -> list[str]:
    """The plans predicted faster than ``best`` that the tie band put behind it, in one line (none if none)."""
    faster = [e for e in result.feasible if e.step_time_s < best.step_time_s]
    if not faster:
        return []
    quickest = min(faster, key=lambda e: e.step_time_s)
    return [f"{len(faster)} plan(s) predict up to {1 - quickest.step_time_s / best.step_time_s:.1%} "
            f"less step time (fastest: {quickest.plan.label()}"
            + (f", {quickest.plan.to_string()}" if quickest.plan.label() == best.plan.label() else "")
            + f") but fall within the {TIE_BAND:.0%} "
            "tie band, where the simpler plan (fewer axes, fewer options) and more memory headroom "
            "win: below the model's error, another parallel axis is not worth its complexity."]


def _conditions_of_change(sc: _Scenario, result: SearchResult, best: Estimate, space: Space,
                          workers: int | None) -> tuple[list[Condition], list[HeldRange]]:
    """When to change the plan: the conditions under which another plan is recommended, and the ranges
    over which ``best`` holds, re-searched with the leading plans of ``result`` as candidates."""
    mfu = sc.mfu

    def ranked_at(m: ModelSpec, c: ClusterSpec, j: JobSpec) -> list[Estimate]:
        # as this search: its leading plans re-timed by the simulator, so that a condition names
        # what plan would recommend there
        return search(m, c, j, space, mfu=mfu, refine_top=REFINE_TOP, workers=1).feasible

    def timed(m: ModelSpec, c: ClusterSpec, j: JobSpec, p: Plan) -> Estimate | None:
        return _try(m, c, j, p, mfu)

    seen: set[str] = set()
    candidates = []
    for e in [*result.feasible[:CANDIDATES], *result.best_by_family().values()]:
        key = e.plan.to_string()
        if key not in seen:
            seen.add(key)
            candidates.append(e.plan)
    return find_conditions(sc.model, sc.cluster, sc.job, best, ranked_at, candidates=candidates, mfu=mfu,
                           workers=workers, timed=timed)
