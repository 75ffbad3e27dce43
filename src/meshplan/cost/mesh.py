"""Where each mesh axis's process groups sit on the cluster, and so which link they run on.

Ranks are laid out innermost axis first (tp, cp, dp_shard, dp_replicate, pp; torchtitan's order), so a
group of axis ``a`` has ranks ``base + i·stride(a)`` with stride = product of the inner degrees.
A group is intra-node when all its ranks fit in one node.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from meshplan.specs import ClusterSpec, Plan

INTRA_NODE = "intra_node"
INTER_NODE = "inter_node"


@dataclass(frozen=True, slots=True)
class Group:
    """One process group of an axis: its size and how it spreads over nodes."""

    axis: str
    size: int
    ranks_per_node: int
    """Ranks of the group in each node it touches (r)."""
    n_nodes: int = 0
    """Nodes the group spans (k = size / r); derived."""
    link: str = ""
    """'intra_node' or 'inter_node'; derived."""

    def __post_init__(self) -> None:
        k = max(1, self.size // self.ranks_per_node)
        object.__setattr__(self, "n_nodes", k)
        object.__setattr__(self, "link", INTRA_NODE if k == 1 else INTER_NODE)


def group(axis: str, size: int, stride: int, gpus_per_node: int) -> Group:
    """Group of ``size`` ranks spaced ``stride`` apart on nodes of ``gpus_per_node`` GPUs."""
    if size <= 1:
        return Group(axis, 1, 1)
    if stride * size <= gpus_per_node:
        return Group(axis, size, size)
    per_node = max(1, gpus_per_node // stride) if stride < gpus_per_node else 1
    return Group(axis, size, min(size, per_node))


def axis_groups(plan: Plan, cluster: ClusterSpec) -> dict[str, Group]:
    """See _axis_groups (memoised on the degrees: a search asks for the same mesh many times)."""
    return _axis_groups(plan.tp, plan.cp, plan.dp_shard, plan.dp_replicate, plan.pp, plan.ep, plan.expert_tp,
                        cluster.gpus_per_node)


@functools.lru_cache(maxsize=4096)
def _axis_groups(tp: int, cp: int, ds: int, dr: int, pp: int, ep: int, etp: int, g: int) -> dict[str, Group]:
    """Groups of every axis, plus the combined ones the implementations use:

    - 'dp_shard' is the FSDP / ZeRO / distributed-optimizer group: dp_shard·cp ranks (torchtitan's
      dp_shard_cp mesh; Megatron shards the optimizer over DP·CP);
    - 'ep' is ep ranks spaced etp apart (Megatron's expert mesh puts expert-TP innermost; its expert-TP
      group is then the tp group); 'edp' is expert data parallel, the rest of tp·cp·dp_shard.
    """
    out = {
        "tp": group("tp", tp, 1, g),
        "cp": group("cp", cp, tp, g),
        "dp_shard": group("dp_shard", ds * cp, tp, g),
        "dp_replicate": group("dp_replicate", dr, tp * cp * ds, g),
        "pp": group("pp", pp, tp * cp * ds * dr, g),
        "ep": group("ep", ep, etp, g),
    }
    expert_world = tp * cp * ds
    if (ep > 1 or etp < tp) and expert_world % (ep * etp) == 0:
        out["edp"] = group("edp", expert_world // (ep * etp), ep * etp, g)
    else:  # experts split like the dense layers: their data-parallel group is the dense one
        out["edp"] = out["dp_shard"]
    return out


def _pp_stride(plan: Plan) -> int:
    """Ranks between pipeline stages: one stage's ranks (pp is outermost, as in _axis_groups)."""
    return plan.world_size // plan.pp


def _boundary_intra(stride: int, a: int, b: int, gpus_per_node: int) -> bool:
    """Whether pipeline stages ``a`` and ``b`` sit on one node (one NVLink domain). Stage s holds ranks
    s·stride .. s·stride + stride - 1; where nodes hold whole stages (gpus_per_node a multiple of the
    stride) the two share a node when their first ranks do; otherwise the boundary is taken to cross."""
    return gpus_per_node % stride == 0 and (a * stride) // gpus_per_node == (b * stride) // gpus_per_node


def stage_links_intra(plan: Plan, stage: int, gpus_per_node: int) -> bool:
    """Whether every pipeline boundary of ``stage`` joins ranks on one node: those with s - 1 and s + 1 and,
    under the interleaved schedule, the one from the last stage back to the first (the next model chunk;
    ZB-V's second chunk turns at the last stage instead)."""
    return _stage_links_intra(_pp_stride(plan), plan.pp, stage, plan.schedule == "interleaved", gpus_per_node)


@functools.lru_cache(maxsize=4096)
def _stage_links_intra(stride: int, pp: int, stage: int, wrap: bool, gpus_per_node: int) -> bool:
    if pp <= 1:
        return False
    neighbours = [t for t in (stage - 1, stage + 1) if 0 <= t < pp or wrap]
    return all(_boundary_intra(stride, stage, t % pp, gpus_per_node) for t in neighbours)


def intra_boundaries(plan: Plan, gpus_per_node: int) -> int:
    """How many of the pipeline's pp - 1 stage boundaries sit on one node."""
    return _intra_boundaries(_pp_stride(plan), plan.pp, gpus_per_node)


@functools.lru_cache(maxsize=4096)
def _intra_boundaries(stride: int, pp: int, gpus_per_node: int) -> int:
    return sum(_boundary_intra(stride, s, s + 1, gpus_per_node) for s in range(pp - 1))
