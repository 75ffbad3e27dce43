"""The memory-bound passes of an MoE layer: the router, and the permutation of token copies to experts and
back. Each moves a number of bytes per token, and its time is those bytes at the memory-bound rate.

**Router** (Megatron-core ``TopKRouter``, ``megatron/core/transformer/moe/router.py`` and
``moe_utils.topk_routing_with_score_function``): after the gating GEMM (timed with the GEMMs), the scores
of the E experts are computed in FP32 (``moe_router_dtype='fp32'`` in NVIDIA's MoE recipes) and the top k
taken; the router returns dense [T, E] probabilities and a boolean routing map. Forward: the logits read
(4E bytes per token), the scores written and read again for the top-k and the load-balancing statistics
(8E), the probabilities written (4E) and the map (E): ``ROUTER_FWD_BYTES_PER_EXPERT`` = 17 bytes per token
and expert. Backward: the probabilities' gradient and the scores read, the logits' gradient written: 12.
Fused (``moe_router_fusion``) it reads the logits once; the difference is small beside the permutation
(E·17 = 4.4 KB per token for DeepSeek-V3's 256 experts, against k·D·2 = 115 KB for one pass over its
routed copies), and one count serves both.

**Permutation** (``MoEAlltoAllTokenDispatcher``, ``token_dispatcher.py``; TE's fused ``moe_permute`` /
``moe_unpermute`` kernels under ``moe_permute_fusion``): forward, each token's row is read once and
written to its k expert slots (D + k·D elements); after the all-to-all a rank holding several experts
sorts the received chunks by expert (``sort_chunks_by_idxs``: k·D read and written), and unsorts them
before the combine; the un-permutation reads the k expert outputs and writes their probability-weighted
sum (k·D + D). The backward runs the transposes, and the probabilities' gradient reads the expert outputs
once more (k·D). The flex dispatcher (DeepEP, HybridEP) sends each token once per rank and permutes on
arrival, without the chunk sort. ``permute_elements_per_token`` counts these; in units of one pass over
the routed copies (k·D elements) it is 2.25-3 per forward and 3.25-4 per backward without the sort
(k = 8 to 2), 6.25-7 and 7.25-8 with it: 5.5-7 passes per layer forward and backward without, 13.5-15
with. The step model charges ``ComputeParams.moe_permute_passes`` (fitted) per forward and twice that per
backward, three times it per layer; the counts above are its physical reading (docs/moe.md).
"""

from __future__ import annotations

ACT_BYTES = 2.0
"""Bytes per element of the token activations the dispatcher moves (BF16, also in FP8 training: Megatron-core
dispatches in BF16 unless ``moe_router_padding_for_quantization`` with FP8 dispatch, which no recipe of the
published rows sets)."""
ROUTER_FWD_BYTES_PER_EXPERT = 17.0
"""Router forward traffic per token and expert [bytes] (module docstring)."""
ROUTER_BWD_BYTES_PER_EXPERT = 12.0
"""Router backward traffic per token and expert [bytes] (module docstring)."""
DISPATCHERS = ("alltoall", "flex")
"""Megatron-core's token dispatchers as meshplan names them: NCCL all-to-all with permutation in
PyTorch/TE kernels, or the flex dispatcher (DeepEP, HybridEP: Plan.ep_dispatch 'deepep')."""


def router_bytes_per_token(n_experts: int) -> tuple[float, float]:
    """(forward, backward) memory traffic of the router's score, top-k and probability passes per token
    [bytes] (module docstring); the gating GEMM is not included."""
    return ROUTER_FWD_BYTES_PER_EXPERT * n_experts, ROUTER_BWD_BYTES_PER_EXPERT * n_experts


def permute_elements_per_token(top_k: int, hidden: int, *, local_experts: float, ep: int,
                               dispatcher: str = "alltoall") -> tuple[float, float]:
    """(forward, backward) elements read and written by the permutation, the chunk sort and the
    un-permutation per token of the micro-batch [elements] (module docstring)."""
    if dispatcher not in DISPATCHERS:
        raise ValueError(f"dispatcher must be one of {DISPATCHERS}, got {dispatcher!r}")
    k, d = float(top_k), float(hidden)
    fwd = (d + k * d) + (k * d + d)
    bwd = fwd + k * d
    if dispatcher == "alltoall" and ep > 1 and local_experts > 1:
        sort = 2 * (2 * k * d)  # sort after the dispatch, unsort before the combine: each reads and writes
        fwd, bwd = fwd + sort, bwd + sort
    return fwd, bwd


def passes_over_copies(top_k: int, *, local_experts: float, ep: int, dispatcher: str = "alltoall"
                       ) -> tuple[float, float]:
    """``permute_elements_per_token`` in passes over the routed copies (k·D elements) [passes]: what
    ``ComputeParams.moe_permute_passes`` reads as (forward, backward)."""
    fwd, bwd = permute_elements_per_token(top_k, 1, local_experts=local_experts, ep=ep, dispatcher=dispatcher)
    return fwd / top_k, bwd / top_k
