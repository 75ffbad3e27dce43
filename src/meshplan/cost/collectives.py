"""Time of one collective on a process group: alpha-beta with nccl-tests bus bandwidth.

.. math:: t = \\alpha + \\frac{S · f(op, n)}{busbw · \\eta(S)},\\qquad \\eta(S) = \\frac{S}{S + S_{1/2}}

S is the payload as nccl-tests defines it (the full gathered / unscattered buffer for all-gather and
reduce-scatter, the buffer for all-reduce, the per-rank send buffer for all-to-all, the message for
send/recv); f is the bus-bandwidth factor: 2(n-1)/n for all-reduce, (n-1)/n for all-gather,
reduce-scatter and all-to-all, 1 for send/recv. busbw is the measured bus bandwidth of the link the
group runs on (catalog), which makes the formula reproduce nccl-tests by construction.

Link rules (formulas.md §1.4-1.6, §2.1):
- inside an NVSwitch node, ring busbw is the same for 2..8 GPUs (nccl#1455); NVLS (NVLink SHARP) raises
  it for all-reduce only, from ``nvls_min_gpus`` GPUs (nccl#1506);
- AMD xGMI is point-to-point: a ring of n GPUs in a node uses n-1 of the 7 peer links, so busbw scales
  with (n-1)/(g-1) of the 8-GPU figure (47.7 GB/s measured with 2 GPUs against 312.9 with 8);
- a ring that spans nodes with r ranks per node drives r NICs per node in parallel (NCCL channels):
  busbw = min(intra busbw, r · NIC · efficiency); its all-reduce may instead run hierarchically
  (reduce-scatter in the node, all-reduce of 1/r across nodes, all-gather in the node), whichever is
  faster, as NCCL's tuner would pick;
- all-to-all across nodes cannot aggregate NICs (sjeaugey, nccl-tests#267): the (n-r)/n of the buffer
  that leaves the node goes through each GPU's own NIC, in n - 1 point-to-point transfers of S/n bytes,
  each at its own size efficiency (``all_to_all_peer_efficiency``: the fan-out at large expert
  parallelism).

References: nccl_tests_perf, thakur2005, ml_engineering (see meshplan.references).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from meshplan.cost.mesh import Group
from meshplan.memo import cache_by_identity
from meshplan.specs import ClusterSpec, InterNodeLink, IntraNodeLink


class _Links(NamedTuple):
    """The parts of a ClusterSpec a collective's time depends on (hashable, for the cache)."""

    intra: IntraNodeLink
    inter: InterNodeLink
    gpus_per_node: int

ALL_GATHER = "all_gather"
REDUCE_SCATTER = "reduce_scatter"
ALL_REDUCE = "all_reduce"
ALL_TO_ALL = "all_to_all"
SEND_RECV = "send_recv"
COLLECTIVES = (ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE, ALL_TO_ALL, SEND_RECV)


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor f(op, n) [dimensionless]; also bytes each rank sends per payload byte."""
    if op == SEND_RECV:
        return 1.0
    if n <= 1:
        return 0.0
    if op == ALL_REDUCE:
        return 2.0 * (n - 1) / n
    return (n - 1) / n


def bytes_sent_per_rank(op: str, message_bytes: float, n: int) -> float:
    """Bytes one rank sends for one call with a ring (or pairwise) algorithm [bytes] (formulas.md §1.2)."""
    return message_bytes * busbw_factor(op, n)


def size_efficiency(message_bytes: float, half_size_bytes: float) -> float:
    """Fraction of the asymptotic bus bandwidth reached at this message size [0-1]."""
    return message_bytes / (message_bytes + half_size_bytes)


def intra_busbw(op: str, n_in_node: int, cluster: ClusterSpec | _Links) -> float:
    """Bus bandwidth of a collective among n GPUs of one node [bytes/s]."""
    link = cluster.intra
    if op == SEND_RECV:
        return link.p2p_bytes_per_s
    if link.kind == "xgmi":
        return link.ring_busbw_bytes_per_s * max(1, n_in_node - 1) / max(1, cluster.gpus_per_node - 1)
    if op == ALL_REDUCE and link.nvls_busbw_bytes_per_s and n_in_node >= link.nvls_min_gpus:
        return link.nvls_busbw_bytes_per_s
    return link.ring_busbw_bytes_per_s


def latency_s(op: str, grp: Group, cluster: ClusterSpec | _Links) -> float:
    """Latency of one call [s], NCCL's composition (formulas.md §1.3, tuning.cc): a fixed part plus one
    hop per ring step, (n-1) steps for all-gather / reduce-scatter and 2(n-1) for a ring all-reduce, of
    which (k-1) (or 2(k-1)) cross nodes; a ring all-reduce across nodes is x1.4 (NCCL's 'plateau'), and
    NCCL may pick a tree instead: 2·((r-1)·intra + log2(k)·inter) hops. All-to-all and send/recv pay the
    fixed part (their transfers run concurrently)."""
    n, k = grp.size, grp.n_nodes
    intra, inter = cluster.intra, cluster.inter
    base = intra.latency_s if k == 1 else inter.latency_s
    if op in (SEND_RECV, ALL_TO_ALL) or n <= 1:
        return base
    steps_inter = k - 1
    steps_intra = (n - 1) - steps_inter
    ring = steps_intra * intra.hop_latency_s + steps_inter * inter.hop_latency_s
    if op != ALL_REDUCE:
        return base + ring
    if k == 1:
        return base + 2 * ring
    tree = 2 * ((grp.ranks_per_node - 1) * intra.hop_latency_s + math.log2(k) * inter.hop_latency_s)
    return base + min(1.4 * 2 * ring, tree)


def _half_size_bytes(op: str, link: IntraNodeLink | InterNodeLink) -> float:
    """The message size at which ``op`` reaches half its bandwidth on ``link``: a send/recv has no ring to
    fill (``p2p_half_size_bytes``), the collectives do (``half_size_bytes``)."""
    return link.p2p_half_size_bytes if op == SEND_RECV else link.half_size_bytes


def _nic_bytes_per_s(cluster: ClusterSpec | _Links) -> float:
    return cluster.inter.nic_bytes_per_s * cluster.inter.efficiency


def _miss(pool: float, removed: float, k: int) -> float:
    """Probability that ``k`` distinct experts drawn uniformly from ``pool`` avoid ``removed`` of them."""
    out = 1.0
    for i in range(k):
        out *= max(0.0, (pool - removed - i) / (pool - i))
    return out


def remote_nodes_per_token(n_experts: int, top_k: int, n_nodes: int, n_groups: int = 0,
                           topk_groups: int = 0) -> float:
    """Expected number of other nodes a token's experts lie on [nodes]: ``n_experts`` spread evenly over
    ``n_nodes`` in consecutive blocks, ``top_k`` distinct experts chosen uniformly (balanced routing). A
    node is missed with probability C(E - E/n_nodes, top_k) / C(E, top_k).

    With group-limited routing (DeepSeek-V3: ``n_groups`` = 8 groups of consecutive experts, a token's
    experts from ``topk_groups`` = 4 of them, arXiv:2412.19437 §2.1.2) the experts come from a pool of
    P = topk_groups·E/G: a node inside one group (n_nodes a multiple of G) is reached only when its group
    is chosen, then missed with C(P - E/n, k)/C(P, k); a node holding g = G/n whole groups is reached
    through the j of them chosen (hypergeometric), missed with C(P - j·E/G, k)/C(P, k). Group layouts
    that do not nest with the nodes are taken as unlimited (an upper bound)."""
    if n_nodes <= 1:
        return 0.0
    E, k, n, G, tg = n_experts, top_k, n_nodes, n_groups, topk_groups
    if not G or (n % G and G % n):
        return (n - 1) * (1.0 - _miss(E, E / n, k))
    pool = tg * E / G
    if n % G == 0:
        reached = tg / G * (1.0 - _miss(pool, E / n, k))
    else:
        g = G // n
        chosen_here = [math.comb(g, j) * math.comb(G - g, tg - j) / math.comb(G, tg) for j in range(min(g, tg) + 1)]
        reached = sum(p * (1.0 - _miss(pool, j * E / G, k)) for j, p in enumerate(chosen_here))
    return (n - 1) * reached


def all_to_all_peer_efficiency(message_bytes: float, n: int, p2p_half_size_bytes: float) -> float:
    """Share of the NIC rate an all-to-all across nodes reaches with a per-rank buffer of ``message_bytes``
    over ``n`` ranks [0-1]: the size efficiency of each of its point-to-point transfers, S/n bytes to
    each peer, at the point-to-point half size (InterNodeLink.p2p_half_size_bytes).

    NCCL runs an all-to-all as one grouped send and receive per peer (``ncclGroupStart``; ``ncclSend`` /
    ``ncclRecv`` to each rank; ``ncclGroupEnd``: nccl-tests ``alltoall.cu``), not as a ring: there is no
    ring pipeline to fill, but each transfer is 1/n of the buffer. At large expert parallelism the
    transfers shrink, and with them the rate each NIC reaches while it takes in n - r flows at once: the
    fan-out and incast of a large all-to-all. DeepEP's published H800 figures show the same trend for its
    own kernels (docs/legacy.md @dd758ca, CX7 400 Gb/s, about 50 GB/s): at 4,096 tokens per rank 43, 58 and
    51 GB/s over 16, 32 and 64 ranks, flat; at 128 tokens 63, 48, 43, 39 and 39 GB/s over 16 to 256 ranks.
    Concurrent transfers may hide part of each other's start-up, so this is on the slow side for many
    small ones."""
    if n <= 1 or message_bytes <= 0:
        return 1.0
    return size_efficiency(message_bytes / n, p2p_half_size_bytes)


def collective_time_s(op: str, message_bytes: float, grp: Group, cluster: ClusterSpec, *,
                      remote_share: float | None = None, rank_share: float | None = None) -> float:
    """Time of one call of ``op`` with payload ``message_bytes`` on group ``grp`` [s]. 0 for a group of 1.

    ``remote_share`` and ``rank_share`` (all-to-all only) describe a deduplicated dispatch (DeepEP,
    HybridEP), which sends a token once to each node and each GPU holding one of its experts, not once per
    routed copy: ``remote_share`` of the payload leaves the node, through each GPU's own NIC, instead of
    the (n-r)/n every routed copy would; ``rank_share`` of it reaches another GPU at all (instead of
    (n-1)/n), over NVLink inside the node; across nodes (r-1)/r of the GPUs it reaches take it over NVLink,
    from the node's own GPU or from the one it arrived on."""
    return _collective_time_s(cluster.intra, cluster.inter, op, message_bytes, grp.size, grp.ranks_per_node,
                              cluster.gpus_per_node, remote_share, rank_share)


@cache_by_identity(n_specs=2)
def _collective_time_s(intra: IntraNodeLink, inter: InterNodeLink, op: str, message_bytes: float, size: int,
                       ranks_per_node: int, gpus_per_node: int, remote_share: float | None = None,
                       rank_share: float | None = None) -> float:
    """``collective_time_s`` on what it depends on (memoised): a group's time depends on its size and
    spread over nodes, not on its axis name."""
    cluster = _Links(intra, inter, gpus_per_node)
    grp = Group("", size, ranks_per_node)
    n = grp.size
    if message_bytes <= 0 or (n <= 1 and op != SEND_RECV):
        return 0.0
    intra, inter = cluster.intra, cluster.inter
    if grp.n_nodes == 1:
        bw = intra_busbw(op, n, cluster) * size_efficiency(message_bytes, _half_size_bytes(op, intra))
        factor = rank_share if op == ALL_TO_ALL and rank_share is not None else busbw_factor(op, n)
        return latency_s(op, grp, cluster) + message_bytes * factor / bw
    r = grp.ranks_per_node
    alpha = latency_s(op, grp, cluster)
    if op == ALL_TO_ALL:
        nic = _nic_bytes_per_s(cluster) * all_to_all_peer_efficiency(message_bytes, n, inter.p2p_half_size_bytes)
        if remote_share is not None:
            # every node's GPUs but the one the copy arrives on (or is sent from) take it over NVLink: of the
            # rank_share·k·n/(n-1) GPUs a token reaches in all, (r-1)/r
            fanned = message_bytes * (rank_share * n / (n - 1) if rank_share is not None else 1.0)
            leaving, staying = message_bytes * remote_share, fanned * (r - 1) / r
        else:
            leaving, staying = message_bytes * (n - r) / n, message_bytes * (r - 1) / n
        t_intra = staying / intra_busbw(op, r, cluster) if r > 1 else 0.0
        return alpha + max(leaving / nic, t_intra)
    nic = _nic_bytes_per_s(cluster) * size_efficiency(message_bytes, _half_size_bytes(op, inter))
    if op == SEND_RECV:
        return alpha + message_bytes / nic
    ring_bw = r * nic if r == 1 else min(intra_busbw(op, r, cluster), r * nic)
    t_ring = alpha + message_bytes * busbw_factor(op, n) / ring_bw
    if op != ALL_REDUCE or r == 1:
        return t_ring
    k = grp.n_nodes
    t_hier = (intra.latency_s * 2 + alpha
              + 2 * message_bytes * busbw_factor(REDUCE_SCATTER, r) / intra_busbw(REDUCE_SCATTER, r, cluster)
              + (message_bytes / r) * busbw_factor(ALL_REDUCE, k) / nic)
    return min(t_ring, t_hier)
