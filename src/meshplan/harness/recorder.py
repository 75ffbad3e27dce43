"""Record every collective a PyTorch program issues, at the dispatcher, with its process group and bytes.

A :class:`~torch.utils._python_dispatch.TorchDispatchMode` sees both families of collective ops that
PyTorch's parallelisms issue:

- the c10d ops behind ``torch.distributed.all_gather_into_tensor`` and friends, which FSDP2 calls
  (``c10d::_allgather_base_``, ``c10d::_reduce_scatter_base_``, ``c10d::allreduce_``, ...), whose process
  group arrives as a boxed ``ProcessGroup`` script object;
- the functional collectives DTensor redistributions use (``_c10d_functional::all_gather_into_tensor``,
  ``reduce_scatter_tensor``, ``all_reduce``, ``all_to_all_single``), whose group arrives by name.

DTensor arguments are passed on (``NotImplemented``) so that the collectives DTensor issues inside its
own dispatch are seen too. Functional collectives run their process-group call in C++ without going back
through the dispatcher, so no collective is counted twice. Each record carries the bytes as nccl-tests
defines a message (the convention of :class:`meshplan.CommEntry`): the gathered output of an all-gather,
the unscattered input of a reduce-scatter, the buffer of an all-reduce, the input of an all-to-all,
the tensor of a send or receive.

Source: torch/distributed/_functional_collectives.py and torch/csrc/distributed/c10d/Ops.cpp (op
signatures), torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py (FSDP2's calls), torch 2.13.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE, ALL_TO_ALL, SEND_RECV, BROADCAST = (
    "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "send_recv", "broadcast")

# op name (without overload) -> (collective, which argument's bytes form the message)
# 'out': the first tensor argument; 'second': the second one (the input of an out-variant op);
# 'in_x_group': the first (input) tensor times the group size.
_C10D_OPS = {
    "_allgather_base_": (ALL_GATHER, "out"),
    "allgather_": (ALL_GATHER, "out"),
    "allgather_into_tensor_coalesced_": (ALL_GATHER, "out"),
    "_reduce_scatter_base_": (REDUCE_SCATTER, "second"),
    "reduce_scatter_": (REDUCE_SCATTER, "second"),
    "reduce_scatter_tensor_coalesced_": (REDUCE_SCATTER, "second"),
    "allreduce_": (ALL_REDUCE, "out"),
    "allreduce_coalesced_": (ALL_REDUCE, "out"),
    "alltoall_base_": (ALL_TO_ALL, "second"),
    "alltoall_": (ALL_TO_ALL, "second"),
    "send": (SEND_RECV, "out"),
    "recv_": (SEND_RECV, "out"),
    "broadcast_": (BROADCAST, "out"),
}
_FUNCOL_OPS = {
    "all_gather_into_tensor": (ALL_GATHER, "in_x_group"),
    "all_gather_into_tensor_out": (ALL_GATHER, "in_x_group"),
    "all_gather_into_tensor_coalesced": (ALL_GATHER, "in_x_group"),
    "reduce_scatter_tensor": (REDUCE_SCATTER, "out"),
    "reduce_scatter_tensor_coalesced": (REDUCE_SCATTER, "out"),
    "all_reduce": (ALL_REDUCE, "out"),
    "all_reduce_": (ALL_REDUCE, "out"),
    "all_reduce_coalesced": (ALL_REDUCE, "out"),
    "all_reduce_coalesced_": (ALL_REDUCE, "out"),
    "all_to_all_single": (ALL_TO_ALL, "out"),
    "broadcast": (BROADCAST, "out"),
    "broadcast_": (BROADCAST, "out"),
}


@dataclass(frozen=True, slots=True)
class CollectiveRecord:
    """One collective call as issued on this rank."""

    collective: str
    """'all_gather', 'reduce_scatter', 'all_reduce', 'all_to_all', 'send_recv' or 'broadcast'."""
    axis: str
    """Mesh axis of its process group (e.g. 'dp_shard', 'tp'); 'dp_replicate+dp_shard' for a flattened
    group; the group name when the group is not one of the mesh's."""
    message_bytes: int
    """nccl-tests message size of the call [bytes]."""
    group_size: int
    dtype: str
    op: str
    """The dispatcher op, e.g. 'c10d._allgather_base_' or '_c10d_functional.all_reduce'."""
    phase: str
    """What the caller labelled the code running at the time ('forward', 'backward', 'step', ...)."""


def _tensors(x: object) -> Iterable[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


def _nbytes(x: object) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(x))


def _dtype(x: object) -> str:
    for t in _tensors(x):
        return str(t.dtype).removeprefix("torch.")
    return "?"


@dataclass
class CollectiveRecorder(TorchDispatchMode):
    """Dispatch mode that appends a :class:`CollectiveRecord` for every collective op it sees.

    ``axis_of_group`` maps process-group names to mesh axis names (see :func:`axis_names_of_mesh`). Set
    ``phase`` while running to label records. Use as a context manager around forward, backward and step.
    """

    axis_of_group: dict[str, str] = field(default_factory=dict)
    records: list[CollectiveRecord] = field(default_factory=list)
    phase: str = ""

    def __post_init__(self) -> None:
        TorchDispatchMode.__init__(self)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        # Modes run before tensor subclasses. Returning NotImplemented for DTensor arguments lets DTensor
        # run first and desugar into the collectives of its implicit redistributions (loss parallel,
        # Partial gradients), which then come back here (the trick of torch's CommDebugMode,
        # torch/distributed/tensor/debug/_comm_mode.py).
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **(kwargs or {}))
        kwargs = kwargs or {}
        ns, name = func.namespace, func.__name__.split(".")[0]
        if ns == "c10d" and name in _C10D_OPS:
            self._record_c10d(func, name, args)
        elif ns == "_c10d_functional" and name in _FUNCOL_OPS:
            self._record_funcol(func, name, args, kwargs)
        return func(*args, **kwargs)

    def _add(self, collective: str, group_name: str, size: int, nbytes: int, dtype: str, op: str) -> None:
        axis = self.axis_of_group.get(group_name, f"group:{group_name}")
        self.records.append(CollectiveRecord(collective, axis, nbytes, size, dtype, op, self.phase))

    def _record_c10d(self, func, name: str, args: tuple) -> None:  # type: ignore[no-untyped-def]
        collective, which = _C10D_OPS[name]
        pg = None
        for a in args:
            if isinstance(a, torch.ScriptObject):
                try:
                    pg = dist.ProcessGroup.unbox(a)
                    break
                except RuntimeError:
                    continue
        group_name, size = (pg.group_name, pg.size()) if pg is not None else ("?", 0)
        tensor_args = [a for a in args if isinstance(a, (torch.Tensor, list, tuple))]
        buf = tensor_args[0] if which == "out" else tensor_args[1]
        self._add(collective, group_name, size, _nbytes(buf), _dtype(buf), f"c10d.{name}")

    def _record_funcol(self, func, name: str, args: tuple, kwargs: dict) -> None:  # type: ignore[no-untyped-def]
        collective, which = _FUNCOL_OPS[name]
        strings = [a for a in args if isinstance(a, str)]
        group_name = kwargs.get("group_name", strings[-1] if strings else "?")
        ints = [a for a in args[1:] if isinstance(a, int) and not isinstance(a, bool)]
        size = ints[0] if ints else 0
        if not size:
            try:
                size = dist.distributed_c10d._resolve_process_group(group_name).size()
            except (RuntimeError, ValueError, KeyError):
                size = 0
        nbytes = _nbytes(args[0]) * (size if which == "in_x_group" else 1)
        self._add(collective, group_name, size, nbytes, _dtype(args[0]), f"_c10d_functional.{name}")


def axis_names_of_mesh(mesh: object) -> dict[str, str]:
    """Map each process-group name of a DeviceMesh's axes to the axis name (the world group to 'world')."""
    out: dict[str, str] = {}
    names = getattr(mesh, "mesh_dim_names", None) or ()
    for axis in names:
        out[mesh[axis].get_group().group_name] = axis  # type: ignore[index]
    world = dist.distributed_c10d._get_default_group().group_name
    out.setdefault(world, "+".join(names) if len(names) == 1 else "world")
    return out
