"""FLOPs per token and per step.

Symbols: S sequence length, L layers, N heads, H head dim, h_q = N·H, D hidden, V vocab.

A multiply-add counts as 2 FLOP. Forward + backward = 3 x forward (backward computes the input and
the weight gradient, each as costly as the forward).

References
----------
[1] A. Chowdhery et al., "PaLM," arXiv:2204.02311, Appendix B: 6N + 12·L·H·Q·T per token (attention
    counted non-causal), model FLOPs utilisation (MFU) versus hardware FLOPs utilisation (HFU).
[2] NVIDIA Megatron-LM, training.py::num_floating_point_operations: causal attention at half that.
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost.params import ParamCounts
from meshplan.specs import ModelSpec
from meshplan.specs.plan import recompute_modules_of


def matmul_flop_per_token_fwd(counts: ParamCounts) -> float:
    """Forward FLOPs of every weight matmul a token passes through [FLOP/token].

    .. math:: 2·(N_{active} - N_{embedding} - N_{norms}) + 2·V·D_{head\\ if\\ tied}

    Assumptions: embedding lookups and norms cost no matmul FLOPs; biases are counted as weights
    (a <0.01 % excess on GPT-3); the LM head counts even when tied to the embedding; routed experts at k/E.
    """
    norms = counts.n_dense_layers * counts.norms_per_layer + counts.n_moe_layers * counts.norms_per_layer
    norms += counts.final_norm
    matmul_params = counts.active - counts.embedding - norms + counts.lm_head_matmul - counts.lm_head
    return 2.0 * matmul_params


def attended_keys(seq_len: int, *, window: int, causal: bool) -> float:
    """Keys a query attends to, averaged over the sequence's queries [tokens].

    Whole sequence: S (the non-causal convention of [1]) or S/2 (causal, [2]). Sliding window of w < S
    keys: w by the non-causal convention; causally, query i sees min(i + 1, w) keys, which sum to
    S·w - w(w-1)/2 over the sequence.
    """
    if not window or window >= seq_len:
        return seq_len * (0.5 if causal else 1.0)
    return window - window * (window - 1) / (2.0 * seq_len) if causal else float(window)


def attention_flop_per_token_fwd(model: ModelSpec, *, seq_len: int, causal: bool) -> float:
    """Forward FLOPs of the attention core (QKᵀ and A·V) per token, all layers [FLOP/token].

    .. math:: 2·S·N·(H_{qk} + H_v)·L  (= 4·S·h_q·L when H_qk = H_v; halved for causal)

    with S replaced by the window's attended keys in sliding-window layers (attended_keys).
    References: [1] (non-causal), [2] (causal).
    """
    per_key = 2.0 * model.n_heads * (model.qk_head_dim + model.value_head_dim)
    windowed = model.windowed_layers
    keys = (model.n_layers - windowed) * attended_keys(seq_len, window=0, causal=causal)
    keys += windowed * attended_keys(seq_len, window=model.attention_window, causal=causal)
    return per_key * keys


def model_flop_per_token(model: ModelSpec, counts: ParamCounts, *, seq_len: int, causal: bool) -> float:
    """Model FLOPs per token, forward and backward [FLOP/token]: 6N + 12·L·h_q·S (PaLM) or 6N + 6·L·h_q·S."""
    return 3.0 * (matmul_flop_per_token_fwd(counts)
                  + attention_flop_per_token_fwd(model, seq_len=seq_len, causal=causal))


def attention_recomputed(recompute: str, flash_attention: bool, megatron: bool) -> bool:
    """Whether selective recomputation re-runs the attention core's forward in the backward: Megatron-core
    checkpoints it whenever 'core_attn' is among its modules (``checkpoint_core_attention``, attention.py),
    the fused kernel too; elsewhere it is the unfused attention's scores that are recomputed, which
    FlashAttention recomputes in its own backward anyway (the convention of [1] and torchtitan)."""
    return "core_attn" in recompute_modules_of(recompute) and (megatron or not flash_attention)


def recompute_flop_per_token(model: ModelSpec, counts: ParamCounts, *, seq_len: int, recompute: str,
                             flash_attention: bool, causal: bool, megatron: bool = False) -> float:
    """Extra forward FLOPs that activation recomputation executes [FLOP/token] (counted by HFU, not MFU).

    'full' re-runs each block's forward (matmuls of the blocks and attention; the LM head is not
    checkpointed); 'selective' re-runs the attention core (``attention_recomputed``: unfused, every score;
    under Megatron with FlashAttention the fused kernel's forward again), and with Megatron's modules
    ('selective:mlp+...', Plan.recompute_key) the matmuls of those it names: MLA's up-projections, the dense
    layers' MLPs, the MoE layers' shared experts (norms and activations: none).
    """
    attn = attention_flop_per_token_fwd(model, seq_len=seq_len, causal=causal)
    if recompute.startswith("selective"):
        modules = recompute_modules_of(recompute)
        extra = 0.0
        if attention_recomputed(recompute, flash_attention, megatron):
            extra += attn if flash_attention else attention_flop_per_token_fwd(  # unfused: every score
                replace(model, attention_window=0, global_attention_every=0), seq_len=seq_len, causal=causal)
        if "mla_up_proj" in modules and model.is_mla:
            extra += 2.0 * model.n_layers * model.n_heads * (  # without a q latent, the q projection itself
                (model.q_lora_rank or model.hidden) * model.qk_head_dim
                + model.kv_lora_rank * (model.d_head + model.value_head_dim))
        if "mlp" in modules:
            extra += 2.0 * counts.n_dense_layers * counts.dense_mlp_per_layer
        if "shared_experts" in modules:
            extra += 2.0 * counts.n_moe_layers * counts.shared_experts_per_moe_layer
        return extra
    if recompute == "full":
        return matmul_flop_per_token_fwd(counts) - 2.0 * counts.lm_head_matmul + attn
    if recompute == "sac":  # every other matmul of the blocks is recomputed
        return 0.5 * (matmul_flop_per_token_fwd(counts) - 2.0 * counts.lm_head_matmul)
    return 0.0
