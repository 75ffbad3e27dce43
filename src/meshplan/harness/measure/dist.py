"""The process group of a measurement run and the mesh-axis groups of a plan.

A rank is on node ``rank // LOCAL_WORLD_SIZE`` (torchrun numbers ranks node by node, every node
running the same ``--nproc-per-node``). A group whose ranks all sit on one node is ``intra_node``,
otherwise ``inter_node``. Mesh axes follow the planner's (and torchtitan's ``ParallelDims``) order,
outermost first: pp, dp_replicate, dp_shard, cp, tp, so inner axes take consecutive ranks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from meshplan.specs import Plan

MESH_AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


class NotUnderTorchrun(RuntimeError):
    """RANK / WORLD_SIZE are not set."""


@dataclass(frozen=True, slots=True)
class RunContext:
    """Who this process is in the run."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    device: torch.device
    device_name: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def n_nodes(self) -> int:
        return max(1, self.world_size // self.local_world_size)


@dataclass(frozen=True, slots=True)
class AxisGroup:
    """The group this rank belongs to on one mesh axis."""

    axis: str
    group: dist.ProcessGroup
    ranks: tuple[int, ...]
    link: str
    """'intra_node' or 'inter_node'."""
    ranks_per_node: int

    @property
    def size(self) -> int:
        return len(self.ranks)


def link_of(ranks: tuple[int, ...], local_world_size: int) -> tuple[str, int]:
    """('intra_node' | 'inter_node', ranks per node) for a group of global ranks."""
    nodes = {r // local_world_size for r in ranks}
    return ("intra_node" if len(nodes) == 1 else "inter_node"), max(1, len(ranks) // len(nodes))


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def init(backend: str | None, *, timeout_s: float) -> RunContext:
    """Join the run torchrun started (env:// rendezvous) with a collective timeout of ``timeout_s``."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise NotUnderTorchrun("RANK and WORLD_SIZE are not set: run under torchrun, or pass --nproc N to "
                               "start N local processes")
    backend = backend or default_backend()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ["WORLD_SIZE"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise RuntimeError("--backend nccl needs CUDA GPUs; use --backend gloo on a CPU machine")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        name = torch.cuda.get_device_name(device)
    else:
        device = torch.device("cpu")
        name = "cpu"
    kwargs = {"device_id": device} if backend == "nccl" else {}
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), **kwargs)
    return RunContext(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank,
                      local_world_size=local_world, backend=backend, device=device, device_name=name)


def build_mesh(ctx: RunContext, plan: Plan):
    """The DeviceMesh of ``plan`` over this run's ranks (axes of degree > 1 only)."""
    from torch.distributed.device_mesh import init_device_mesh

    if plan.world_size != ctx.world_size:
        raise ValueError(f"plan {plan.to_string()} needs {plan.world_size} ranks "
                         f"(pp·dp_replicate·dp_shard·cp·tp); this run has {ctx.world_size}")
    axes = [(a, getattr(plan, a)) for a in MESH_AXES if getattr(plan, a) > 1]
    if not axes:
        return None
    return init_device_mesh(ctx.device.type, tuple(d for _, d in axes), mesh_dim_names=tuple(a for a, _ in axes))


def axis_groups(ctx: RunContext, plan: Plan | None) -> list[AxisGroup]:
    """This rank's group on every mesh axis of ``plan`` of degree > 1.

    Without a plan: the world, and on several nodes also 'node' (the ranks of this node) and
    'cross_node' (this local rank on every node).
    """
    out: list[AxisGroup] = []

    def add(axis: str, group: dist.ProcessGroup) -> None:
        ranks = tuple(dist.get_process_group_ranks(group))
        link, rpn = link_of(ranks, ctx.local_world_size)
        out.append(AxisGroup(axis=axis, group=group, ranks=ranks, link=link, ranks_per_node=rpn))

    if plan is not None:
        mesh = build_mesh(ctx, plan)
        if mesh is not None:
            for name in mesh.mesh_dim_names:
                add(name, mesh[name].get_group())
        return out
    if ctx.world_size > 1:
        add("world", dist.group.WORLD)
    if ctx.n_nodes > 1 and ctx.local_world_size > 1:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(ctx.device.type, (ctx.n_nodes, ctx.local_world_size),
                                mesh_dim_names=("cross_node", "node"))
        add("node", mesh["node"].get_group())
        add("cross_node", mesh["cross_node"].get_group())
    return out
