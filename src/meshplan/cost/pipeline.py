"""Pipeline schedules: stage layout, bubble time and in-flight micro-batches.

Symbols: p pipeline stages, m micro-batches per step, v model chunks per rank (interleaving),
t_F, t_B, t_W forward, input-gradient and weight-gradient time of one micro-batch on one stage
(full backward t_B + t_W).

References
----------
[1] D. Narayanan et al., SC'21, arXiv:2104.04473, §2.2: 1F1B bubble (p-1)(t_F + t_B,full); interleaved
    divides it by v and multiplies point-to-point traffic by v.
[2] P. Qi et al., "Zero Bubble Pipeline Parallelism," ICLR 2024: ZB-H1 bubble (p-1)(t_F + t_B - t_W)
    at the activation memory of 1F1B; ZB-V (two chunks per rank, V-shape) near zero bubble at the same
    memory when t_F = t_B = t_W, in general (p-1)·max(0, t_F + t_B - 2·t_W). Both assume enough
    micro-batches and the paper's optimizer post-validation; ``bubble_time_s`` adds the limits of few
    micro-batches and of a step that ends in a synchronisation.
[3] V. Korthikanti et al., arXiv:2205.05198, §4.2.3: the first 1F1B stage holds p micro-batches in
    flight; interleaving multiplies it by (1 + (p-1)/(p·v)).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from meshplan.memo import cache_by_identity
from meshplan.specs import ModelSpec, Plan
from meshplan.specs.layout import layers_per_stage, parse_layout

MTP_CHUNK_SLOTS = 3
"""Layers the last model chunk gives up per multi-token-prediction depth, for its MTP layer and the loss:
NVIDIA's DeepSeek-V3 layouts split 61 layers as if there were 64 (4, 8 and 16 chunks: ``Et*16|t*16|t*16|
t*13mL``, ``Et*8|(t*8|)*6t*5mL``, ``Et*4|(t*4|)*14tmL``, Megatron-Bridge
src/megatron/bridge/recipes/deepseek/deepseek_v3.py @05d003f; 32 chunks on H100: ``Et|(tt|)*30mL``,
perf_recipes/deepseek/h100/deepseek_v3.py @2e7ec2a)."""


ZERO_BUBBLE = ("zb-h1", "zb-v")
"""Schedules that split the backward's weight-gradient pass W off and defer it into the idle slots."""


def mtp_chunk_layers(n_layers: int, mtp_layers: int, chunks: int) -> list[int]:
    """Decoder layers per model chunk of a model with MTP, without a layout: every chunk but the last holds
    k = ceil((L + 3·mtp) / chunks) (MTP_CHUNK_SLOTS), the last what remains; where (chunks - 1)·k exceeds
    L, the first chunks hold one fewer. Reproduces every DeepSeek-V3 layout of NVIDIA's recipes."""
    k = -(-(n_layers + MTP_CHUNK_SLOTS * mtp_layers) // chunks)
    sizes = [k] * (chunks - 1) + [0]
    over = sum(sizes) - n_layers
    for i in range(max(0, over)):
        sizes[i % (chunks - 1)] -= 1
    sizes[-1] += max(0, -over)
    return sizes


def _chunk_sizes(model: ModelSpec, pp: int, layout: str, chunks: int) -> list[int] | None:
    """Decoder layers of every model chunk where the split is not even: a layout's, or MTP's
    (mtp_chunk_layers); None for an even split. The MTP layers themselves are not counted."""
    if layout:
        return [c.layers for c in parse_layout(layout)]
    if model.mtp_layers and pp > 1:
        return mtp_chunk_layers(model.n_layers, model.mtp_layers, pp * chunks)
    return None


@cache_by_identity(n_specs=1, maxsize=1024)
def stage_layers(model: ModelSpec, pp: int, layout: str = "", chunks: int = 1) -> list[tuple[int, int]]:
    """(dense layers, MoE layers) on each stage, the model's multi-token-prediction layers (ModelSpec.mtp_layers,
    of the last decoder layer's kind) counted on the last. With a ``layout`` (Plan.layout) each stage holds
    the layers of its chunks (``chunks`` per rank, chunk c on rank c mod pp); without one, a model with MTP
    takes mtp_chunk_layers over pp x ``chunks`` chunks, and other models split evenly, the remainder to the
    first stages. The leading dense layers of an MoE model are taken in order."""
    sizes = _chunk_sizes(model, pp, layout, chunks)
    if sizes is not None:
        counts = layers_per_stage(sizes, pp)
    else:
        base, extra = divmod(model.n_layers, pp)
        counts = [base + (1 if s < extra else 0) for s in range(pp)]
    out: list[tuple[int, int]] = []
    start = 0
    dense_end = model.n_layers - model.n_moe_layers
    for n in counts:
        dense = max(0, min(start + n, dense_end) - start)
        out.append((dense, n - dense))
        start += n
    if model.mtp_layers:
        d, e = out[-1]
        out[-1] = (d, e + model.mtp_layers) if model.n_moe_layers else (d + model.mtp_layers, e)
    return out


def in_flight_microbatches(*, schedule: str, pp: int, m: int, vpp: int, stage: int, layers: int,
                           ep_overlap: bool = False, chunk_layers: tuple[float, ...] = ()) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak [micro-batches of its layers] [3].

    Megatron's MoE all-to-all overlap runs the forward of one micro-batch beside the backward of the one
    before, layer by layer: forward layer i pairs with backward layer N-1-i
    (``TransformerModelChunkSchedulePlan.run``: ``get_layer(i)`` against ``pop_layer()``,
    megatron/core/models/common/model_chunk_schedule_plan.py), and autograd frees each backward layer's
    saved tensors as it goes, so without a pipeline one micro-batch and one layer (of the stage's
    ``layers``) are alive; the interleaved schedule warms up one more model chunk
    (num_warmup_microbatches + 1, megatron/core/pipeline_parallel/schedules.py).

    Interleaved, stage r runs 2(p - r - 1) + (v - 1)p chunk forwards before its steady state
    (``warmup_forwards``), then a forward and a backward by turns, in groups of p micro-batches per
    model chunk (``microbatch_group_size_per_vp_stage``, p by default): forward i runs the rank's chunk
    (i // p) mod v, backward i its chunk v - 1 - (i // p) mod v. The held micro-batches are the most
    chunk forwards alive at once, each weighted by its chunk's layers (``chunk_layers``, the stage's chunks
    in order; equal chunks without) over the stage's (``interleaved_peak``): p + (p - 1)/v on the first
    stage with equal chunks ([3]'s 1 + (p - 1)/(pv) times p), ((v - 1)p + 1)/v on the last. With equal
    chunks the peak is the first steady forward's; where a rank's later chunks are the smaller, it comes
    later (a backward then frees less than the forward before it added)."""
    if pp == 1:
        return 1.0 + (1.0 / layers if ep_overlap and m > 1 else 0.0)
    if schedule == "gpipe":
        return float(m)
    if schedule in ZERO_BUBBLE:
        # every stage holds p micro-batches short of their W pass [2]: ZB-H1 holds back s of stage s's W
        # passes (§2.1), PyTorch's ScheduleZBVZeroBubble (torch/distributed/pipelining/schedules.py) runs
        # 2(p - r) - 1 + r first-chunk forwards and r + 1 second-chunk ones before rank r's first W, 2p
        # chunks of half its layers. A micro-batch waiting for its W keeps the weight gradients' inputs
        # and output gradients, nearly all of its activations ([2] Table 1: M_W = 32sbh of
        # M_B = 34sbh + 5as²b), so it counts whole. Under ZB-V with fewer than 2p - 1 micro-batches its legs
        # hold fewer (stage_alive), each chunk half the stage's layers.
        if schedule == "zb-v":
            first, second = stage_alive(schedule=schedule, pp=pp, vpp=2, m=m, rank=stage, held=0.0)
            return (first + second) / 2.0
        return float(min(m, pp))
    if schedule != "interleaved":
        return float(min(m, pp - stage))
    sizes = chunk_layers or (1.0,) * vpp
    return interleaved_peak(pp, vpp, m, stage, tuple(sizes), ep_overlap)


def interleaved_peak(pp: int, vpp: int, m: int, stage: int, sizes: tuple[float, ...], ep_overlap: bool) -> float:
    """The most layers' activations stage ``stage`` of Megatron's interleaved schedule holds at once, in
    units of its layers (``sizes``: the layers of each of its chunks, in order) [micro-batches]: its
    warm-up forwards (one more with the MoE all-to-all overlap, whose forward runs beside the next
    backward), then a forward and a backward by turns (in_flight_microbatches). The live set repeats
    with the period of p·v passes, so two periods past the warm-up bound its peak."""
    return _interleaved_live(pp, vpp, m, stage, sizes, ep_overlap)[0]


def interleaved_chunks_alive(pp: int, vpp: int, m: int, stage: int, sizes: tuple[float, ...], ep_overlap: bool
                             ) -> tuple[int, ...]:
    """Micro-batches alive on each model chunk of stage ``stage`` at ``interleaved_peak`` (p = 8, v = 2,
    m = 32: 15 and 8 on the first rank, 8 and 1 on the last, as PyTorch's Interleaved1F1B runs them too)."""
    return _interleaved_live(pp, vpp, m, stage, sizes, ep_overlap)[1]


@functools.lru_cache(maxsize=4096)
def _interleaved_live(pp: int, vpp: int, m: int, stage: int, sizes: tuple[float, ...], ep_overlap: bool
                      ) -> tuple[float, tuple[int, ...]]:
    v, total = vpp, sum(sizes)
    passes = m * v
    warm = min(passes, warmup_forwards(pp, v, stage) + (1 if ep_overlap else 0))
    counts = [0] * v
    for i in range(warm):
        counts[(i // pp) % v] += 1
    live = peak = sum(n * size for n, size in zip(counts, sizes, strict=True))
    at_peak = tuple(counts)
    for j, i in enumerate(range(warm, min(passes, warm + 2 * pp * v))):
        live += sizes[(i // pp) % v]
        counts[(i // pp) % v] += 1
        if live > peak:
            peak, at_peak = live, tuple(counts)
        live -= sizes[v - 1 - (j // pp) % v]
        counts[v - 1 - (j // pp) % v] -= 1
    return (peak / total if total > 0 else min(float(m), (warm + 1) / v)), at_peak


def unpaired_microbatches(*, schedule: str, pp: int, m: int, vpp: int, stage: int) -> float:
    """Micro-batches (in layers of the stage) whose forward runs with no backward beside it, and as many
    backwards with no forward: the warm-up and cool-down of stage ``stage``. Megatron's MoE all-to-all
    overlap pairs a forward with a backward only in the steady state; its interleaved schedule warms up
    (pp - stage - 1)·2 + (v - 1)·pp + 1 model chunks (get_pp_rank_microbatches,
    megatron/core/pipeline_parallel/schedules.py), a chunk being 1/v of the stage's layers. Without a
    pipeline one micro-batch: the first forward and the last backward."""
    if pp == 1:
        return 1.0 if m > 0 else 0.0
    v = vpp if schedule == "interleaved" else 1
    return min(float(m), (warmup_forwards(pp, v, stage) + 1) / v)


def warmup_forwards(pp: int, v: int, stage: int) -> int:
    """Model-chunk forwards stage ``stage`` runs before its first backward is due, with ``v`` chunks per
    rank: (pp - stage - 1)·2 + (v - 1)·pp interleaved, pp - stage - 1 in 1F1B
    (get_pp_rank_microbatches, megatron/core/pipeline_parallel/schedules.py)."""
    return (pp - stage - 1) * (2 if v > 1 else 1) + (v - 1) * pp


def bubble_time_s(*, schedule: str, pp: int, vpp: int, m: int, t_f_s: float, t_b_s: float, t_w_s: float
                  ) -> float:
    """Idle time of a pipeline rank per step of ``m`` micro-batches [s] ([1], [2]). t_b_s is the
    input-gradient part of the backward, t_w_s the weight-gradient part (both chunks' under ZB-V).

    ZB-H1 fills the 1F1B bubble, (p - 1)(t_F + t_B), with deferred weight-gradient passes ([2]), exactly
    as its order runs on uniform stages (sim.pipeline, the paper's; the paths enumerated as for ZB-V, below)
    with n = min(m, p): stage 0's last W runs after its last B, which ends the step, so it fills n - 1 of
    its p - 1 slots; and without the paper's optimizer post-validation every rank waits for the last, so
    the bubble never falls below (p - 1)·t_F + (p - n)·t_B, nor the same with t_F and t_B swapped. ZB-V is
    PyTorch's order (``_zb_v_bubble``). The paper's formulas, (p - 1)·max(0, t_F + t_B - k·t_W), hold only
    with many micro-batches and balanced passes. Exact on uniform stages; where they differ (the loss's
    is heavier), ``stage_bubbles_s`` gives each stage the bubble of the other ranks' times."""
    if pp == 1:
        return 0.0
    full = t_f_s + t_b_s + t_w_s
    if schedule in ("gpipe", "1f1b"):
        return (pp - 1) * full
    if schedule == "interleaved":
        return (pp - 1) * full / vpp
    if schedule == "zb-h1":
        slots, short = pp - 1, pp - min(m, pp)
        return max(slots * t_f_s + short * t_b_s, short * t_f_s + slots * t_b_s,
                   slots * (t_f_s + t_b_s - t_w_s) + short * t_w_s)
    return _zb_v_bubble(pp, m, t_f_s, t_b_s, t_w_s)


# ZB-V's bubble on uniform stages is the longest of these paths through PyTorch's order, each a linear
# form in (t_F, t_B, t_W) whose coefficients are (c0 + cj·j + ck·k)/2, one (c0, cj, ck) per time, with
# n = min(m, 2p - 1) micro-batches (more add none: the steady state keeps the bubble), j = n - p and
# k = 2p - 1 - n. The paths were enumerated exactly (max-plus, in rational arithmetic) on the simulator's
# ZB-V order for p = 2..10 and every m, fitted as linear in (j, k), and each form checked against the
# simulator for p = 2..20 (tests/test_pipeline.py); every one is needed, at some (p, m, t_F, t_B, t_W).
_ZB_V_FEW = (  # n <= p
    ((0, -2, 0), (0, 2, 2), (0, 0, 0)),
    ((0, 0, 1), (0, 0, 1), (0, 0, 0)),
    ((0, 2, 2), (0, -4, -1), (0, -2, -1)),
    ((0, 2, 2), (0, -2, 0), (0, -4, -2)),
)
_ZB_V_MANY = (  # n > p
    ((-1, 2, 1), (1, 0, 1), (0, -2, 0)),
    ((0, 0, 0), (0, 2, 2), (0, -2, 0)),
    ((0, 2, 1), (0, 0, 1), (-1, -2, 0)),
    ((-1, 2, 1), (1, -1, 0), (0, 0, 0)),
    ((1, 0, 1), (0, 0, 0), (-1, 1, 0)),
    ((0, 2, 2), (0, 0, 0), (-1, -2, -2)),
    ((0, 0, 0), (1, 0, 1), (-1, 1, 0)),
    ((0, 2, 1), (0, -1, 0), (-1, 0, 0)),
    ((0, 2, 1), (0, -1, 1), (0, -1, 0)),
    ((0, 2, 2), (0, -1, 0), (0, -1, -2)),
    ((0, 2, 2), (0, -1, -1), (0, -1, -1)),
    ((0, 0, 1), (0, 0, 1), (0, 0, 0)),
    ((0, 0, 0), (0, 0, 2), (0, 0, 0)),
    ((0, 2, 1), (0, -1, 1), (-1, 0, -1)),
    ((0, 0, 0), (0, 1, 2), (0, 0, -1)),
    ((-1, 2, 1), (1, -1, 1), (0, 0, -1)),
    ((0, 2, 2), (0, -1, -1), (-1, 0, -2)),
    ((0, 2, 2), (0, -1, 0), (-1, 0, -3)),
)


def _zb_v_bubble(pp: int, m: int, t_f_s: float, t_b_s: float, t_w_s: float) -> float:
    """Idle time of PyTorch's ZB-V (``ScheduleZBVZeroBubble``; sim.pipeline._zb_v) on uniform stages [s],
    exact: the longest of the paths in ``_ZB_V_FEW`` / ``_ZB_V_MANY``. With m >= 2p - 1 micro-batches eight
    forms can be the longest, among them (p - 1)·t_B/2, the steady state running F, B and W of each leg in
    turn (the paper's (p - 1)·t_F/2 holds only at t_F = t_B with t_W neither short nor long; [2] §6
    balances the passes by hand); (p - 3/2)·t_F - (p - 2)·t_B/2; (p - 1)(t_B - t_W) and
    (p - 1)·t_F - (p - 1/2)·t_W where t_W is short; and (max(t_F, t_B) + (p - 2)·t_W)/2 where it is long,
    the W passes held to the cool-down. With fewer, PyTorch still plans 2p - 1 micro-batches and drops the
    rest, and the bubble grows to (p - 1)(t_F + t_B) at one micro-batch (7·t_F against 3.5·t_F at p = 8,
    m = 8, equal times)."""
    n = min(m, 2 * pp - 1)
    j, k = n - pp, 2 * pp - 1 - n
    times = (t_f_s, t_b_s, t_w_s)
    return max(sum(t * (c0 + cj * j + ck * k) for t, (c0, cj, ck) in zip(times, form, strict=True))
               for form in (_ZB_V_FEW if n <= pp else _ZB_V_MANY)) / 2.0


def stand_ins(stages: Sequence[int], pp: int, loads: Sequence[float]) -> list[int]:
    """For each of the ``pp`` ranks, the position in ``stages`` (the timed ones, cost.stage.bounding_stages:
    sorted, the first 0 and the last pp - 1) of the stage whose times stand for it: rank 0 the first, rank
    pp - 1 the last, every middle rank the timed middle stage of the largest ``loads`` (its per micro-batch
    time), or the first where no middle one is timed. The closed form (``stage_bubbles_s``) and the
    simulator (sim.simulate) lay out the pipeline alike."""
    last, middle = len(stages) - 1, _slowest_middle(loads)
    return [_stand_in(r, pp, last, middle) for r in range(pp)]


def _slowest_middle(loads: Sequence[float]) -> int:
    """The position of the timed middle stage of the largest load (stand_ins), 0 where none is timed."""
    return max(range(1, len(loads) - 1), key=loads.__getitem__, default=0)


def _stand_in(rank: int, pp: int, last: int, middle: int) -> int:
    """The position of the timed stage that stands for ``rank`` (stand_ins)."""
    return 0 if rank == 0 else last if rank == pp - 1 else middle


def stage_bubbles_s(*, schedule: str, pp: int, vpp: int, m: int, stages: Sequence[int],
                    passes: Sequence[tuple[float, float, float]]) -> list[float]:
    """Idle time per step of each timed stage of ``stages`` [s], whose ``passes`` are its (t_F, t_B, t_W)
    per micro-batch as ``bubble_time_s`` takes them: the bubble at the mean times of the other ranks
    (``stand_ins``), not its own, except under the zero-bubble schedules its W: a rank waits in the warm-up
    and cool-down for the other ranks' forwards and input-gradient passes, and fills what it can of the
    wait with its own deferred weight-gradient passes. Under 1F1B the busiest stage s ends after
    m·(t_F + t_B)_s + sum over r != s of (t_F + t_B)_r, where charging every rank stage s's times
    overstates the bubble by (p - 1) times s's excess, the LM head and loss on the last stage. Against the
    timeline simulator (sim.pipeline) on random pass times, p = 2..16 and m = 1..4p, the last stage's t_F
    and t_B heavier by up to 60 % and its t_W by half as much: exact under 1F1B (each stage's own times
    overstated the step by 7.5 % on average, and by 54 % at p = 16, m = 1, a last stage 1.6 times as
    slow); with the first heavier too, by up to 10 %, 0.1 % above on average (at most 4 %); under ZB-H1
    0.7 % (at most 7 %; own times 7.6 %, the other ranks' W as well 1.1 %) and under ZB-V 3.9 % (at most
    14 %; own times 7.7 %), whose forms were derived on uniform stages (tests/test_pipeline.py; at extreme
    mixes, t_B thirty times t_F, up to 30 % above). Under the zero-bubble schedules it can also fall a
    few per cent below the simulated step: where the loss stage's t_W is lighter than its layers' share
    (its head adds to t_B only), ZB-H1 0.5 % off on average, -4 % at worst (-8 % with the other ranks'
    W). A stage's own W enters as it would on uniform stages, so a longer W never shortens the step; ZB-V's
    forms keep negative coefficients on t_B, so a longer t_B on the other ranks alone can, which adding
    layers (F, B and W together) never does."""
    if pp == 1:
        return [0.0] * len(stages)
    last = len(stages) - 1
    middle = _slowest_middle([sum(x) for x in passes]) if last > 1 else 0
    ranks = [0] * len(stages)  # how many ranks each timed stage stands for (stand_ins, counted)
    ranks[0] += 1
    ranks[last] += 1
    ranks[middle] += pp - 2
    tf = tb = tw = 0.0
    for n, (f, b, w) in zip(ranks, passes, strict=True):
        tf, tb, tw = tf + n * f, tb + n * b, tw + n * w
    own_w = schedule in ZERO_BUBBLE  # the deferred W passes that fill a rank's idle slots are its own
    out = []
    for s in stages:
        f, b, w = passes[_stand_in(s, pp, last, middle)]
        out.append(bubble_time_s(schedule=schedule, pp=pp, vpp=vpp, m=m, t_f_s=(tf - f) / (pp - 1),
                                 t_b_s=(tb - b) / (pp - 1), t_w_s=w if own_w else (tw - w) / (pp - 1)))
    return out


def bubble_fraction(*, schedule: str, pp: int, m: int, vpp: int) -> float:
    """Bubble as a fraction of the step's wall time for t_F = t_B = t_W: (p-1)/(m+p-1) for 1F1B."""
    bubble = bubble_time_s(schedule=schedule, pp=pp, vpp=vpp, m=m, t_f_s=1.0, t_b_s=1.0, t_w_s=1.0)
    return bubble / (bubble + 3.0 * m)


def rank_stage_ids(schedule: str, pp: int, vpp: int, rank: int) -> tuple[int, ...]:
    """The pipeline stages (model chunks, numbered along the model) rank ``rank`` runs: r, r + p, ... under
    the interleaved schedule, r and 2p - 1 - r under ZB-V (the V), r otherwise."""
    if schedule == "interleaved":
        return tuple(rank + k * pp for k in range(vpp))
    if schedule == "zb-v":
        return (rank, 2 * pp - 1 - rank)
    return (rank,)


@functools.lru_cache(maxsize=4096)
def stage_alive(*, schedule: str, pp: int, vpp: int, m: int, rank: int, held: float,
                chunk_layers: tuple[float, ...] = (), ep_overlap: bool = False) -> tuple[float, ...]:
    """Micro-batches alive (forward run, backward or W not yet) on each stage of ``rank_stage_ids`` at the
    rank's activation peak, ``held`` being the rank's (in_flight_microbatches): the interleaved schedule's
    per chunk (interleaved_chunks_alive); under ZB-V min(m, 2p - r - 1) on the V's first leg and min(m,
    r + 1) on its second, which holds the loss on rank 0 (counted on PyTorch's order, sim.pipeline._zb_v,
    for p up to 12 and every m and rank); ``held`` on a rank's one stage otherwise."""
    if pp > 1 and schedule == "interleaved":
        return tuple(float(n) for n in interleaved_chunks_alive(pp, vpp, m, rank, chunk_layers or (1.0,) * vpp,
                                                                ep_overlap))
    if pp > 1 and schedule == "zb-v":
        return (float(min(m, 2 * pp - rank - 1)), float(min(m, rank + 1)))
    return (held,)


def stage_input_grads_kept(*, schedule: str, pp: int, m: int, rank: int, alive: tuple[float, ...]
                           ) -> tuple[float, ...] | None:
    """Input-gradient passes each stage of rank ``rank`` has run at its peak, whose gradients PyTorch's
    zero-bubble schedules leave on the received inputs until the next step
    (memory.pipelining_boundary_tensors); None for the schedules that run the backward whole. ZB-H1 holds
    p micro-batches short of their W to the end of the step, by then having run m - (p - 1 - r) input
    gradients; ZB-V's legs m less those alive (both measured on two and four gloo ranks, torch 2.13, within
    one tensor)."""
    if schedule == "zb-h1":
        return (float(max(0, m - (pp - 1 - rank))),)
    if schedule == "zb-v":
        return tuple(max(0.0, m - a) for a in alive)
    return None


def head_stage(schedule: str, pp: int) -> int:
    """The pipeline rank that holds the final norm, the LM head and the loss: the last, except under ZB-V,
    whose V-shaped placement gives rank r the stages r and 2p - 1 - r, so rank 0 holds the embedding and the
    head (torch.distributed.pipelining's V-style stage_ids_this_rank; torchtitan #774)."""
    return 0 if schedule == "zb-v" else pp - 1


def round_robin_chunks(schedule: str, vpp: int) -> int:
    """Model chunks per rank that stage_layers places round-robin: the interleaved schedule's virtual
    stages (ZB-V's V-shaped pair is split as one chunk per rank)."""
    return vpp if schedule == "interleaved" else 1


@cache_by_identity(n_specs=1, maxsize=4096)
def stage_chunk_layers(model: ModelSpec, pp: int, layout: str, chunks: int, stage: int) -> tuple[float, ...]:
    """Layers of each model chunk of rank ``stage``, in the order it runs them (chunk c on rank c mod pp), as
    stage_layers places them: a layout's, MTP's split (its layers on the last chunk), or the stage's layers
    split evenly."""
    sizes = _chunk_sizes(model, pp, layout, chunks)
    if sizes is None:
        d, e = stage_layers(model, pp, layout, chunks)[stage]
        return ((d + e) / chunks,) * chunks
    sized = [float(n) for n in sizes]
    sized[-1] += model.mtp_layers  # on the last chunk, as stage_layers counts them on the last stage
    return tuple(sized[stage::pp])


def plan_stage_layers(model: ModelSpec, plan: Plan) -> list[tuple[int, int]]:
    """stage_layers for ``plan``: its stages, layout and round-robin chunks."""
    return stage_layers(model, plan.pp, plan.layout, round_robin_chunks(plan.schedule, plan.vpp))
