"""Accelerator, node links and cluster specs. All rates in bytes/s or FLOP/s, per direction, per GPU."""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.errors import SpecError
from meshplan.specs._validate import (
    MAX_BYTES,
    MAX_BYTES_PER_S,
    MAX_FLOP_PER_S,
    efficiency,
    instance,
    non_negative_number,
    one_of,
    positive_int,
    positive_number,
    text,
)
from meshplan.units import MAX_LINK_BYTES_PER_S, MIN_LINK_BYTES_PER_S

MIN_FLOP_PER_S = 1e9
"""The slowest accelerator a spec may describe (1 GFLOP/s; a GPU of the last decade does 1e13 and more):
below it, and below MIN_LINK_BYTES_PER_S for a link or memory, every time would be meaningless."""
MIN_HBM_BYTES = float(2**20)
"""The smallest memory an accelerator spec may have (1 MiB)."""
MAX_LATENCY_S = 1.0
"""The longest fixed latency a link spec may give (real ones are microseconds)."""

MAX_GPUS = 2**21
"""The largest cluster meshplan plans for (2,097,152 GPUs, some ten times the largest announced training
clusters): the search enumerates the divisors of the GPU count, and a runaway count would only hang it."""


def _link_rate(field: str, value: object) -> None:
    """A link's rate per GPU per direction: 1 MB/s to 100 TB/s (what --inter-node-bandwidth takes)."""
    positive_number(field, value, least=MIN_LINK_BYTES_PER_S, most=MAX_LINK_BYTES_PER_S)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertGemmPoint:
    """One measured point of the expert-GEMM curve: a rank's expert GEMMs of one shape, launched one way,
    against the device's best dense GEMM (``meshplan measure moe``; catalog ``[[expert_gemm]]``)."""

    kernel: str
    """'per_expert' (one GEMM per expert, as Transformer Engine's GroupedLinear runs them) or 'grouped' (one
    grouped kernel); meshplan.cost.grouped_gemm."""
    dtype: str
    """'bf16' or 'fp8'."""
    n: int
    """Output columns of each expert's GEMM."""
    k: int
    """Reduction dimension."""
    tokens_per_expert: float
    """m, the rows of each expert's GEMM [tokens]."""
    relative_efficiency: float
    """Achieved FLOP/s over the device's best dense GEMM's (the efficiency curve's asymptote) [0-2]."""

    def __post_init__(self) -> None:
        one_of("expert_gemm.kernel", self.kernel, ("per_expert", "grouped"))
        one_of("expert_gemm.dtype", self.dtype, ("bf16", "fp8"))
        positive_int("expert_gemm.n", self.n)
        positive_int("expert_gemm.k", self.k)
        positive_number("expert_gemm.tokens_per_expert", self.tokens_per_expert)
        positive_number("expert_gemm.relative_efficiency", self.relative_efficiency, most=2.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceleratorSpec:
    """One GPU: dense peaks (no sparsity), HBM, and the best measured GEMM efficiency."""

    name: str
    description: str
    bf16_flop_per_s: float
    """Dense BF16 tensor-core peak."""
    fp8_flop_per_s: float | None
    """Dense FP8 peak, None where the part has no FP8."""
    hbm_capacity_bytes: float
    hbm_bytes_per_s: float
    gemm_efficiency: float
    """Best-shape BF16 matmul throughput over peak (maximum achievable matmul FLOPS)."""
    expert_gemm_curve: tuple[ExpertGemmPoint, ...] = ()
    """Measured expert-GEMM throughputs (a ``meshplan measure moe`` profile, or the catalog's with their
    source): where the curve holds points of a plan's expert shape and launch, they replace the analytic
    shape curve for it (meshplan.cost.grouped_gemm)."""
    moe_pass_bytes_per_s: float | None = None
    """Measured rate of the MoE permutation passes (``meshplan measure moe``), in place of the memory-bound
    rate (HBM bandwidth times the calibrated memory efficiency); None: not measured."""
    sources: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        text("accelerator.name", self.name)
        w = f"accelerator[{self.name[:40]}]"
        text(f"{w}.description", self.description)
        positive_number(f"{w}.bf16_flop_per_s", self.bf16_flop_per_s, least=MIN_FLOP_PER_S, most=MAX_FLOP_PER_S)
        if self.fp8_flop_per_s is not None:
            positive_number(f"{w}.fp8_flop_per_s", self.fp8_flop_per_s, least=MIN_FLOP_PER_S, most=MAX_FLOP_PER_S)
        positive_number(f"{w}.hbm_capacity_bytes", self.hbm_capacity_bytes, least=MIN_HBM_BYTES, most=MAX_BYTES)
        positive_number(f"{w}.hbm_bytes_per_s", self.hbm_bytes_per_s, least=MIN_LINK_BYTES_PER_S,
                        most=MAX_BYTES_PER_S)
        efficiency(f"{w}.gemm_efficiency", self.gemm_efficiency)
        instance(f"{w}.sources", self.sources, dict, "a table of sources")
        if self.moe_pass_bytes_per_s is not None:
            positive_number(f"{w}.moe_pass_bytes_per_s", self.moe_pass_bytes_per_s, least=MIN_LINK_BYTES_PER_S,
                            most=MAX_BYTES_PER_S)

    def expert_gemm_points(self, kernel: str, dtype: str, n: int, k: int) -> tuple[tuple[float, float], ...]:
        """(tokens per expert, relative efficiency) of the measured points of one expert shape and launch."""
        return tuple((p.tokens_per_expert, p.relative_efficiency) for p in self.expert_gemm_curve
                     if (p.kernel, p.dtype, p.n, p.k) == (kernel, dtype, n, k))

    def peak_flop_per_s(self, precision: str) -> float:
        """Dense peak for the compute precision ('bf16' or 'fp8')."""
        if precision == "fp8":
            if self.fp8_flop_per_s is None:
                raise SpecError("job.precision", f"{self.name} has no FP8 tensor cores; use bf16")
            return self.fp8_flop_per_s
        return self.bf16_flop_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class IntraNodeLink:
    """The scale-up fabric inside a node (NVLink through NVSwitch, or AMD xGMI point-to-point)."""

    kind: str
    """'nvswitch' (any GPU reaches any other at full rate) or 'xgmi' (point-to-point mesh)."""
    link_bytes_per_s: float
    """Spec bandwidth per GPU per direction (for 'xgmi': per peer link)."""
    ring_busbw_bytes_per_s: float
    """Measured large-message ring bus bandwidth (nccl-tests busbw) for all the node's GPUs."""
    nvls_busbw_bytes_per_s: float | None = None
    """Measured NVLink-SHARP all-reduce busbw; None where NVLS does not exist."""
    nvls_min_gpus: int = 5
    """Smallest group NCCL runs NVLS on (formulas.md §1.4)."""
    p2p_bytes_per_s: float | None = None
    """Measured unidirectional point-to-point copy bandwidth (send/recv); None: ``link_bytes_per_s``."""
    latency_s: float = 20e-6
    """Fixed latency of one collective call inside a node (launch and setup)."""
    hop_latency_s: float = 3.4e-6
    """Latency of one ring step over NVLink (NCCL tuning.cc hwLat NVLink, Ring, Simple: 3.4 us)."""
    half_size_bytes: float = 8 * 2**20
    """Message size at which a collective reaches half of its bus bandwidth."""
    p2p_half_size_bytes: float = 2 * 2**20
    """Message size at which one point-to-point copy (send/recv) reaches half of ``p2p_bytes_per_s``
    (heuristic, not measured here: the point-to-point pipeline measured across nodes,
    InterNodeLink.p2p_half_size_bytes; a send/recv has no ring to fill on NVLink or xGMI either)."""

    def __post_init__(self) -> None:
        one_of("cluster.intra.kind", self.kind, ("nvswitch", "xgmi"))
        for name in ("link_bytes_per_s", "ring_busbw_bytes_per_s", "nvls_busbw_bytes_per_s", "p2p_bytes_per_s"):
            if name.startswith(("link", "ring")) or getattr(self, name) is not None:
                _link_rate(f"cluster.intra.{name}", getattr(self, name))
        if self.p2p_bytes_per_s is None:
            object.__setattr__(self, "p2p_bytes_per_s", self.link_bytes_per_s)
        positive_int("cluster.intra.nvls_min_gpus", self.nvls_min_gpus, MAX_GPUS)
        for name in ("latency_s", "hop_latency_s"):
            positive_number(f"cluster.intra.{name}", getattr(self, name), most=MAX_LATENCY_S)
        for name in ("half_size_bytes", "p2p_half_size_bytes"):
            non_negative_number(f"cluster.intra.{name}", getattr(self, name), most=MAX_BYTES)


@dataclass(frozen=True, slots=True, kw_only=True)
class InterNodeLink:
    """The scale-out network: one NIC per GPU (InfiniBand, RoCE, EFA)."""

    nic_bytes_per_s: float
    """Spec NIC bandwidth per GPU per direction (400 Gb/s NDR = 50e9)."""
    efficiency: float = 0.92
    """Fraction of the NIC rate NCCL reaches on large messages."""
    latency_s: float = 40e-6
    """Fixed latency of one collective call that crosses nodes."""
    hop_latency_s: float = 14e-6
    """Latency of one ring step over the network (NCCL tuning.cc hwLat NET, Ring, Simple: 14 us)."""
    half_size_bytes: float = 64 * 2**20
    """Message size at which a collective across nodes reaches half of its bus bandwidth (heuristic:
    between 8-GPU NVLink rings, at half their 1 GiB busbw near 16 MiB, and ml-engineering's 4-node B200
    all-reduce, at half only near 512 MiB; formulas.md §1.6)."""
    p2p_half_size_bytes: float = 2 * 2**20
    """Message size at which one point-to-point transfer across nodes (send/recv between pipeline stages,
    ring context parallelism's KV passes) reaches half of the NIC rate (heuristic): no ring of many steps
    to fill, only NCCL's chunked pipeline over one connection (its log in nccl#1357: "P2P Chunksize set to
    131072", a few such chunks in flight per channel). The nearest public measurement, nccl-tests#232: two
    H100 nodes exchanging through one GPU each (a two-rank Tree all-reduce over 4 RoCE NICs, which sends
    and receives the message once per GPU, as a send/recv does): 18.5-22.5 GB/s at 2 MiB, 27 at 4 MiB, 36
    at 8 MiB, 40 at 16 MiB, 41 at 32 MiB, latency included. B / (B + 2 MiB) of the NIC rate, with the
    call latency added, is within 25 % of that and on the slow side at small sizes."""

    def __post_init__(self) -> None:
        _link_rate("cluster.inter.nic_bytes_per_s", self.nic_bytes_per_s)
        efficiency("cluster.inter.efficiency", self.efficiency)
        for name in ("latency_s", "hop_latency_s"):
            positive_number(f"cluster.inter.{name}", getattr(self, name), most=MAX_LATENCY_S)
        for name in ("half_size_bytes", "p2p_half_size_bytes"):
            non_negative_number(f"cluster.inter.{name}", getattr(self, name), most=MAX_BYTES)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """n_nodes identical nodes of gpus_per_node accelerators."""

    name: str
    accelerator: AcceleratorSpec
    n_nodes: int
    gpus_per_node: int
    intra: IntraNodeLink
    inter: InterNodeLink
    host_bytes_per_s: float | None = None
    """Copy bandwidth between a GPU's HBM and host memory, per GPU per direction, with every GPU of the
    node copying at once (PCIe to the CPU, or NVLink-C2C to a Grace CPU); None where the node spec does
    not say. What activation offloading (Plan.offload_layers) moves its tensors at."""
    host_memory_bytes: float | None = None
    """Host memory per GPU (the node's CPU memory over its GPUs) that offloaded activations may take; None
    where the node spec does not say (then not checked)."""
    storage_bytes_per_s: float | None = None
    """Checkpoint write bandwidth to shared storage per GPU (its share of what the storage system sustains
    for the job), with every GPU writing at once; None where the cluster spec does not say (then
    meshplan.economics takes its stated default). What the checkpoint write time of goodput is timed at."""
    sources: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        text("cluster.name", self.name)
        instance("cluster.accelerator", self.accelerator, AcceleratorSpec, "an AcceleratorSpec")
        instance("cluster.intra", self.intra, IntraNodeLink, "an IntraNodeLink")
        instance("cluster.inter", self.inter, InterNodeLink, "an InterNodeLink")
        instance("cluster.sources", self.sources, dict, "a table of sources")
        positive_int("cluster.nodes", self.n_nodes)
        positive_int("cluster.gpus_per_node", self.gpus_per_node)
        if self.n_nodes * self.gpus_per_node > MAX_GPUS:
            raise SpecError("cluster.nodes", f"at most {MAX_GPUS:,} GPUs in all; got {self.n_nodes:,} nodes x "
                                             f"{self.gpus_per_node} GPUs")
        if self.host_bytes_per_s is not None:
            _link_rate("cluster.node.host_gb_per_s", self.host_bytes_per_s)
        if self.host_memory_bytes is not None:
            positive_number("cluster.node.host_memory_gib", self.host_memory_bytes, most=MAX_BYTES)
        if self.storage_bytes_per_s is not None:
            _link_rate("cluster.node.storage_gb_per_s", self.storage_bytes_per_s)

    @property
    def n_gpus(self) -> int:
        return self.n_nodes * self.gpus_per_node
