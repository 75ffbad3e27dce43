"""The GEMM shapes a plan runs per layer, after tensor- and context-parallel splitting.

Symbols (docs/notation.md): D hidden, N query heads, K KV heads, H head dim, F ffn_hidden, V vocab,
h_q = N·H, h_kv = K·H; T = mbs·S/cp tokens per rank and micro-batch; t = tp.

A GEMM ``[m, k] x [k, n]`` costs 2·m·n·k FLOP (one multiply-add = 2 FLOP).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.specs import ModelSpec, Plan


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmShape:
    """One matrix product ``[m, k] x [k, n]`` and where it comes from."""

    name: str
    """What runs it, e.g. 'attention.qkv' or 'square'."""
    m: int
    """Rows of the activation (tokens). [tokens]"""
    n: int
    """Output columns."""
    k: int
    """Reduction dimension."""

    @property
    def flop(self) -> float:
        """2·m·n·k [FLOP]."""
        return 2.0 * self.m * self.n * self.k


BACKWARD_OVER_FORWARD = 2.5
"""Attention backward FLOPs over forward FLOPs (FlashAttention-2 §3.1.2; meshplan.cost.compute.layer_times)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionShape:
    """Causal self-attention of ``b`` sequences of ``s`` tokens over ``heads`` query heads (one rank)."""

    b: int
    """Sequences per call (the micro-batch)."""
    s: int
    """Tokens per sequence, queries and keys alike. [tokens]"""
    heads: int
    """Query heads on this rank (after tensor-parallel splitting)."""
    head_dim: int

    @property
    def flop_fwd_unmasked(self) -> float:
        """Forward FLOPs without the causal mask, QKᵀ and A·V: 4·b·s²·heads·head_dim [FLOP]."""
        return 4.0 * self.b * self.s * self.s * self.heads * self.head_dim

    @property
    def flop_fwd(self) -> float:
        """Causal forward FLOPs, masked half skipped [FLOP]."""
        return self.flop_fwd_unmasked / 2.0

    @property
    def flop_fwd_bwd(self) -> float:
        return self.flop_fwd * (1.0 + BACKWARD_OVER_FORWARD)


def _split(width: int, parts: int, what: str) -> int:
    if width % parts:
        raise ValueError(f"{what}={width} is not divisible by tp={parts}")
    return width // parts


def plan_gemm_shapes(model: ModelSpec, plan: Plan, *, seq_len: int) -> list[GemmShape]:
    """Per-layer forward GEMMs of ``model`` on one rank under ``plan`` (tp/cp split), plus the LM head.

    Parameters
    ----------
    model : ModelSpec
        The architecture (dense or MoE; MLA is treated as ordinary attention of width N·H).
    plan : Plan
        Uses ``tp``, ``cp``, ``ep`` and ``mbs`` (None: 1).
    seq_len : int
        S, tokens per sequence. [tokens]

    Returns
    -------
    list of GemmShape
        ``[T, D]x[D, (h_q+2h_kv)/t]``, ``[T, h_q/t]x[h_q/t, D]``, ``[T, D]x[D, 2F/t]`` (gated) or
        ``F/t``, ``[T, F/t]x[F/t, D]`` and ``[T, D]x[D, V/t]``, with T = mbs·S/cp. MoE layers add the
        expert GEMMs with T·k/E tokens per expert (balanced routing, expert-TP = 1).

    Notes
    -----
    Megatron-style column/row split (Shoeybi et al., "Megatron-LM", arXiv:1909.08053, §3, Fig. 3);
    the backward pass runs two GEMMs of the same size per forward GEMM (transposed operands), so the
    forward shapes are the ones to time. Assumption: sequence parallelism gathers the full T tokens
    before the column-parallel GEMMs, so m = T whether or not SP is on.
    """
    t, cp = plan.tp, plan.cp
    mbs = plan.mbs or 1
    if (mbs * seq_len) % cp:
        raise ValueError(f"mbs·seq_len={mbs * seq_len} is not divisible by cp={cp}")
    T = mbs * seq_len // cp
    D, F, V = model.hidden, model.ffn_hidden, model.vocab
    h_q_in = model.n_heads * model.qk_head_dim
    h_kv = model.kv_dim
    h_o = model.q_dim
    shapes = [
        GemmShape(name="attention.qkv", m=T, k=D, n=_split(h_q_in + 2 * h_kv, t, "h_q+2h_kv")),
        GemmShape(name="attention.out", m=T, k=_split(h_o, t, "h_q"), n=D),
    ]
    mlp_in = 2 * F if model.gated_mlp else F
    if not model.is_moe or model.n_dense_layers:
        shapes += [GemmShape(name="mlp.in", m=T, k=D, n=_split(mlp_in, t, "mlp width")),
                   GemmShape(name="mlp.out", m=T, k=_split(F, t, "F"), n=D)]
    if model.is_moe:
        Fe = model.expert_ffn_hidden
        tokens_per_expert = max(1, T * model.top_k // model.n_experts)
        e_in = 2 * Fe if model.gated_mlp else Fe
        shapes += [GemmShape(name="expert.in", m=tokens_per_expert, k=D, n=e_in),
                   GemmShape(name="expert.out", m=tokens_per_expert, k=Fe, n=D)]
    shapes.append(GemmShape(name="lm_head", m=T, k=D, n=-(-V // t)))  # ceil: an uneven vocab is padded
    return shapes


def default_gemm_shapes(*, gpu: bool) -> list[GemmShape]:
    """The sweep without a model: square products and skinny (few-token) ones.

    Sizes are multiples of 128 (tensor-core tiles). On a GPU squares go to 16384 (2·16384³ = 8.8
    TFLOP, ~10 ms on an H100); on a CPU to 2048 so the sweep takes seconds.
    """
    squares = (1024, 2048, 4096, 8192, 16384) if gpu else (256, 512, 1024, 2048)
    wide = 8192 if gpu else 2048
    out = [GemmShape(name="square", m=s, n=s, k=s) for s in squares]
    for m in (16, 128, 512) if gpu else (16, 128):
        out.append(GemmShape(name="skinny", m=m, n=wide, k=wide))
    out.append(GemmShape(name="tall", m=wide * 4 if gpu else wide, n=wide // 4, k=wide))
    return out


def plan_attention_shape(model: ModelSpec, plan: Plan, *, seq_len: int) -> AttentionShape:
    """The attention core of one layer on one rank under ``plan``: mbs sequences of S tokens over N/t heads.

    Context parallelism is not split here: ring attention runs cp blocks of S/cp queries against
    S/cp keys, a different kernel mix; ``ValueError`` for cp > 1 and for MLA (query-key and value head
    dimensions differ)."""
    if plan.cp > 1:
        raise ValueError("attention timing runs whole sequences; the plan has cp > 1")
    if model.is_mla:
        raise ValueError("attention timing runs ordinary attention; the model uses MLA")
    return AttentionShape(b=plan.mbs or 1, s=seq_len, heads=_split(model.n_heads, plan.tp, "n_heads"),
                          head_dim=model.d_head)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertShape:
    """One forward expert GEMM of an MoE layer on one rank: ``groups`` experts, each ``[m, k] x [k, n]``."""

    name: str
    """'expert.in' (D to 2F or F) or 'expert.out' (F to D)."""
    groups: int
    """Experts on the rank (E/ep)."""
    m: int
    """Tokens routed to each expert in the micro-batch (balanced routing). [tokens]"""
    n: int
    k: int

    @property
    def flop(self) -> float:
        """2·groups·m·n·k [FLOP]."""
        return 2.0 * self.groups * self.m * self.n * self.k


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutingShape:
    """The router and the token permutation of one MoE layer on one rank and micro-batch."""

    tokens: int
    """Tokens the rank routes (T after sequence parallelism). [tokens]"""
    hidden: int
    top_k: int
    n_experts: int


MOE_SWEEP = (0.125, 0.25, 0.5, 1.0, 2.0)
"""Multiples of a plan's tokens per expert that ``plan_expert_shapes`` also times: the curve around the
plan's point (fewer tokens per expert: smaller micro-batches, more experts per token, or more EP ranks)."""


def plan_routing_shape(model: ModelSpec, plan: Plan, *, seq_len: int) -> RoutingShape:
    """The tokens one rank routes per micro-batch under ``plan``: T = mbs·S/cp, split over tp by sequence
    parallelism (Megatron-core's MoE layers route the rank's sequence-parallel share)."""
    if not model.is_moe:
        raise ValueError(f"{model.name} has no routed experts")
    mbs = plan.mbs or 1
    if (mbs * seq_len) % (plan.cp * plan.tp):
        raise ValueError(f"mbs·seq_len={mbs * seq_len} is not divisible by cp·tp={plan.cp * plan.tp}")
    return RoutingShape(tokens=mbs * seq_len // (plan.cp * plan.tp), hidden=model.hidden, top_k=model.top_k,
                        n_experts=model.n_experts)


def plan_expert_shapes(model: ModelSpec, plan: Plan, *, seq_len: int,
                       sweep: tuple[float, ...] = MOE_SWEEP) -> list[ExpertShape]:
    """The expert GEMMs of ``model`` on one rank under ``plan``, at the plan's tokens per expert and at the
    ``sweep`` multiples of it.

    A rank holds E/ep experts; each receives, from the ep ranks' T tokens (``plan_routing_shape``),
    m = ep·T·k/E of them on average. Shapes ``[m, D] x [D, 2F]`` (gated; ``F`` otherwise) and
    ``[m, F] x [F, D]``, F the expert FFN width (expert-TP 1)."""
    routing = plan_routing_shape(model, plan, seq_len=seq_len)
    if model.n_experts % plan.ep:
        raise ValueError(f"n_experts={model.n_experts} is not divisible by ep={plan.ep}")
    groups = model.n_experts // plan.ep
    mean = plan.ep * routing.tokens * model.top_k / model.n_experts
    fe = model.expert_ffn_hidden
    out = []
    for f in sweep:
        m = max(1, round(mean * f))
        out += [ExpertShape(name="expert.in", groups=groups, m=m, k=model.hidden, n=(2 if model.gated_mlp else 1) * fe),
                ExpertShape(name="expert.out", groups=groups, m=m, k=fe, n=model.hidden)]
    return out


def default_expert_shapes(*, gpu: bool) -> list[ExpertShape]:
    """The sweep without a model: 8 experts of width 2048 (GPU) or 256 (CPU) on hidden 4096 or 512, from 32
    to 4,096 tokens per expert (GPU) or 16 to 512 (CPU), first GEMM only."""
    d, f = (4096, 2048) if gpu else (512, 256)
    ms = (32, 128, 512, 1024, 4096) if gpu else (16, 64, 256, 512)
    return [ExpertShape(name="expert.in", groups=8, m=m, k=d, n=2 * f) for m in ms]
