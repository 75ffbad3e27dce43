"""Activation offloading (Plan.offload_layers): where it can run, how long the layers wait for its copies
over the host link, and what it moves. What it takes out of HBM is stage_memory's."""

from __future__ import annotations

from meshplan.cost.stage import StageCtx
from meshplan.cost.stage_memory import StaticMemory, offloaded_bytes, offloaded_layers
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan
from meshplan.units import GB, format_gib


def offload_runs_with(job: JobSpec) -> bool:
    """Whether Megatron-core runs activation offloading with ``job``'s CUDA graphs: without any, or with one
    graph for the whole iteration (TransformerConfig.__post_init__ refuses other cuda_graph_impl values)."""
    return not job.cuda_graphs or job.cuda_graph_scope == "full_iteration"


def offload_offered(cluster: ClusterSpec, job: JobSpec, plan: Plan) -> bool:
    """Whether activation offloading is an option for ``plan`` at all (the search's variant, the memory
    question's alternative): a Megatron plan (its distributed optimizer, or job software = megatron, as
    Megatron-FSDP) without a pipeline, on a node whose host link rate is known, outside per-layer CUDA
    graphs (offload_reasons names each of these where a plan offloads anyway)."""
    return (plan.pp == 1 and cluster.host_bytes_per_s is not None and offload_runs_with(job)
            and plan.runs_megatron_layers(job.software))


def offload_reasons(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, ctxs: list[StageCtx],
                    static: dict[int, StaticMemory]) -> list[str]:
    """Why ``plan``'s activation offloading cannot run here (empty if it can): it is Megatron-core's (TE's
    offload context under Megatron's transformer block); Megatron offloads at most the decoder layers less
    one (cpu_offloading_num_layers < num_layers, MTP layers not counted); the host link's rate must be known
    to time it (ClusterSpec.host_bytes_per_s); it runs in a CUDA graph only if the graph is the whole
    iteration (offload_runs_with); and the offloaded tensors must fit in the GPU's share of host memory
    where the node spec gives it (ClusterSpec.host_memory_bytes)."""
    reasons = []
    if not plan.runs_megatron_layers(job.software):
        reasons.append(f"activation offloading is Megatron-core's (Transformer Engine's offload context): needs "
                       f"sharding=megatron or job software = megatron, got sharding={plan.sharding} and software="
                       f"{job.software}")
    if plan.offload_layers > model.n_layers - 1:
        reasons.append(f"offload_layers={plan.offload_layers}: Megatron offloads at most the decoder layers less "
                       f"one ({model.n_layers - 1} of {model.n_layers})")
    if cluster.host_bytes_per_s is None:
        reasons.append("activation offloading needs the node's host link rate (cluster node key host_gb_per_s)")
    if not offload_runs_with(job):
        reasons.append("activation offloading does not run inside per-layer CUDA graphs (job cuda_graphs = true "
                       "with cuda_graph_scope = layers; a full_iteration graph can)")
    host_memory = cluster.host_memory_bytes
    if host_memory is not None:
        moved = max(offloaded_bytes(c, static[c.s]) for c in ctxs)
        if moved > host_memory:
            reasons.append(f"the offloaded activations need {format_gib(moved)} of host memory per GPU, over "
                           f"the {format_gib(host_memory)} the node has per GPU")
    return reasons


def offload_waits_s(c: StageCtx, st: StaticMemory, fwd_s: float, bwd_s: float) -> tuple[float, float]:
    """Per micro-batch, how long stage ``c.s``'s layers wait for activation offloading, forward and backward
    [s] (offload_stalls_s, with each offloaded layer's saved tensors over the host link,
    ClusterSpec.host_bytes_per_s, and the stage's mean layer: ``fwd_s`` and ``bwd_s`` over its layers). The
    copies run on the copy engines; the HBM bandwidth they take (a few per cent of it) is not modelled."""
    host = c.cluster.host_bytes_per_s
    layers = c.n_dense + c.n_moe
    if not c.plan.offload_layers or not host or not layers:
        return 0.0, 0.0
    flash = c.job.flash_attention
    d, e = offloaded_layers(c.plan.offload_layers, c.n_dense, c.n_moe)
    copies = [c.tokens * st.a_dense[flash] / host] * d + [c.tokens * st.a_moe[flash] / host] * e
    # TE schedules over the decoder's layers (Megatron passes num_layers; MTP layers run after them)
    return offload_stalls_s(fwd_s / layers, bwd_s / layers, copies, c.model.n_layers)


def offload_stalls_s(layer_f_s: float, layer_b_s: float, copies_s: list[float], n_layers: int
                     ) -> tuple[float, float]:
    """The compute stream's waits, forward and backward [s], of ``n_layers`` layers of equal time whose first
    len(``copies_s``) = N offload their saved tensors, each copy taking its ``copies_s`` each way, as
    Transformer Engine schedules them by default from TE 2.10 (cpu_offload.py, DefaultOffloadSynchronizer;
    TE PR #1762): one copy stream for both directions, in order; layer i's copy out is queued when it
    ends, and layer L - N + i waits for it before it starts (so at most L - N layers' tensors are ever in
    HBM); in the backward, layer i's copy back is queued when the backward of layer L - 1 - N + i begins
    and its own backward waits for it. The limit is the link's throughput, not one layer's compute: with
    N <= L - 2, uniform layers wait N·c - (L - 2)·t in each phase when a copy c outlasts a layer t; with
    N = L - 1 every layer waits for the copy before it whatever the link (TE warns that it prevents
    overlap). TE queues each tensor's copy when it is saved, not when its layer ends, so this is slightly
    pessimistic. (TE 2.9 and earlier bulk copied each layer with about L / N layers to hide it: waits of
    about max(0, c - t·L / N) each.)"""
    n_off, t = len(copies_s), 0.0
    done, stream = [0.0] * n_off, 0.0
    for j in range(n_layers):  # layer j + 1, forward
        i = j - (n_layers - n_off)  # the offloaded layer whose copy must have ended (0-based), if any
        if i >= 0:
            t = max(t, done[i])
        t += layer_f_s
        if j < n_off:
            stream = max(stream, t) + copies_s[j]
            done[j] = stream
    fwd_wait = _beyond(t, n_layers * layer_f_s)
    t, stream = 0.0, max(0.0, stream - t)  # the backward starts where the forward ends
    back = [0.0] * n_off
    for j in range(n_layers - 1, -1, -1):  # layer j + 1, backward
        i = j - (n_layers - 1 - n_off)  # the layer whose copy back its start queues
        if 0 <= i < n_off:
            stream = max(stream, t) + copies_s[i]
            back[i] = stream
        if j < n_off:
            t = max(t, back[j])
        t += layer_b_s
    return fwd_wait, _beyond(t, n_layers * layer_b_s)


def _beyond(t: float, compute: float) -> float:
    """How far ``t`` runs past ``compute`` [s], rounding error (summing layer times) taken as none."""
    return t - compute if t > compute * (1.0 + 1e-9) else 0.0


def offload_note(c: StageCtx, st: StaticMemory, cluster: ClusterSpec) -> str:
    """What activation offloading moves, for the report (pp = 1: one stage)."""
    host = cluster.host_bytes_per_s
    link = f"over the host link at {host / GB:,.0f} GB/s per GPU per direction" if host else "(no host link rate)"
    return (f"activation offload: {c.plan.offload_layers} of {c.model.n_layers} decoder layers, "
            f"{offloaded_bytes(c, st) / GB:,.1f} GB to host memory and back per micro-batch {link}")
