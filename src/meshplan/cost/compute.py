"""Compute time per operation: GEMMs with shape-dependent efficiency, FlashAttention, memory-bound ops.

GEMM time (roofline with a shape-dependent efficiency, in the spirit of calculon's efficiency curves):

.. math:: t = \\frac{2MNK}{P · e_{max} · \\prod_{d \\in \\{M,N,K\\}} \\frac{d}{d + d_{1/2}}}

P is the dense peak of the compute precision, e_max the best measured matmul efficiency of the part
(maximum achievable matmul FLOPS, catalog), d_{1/2} a dimension at which one factor halves (small or
skinny GEMMs, such as TP-split FFNs or experts with few tokens, are slower). Attention runs at its
own efficiency of peak (FlashAttention reaches far less than a GEMM: FA2 fwd+bwd 328 TFLOP/s on H100,
Azure AI-benchmarking-guide); causal attention executes half the FLOPs of the non-causal convention.
Memory-bound operations (norms, activation functions, rotary, residual adds, the loss softmax, the
optimizer step) take bytes / (HBM bandwidth · memory efficiency).

The efficiency parameters are calibrated on published runs (meshplan.calibration); their defaults and
provenance live in the catalog (catalog/calibration/*.toml).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from meshplan.cost.gemm_shape import gemm_efficiency, gemm_time_s
from meshplan.cost.grouped_gemm import grouped_gemm_time_s, measured_points
from meshplan.cost.moe_passes import router_bytes_per_token
from meshplan.specs import AcceleratorSpec, ModelSpec

__all__ = ["gemm_efficiency", "gemm_time_s"]  # re-exported: the shape curve lives in cost.gemm_shape

BF16_BYTES = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeParams:
    """Physical efficiency parameters shared by every plan on an accelerator (calibrated, not per row)."""

    gemm_scale: float = 1.0
    """Achieved over best-case (MAMF) matmul efficiency in training kernels, per accelerator."""
    kernel_scale: float = 1.0
    """A software stack's GEMM kernels (unfused attention's batched GEMMs among them) against the reference
    stack's (Megatron-core with Transformer Engine) on the same GPU generation: stacks and their releases
    reach different shares of the same silicon."""
    attention_kernel_scale: float = 1.0
    """A software stack's FlashAttention kernel against the reference stack's on the same GPU generation:
    on Hopper, Megatron-core runs Transformer Engine's attention (cuDNN fused attention by default), while
    the PyTorch stacks of the data ran FlashAttention-2 (flash_attn, or PyTorch SDPA's FlashAttention-2
    backend), which reaches a smaller share of Hopper's peak than of Ampere's. Fitted on Hopper only
    (calibrate.ATTENTION_SPLIT_FAMILIES)."""
    gemm_half_dim: float = 128.0
    """d_{1/2} of the GEMM shape factor [elements]."""
    fp8_half_dim_ratio: float = 1.0
    """d_{1/2} of FP8 GEMMs over ``gemm_half_dim``: at twice the BF16 rate on the same memory, an FP8
    GEMM needs larger shapes to reach its peak (its ridge point doubles), and its per-tensor scaling and
    casts grow with the operands, not the FLOPs."""
    fp8_gemm_efficiency: float = 0.72
    """Best FP8 matmul throughput over FP8 peak (ml-engineering MAMF: H100 70.9 %, B200 76.3 %)."""
    attention_efficiency: float = 0.40
    """FlashAttention forward+backward throughput over BF16 peak, on long blocks."""
    attention_half_len: float = 256.0
    """Block length L½ of the attention length efficiency (L / (L + L½))², a quarter of the long-sequence
    rate at L = L½: short sequences, and short blocks as in ring context parallelism with many ranks, run
    FlashAttention below its long-sequence rate."""
    memory_efficiency: float = 0.80
    """Achieved over spec HBM bandwidth for memory-bound kernels (Azure STREAM-like: 79-95 %)."""
    overlap_efficiency: float = 0.9
    """Share of overlappable communication that compute can actually hide (stream and SM contention)."""
    zero3_overlap_efficiency: float = 0.9
    """The same for DeepSpeed ZeRO-3's parameter fetches, whose prefetching is bucket-limited."""
    zero3_collective_efficiency: float = 1.0
    """Share of NCCL's bus bandwidth that DeepSpeed ZeRO-3's parameter all-gathers and gradient
    reduce-scatters reach. Its 2021 releases issued them tensor by tensor in list form (PyTorch gathers
    into a flat buffer, then copies each rank's slice out) behind a device-wide synchronisation
    (``partition_parameters.py``, ``stage3.py``)."""
    comm_slowdown: float = 0.05
    """Compute slowdown while a collective runs beside it (NCCL kernels take SMs and HBM bandwidth)."""
    step_overhead_s: float = 0.0
    """Fixed time per step outside the model (data loading, logging, launch gaps)."""
    layer_overhead_s: float = 0.0
    """Fixed time per layer per micro-batch, forward and backward together (kernel launches and
    synchronisation the roofline does not see; depends on the software stack)."""
    elementwise_passes: float = 1.0
    """A software stack's elementwise memory traffic (norms, residual adds, rotary, activation function)
    over the fused minimum that ``layer_times`` counts: eager PyTorch's unfused kernels (rotary by slicing
    and concatenation, separate casts and norms) move about 2.7x that (measured on an H200,
    docs/measure-and-crosscheck.md)."""
    moe_gemm_efficiency: float = 1.0
    """The routed experts' GEMMs against the model of their launch (meshplan.cost.grouped_gemm: a dense GEMM's
    shape curve at each expert's tokens for Transformer Engine's one GEMM per expert, the whole rows of a
    grouped kernel) [dimensionless, 0.1-1]. 1, the neutral default, credits no overlap of TE's 4 compute
    streams, on which small per-expert GEMMs could share the GPU. Fitted on the published MoE runs
    (docs/moe.md)."""
    moe_layer_overhead_s: float = 0.0
    """Fixed time per MoE layer forward per micro-batch (also in its recomputation), added to the kernels:
    the router's top-k, auxiliary loss and token bookkeeping, small kernels the roofline does not see, and
    the gaps between them. It applies with per-layer CUDA graphs too: the 25.09 token-drop rows, whose
    layers ran as graphs, need it. A whole-iteration graph (JobSpec.cuda_graph_scope 'full_iteration')
    leaves it out: the 2026 Megatron-Bridge recipes that capture the iteration ran faster than the model
    with it (cross-validated MAPE 6.63 % against 6.77 % with it, docs/validation.md). The host
    synchronisation of the dropless dispatchers (``token_dispatcher.py``: the all-to-all dispatcher copies
    its splits to the host at its ``cuda_sync_point``; the grouped GEMM takes the counts as a host list) is
    ``moe_layer_host_s``, a floor. Fitted on Megatron-core rows (the only MoE rows), applied to every
    stack's MoE layers."""
    moe_layer_host_s: float = 0.0
    """Host time to issue one MoE layer's kernels, forward and backward, per micro-batch, when the layer
    is not captured in a CUDA graph (JobSpec.cuda_graphs) [s]. The GPU cannot run the layers faster than
    the host launches them, so each phase of a stage takes at least its MoE layers' launches, its kernels
    and in-layer communication included (cost.stage_time._host_waits_s, "host-bound MoE launches"): a floor,
    not an addition, reached by small layers at small micro-batches. Megatron-Bridge's GPT-OSS recipe
    says why: "the legacy grouped MLP path syncs tokens_per_expert to the host every layer, which
    serializes the CPU behind the GPU" (perf_recipes/gpt_oss/gb300/gpt_oss.py@007282e). Qwen3-30B-A3B at
    micro-batch 1 took 9.2 and 8.8 ms per layer (from the published tokens/s) on B200 (Megatron-Bridge
    25.11, 26.02) and 9.5 and 9.7 ms on H100 (26.04, 26.06), which has 2.3x less compute: the host's pace,
    not the GPU's; the same layers captured in CUDA graphs (25.09 token-drop recipe) took 4.7 ms on B200.
    Fitted on the published runs (docs/validation.md)."""
    moe_expert_host_s: float = 0.0
    """Host time added to ``moe_layer_host_s`` per local expert [s]: Transformer Engine's grouped linear
    layers launch and allocate per expert GEMM (``torch.empty`` twice per GEMM, TransformerEngine#1499;
    per-expert casts and splits), so the launch time grows with the experts a rank holds. Fitted on the
    published runs."""
    moe_permute_passes: float = 4.0
    """Memory passes over a rank's routed token copies (k·D elements per token) in an MoE layer's forward,
    twice as many in its backward [passes]: the permutation to the experts, the sort of the received chunks
    by expert, and their inverses (meshplan.cost.moe_passes counts them: 2.25-3 per forward for a fused or
    flex dispatcher, 6.25-7 with the all-to-all dispatcher's chunk sort, k = 8 to 2). At least 2: the
    copies written by the permutation and read back by the un-permutation. Fitted."""
    causal_attention_fraction: float = 0.5
    """Time of a causal attention kernel over the non-causal one of the same shape on long sequences (0.5:
    masked tiles skipped perfectly); shorter ones compute their diagonal tiles whole (causal_time_fraction)."""
    source: str = "defaults (uncalibrated)"


def gemm_curve(accel: AcceleratorSpec, params: ComputeParams, precision: str) -> tuple[float, float, float]:
    """(peak FLOP/s, e_max, d_½) of the GEMM efficiency curve for ``precision`` ('bf16' or 'fp8'; FP8 on an
    accelerator without FP8 runs in BF16)."""
    fp8 = precision == "fp8" and accel.fp8_flop_per_s is not None
    peak = accel.fp8_flop_per_s if fp8 else accel.bf16_flop_per_s
    e_max = (params.fp8_gemm_efficiency if fp8 else accel.gemm_efficiency) * params.gemm_scale * params.kernel_scale
    return peak, e_max, params.gemm_half_dim * (params.fp8_half_dim_ratio if fp8 else 1.0)


FP8_ATTENTION_SPEEDUP = 1.5
"""Fused attention in FP8 against the same kernel in BF16 (JobSpec.fp8_attention); an assumption, not a
matched measurement. NVIDIA's "Accelerating Transformers with NVIDIA cuDNN 9" (developer.nvidia.com blog,
2024) puts cuDNN's SDPA at up to 2x the best PyTorch eager implementation in BF16 and up to 3x in FP8 (up
to 1.2 PFLOP/s in FP8 on an H200); the ratio of the two "up to" figures, 3/2, is taken as FP8's gain over
cuDNN's BF16 kernel. The same post's end-to-end Llama 2 70B LoRA run on 8 H200 (1.11x with cuDNN's BF16
attention, 1.15x with its FP8 one: 3.6 %) fits it if attention took about a tenth of that step. Applied to
the forward and the backward alike (TE's FP8 attention runs both in FP8) and to every GPU with FP8,
Blackwell included, where it was not measured."""

FLASH_TILE = 128
"""Query tile of FlashAttention's kernels [tokens], the granularity at which a causal mask is skipped
(FlashAttention-2 forward: kBlockM = 128, and kBlockN = 128 for head dimension 64,
csrc/flash_attn/src/flash_fwd_launch_template.h; other head dimensions and kernels use 64-176-token key
tiles, which the calibrated asymptote absorbs)."""


def causal_time_fraction(block_len: float, asymptote: float) -> float:
    """Time of a causal attention kernel over the non-causal one on ``block_len`` queries and keys [0-1].

    A causal kernel skips the key tiles above the diagonal but computes the n diagonal tiles whole: of
    the n² tiles (n = block / tile) it computes n(n+1)/2, a fraction (n+1)/(2n) that tends to 1/2. The
    calibrated ``asymptote`` (0.5 for perfect skipping) carries the rest, masking and load imbalance
    between query tiles, scaled by the same (n+1)/n."""
    n = max(1.0, block_len / FLASH_TILE)
    return min(1.0, asymptote * (n + 1) / n)


def attention_length_efficiency(block_len: float, half_len: float, key_len: float | None = None) -> float:
    """Share of its long-sequence rate a FlashAttention kernel reaches on blocks of ``block_len`` queries
    and ``key_len`` keys (default: as many as queries) [0-1]: Lq / (Lq + L½) · Lk / (Lk + L½), L½
    calibrated on the published runs (catalog).

    One factor for the keys: each thread block streams them past one query tile, and its fixed cost
    (loading the tile, the prologue, the output write) is amortised over the key length. One for the
    queries: short blocks, as in ring context parallelism, give few query tiles per head. A single
    factor fits the published runs worse (docs/validation.md, alternatives tested and rejected)."""
    queries = block_len / (block_len + half_len)
    return queries * (queries if key_len is None else key_len / (key_len + half_len))


def flash_attention_time_s(flop: float, *, seq_len: float, block_len: float, causal: bool,
                           accel: AcceleratorSpec, params: ComputeParams, key_len: float | None = None) -> float:
    """Forward time of a FlashAttention kernel doing ``flop`` FLOPs if no mask were applied [s]: a causal
    kernel skips the masked tiles (causal_time_fraction on the sequence), and blocks of ``block_len``
    queries against ``key_len`` keys per query tile (default: as many) run at attention_length_efficiency
    of the long-sequence rate."""
    if causal:  # only the sequence's diagonal tiles are partial, however CP splits it
        flop *= causal_time_fraction(seq_len, params.causal_attention_fraction)
    return flop / (accel.bf16_flop_per_s * params.attention_efficiency * params.attention_kernel_scale
                   * attention_length_efficiency(block_len, params.attention_half_len, key_len))


def window_key_span(window: int, seq_len: float) -> float:
    """Keys a FlashAttention query tile runs over in a sliding-window layer, averaged over the sequence's
    query tiles [tokens]. Query tile i (of n = ceil(S / tile)) attends keys i·tile - w + 1 .. i·tile +
    tile - 1, which touch min(i, c) + 1 key tiles, c = ceil((w - 1) / tile); each is run whole
    (FlashAttention-2's ``window_size=(w - 1, 0)``, cuDNN's sliding window and FlexAttention skip the tiles
    outside the band and mask the partial ones). Tiles near the start of the sequence see fewer."""
    n = max(1, math.ceil(seq_len / FLASH_TILE))
    c = math.ceil((window - 1) / FLASH_TILE)
    tiles = n * (n - 1) / 2 if c >= n - 1 else c * (c + 1) / 2 + c * (n - 1 - c)  # sum of min(i, c), i < n
    return (1.0 + tiles / n) * FLASH_TILE


@dataclass(frozen=True, slots=True)
class LayerTimes:
    """One layer, one micro-batch, on one rank [s]: forward, input-gradient, weight-gradient parts, and
    the attention core (the window a context-parallel exchange can hide behind)."""

    fwd_s: float
    bwd_input_s: float
    bwd_weight_s: float
    attention_fwd_s: float
    gemm_fwd_s: float
    mla_up_fwd_s: float = 0.0
    """MLA's up-projection GEMMs (q and kv), forward."""
    mlp_fwd_s: float = 0.0
    """A dense layer's MLP (GEMMs and activation), or an MoE layer's shared experts, forward."""
    norm_fwd_s: float = 0.0
    """One norm over the layer's tokens (sequence-parallel share), forward."""
    routed_act_fwd_s: float = 0.0
    """The activation function over every routed copy, forward."""


def layer_times(model: ModelSpec, accel: AcceleratorSpec, params: ComputeParams, *, tokens: float,
                seq_len: int, cp: int, tp: int, precision: str, causal_kernel: bool = True, cp_chunked: bool = True,
                flash_attention: bool = True,
                moe: bool = False, expert_tokens: float = 0.0, local_experts: float = 0.0,
                expert_tp: int = 1, sequence_parallel: bool = False, fused_grouped_mlp: bool = False,
                mla_down_local: bool = False, moe_kernel: str = "per_expert") -> LayerTimes:
    """Forward and backward time of one transformer layer for ``tokens`` tokens on a rank (T = b·S/cp).

    GEMM shapes after tensor-parallel splitting (Megatron column/row split): QKV [T, D]x[D, (h_q+2h_kv)/t],
    output [T, h_q/t]x[h_q/t, D], MLP up (and gate) [T, D]x[D, F/t], down [T, F/t]x[F/t, D]; the backward
    runs the same shapes twice (input and weight gradient). MoE layers: each local expert processes
    ``expert_tokens`` tokens (on the busiest rank: meshplan.cost.moe_routing), its FFN split ``expert_tp``
    ways (Plan.expert_tp), the GEMMs launched as ``moe_kernel`` (``expert_gemms_fwd_s``); the router's and
    the permutation's memory passes (``moe_passes_s``). Attention: 4·T·S_kv·h_q/t
    FLOPs forward (half when causal, FlashAttention skips masked blocks), in sliding-window layers only
    the key tiles of the band (window_key_span; the layer's mean over windowed and global layers);
    FlashAttention's backward is 2.5x its forward (it recomputes QKᵀ), unfused attention's backward runs
    twice the forward's batched GEMMs and its own elementwise traffic over the score matrix, which it
    computes whole, window or not. ``fused_grouped_mlp`` (JobSpec.fused_grouped_mlp): the routed experts'
    activation runs inside their fused GEMMs, so it moves no elementwise traffic of its own.
    ``mla_down_local``: MLA's replicated down-projections run on the rank's sequence-parallel share, T/t
    tokens, and the latents are gathered after them (Megatron-core with sequence parallelism,
    multi_latent_attention.py); otherwise on all T (torchtitan gathers their input).
    """
    D, t = model.hidden, float(tp)
    peak, e_max, hd = gemm_curve(accel, params, precision)

    def g(m: float, n: float, k: float) -> float:
        return gemm_time_s(m, n, k, peak_flop_per_s=peak, e_max=e_max, half_dim=hd)

    attn_proj, mla_up = _attention_projections_s(model, g, tokens, t, mla_down_local)
    mlp, own_mlp = _mlp_s(model, g, tokens, t, moe)
    if moe:
        mlp += expert_gemms_fwd_s(model, accel, params, precision=precision, tokens_per_expert=expert_tokens,
                                  local_experts=local_experts, expert_tp=expert_tp, kernel=moe_kernel)
    gemm_fwd = attn_proj + mlp
    attn_fwd, attn_bwd = _attention_core_s(model, accel, params, tokens, seq_len, cp, t, causal_kernel, cp_chunked,
                                           flash_attention)
    f_local = (model.expert_ffn_hidden * model.top_k if moe else model.ffn_hidden) / t
    sp_share = t if sequence_parallel else 1.0
    act = 3 if model.gated_mlp else 2  # the activation's elements per F
    ew_bytes = _elementwise_bytes(model, params, tokens, t, sp_share, act, f_local, moe, fused_grouped_mlp)
    hbm = accel.hbm_bytes_per_s * params.memory_efficiency
    ew_fwd = ew_bytes / hbm
    moe_fwd = moe_bwd = 0.0
    if moe:  # the router's passes, and the permutation of every routed copy to its expert and back
        moe_fwd, moe_bwd = moe_passes_s(model, accel, params, routed_tokens=tokens / sp_share,
                                        copies=expert_tokens * local_experts)
    over = params.layer_overhead_s
    host_sync = params.moe_layer_overhead_s if moe else 0.0
    ew_element_s = BF16_BYTES * params.elementwise_passes / hbm  # one element through memory
    own_f = (model.n_shared_experts * model.expert_ffn_hidden if moe else model.ffn_hidden) / t
    return LayerTimes(
        fwd_s=gemm_fwd + attn_fwd + ew_fwd + moe_fwd + over / 3 + host_sync,
        bwd_input_s=gemm_fwd + attn_bwd + 2 * ew_fwd + moe_bwd + over / 3,
        bwd_weight_s=gemm_fwd + over / 3,
        attention_fwd_s=attn_fwd,
        gemm_fwd_s=gemm_fwd,
        mla_up_fwd_s=mla_up,
        mlp_fwd_s=own_mlp + ew_element_s * tokens * act * own_f,
        norm_fwd_s=ew_element_s * tokens * 2 * D / sp_share,
        routed_act_fwd_s=(ew_element_s * expert_tokens * local_experts * act * model.expert_ffn_hidden / expert_tp
                          if moe and not fused_grouped_mlp else 0.0),
    )


_Gemm = Callable[[float, float, float], float]
"""A GEMM's time [s] for its (m, n, k) at the layer's precision (``layer_times``)."""


def _attention_projections_s(model: ModelSpec, g: _Gemm, tokens: float, t: float, mla_down_local: bool
                             ) -> tuple[float, float]:
    """Forward time of the attention's projections [s]: QKV and the output projection, or MLA's down- and
    up-projections and the output projection; and of MLA's up-projections alone (0 without MLA)."""
    D = model.hidden
    mla_up = 0.0
    if model.is_mla:
        q_out = model.n_heads * model.qk_head_dim
        kv_out = model.n_heads * (model.d_head + model.value_head_dim)
        r_q, r_kv = model.q_lora_rank, model.kv_lora_rank
        # the region Megatron's mla_up_proj re-runs: the q up-projection (or, without a q latent, the q
        # projection itself) and the kv up-projection
        mla_up = (g(tokens, q_out / t, r_q) if r_q else g(tokens, q_out / t, D)) + g(tokens, kv_out / t, r_kv)
        down_tokens = tokens / t if mla_down_local else tokens
        attn_proj = mla_up + (g(down_tokens, r_q, D) if r_q else 0.0)
        attn_proj += g(down_tokens, r_kv + model.qk_rope_head_dim, D)
    else:
        attn_proj = g(tokens, (model.q_dim + 2 * model.kv_dim) / t, D)
    attn_proj += g(tokens, D, model.q_dim / t)
    return attn_proj, mla_up


def _mlp_s(model: ModelSpec, g: _Gemm, tokens: float, t: float, moe: bool) -> tuple[float, float]:
    """Forward time of the layer's MLP GEMMs [s] but an MoE layer's routed experts (``expert_gemms_fwd_s``):
    a dense layer's MLP, or an MoE layer's shared experts and router; and of its own MLP alone (a dense
    layer's, or an MoE layer's shared experts)."""
    D = model.hidden
    n_in = 2 if model.gated_mlp else 1
    if moe:
        f = model.expert_ffn_hidden
        mlp = 0.0
        own_mlp = model.n_shared_experts * (g(tokens, n_in * f / t, D) + g(tokens, D, f / t))
        mlp += own_mlp + g(tokens, model.n_experts, D)  # shared experts, router
    else:
        f = model.ffn_hidden
        mlp = own_mlp = g(tokens, n_in * f / t, D) + g(tokens, D, f / t)
    return mlp, own_mlp


def _attention_core_s(model: ModelSpec, accel: AcceleratorSpec, params: ComputeParams, tokens: float, seq_len: int,
                      cp: int, t: float, causal_kernel: bool, cp_chunked: bool, flash_attention: bool
                      ) -> tuple[float, float]:
    """The attention kernel's forward and backward time [s] (``layer_times``): FlashAttention, or unfused."""
    kv_len = seq_len  # every local query attends over the whole (gathered or ring-passed) sequence
    attn_flop = 2.0 * tokens * kv_len * model.n_heads * (model.qk_head_dim + model.value_head_dim) / t
    if flash_attention:
        # blocks of S/cp queries against S/cp keys with ring or all-gather CP; whole sequences otherwise
        block = seq_len / cp if cp_chunked else seq_len
        attn_fwd = flash_attention_time_s(attn_flop, seq_len=seq_len, block_len=block, causal=causal_kernel,
                                          accel=accel, params=params)
        if model.windowed_layers:  # the layers' mean: windowed ones run only the key tiles of their band
            span = window_key_span(model.attention_window, seq_len)
            windowed = flash_attention_time_s(attn_flop * span / kv_len, seq_len=seq_len, block_len=block,
                                              key_len=min(block, span), causal=False, accel=accel, params=params)
            share = model.windowed_layers / model.n_layers
            attn_fwd = (1.0 - share) * attn_fwd + share * min(attn_fwd, windowed)
        return attn_fwd, 2.5 * attn_fwd
    # Unfused attention (Megatron before FlashAttention): QKᵀ and A·V as batched GEMMs over every score,
    # masked or not, and the score matrix through memory. Each batched GEMM writes or reads the score
    # matrix once (2 B per score) and two S x d operands (2 B each, 4d/S per score) for 2·d FLOPs per
    # score: with the head dimension d as its inner or outer size it sits below the GPU's ridge point,
    # so it runs at the larger of its FLOP and its HBM time (a roofline). Forward: two such GEMMs; the
    # Megatron v2-v3 fused scale-mask-softmax (FusedScaleMaskSoftmax) reads and writes the
    # scores (2 + 2 B), dropout reads them and writes them with its 1-byte mask (2 + 2 + 1 B).
    # Backward: four (dV, dP, dQ, dK); dropout's backward reads the gradient and the mask and writes
    # the gradient (2 + 1 + 2 B), softmax's backward reads the probabilities and the gradient and
    # writes the gradient (2 + 2 + 2 B). N/t heads x S scores per token.
    scores = tokens * kv_len * model.n_heads / t
    hbm = accel.hbm_bytes_per_s * params.memory_efficiency
    bf16_peak, bf16_e_max, _ = gemm_curve(accel, params, "bf16")  # unfused attention runs in BF16
    one_gemm = max(attn_flop / 2 / (bf16_peak * bf16_e_max),
                   2.0 * scores * (1.0 + 2.0 * model.qk_head_dim / kv_len) / hbm)
    return 2 * one_gemm + 9.0 * scores / hbm, 4 * one_gemm + 11.0 * scores / hbm


def _elementwise_bytes(model: ModelSpec, params: ComputeParams, tokens: float, t: float, sp_share: float, act: int,
                       f_local: float, moe: bool, fused_grouped_mlp: bool) -> float:
    """Memory-bound elementwise traffic of the layer's forward [bytes], fused minimum in bf16 elements per
    token: two norms (read D, write D each) and two residual adds (read 2D, write D each), on T/t tokens
    under sequence parallelism (``sp_share`` t) and on all T otherwise; rotary embeddings on q and k (read
    and write each) where the model has them; the activation (SwiGLU: read 2F, write F; GELU: read F,
    write F; ``act`` elements per F) on the rank's share of the MLP (``f_local``); times
    ComputeParams.elementwise_passes. An MoE layer's router and permutation are ``moe_passes_s``'s."""
    D = model.hidden
    per_token = (4 * D + 6 * D) / sp_share
    if model.learned_pos_emb == 0:
        per_token += 2 * (model.q_dim + model.kv_dim) / t
    if not (moe and fused_grouped_mlp):
        per_token += act * f_local
    return BF16_BYTES * tokens * per_token * params.elementwise_passes


def expert_gemms_fwd_s(model: ModelSpec, accel: AcceleratorSpec, params: ComputeParams, *, precision: str,
                       tokens_per_expert: float, local_experts: float, expert_tp: int = 1,
                       kernel: str = "per_expert") -> float:
    """Forward time of a rank's routed-expert GEMMs [s]: the first (D to 2F/etp or F/etp) and the second
    (F/etp to D) of each of ``local_experts`` experts over ``tokens_per_expert`` tokens, launched as
    ``kernel`` (meshplan.cost.grouped_gemm: one GEMM per expert, Transformer Engine's GroupedLinear, or one
    grouped kernel), held to the memory floor of their weights and activations, over the calibrated
    ``moe_gemm_efficiency``. Where the accelerator carries measured points of a shape
    (AcceleratorSpec.expert_gemm_curve, ``meshplan measure moe``), they replace the analytic curve."""
    peak, e_max, hd = gemm_curve(accel, params, precision)
    fp8 = precision == "fp8" and accel.fp8_flop_per_s is not None
    dtype = "fp8" if fp8 else "bf16"
    fe = model.expert_ffn_hidden / expert_tp
    n_in = 2 if model.gated_mlp else 1
    curve = getattr(accel, "expert_gemm_curve", ())
    hbm = accel.hbm_bytes_per_s * params.memory_efficiency
    total = 0.0
    for n, k in ((n_in * fe, model.hidden), (model.hidden, fe)):
        measured = measured_points(curve, kernel, dtype, n, k)
        total += grouped_gemm_time_s(tokens_per_expert, local_experts, n, k, kernel=kernel, peak_flop_per_s=peak,
                                     e_max=e_max, half_dim=hd, hbm_bytes_per_s=hbm, operand_bytes=1.0 if fp8 else 2.0,
                                     measured=measured)
    return total / params.moe_gemm_efficiency


def moe_passes_s(model: ModelSpec, accel: AcceleratorSpec, params: ComputeParams, *, routed_tokens: float,
                 copies: float) -> tuple[float, float]:
    """(forward, backward) time of an MoE layer's memory-bound passes on a rank [s]: the router's score,
    top-k and probability passes over the ``routed_tokens`` it routes (meshplan.cost.moe_passes), and
    ``moe_permute_passes`` passes over its ``copies`` routed copies (D elements each) forward, twice that
    backward. The router at the memory-bound rate; the permutation at the rate measured for it where the
    accelerator has one (AcceleratorSpec.moe_pass_bytes_per_s), else the same."""
    hbm = accel.hbm_bytes_per_s * params.memory_efficiency
    router_fwd, router_bwd = router_bytes_per_token(model.n_experts)
    permute = BF16_BYTES * params.moe_permute_passes * copies * model.hidden
    permute_rate = getattr(accel, "moe_pass_bytes_per_s", None) or hbm
    return (routed_tokens * router_fwd / hbm + permute / permute_rate,
            routed_tokens * router_bwd / hbm + 2 * permute / permute_rate)


def selective_recompute_s(lt: LayerTimes, modules: frozenset[str], *, moe_layer: bool, mla: bool) -> float:
    """Forward time one layer re-runs under Megatron-core's selective recomputation of ``modules`` [s]:
    the norms whose outputs 'layernorm' discards (an MoE layer's pre-MLP norm, MLA's input norm), the
    routed copies' activation ('moe_act'), MLA's up-projections ('mla_up_proj'), a dense layer's MLP and
    its norm ('mlp'), an MoE layer's shared experts ('shared_experts'); the attention core ('core_attn') is
    the caller's (nothing with FlashAttention, which recomputes its scores anyway). Not charged: the
    sequence-parallel all-gather and reduce-scatter a recomputed MLP repeats under TP. The memory side:
    memory.selective_freed_bytes_per_token."""
    t = 0.0
    if "layernorm" in modules:
        t += lt.norm_fwd_s * ((1 if moe_layer else 0) + (1 if mla else 0))
    if "moe_act" in modules and moe_layer:
        t += lt.routed_act_fwd_s
    if "mla_up_proj" in modules:
        t += lt.mla_up_fwd_s
    if "mlp" in modules and not moe_layer:  # with its norm, fused into the first linear under TE
        t += lt.mlp_fwd_s + lt.norm_fwd_s
    if "shared_experts" in modules and moe_layer:
        t += lt.mlp_fwd_s
    return t


LOSS_TRAFFIC_BYTES_PER_LOGIT = {"eager": 14.0, "vocab_parallel": 14.0, "fused": 6.0, "te": 6.0}
"""HBM traffic of the cross-entropy per logit, forward and backward [bytes] (key: JobSpec.loss_impl).
Eager: read the bf16 logits, write and read their fp32 upcast, the softmax and the fp32 gradient
(2 + 4 + 4 + 4); Megatron's vocab-parallel loss is charged the same. Fused: read the bf16 logits forward,
read them again and write their bf16 gradient backward (2 + 2 + 2). Transformer Engine's the same: an online
softmax reads the logits forward; backward reads them and writes the gradient over them in place (2 + 2 + 2;
transformer_engine/pytorch/triton/cross_entropy.py @02965d2)."""


def lm_head_times(model: ModelSpec, accel: AcceleratorSpec, params: ComputeParams, *, tokens: float, tp: int,
                  loss: str = "eager") -> tuple[float, float]:
    """(forward, backward) time of the LM head GEMM and the cross-entropy loss on the last stage [s]. The
    head runs in BF16 even in FP8 training: Megatron-core's output layer is a plain ColumnParallelLinear,
    outside Transformer Engine's FP8 modules, and torchtitan's float8 recipes leave ``output`` out
    (``filter_fqns=["output"]``, torchtitan components/quantization/float8.md)."""
    peak, e_max, hd = gemm_curve(accel, params, "bf16")
    v_local = model.vocab / tp
    gemm = gemm_time_s(tokens, v_local, model.hidden, peak_flop_per_s=peak, e_max=e_max, half_dim=hd)
    loss_bytes = tokens * v_local * LOSS_TRAFFIC_BYTES_PER_LOGIT[loss]
    loss = loss_bytes / (accel.hbm_bytes_per_s * params.memory_efficiency)
    return gemm + loss / 2, 2 * gemm + loss / 2


def mtp_projection_time_s(model: ModelSpec, accel: AcceleratorSpec, params: ComputeParams, *, tokens: float,
                          tp: int, precision: str) -> float:
    """Forward time of one multi-token-prediction depth's projection of the concatenated normed hidden state
    and embedding, [T, 2D] x [2D, D / t] (Megatron-core's ``eh_proj``, column-parallel) [s]; its backward
    runs the shape twice."""
    peak, e_max, hd = gemm_curve(accel, params, precision)
    return gemm_time_s(tokens, model.hidden / tp, 2 * model.hidden, peak_flop_per_s=peak, e_max=e_max, half_dim=hd)


def optimizer_step_time_s(*, n_params_local: float, bytes_touched_per_param: float, accel: AcceleratorSpec,
                          params: ComputeParams) -> float:
    """Optimizer update, memory-bound [s]: every local parameter's states read and written once."""
    return n_params_local * bytes_touched_per_param / (accel.hbm_bytes_per_s * params.memory_efficiency)
