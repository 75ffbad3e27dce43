"""Parameter counts per component.

Symbols: D hidden, F ffn_hidden, F_e expert_ffn_hidden, V vocab, L layers, h_q = N·H, h_kv = K·H,
E experts, k top_k.

References
----------
[1] H. Touvron et al., "Llama 2," arXiv:2307.09288 (RMSNorm, SwiGLU, GQA); counts match the Hugging Face
    implementations exactly (tests/test_params.py: 6,738,415,616 for Llama-2-7B).
[2] DeepSeek-AI, "DeepSeek-V3 Technical Report," arXiv:2412.19437, §2.1.1 (multi-head latent attention).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.specs import ModelSpec


def norm_params(*, hidden: int, kind: str) -> int:
    """Parameters of one normalisation layer [count]: D for RMSNorm, 2D for LayerNorm (weight, bias)."""
    return hidden if kind == "rmsnorm" else 2 * hidden


def attention_params(model: ModelSpec) -> int:
    """Attention projections of one layer [count], biases included.

    GQA: D·(h_q + 2·h_kv) + h_q·D, with the biases, query/key norms (2·H) and sink logits (N) the model
    has (Hugging Face's Qwen2, Qwen3 and GPT-OSS attention; tests/frameworks/test_hf.py). MLA [2]: query
    down/up projections (with their RMSNorm), the joint
    KV down-projection with the rotary key part, its RMSNorm, the KV up-projection and the output.
    """
    D, N = model.hidden, model.n_heads
    if model.is_mla:
        qk, v, rope = model.qk_head_dim, model.value_head_dim, model.qk_rope_head_dim
        if model.q_lora_rank:
            q = D * model.q_lora_rank + model.q_lora_rank + model.q_lora_rank * N * qk
        else:
            q = D * N * qk
        kv = D * (model.kv_lora_rank + rope) + model.kv_lora_rank + model.kv_lora_rank * N * (model.d_head + v)
        return q + kv + N * v * D
    hq, hkv = model.n_heads * model.d_head, model.kv_dim
    weights = D * (hq + 2 * hkv) + hq * D
    biases = (hq + 2 * hkv + D) if model.linear_bias else (hq + 2 * hkv) if model.qkv_bias else 0
    qk_norms = 2 * model.d_head if model.qk_norm else 0  # one RMSNorm weight of the head width for q, one for k
    sinks = N if model.attention_sinks else 0
    return weights + biases + qk_norms + sinks


def attention_replicated_params(model: ModelSpec) -> int:
    """The part of ``attention_params`` that tensor parallelism does not split [count]: MLA's down-projections
    of the query and of the joint KV (with the rotary key part) and their RMSNorms, which Megatron-core
    builds as ``TELinear(parallel_mode='duplicated')`` (multi_latent_attention.py) and torchtitan leaves
    unparallelised; 0 for GQA (its biases are split with their projections, the output's few D
    replicated ones aside)."""
    if not model.is_mla:
        return 0
    D, q_lora = model.hidden, model.q_lora_rank
    q = D * q_lora + q_lora if q_lora else 0
    return q + D * (model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank


def mlp_params(*, hidden: int, ffn_hidden: int, gated: bool, bias: bool) -> int:
    """One MLP [count]: 3·D·F gated (gate, up, down) or 2·D·F, plus biases."""
    n_in = 2 if gated else 1
    weights = (n_in + 1) * hidden * ffn_hidden
    biases = (n_in * ffn_hidden + hidden) if bias else 0
    return weights + biases


@dataclass(frozen=True, slots=True)
class ParamCounts:
    """Parameters by component [count]. Per-layer figures are for one layer of that kind."""

    embedding: int
    lm_head: int
    final_norm: int
    attention_per_layer: int
    norms_per_layer: int
    dense_mlp_per_layer: int
    router_per_moe_layer: int
    routed_experts_per_moe_layer: int
    shared_experts_per_moe_layer: int
    n_dense_layers: int
    n_moe_layers: int
    active_routed_fraction: float
    """k/E: the share of routed-expert parameters a token uses."""

    @property
    def dense_layer(self) -> int:
        return self.attention_per_layer + self.norms_per_layer + self.dense_mlp_per_layer

    @property
    def moe_layer_non_expert(self) -> int:
        """An MoE layer's parameters outside the routed experts (attention, norms, router, shared)."""
        return (self.attention_per_layer + self.norms_per_layer + self.router_per_moe_layer
                + self.shared_experts_per_moe_layer)

    @property
    def layers(self) -> int:
        return (self.n_dense_layers * self.dense_layer
                + self.n_moe_layers * (self.moe_layer_non_expert + self.routed_experts_per_moe_layer))

    @property
    def routed_experts(self) -> int:
        return self.n_moe_layers * self.routed_experts_per_moe_layer

    @property
    def total(self) -> int:
        return self.embedding + self.layers + self.final_norm + self.lm_head

    @property
    def non_expert(self) -> int:
        return self.total - self.routed_experts

    @property
    def active(self) -> float:
        """Parameters a token passes through (routed experts at k/E)."""
        return self.non_expert + self.routed_experts * self.active_routed_fraction

    @property
    def lm_head_matmul(self) -> int:
        """Weights of the output projection as a matmul (V·D even when tied to the embedding)."""
        return self.lm_head if self.lm_head else self.embedding - self.pos_embedding

    pos_embedding: int = 0
    attention_replicated_per_layer: int = 0
    """The part of ``attention_per_layer`` every TP rank holds whole (attention_replicated_params)."""

    def attention_per_tp_rank(self, tp: int) -> float:
        """One layer's attention parameters on a rank of ``tp`` tensor-parallel ranks [count]."""
        split = self.attention_per_layer - self.attention_replicated_per_layer
        return split / tp + self.attention_replicated_per_layer


def param_counts(model: ModelSpec) -> ParamCounts:
    """Exact parameter counts of ``model`` (the reference PyTorch model matches them; tests)."""
    D = model.hidden
    norm = norm_params(hidden=D, kind=model.norm)
    routed = 0
    shared = 0
    router = 0
    if model.is_moe:
        one_expert = mlp_params(hidden=D, ffn_hidden=model.expert_ffn_hidden, gated=model.gated_mlp,
                                bias=model.linear_bias)
        routed = model.n_experts * one_expert
        shared = model.n_shared_experts * one_expert
        router = model.n_experts * D + (model.n_experts if model.router_bias else 0)
    pos = model.learned_pos_emb * D
    return ParamCounts(
        embedding=model.vocab * D + pos,
        lm_head=0 if model.tied_embeddings else model.vocab * D,
        final_norm=norm,
        attention_per_layer=attention_params(model),
        norms_per_layer=(4 if model.sandwich_norm else 2) * norm,
        dense_mlp_per_layer=mlp_params(hidden=D, ffn_hidden=model.ffn_hidden, gated=model.gated_mlp,
                                       bias=model.linear_bias),
        router_per_moe_layer=router,
        routed_experts_per_moe_layer=routed,
        shared_experts_per_moe_layer=shared,
        n_dense_layers=model.n_layers - model.n_moe_layers,
        n_moe_layers=model.n_moe_layers,
        active_routed_fraction=(model.top_k / model.n_experts) if model.is_moe else 0.0,
        pos_embedding=pos,
        attention_replicated_per_layer=attention_replicated_params(model),
    )
