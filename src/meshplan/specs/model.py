"""Transformer architecture spec.

Symbols (docs/notation.md): L layers, D = ``hidden``, N heads, K KV heads, H head dim,
F = ``ffn_hidden``, V vocab, E experts, k = ``top_k``.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.errors import SpecError
from meshplan.specs._validate import boolean, non_negative_int, one_of, positive_int, positive_number, text
from meshplan.specs.layout import embedding_loss_layout

MAX_LAYERS = 100_000
"""The most decoder layers a model spec may have (the largest trained have a few hundred)."""
MAX_WIDTH = 1 << 30
"""The most a model's widths and counts may be (hidden size, heads, vocabulary, experts): beyond any model,
within floating point's exact integers once multiplied."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer (Llama / GPT style), dense or mixture-of-experts."""

    name: str
    n_layers: int
    """L, transformer blocks."""
    hidden: int
    """D, model width."""
    n_heads: int
    """N, query heads."""
    n_kv_heads: int
    """K, key/value heads (K = N for multi-head, K < N for grouped-query attention)."""
    ffn_hidden: int
    """F, intermediate size of a dense MLP."""
    vocab: int
    """V, vocabulary size."""
    gated_mlp: bool = True
    """SwiGLU-style MLP with three matrices (gate, up, down); False: two-matrix GeLU MLP."""
    tied_embeddings: bool = False
    """The LM head reuses the input embedding matrix."""
    head_dim: int | None = None
    """H; defaults to hidden / n_heads."""
    norm: str = "rmsnorm"
    """'rmsnorm' (weight only) or 'layernorm' (weight and bias)."""
    linear_bias: bool = False
    """Biases on the attention and MLP projections (GPT-2/3 style)."""
    qkv_bias: bool = False
    """Biases on the query, key and value projections only, not on the output projection nor the MLP (Qwen2,
    Hugging Face ``Qwen2Attention``: q/k/v ``bias=True``, o_proj ``bias=False``). Implied by linear_bias."""
    qk_norm: bool = False
    """An RMSNorm over each head's query and key before attention, one weight of the head width each, shared
    by the heads (Qwen3, Gemma 3: ``q_norm``, ``k_norm``; Megatron-core ``--qk-layernorm``)."""
    sandwich_norm: bool = False
    """Norms after attention and after the MLP as well as before them: four per layer (Gemma 2 and 3:
    ``post_attention_layernorm``, ``pre_feedforward_layernorm``, ``post_feedforward_layernorm``)."""
    router_bias: bool = False
    """The MoE router's linear has a bias, one per expert (GPT-OSS ``router.bias``)."""
    attention_sinks: bool = False
    """A learned sink logit per query head in every layer's softmax (GPT-OSS ``self_attn.sinks``): one
    parameter per head, no modelled time."""
    learned_pos_emb: int = 0
    """Rows of a learned absolute position embedding (0 for rotary)."""
    n_experts: int = 0
    """E, routed experts per MoE layer (0: dense model)."""
    top_k: int = 0
    """k, experts each token is routed to."""
    expert_ffn_hidden: int = 0
    """Intermediate size of one expert's MLP."""
    n_shared_experts: int = 0
    """Experts every token passes through (DeepSeek style), each of size expert_ffn_hidden."""
    n_dense_layers: int = 0
    """Leading layers with a dense MLP in an MoE model (DeepSeek-V3: 3)."""
    n_expert_groups: int = 0
    """Group-limited routing: the routed experts form this many equal groups of consecutive experts
    (DeepSeek-V3 ``n_group`` = 8, one per node of its 64-way EP); 0: no groups."""
    topk_groups: int = 0
    """Groups a token's experts may come from (DeepSeek-V3 ``topk_group`` = 4: at most 4 nodes)."""
    q_lora_rank: int = 0
    """Multi-head latent attention (MLA): rank of the query down-projection (0: no query compression)."""
    kv_lora_rank: int = 0
    """MLA: rank of the joint key/value compression; 0 means ordinary (grouped-query) attention."""
    qk_rope_head_dim: int = 0
    """MLA: per-head rotary part of queries and keys, added to head_dim (the non-rotary part)."""
    v_head_dim: int = 0
    """MLA: per-head value width (0: head_dim)."""
    attention_window: int = 0
    """Sliding-window attention: keys a query attends to in a windowed layer, itself included [tokens]
    (0: every layer attends over the whole sequence). GPT-OSS: 128 (Hugging Face ``sliding_window``;
    Megatron-Bridge ``window_size=(127, 0)``). Counted in model FLOPs and in FlashAttention's time (and
    masked in the PyTorch reference model); context-parallel exchanges are still charged as for global
    attention, and unfused attention computes every score."""
    global_attention_every: int = 0
    """With a window, every n-th layer attends over the whole sequence and the others over the window
    (0: every layer windowed). GPT-OSS: 2 (sliding and full layers alternate, Megatron-core
    ``window_attn_skip_freq=2``); Gemma 3: 6 (five local layers to one global)."""
    mtp_layers: int = 0
    """Multi-token prediction depth (DeepSeek-V3: 1, its ``num_nextn_predict_layers``). Megatron-core's MTP
    module, per depth, on the last pipeline stage: an embedding lookup of the shifted tokens, two norms, a
    2D -> D projection, one transformer layer of the last decoder layer's kind, and the LM head and loss
    again (megatron/core/transformer/multi_token_prediction.py). Its time and memory count on the last
    stage. meshplan's model FLOPs (MFU) leave it out; Megatron's own FLOP count includes it, so an MFU
    Megatron reports for such a model reads higher than meshplan's for the same step time."""
    nominal_params: float | None = None
    """The parameter count the model is known by, if it differs from the exact count."""
    source: str = ""
    """Where the architecture comes from."""

    def __post_init__(self) -> None:
        text("model.source", self.source)
        if not isinstance(self.name, str) or not self.name:
            raise SpecError("model.name", f"must be a non-empty string, got {self.name!r}")
        for f in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab"):
            positive_int(f"model.{f}", getattr(self, f), MAX_LAYERS if f == "n_layers" else MAX_WIDTH)
        for f in ("learned_pos_emb", "n_experts", "top_k", "expert_ffn_hidden", "n_shared_experts",
                  "n_dense_layers", "n_expert_groups", "topk_groups", "q_lora_rank", "kv_lora_rank",
                  "qk_rope_head_dim", "v_head_dim", "attention_window", "global_attention_every", "mtp_layers"):
            non_negative_int(f"model.{f}", getattr(self, f), MAX_WIDTH)
        if self.mtp_layers >= self.n_layers:
            raise SpecError("model.mtp_layers", f"must be below n_layers={self.n_layers}")
        if self.n_dense_layers > self.n_layers:
            raise SpecError("model.n_dense_layers", f"must be at most n_layers={self.n_layers}")
        one_of("model.norm", self.norm, ("rmsnorm", "layernorm"))
        for f in ("gated_mlp", "tied_embeddings", "linear_bias", "qkv_bias", "qk_norm", "sandwich_norm", "router_bias",
                  "attention_sinks"):
            boolean(f"model.{f}", getattr(self, f))
        if self.head_dim is not None:
            positive_int("model.head_dim", self.head_dim, MAX_WIDTH)
        elif self.hidden % self.n_heads:
            raise SpecError("model.n_heads", f"must divide hidden={self.hidden} (or give head_dim); "
                                             f"got {self.n_heads}")
        if self.n_expert_groups:
            if not self.n_experts or self.n_experts % self.n_expert_groups:
                raise SpecError("model.n_expert_groups", f"must divide n_experts={self.n_experts}; got "
                                                         f"{self.n_expert_groups}")
            if not 1 <= self.topk_groups <= self.n_expert_groups or \
                    self.topk_groups * self.n_experts // self.n_expert_groups < self.top_k:
                raise SpecError("model.topk_groups", f"must be 1..n_expert_groups={self.n_expert_groups} and "
                                                     f"hold top_k={self.top_k} experts; got {self.topk_groups}")
        elif self.topk_groups:
            raise SpecError("model.topk_groups", "needs n_expert_groups")
        if self.n_heads % self.n_kv_heads:
            raise SpecError("model.n_kv_heads", f"must divide n_heads={self.n_heads}; got {self.n_kv_heads}")
        if self.n_experts:
            if not 1 <= self.top_k <= self.n_experts:
                raise SpecError("model.top_k", f"must be in 1..n_experts={self.n_experts} for an MoE model; "
                                               f"got {self.top_k}")
            positive_int("model.expert_ffn_hidden", self.expert_ffn_hidden, MAX_WIDTH)
            if self.n_dense_layers >= self.n_layers:
                raise SpecError("model.n_dense_layers", f"must be below n_layers={self.n_layers}")
        elif self.top_k or self.n_shared_experts or self.router_bias:
            raise SpecError("model.n_experts", "top_k, shared experts and a router bias need n_experts > 0")
        if self.nominal_params is not None:
            positive_number("model.nominal_params", self.nominal_params, most=1e18)
        if self.global_attention_every and not self.attention_window:
            raise SpecError("model.global_attention_every", "needs attention_window > 0")
        if self.global_attention_every == 1:
            raise SpecError("model.global_attention_every",
                            "must be 0 (every layer windowed) or at least 2 (1 would leave no windowed layer: "
                            "set attention_window = 0)")

    @property
    def d_head(self) -> int:
        """H, per-head width."""
        return self.head_dim if self.head_dim is not None else self.hidden // self.n_heads

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def qk_head_dim(self) -> int:
        """Width of one head's query and key (MLA: non-rotary plus rotary part)."""
        return self.d_head + (self.qk_rope_head_dim if self.is_mla else 0)

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim or self.d_head

    @property
    def q_dim(self) -> int:
        """h_q = N·H, width of the attention output (the input of the output projection)."""
        return self.n_heads * self.value_head_dim

    @property
    def kv_dim(self) -> int:
        """h_kv = K·H, width of each of the key and value projections."""
        return self.n_kv_heads * self.d_head

    def layer_is_windowed(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) attends over the sliding window only: every layer but each
        global_attention_every-th (GPT-OSS: layers 0, 2, 4, ... windowed, 1, 3, 5, ... global)."""
        every = self.global_attention_every
        return bool(self.attention_window) and not (every and (layer + 1) % every == 0)

    @property
    def windowed_layers(self) -> int:
        """How many layers layer_is_windowed holds for (counted in closed form: the cost model asks often)."""
        if not self.attention_window:
            return 0
        return self.n_layers - (self.n_layers // self.global_attention_every if self.global_attention_every else 0)

    def embedding_loss_layout(self, chunks: int) -> str | None:
        """specs.layout.embedding_loss_layout for this model's layers over ``chunks`` model chunks; None for a
        model with multi-token prediction, whose layouts give the MTP layer and the loss the last chunk
        (cost.pipeline.mtp_chunk_layers) instead."""
        return None if self.mtp_layers else embedding_loss_layout(self.n_layers, chunks)

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.n_dense_layers if self.is_moe else 0
