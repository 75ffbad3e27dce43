"""A Llama-style reference transformer built from a :class:`meshplan.ModelSpec`, and a scaled-down spec.

The module tree uses torchtitan's attribute names (``tok_embeddings``, ``layers[i].attention``,
``.attention_norm``, ``.feed_forward`` or ``.moe``, ``.ffn_norm``, ``norm``, ``output``; projections
``wq wk wv wo`` and ``w1 w2 w3``) so that torchtitan's tensor-parallel layer plan applies to it unchanged.
Its parameter count equals :func:`meshplan.param_counts` exactly for every catalog model (tests/torch).

Symbols: D hidden, N heads, K KV heads, H head dim, F ffn_hidden, V vocab, E experts, k top_k.

References
----------
[1] pytorch/torchtitan, ``torchtitan/models/llama3/model/model.py`` (Attention, FeedForward,
    TransformerBlock, Transformer) and ``torchtitan/models/moe.py`` (GroupedExperts, router, shared experts).
[2] DeepSeek-AI, "DeepSeek-V3 Technical Report," arXiv:2412.19437, §2.1.1 (multi-head latent attention),
    layer layout as in ``torchtitan/models/deepseek_v3/model/model.py``.
[3] J. Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding," arXiv:2104.09864.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from meshplan.specs import ModelSpec

ROPE_THETA = 10000.0  # RoFormer [3] base


def _norm(spec: ModelSpec, dim: int, fk: dict) -> nn.Module:
    """RMSNorm (weight only) or LayerNorm (weight and bias), as ``spec.norm`` says."""
    if spec.norm == "layernorm":
        return nn.LayerNorm(dim, eps=1e-5, **fk)
    return nn.RMSNorm(dim, eps=1e-5, **fk)


def _rotate(x: torch.Tensor, positions: int) -> torch.Tensor:
    """Apply rotary embedding [3] (rotate-half form) to ``x`` of shape (b, s, heads, d), d even."""
    d = x.shape[-1]
    half = d // 2
    inv = ROPE_THETA ** (-torch.arange(0, half, device=x.device, dtype=torch.float32) / half)
    angles = torch.outer(torch.arange(positions, device=x.device, dtype=torch.float32), inv)
    cos = angles.cos()[None, :, None, :].to(x.dtype)
    sin = angles.sin()[None, :, None, :].to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int = 0) -> torch.Tensor:
    """Causal attention on (b, s, heads, d) tensors, over the last ``window`` keys (itself included) when
    ``window`` is set and shorter than the sequence; returns (b, s, heads·d_v)."""
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    s = q.shape[2]
    if window and window < s:
        pos = torch.arange(s, device=q.device)
        behind = pos[:, None] - pos[None, :]  # query i, key j: i - j
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=(behind >= 0) & (behind < window))
    else:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).flatten(2)


class Attention(nn.Module):
    """Grouped-query attention [1]: wq (D→N·H), wk, wv (D→K·H), wo (N·H→D), biases when spec.linear_bias.

    Head counts come from the local projection widths (``view(..., -1, H)``), so the module runs
    unchanged on tensor-parallel shards (torchtitan's convention).
    """

    def __init__(self, spec: ModelSpec, fk: dict, window: int = 0) -> None:
        super().__init__()
        D, H, b = spec.hidden, spec.d_head, spec.linear_bias
        self.window = window
        self.head_dim = H
        self.n_rep = spec.n_heads // spec.n_kv_heads
        self.rotary = spec.learned_pos_emb == 0
        self.wq = nn.Linear(D, spec.n_heads * H, bias=b, **fk)
        self.wk = nn.Linear(D, spec.n_kv_heads * H, bias=b, **fk)
        self.wv = nn.Linear(D, spec.n_kv_heads * H, bias=b, **fk)
        self.wo = nn.Linear(spec.n_heads * H, D, bias=b, **fk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, s, _ = x.shape
        q = self.wq(x).view(bs, s, -1, self.head_dim)
        k = self.wk(x).view(bs, s, -1, self.head_dim)
        v = self.wv(x).view(bs, s, -1, self.head_dim)
        if self.rotary:
            q, k = _rotate(q, s), _rotate(k, s)
        if self.n_rep > 1:  # torchtitan repeat_kv: FLOPs are those of N query heads
            k = k.repeat_interleave(self.n_rep, dim=2)
            v = v.repeat_interleave(self.n_rep, dim=2)
        return self.wo(_attend(q, k, v, self.window))


class MLAttention(nn.Module):
    """Multi-head latent attention [2], parameter layout of meshplan.cost.params.attention_params.

    Query: wq (D→N·H_qk) or, with q_lora_rank r_q, wq_a (D→r_q), q_norm, wq_b (r_q→N·H_qk).
    Keys and values: wkv_a (D→r_kv + H_rope), kv_norm (r_kv), wkv_b (r_kv→N·(H + H_v)); wo (N·H_v→D).
    H = spec.d_head is the non-rotary query/key part; H_qk = H + H_rope. No biases.
    """

    def __init__(self, spec: ModelSpec, fk: dict, window: int = 0) -> None:
        super().__init__()
        D, N = spec.hidden, spec.n_heads
        self.window = window
        self.nope, self.rope, self.v_dim = spec.d_head, spec.qk_rope_head_dim, spec.value_head_dim
        self.qk_dim = spec.qk_head_dim
        self.kv_rank = spec.kv_lora_rank
        if spec.q_lora_rank:
            self.wq_a = nn.Linear(D, spec.q_lora_rank, bias=False, **fk)
            self.q_norm = nn.RMSNorm(spec.q_lora_rank, eps=1e-6, **fk)
            self.wq_b = nn.Linear(spec.q_lora_rank, N * self.qk_dim, bias=False, **fk)
        else:
            self.wq = nn.Linear(D, N * self.qk_dim, bias=False, **fk)
        self.wkv_a = nn.Linear(D, self.kv_rank + self.rope, bias=False, **fk)
        self.kv_norm = nn.RMSNorm(self.kv_rank, eps=1e-6, **fk)
        self.wkv_b = nn.Linear(self.kv_rank, N * (self.nope + self.v_dim), bias=False, **fk)
        self.wo = nn.Linear(N * self.v_dim, D, bias=False, **fk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, s, _ = x.shape
        q = self.wq_b(self.q_norm(self.wq_a(x))) if hasattr(self, "wq_a") else self.wq(x)
        q = q.view(bs, s, -1, self.qk_dim)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        q = torch.cat([q_nope, _rotate(q_pe, s)], dim=-1)
        kv, k_pe = self.wkv_a(x).split([self.kv_rank, self.rope], dim=-1)
        k_pe = _rotate(k_pe.unsqueeze(2), s)  # one rotary key shared by every head
        kv = self.wkv_b(self.kv_norm(kv)).view(bs, s, -1, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, -1, k_nope.shape[2], -1)], dim=-1)
        return self.wo(_attend(q, k, v, self.window))


class FeedForward(nn.Module):
    """SwiGLU MLP w2(silu(w1 x) · w3 x) when gated, else GeLU MLP w2(gelu(w1 x)) [1]."""

    def __init__(self, spec: ModelSpec, ffn_hidden: int, fk: dict) -> None:
        super().__init__()
        D, b = spec.hidden, spec.linear_bias
        self.w1 = nn.Linear(D, ffn_hidden, bias=b, **fk)
        self.w2 = nn.Linear(ffn_hidden, D, bias=b, **fk)
        self.w3 = nn.Linear(D, ffn_hidden, bias=b, **fk) if spec.gated_mlp else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is None:
            return self.w2(F.gelu(self.w1(x)))
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class GroupedExperts(nn.Module):
    """E expert MLPs held as stacked weights [1]: w1, w3 (E, F_e, D), w2 (E, D, F_e), biases b1 b2 b3."""

    def __init__(self, spec: ModelSpec, n_experts: int, fk: dict) -> None:
        super().__init__()
        E, D, Fe = n_experts, spec.hidden, spec.expert_ffn_hidden
        self.gated = spec.gated_mlp
        self.w1 = nn.Parameter(torch.empty(E, Fe, D, **fk))
        self.w2 = nn.Parameter(torch.empty(E, D, Fe, **fk))
        self.w3 = nn.Parameter(torch.empty(E, Fe, D, **fk)) if spec.gated_mlp else None
        self.b1 = nn.Parameter(torch.zeros(E, Fe, **fk)) if spec.linear_bias else None
        self.b2 = nn.Parameter(torch.zeros(E, D, **fk)) if spec.linear_bias else None
        self.b3 = nn.Parameter(torch.zeros(E, Fe, **fk)) if spec.linear_bias and spec.gated_mlp else None
        for w in (self.w1, self.w2, self.w3):
            if w is not None and w.device.type != "meta":
                nn.init.normal_(w, std=0.02)

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` on tokens ``x`` (n, D)."""

        def bias(b: nn.Parameter | None) -> torch.Tensor | None:
            return None if b is None else b[e]

        h = F.linear(x, self.w1[e], bias(self.b1))
        h = F.silu(h) * F.linear(x, self.w3[e], bias(self.b3)) if self.gated else F.gelu(h)
        return F.linear(h, self.w2[e], bias(self.b2))


class MoE(nn.Module):
    """Token-choice top-k mixture of experts [1]: router (D→E, no bias), E routed experts, shared experts."""

    def __init__(self, spec: ModelSpec, fk: dict) -> None:
        super().__init__()
        self.top_k = spec.top_k
        self.router = nn.Linear(spec.hidden, spec.n_experts, bias=False, **fk)
        self.experts = GroupedExperts(spec, spec.n_experts, fk)
        self.shared_experts = GroupedExperts(spec, spec.n_shared_experts, fk) if spec.n_shared_experts else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, chosen = self.router(x).softmax(dim=-1).topk(self.top_k, dim=-1)
        out = torch.zeros_like(x)
        for e in range(self.experts.w1.shape[0]):
            token, slot = torch.where(chosen == e)
            if token.numel():
                y = self.experts.expert(e, x[token]) * weights[token, slot, None].to(x.dtype)
                out = out.index_add(0, token, y)
        if self.shared_experts is not None:
            for e in range(self.shared_experts.w1.shape[0]):
                out = out + self.shared_experts.expert(e, x)
        return out.reshape(shape)


class TransformerBlock(nn.Module):
    """Pre-norm block: h = x + attention(attention_norm(x)); out = h + ffn(ffn_norm(h)) [1]."""

    def __init__(self, spec: ModelSpec, layer_id: int, fk: dict) -> None:
        super().__init__()
        self.attention_norm = _norm(spec, spec.hidden, fk)
        window = spec.attention_window if spec.layer_is_windowed(layer_id) else 0
        self.attention = MLAttention(spec, fk, window) if spec.is_mla else Attention(spec, fk, window)
        self.ffn_norm = _norm(spec, spec.hidden, fk)
        self.moe_enabled = spec.is_moe and layer_id >= spec.n_dense_layers
        if self.moe_enabled:
            self.moe = MoE(spec, fk)
        else:
            self.feed_forward = FeedForward(spec, spec.ffn_hidden, fk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        ffn = self.moe if self.moe_enabled else self.feed_forward
        return h + ffn(self.ffn_norm(h))


class Transformer(nn.Module):
    """Decoder-only transformer: tokens (b, s) → logits (b, s, V)."""

    def __init__(self, spec: ModelSpec, fk: dict) -> None:
        super().__init__()
        self.spec = spec
        self.tok_embeddings = nn.Embedding(spec.vocab, spec.hidden, **fk)
        self.pos_embeddings = nn.Embedding(spec.learned_pos_emb, spec.hidden, **fk) if spec.learned_pos_emb else None
        self.layers = nn.ModuleList(TransformerBlock(spec, i, fk) for i in range(spec.n_layers))
        self.norm = _norm(spec, spec.hidden, fk)
        self.output = nn.Linear(spec.hidden, spec.vocab, bias=False, **fk)
        if spec.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        if self.pos_embeddings is not None:
            h = h + self.pos_embeddings(torch.arange(tokens.shape[1], device=tokens.device))
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def build_model(spec: ModelSpec, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
                ) -> nn.Module:
    """The reference transformer of ``spec`` on ``device`` (``"meta"`` builds any catalog model for free).

    ``sum(p.numel() for p in model.parameters()) == meshplan.param_counts(spec).total`` (tied weights counted once).
    """
    return Transformer(spec, {"device": torch.device(device), "dtype": dtype})


def _round_to(x: float, multiple: int, minimum: int) -> int:
    return max(minimum, multiple * round(x / multiple))


def scale_down(spec: ModelSpec, *, hidden: int = 256, n_layers: int = 2, vocab: int = 512) -> ModelSpec:
    """A CPU-sized copy of ``spec`` that keeps its shape: GQA ratio N/K, attention width N·H/D, F/D,
    gating, norm, biases, tied embeddings, MLA ranks relative to D, and the MoE layout (some dense layers,
    then MoE layers with shared experts).

    KV heads are capped at 8 (so TP degrees up to 8 divide them when the original's do), query heads at 64;
    widths are rounded to multiples of 64 (FFN) or 8 so FSDP shards split evenly up to 64 ranks where
    possible. ``n_layers`` counts the MoE layers of an MoE model, after at most one dense layer.
    """
    ratio = spec.n_heads // spec.n_kv_heads
    n_kv = min(spec.n_kv_heads, 8)
    while n_kv > 1 and n_kv * ratio > 64:
        n_kv //= 2
    n_heads = n_kv * ratio
    width_ratio = spec.n_heads * spec.d_head / spec.hidden
    head_dim = max(4, 2 * round(width_ratio * hidden / n_heads / 2))
    explicit_head = spec.head_dim is not None or n_heads * head_dim != hidden or hidden % n_heads
    scale = hidden / spec.hidden
    changes: dict = {
        "name": f"{spec.name}-scaled", "hidden": hidden, "n_heads": n_heads, "n_kv_heads": n_kv,
        "head_dim": head_dim if explicit_head else None,
        "ffn_hidden": _round_to(spec.ffn_hidden * scale, 64, 64), "vocab": vocab,
        "learned_pos_emb": min(spec.learned_pos_emb, 256), "nominal_params": None,
        "source": f"meshplan.harness.reference_model.scale_down of {spec.name}",
    }
    if spec.is_mla:
        changes.update(
            q_lora_rank=_round_to(spec.q_lora_rank * scale, 8, 8) if spec.q_lora_rank else 0,
            kv_lora_rank=_round_to(spec.kv_lora_rank * scale, 8, 8),
            qk_rope_head_dim=max(2, 2 * round(head_dim * spec.qk_rope_head_dim / spec.d_head / 2)),
            v_head_dim=max(2, 2 * round(head_dim * spec.value_head_dim / spec.d_head / 2)),
        )
    n_dense = 0
    if spec.is_moe:
        n_experts = min(spec.n_experts, 8)
        top_k = max(min(spec.top_k, 2), round(spec.top_k * n_experts / spec.n_experts))
        n_dense = min(spec.n_dense_layers, 1)
        changes.update(n_experts=n_experts, top_k=min(top_k, n_experts), n_dense_layers=n_dense,
                       n_shared_experts=min(spec.n_shared_experts, 2),
                       expert_ffn_hidden=_round_to(spec.expert_ffn_hidden * scale, 64, 64))
    changes["n_layers"] = n_dense + n_layers
    return replace(spec, **changes)


def reference_seq_len(spec: ModelSpec, default: int = 64) -> int:
    """A sequence length the scaled model accepts (at most its learned position table)."""
    return min(default, spec.learned_pos_emb) if spec.learned_pos_emb else default


__all__ = ["build_model", "reference_seq_len", "scale_down"]
