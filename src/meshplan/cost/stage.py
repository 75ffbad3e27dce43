"""One pipeline stage of a plan, as every part of its evaluation sees it: which layers and parameters it
holds (its FSDP units), which of its layers are recomputed, and which stages bound the step and the memory
(the first, the last and the heaviest middle ones), so that only those are evaluated."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from meshplan.cost.comm import MOE_BLOCK, Unit
from meshplan.cost.mesh import Group
from meshplan.cost.params import ParamCounts
from meshplan.cost.pipeline import head_stage, stage_chunk_layers
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan


@dataclass(frozen=True, slots=True)
class StageCtx:
    """What every part of one stage's evaluation shares."""

    model: ModelSpec
    counts: ParamCounts
    cluster: ClusterSpec
    job: JobSpec
    plan: Plan
    groups: dict[str, Group]
    s: int
    n_dense: int
    n_moe: int
    m: int
    units: tuple[Unit, ...]

    @property
    def tokens(self) -> float:
        return (self.plan.mbs or 1) * self.job.seq_len / self.plan.cp

    @property
    def recompute(self) -> str:
        return self.plan.recompute_key

    @property
    def last(self) -> bool:
        """Whether this stage holds the LM head and the loss (pipeline.head_stage)."""
        return self.s == head_stage(self.plan.schedule, self.plan.pp)

    @property
    def recomputed(self) -> tuple[int, int]:
        """(dense, MoE) layers of this stage whose forward is recomputed (the first ones: dense first)."""
        return recomputed_layers(self.plan.recompute, self.plan.recompute_layers, self.n_dense, self.n_moe)

    def params(self, group: str) -> float:
        return sum(u.n_params * u.count for u in self.units if u.group == group)


def recomputed_layers(recompute: str | None, recompute_layers: int | None, n_dense: int, n_moe: int
                      ) -> tuple[int, int]:
    """(dense, MoE) layers of a stage with ``n_dense`` then ``n_moe`` layers that recompute='full' re-runs:
    all, or the first ``recompute_layers`` (Megatron's block method); none for other modes."""
    if recompute != "full":
        return 0, 0
    n = n_dense + n_moe if recompute_layers is None else min(recompute_layers, n_dense + n_moe)
    return min(n, n_dense), n - min(n, n_dense)


def local_units(model: ModelSpec, counts: ParamCounts, plan: Plan, s: int, n_dense: int, n_moe: int,
                tied_copy: bool) -> tuple[Unit, ...]:
    """FSDP units of stage ``s`` with their parameters on one rank (matrices split by TP, experts by EP)."""
    mtp = (model.mtp_layers, model.hidden) if model.mtp_layers else (0, 0)
    return _units(counts, plan.tp, plan.ep, plan.expert_tp, s, head_stage(plan.schedule, plan.pp), n_dense, n_moe,
                  tied_copy, *mtp)


DENSE_BLOCK = "block"
"""The name of a dense layer's unit (``_units``); an MoE layer's are its non-expert part and its experts."""


@functools.lru_cache(maxsize=8192)
def _units(counts: ParamCounts, t: int, ep: int, etp: int, s: int, head: int, n_dense: int, n_moe: int,
           tied_copy: bool, mtp: int = 0, hidden: int = 0) -> tuple[Unit, ...]:
    """``local_units``; ``head``: the stage holding the LM head (pipeline.head_stage). ``mtp`` MTP depths
    (their layers counted in ``n_dense`` / ``n_moe``) add to the head's stage its 2D -> D projections and,
    where that is not the embedding's stage, a copy of the embedding, which the MTP module looks the shifted
    tokens up in (Megatron-core keeps it on the last stage as it does a tied one)."""
    attention = counts.attention_per_tp_rank(t)
    dense = attention + counts.dense_mlp_per_layer / t + counts.norms_per_layer
    moe = attention + counts.shared_experts_per_moe_layer / t + counts.norms_per_layer + counts.router_per_moe_layer
    experts = counts.routed_experts_per_moe_layer / ep / etp
    root = 0.0
    if s == 0:
        root += counts.embedding / t
    if s == head:
        weights = counts.lm_head if counts.lm_head else (counts.lm_head_matmul if tied_copy else 0)
        root += weights / t + counts.final_norm
        if mtp:
            root += mtp * 2 * hidden * hidden / t + (counts.embedding / t if s != 0 else 0.0)
    units = [Unit(DENSE_BLOCK, dense, n_dense, "dp_shard"), Unit(MOE_BLOCK, moe, n_moe, "dp_shard"),
             Unit("experts", experts, n_moe, "edp"), Unit("root (embedding / LM head)", root, 1, "dp_shard",
                                                           root=True)]
    return tuple(u for u in units if u.count and u.n_params)


def chunk_layers(model: ModelSpec, plan: Plan, stage: int) -> tuple[float, ...]:
    """The layers of each model chunk of an interleaved stage, in order (in_flight_microbatches weighs
    the chunks its warm-up runs by them); none for other schedules."""
    if plan.schedule != "interleaved" or plan.pp == 1:
        return ()
    return stage_chunk_layers(model, plan.pp, plan.layout, plan.vpp, stage)


def bounding_stages(layout: list[tuple[int, int]], head: int | None = None) -> list[int]:
    """The stages that bound the step and the memory: the first (embedding, and the most micro-batches in
    flight), the last (LM head, MTP) and the earliest middle stage of each (dense, MoE) layer count that no
    earlier stage holds at least as many of both: a layout or MTP's split can give a middle stage more
    layers, and an MoE model's leading dense layers give its first stage lighter ones (DeepSeek-V3 at
    PP=16: 3 dense and 1 MoE layer first, 4 MoE layers in the middle). Where the first stage holds the LM
    head too (``head`` 0: ZB-V), it stands for no middle stage: the simulator times the middle ranks by
    the middle stage it is given."""
    pp = len(layout)
    middle: dict[tuple[int, int], int] = {}
    for s in range(1, pp - 1):
        middle.setdefault(layout[s], s)
    first = [(layout[0], 0)] if head != 0 else []

    def covered(x: tuple[int, int]) -> bool:  # by an earlier stage (more micro-batches in flight) of as many
        return any(y[0] >= x[0] and y[1] >= x[1] and s < middle[x]
                   for y, s in [*first, *middle.items()])

    return sorted({0, *(s for x, s in middle.items() if not covered(x)), pp - 1})
