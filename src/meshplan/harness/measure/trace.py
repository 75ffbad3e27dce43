"""Exposed communication time from a ``torch.profiler`` Chrome trace (pure Python).

Exposed time of a collective type = the length of the union of its communication intervals minus
the part that overlaps compute: |C_op \\ K| where C_op is the union of the intervals of that type and
K the union of compute intervals.

- GPU (NCCL): communication intervals are the kernels whose name contains ``nccl``, typed by name
  (``AllGather``, ``ReduceScatter``, ``AllReduce``, ``SendRecv``; NCCL runs all-to-all as grouped
  send/recv kernels, so those count under ``send_recv``); compute is every other kernel.
- CPU (gloo): gloo runs each collective on its own threads, annotated ``gloo:<op>``; gloo implements
  reduce-scatter with an all-reduce, so each interval takes its type from the c10d call that launched
  it (the latest ``c10d::``/``_c10d_functional::`` op started before it). Compute is the leaf
  operators (those enclosing no other operator) on the training thread, the thread of the
  ``meshplan.step`` annotation. Python overhead between operators counts as idle, so on a CPU exposed
  time is an upper bound.

Chrome trace times are microseconds; results are seconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

STEP_ANNOTATION = "meshplan.step"

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same points."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in union(intervals))


def overlap(a: list[Interval], b: list[Interval]) -> float:
    """Length of the intersection of two unions (each sorted and disjoint)."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def collective_of(name: str) -> str | None:
    """The collective type a c10d op, gloo annotation or NCCL kernel name stands for, or None."""
    n = name.lower().replace("_", "")
    for key, op in (("allgather", "all_gather"), ("reducescatter", "reduce_scatter"), ("allreduce", "all_reduce"),
                    ("alltoall", "all_to_all"), ("sendrecv", "send_recv"), ("send", "send_recv"),
                    ("recv", "send_recv"), ("broadcast", "broadcast")):
        if key in n:
            return op
    return None


def _is_launch(name: str) -> bool:
    return name.startswith(("c10d::", "_c10d_functional::")) and "wait" not in name and "barrier" not in name


def _leaves(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events of one thread that enclose no other event of that thread."""
    evs = sorted(events, key=lambda e: (e["ts"], -e["dur"]))
    leaves = []
    for i, e in enumerate(evs):
        nxt = evs[i + 1] if i + 1 < len(evs) else None
        if nxt is None or nxt["ts"] >= e["ts"] + e["dur"]:
            leaves.append(e)
    return leaves


def comm_intervals(trace: dict[str, Any]) -> tuple[dict[str, list[Interval]], list[Interval]]:
    """(communication intervals by collective type, compute intervals) of a trace [us]."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and "ts" in e]
    comm: dict[str, list[Interval]] = {}
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if any("nccl" in e["name"].lower() for e in kernels):
        compute = []
        for e in kernels:
            iv = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
            if "nccl" in e["name"].lower():
                comm.setdefault(collective_of(e["name"]) or "other", []).append(iv)
            else:
                compute.append(iv)
        return comm, compute
    steps = [e for e in events if e["name"] == STEP_ANNOTATION]
    cpu_ops = [e for e in events if e.get("cat") == "cpu_op"]
    if steps:
        main = (steps[0].get("pid"), steps[0].get("tid"))
    else:
        counts: dict[tuple, int] = {}
        for e in cpu_ops:
            counts[(e.get("pid"), e.get("tid"))] = counts.get((e.get("pid"), e.get("tid")), 0) + 1
        main = max(counts, key=counts.get) if counts else (None, None)
    launches = sorted((float(e["ts"]), op) for e in cpu_ops
                      if _is_launch(e["name"]) and (op := collective_of(e["name"].split("::", 1)[1])) is not None)
    on_main = [e for e in cpu_ops if (e.get("pid"), e.get("tid")) == main]
    compute = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in _leaves(on_main)
               if not _is_launch(e["name"]) and "record_param_comms" not in e["name"]]
    for e in events:
        if not e["name"].startswith("gloo:") or (e.get("pid"), e.get("tid")) == main:
            continue
        start = float(e["ts"])
        kind = None
        for ts, op in launches:
            if ts > start:
                break
            kind = op
        comm.setdefault(kind or collective_of(e["name"]) or "other", []).append((start, start + float(e["dur"])))
    return comm, compute


def exposed_comm_s(trace: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """(exposed seconds by collective type, total communication seconds by type) of one trace."""
    comm, compute = comm_intervals(trace)
    k = union(compute)
    exposed, total = {}, {}
    for op, ivs in sorted(comm.items()):
        u = union(ivs)
        busy = sum(b - a for a, b in u)
        total[op] = busy / 1e6
        exposed[op] = (busy - overlap(u, k)) / 1e6
    return exposed, total


KERNEL_KINDS = ("gemm", "attention", "optimizer", "communication", "other")
"""What ``kernel_kind`` sorts GPU kernels into."""


def kernel_kind(name: str) -> str:
    """The kind of GPU work a kernel name stands for, by the name patterns of cuBLAS/CUTLASS GEMMs
    (``gemm``, ``nvjet``, ``cutlass``, ``xmma``, and cuBLASLt's split-K reduction), fused
    attention (``flash``, ``fmha``, cuDNN's ``sdpa`` kernels and the ``cudnn::fusion`` helpers of its
    backward), optimizers (``adam``, ``sgd``, PyTorch's ``FusedOptimizer``/``FusedAdam`` functors) and
    NCCL; everything else (elementwise, norms, copies, softmax, reductions) is 'other'. PyTorch's plain
    foreach kernels (``multi_tensor_apply_kernel`` with a ``CopyFunctor``: FSDP2's all-gather copy-in)
    are copies, not optimizer work."""
    n = name.lower()
    if "nccl" in n:
        return "communication"
    if any(k in n for k in ("flash", "fmha", "attention", "sdpa", "cudnn::fusion")):
        return "attention"
    if any(k in n for k in ("gemm", "nvjet", "cutlass", "xmma", "splitkreduce")):
        return "gemm"
    if any(k in n for k in ("adam", "sgd", "fusedoptimizer")):
        return "optimizer"
    return "other"


def kernel_time_s(trace: dict[str, Any]) -> dict[str, float] | None:
    """Summed GPU kernel time by kind [s], and 'busy' (the union of all kernel intervals); None for a
    trace without GPU kernels (a CPU run)."""
    kernels = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") == "kernel"
               and "dur" in e and "ts" in e]
    if not kernels:
        return None
    out = dict.fromkeys(KERNEL_KINDS, 0.0)
    for e in kernels:
        out[kernel_kind(e["name"])] += float(e["dur"]) / 1e6
    out["busy"] = length((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in kernels) / 1e6
    return out
