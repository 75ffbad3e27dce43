"""Per-GPU memory: model states, activations, transient buffers, runtime overheads. All [bytes].

Symbols: Ψ parameters a rank's model shard holds before data-parallel sharding (after TP, PP, EP),
N_d the sharding degree, b micro-batch size, S sequence, T = b·S/cp tokens on a rank, D hidden,
h_q, h_kv attention widths, F (expert) FFN width, V vocab, t tensor-parallel degree.

References
----------
[1] S. Rajbhandari et al., "ZeRO," arXiv:1910.02054, §3.1 and §5.1: 16Ψ mixed-precision Adam
    (2 + 2 + K, K = 12), ZeRO-1 4Ψ + KΨ/N_d, ZeRO-2 2Ψ + 14Ψ/N_d, ZeRO-3 16Ψ/N_d.
[2] Megatron-LM theoretical_memory_usage.py and dist_optimizer.md: 18Ψ (bf16 params, fp32 grads,
    fp32 main params + Adam), distributed optimizer 6Ψ + 12Ψ/d.
[3] PyTorch FSDP2 (_fully_shard.py, _fsdp_param.py): sharded parameters stay in their original dtype
    (fp32) and serve as the optimizer's master copy; gradients are reduce-scattered in reduce_dtype;
    with set_requires_gradient_sync(False) unsharded gradients accumulate in reduce_dtype.
[4] V. Korthikanti et al., arXiv:2205.05198, Table 2: activation bytes per layer sbh(34 + 5as/h),
    /t with tensor and sequence parallelism; 2sbh per layer with full recomputation.
[5] PyTorch DistributedDataParallel (torch/nn/parallel/distributed.py, torch 2.13): the reducer allocates
    its gradient buckets, together as large as every gradient, when it is built and keeps them; with
    ``gradient_as_bucket_view=False`` (the default, which torchtitan's ``replicate(..., bucket_cap_mb=100)``
    keeps) ``param.grad`` is a separate tensor that each bucket copies in before its
    all-reduce and back after.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.specs import ModelSpec

# Optimizer state bytes per parameter, excluding any fp32 master copy (formulas.md §4.1).
OPTIMIZER_STATE_BYTES = {
    "adamw": 8.0,               # fp32 m and v [1]
    "adamw-bf16-moments": 4.0,  # bf16 m and v (DeepSeek-V3 §3.3; Megatron precision-aware optimizer)
    "adam-8bit": 2.0,           # int8 block-wise m and v (bitsandbytes docs: 75 % less optimizer memory)
    "sgd-momentum": 4.0,        # fp32 momentum buffer
    "sgd": 0.0,
    "adafactor": 0.0,           # factored second moment: 4·(rows+cols) B per matrix, <0.1 %; no momentum
}


@dataclass(frozen=True, slots=True)
class StateBytes:
    """Bytes per parameter of each model state, and whether N_d divides it."""

    params: float
    params_sharded: bool
    grads: float
    grads_sharded: bool
    master: float
    optimizer: float


def state_bytes_per_param(*, sharding: str, optimizer: str, dp_sharded: bool, reduce_dtype_bytes: float
                          ) -> StateBytes:
    """Bytes per parameter of parameters, gradients, master weights and optimizer state [bytes/param].

    - 'fsdp' (PyTorch FSDP2 full shard; DDP when not sharded): fp32 params (the master copy), gradients
      in the reduce dtype (fp32 unsharded: DDP's are the parameters' own [5]), optimizer state; everything
      sharded over N_d [3]. 4 + 4 + 8 = 16 with AdamW.
    - 'zero1'/'zero2'/'zero3' (DeepSpeed bf16): bf16 params and grads, fp32 master, optimizer [1].
    - 'megatron': bf16 params, a gradient buffer in the reduce dtype (not sharded; fp32 unless
      grad_reduce_in_fp32=False), fp32 main params and optimizer state sharded by the distributed
      optimizer [2]. 18 without sharding with an fp32 buffer, 16 with a bf16 one.
    """
    k = OPTIMIZER_STATE_BYTES[optimizer]
    if sharding == "fsdp":  # unsharded (DDP), ``param.grad`` keeps the parameter's fp32; a reduce dtype
        # is then a comm hook's, casting a copy for the all-reduce
        return StateBytes(4.0, dp_sharded, reduce_dtype_bytes if dp_sharded else 4.0, dp_sharded, 0.0, k)
    if sharding == "megatron":
        return StateBytes(2.0, False, reduce_dtype_bytes, False, 4.0, k)
    stage = int(sharding[-1])
    return StateBytes(2.0, stage >= 3, 2.0, stage >= 2, 4.0, k)


def model_state_bytes(*, n_params: float, shard_degree: int, state: StateBytes) -> dict[str, float]:
    """Model states of ``n_params`` parameters sharded ``shard_degree`` ways, by term [bytes]."""
    d = float(shard_degree)
    return {
        "params": n_params * state.params / (d if state.params_sharded else 1.0),
        "grads": n_params * state.grads / (d if state.grads_sharded else 1.0),
        "master_params": n_params * state.master / d,
        "optimizer_state": n_params * state.optimizer / d,
    }


def ddp_bucket_bytes(state_terms: dict[str, float]) -> float:
    """PyTorch DDP's gradient buckets [bytes]: a second copy of every gradient the rank holds (the
    ``grads`` terms of ``model_state_bytes``, dense and expert), kept for the whole run [5]. Measured under
    a fake process group on the reference model: the buckets' buffers total the gradients' bytes exactly
    and share no storage with ``param.grad`` (tests/torch/test_crosscheck.py)."""
    return sum(v for k, v in state_terms.items() if k.endswith("grads"))


def layer_activation_bytes_per_token(model: ModelSpec, *, ffn_hidden: int, tp: int, sp: bool,
                                     flash_attention: bool, seq_len: int, moe_tokens_factor: float = 0.0,
                                     moe_ffn_hidden: int = 0, n_shared: int = 0, expert_tp: int = 1,
                                     fp8_inputs: bool = False, gathered_inputs: bool = False,
                                     kv_expanded: bool = False, glu_saves_activation: bool = False) -> float:
    """Activation bytes one layer saves for backward, per token on the rank, no recompute [bytes/token].

    .. math:: 8D/t_{sp} + (4h_q + 4h_{kv} + 6F)/t  + 2·N·S/t\\ (no\\ FlashAttention)

    Generalises [4] Table 2 to GQA and SwiGLU (formulas.md §3.8): norm inputs 4D, QKV and MLP inputs 2D
    each (all replicated unless sequence-parallel; the QKV and MLP inputs replicated under it too with
    ``gathered_inputs``, PyTorch's tensor parallelism: activation_parts_per_token), Q, K, V and attention
    output 2 bytes each, gated MLP 6F (4F for GeLU; 8F with ``glu_saves_activation``, eager PyTorch's:
    JobSpec.glu_saves_activation). No dropout (Llama-style); bf16 activations. Without
    FlashAttention the softmax output (2·N·S bytes per token) is stored too.
    For an MoE layer, ``moe_tokens_factor`` = k·capacity·imbalance expert-token copies per token, each
    storing 6F_e (gated) plus its dispatched input and combined output (2D each); shared experts store
    6F_e per token each. With the experts split over TP (``expert_tp`` > 1, Plan.expert_tp) each rank
    holds every token's copies with 1/t of their FFN (under expert parallelism too: the expert-TP
    all-gather brings it as many copies as its TP group routed): the dispatched inputs and combined
    outputs are not divided by t. With whole experts a rank routes its own tokens: 1/t of them under sequence
    parallelism, all of them without.
    With ``fp8_inputs`` (Transformer Engine's FP8 linears: the input a weight gradient needs is saved as
    the FP8 copy the forward GEMM already made, ``saved_inputmat_t = inputmat_t`` in TE 1.x's Linear; TE
    2.x keeps only the columnwise FP8 data, MXFP8 included) a GEMM input that nothing else keeps is stored
    at 1 byte: the QKV input, a dense layer's MLP input, the MLP's second input and each routed copy's
    dispatched input. Kept in bf16 beside their FP8 copy: the attention output, which FlashAttention saves
    for its own backward (2 + 1 bytes), and an MoE layer's MLP input, which the router (a bf16 GEMM)
    saves. Norm inputs, Q/K/V, the first MLP output and MLA's latents stay bf16.
    """
    return sum(activation_parts_per_token(
        model, ffn_hidden=ffn_hidden, tp=tp, sp=sp, flash_attention=flash_attention, seq_len=seq_len,
        moe_tokens_factor=moe_tokens_factor, moe_ffn_hidden=moe_ffn_hidden, n_shared=n_shared,
        expert_tp=expert_tp, fp8_inputs=fp8_inputs, gathered_inputs=gathered_inputs,
        kv_expanded=kv_expanded, glu_saves_activation=glu_saves_activation).values())


def activation_parts_per_token(model: ModelSpec, *, ffn_hidden: int, tp: int, sp: bool, flash_attention: bool,
                               seq_len: int, moe_tokens_factor: float = 0.0, moe_ffn_hidden: int = 0,
                               n_shared: int = 0, expert_tp: int = 1, fp8_inputs: bool = False,
                               gathered_inputs: bool = False, kv_expanded: bool = False,
                               glu_saves_activation: bool = False) -> dict[str, float]:
    """``layer_activation_bytes_per_token`` by the tensor that holds it, each on the rank's share of the
    tokens [bytes/token]: 'norm_inputs', 'qkv_input', 'mlp_input' (the two norms' outputs), 'qkv' (Q, K, V
    as attention saves them), 'attn_out', 'mla_latents', 'mlp' (a dense layer's MLP; an MoE layer's shared
    experts), 'routed_act1' (each routed copy's first expert-GEMM output), 'routed_act2' (the activation
    output, the second GEMM's input), 'routed_io' (dispatched inputs and combined outputs), 'scores'
    (unfused attention's softmax output). Megatron's selective recomputation frees some of them
    (selective_freed_bytes_per_token).

    ``gathered_inputs``: under sequence parallelism the QKV and MLP inputs are held whole, as the
    all-gather delivered them, not as the rank's shard. PyTorch's tensor parallelism (torchtitan's plan:
    ``SequenceParallel`` norms, then ``ColwiseParallel`` linears whose inputs are redistributed to
    ``Replicate``) saves the gathered input for the weight gradient, since its backward gathers nothing
    again; Megatron-core saves the shard and gathers it again in backward (``comm``'s "SP input
    re-gather"). Measured under a fake process group with ``saved_tensors_hooks`` on the harness's
    ``apply_tp`` (tp=4): wq/wk/wv and w1/w3 save the full sequence, the norms their shard.

    ``kv_expanded``: attention saves K and V repeated to every query head (JobSpec.attention_kv_expanded:
    torchtitan's ``repeat_kv`` before SDPA), not at the KV heads. Measured on the harness's model, which
    attends as torchtitan does (tests/torch/test_saved_activations.py): SDPA saves Q, K and V at every
    query head, and its output, whose storage the output projection saves again as its input (SDPA
    returns the output in the projection's layout, so torchtitan's ``transpose(1, 2).contiguous()``
    copies nothing): one copy.

    ``glu_saves_activation``: a gated MLP run as eager PyTorch ops, w2(silu(w1 x) · w3 x), saves silu's
    input, its output and w3's output for the product's backward and the product for w2's: four tensors of
    the FFN width, where a fused SwiGLU (Megatron-core's, or torch.compile's) saves three. Measured with
    ``saved_tensors_hooks`` on the harness's model (tests/torch/test_saved_activations.py), eager and
    compiled (torch 2.13, CPU; which tensors autograd saves does not depend on the device)."""
    D = model.hidden
    t = float(tp)
    g = 1.0 if fp8_inputs else 2.0  # bytes per element of a GEMM input saved by its linear alone
    moe_layer = bool(moe_tokens_factor)
    rep = t if sp else 1.0  # norms and the GEMM inputs they feed: split only under sequence parallelism
    rep_in = 1.0 if gathered_inputs else rep  # the GEMM inputs: whole where the all-gathered copy is saved
    parts = {"norm_inputs": 4.0 * D / rep, "qkv_input": g * D / rep_in,
             "mlp_input": (2.0 if moe_layer else g) * D / rep_in}
    kv_heads = model.n_heads if kv_expanded else model.n_kv_heads
    qkv = 2.0 * model.n_heads * model.qk_head_dim + 2.0 * kv_heads * model.qk_head_dim
    qkv += 2.0 * kv_heads * model.value_head_dim
    parts["qkv"] = qkv / t
    # the attention output: the projection's input; FlashAttention also keeps it in bf16 for its backward
    parts["attn_out"] = (2.0 + (1.0 if fp8_inputs else 0.0) if flash_attention else g) * model.q_dim / t
    if model.is_mla:  # MLA also stores its compressed latents (q and kv) for the up-projections
        parts["mla_latents"] = 2.0 * (model.q_lora_rank + model.kv_lora_rank) / t
    # the first output (both halves if gated; eager PyTorch's activation also saves its output for the product)
    act1 = (6.0 if glu_saves_activation else 4.0) if model.gated_mlp else 2.0
    parts["mlp"] = (n_shared * (act1 + g) * moe_ffn_hidden if moe_layer else (act1 + g) * ffn_hidden) / t
    if moe_layer:
        f = moe_tokens_factor * moe_ffn_hidden
        io = moe_tokens_factor * (g + 2.0) * D
        if expert_tp > 1:  # every token's copies, 1/t of their FFN
            parts.update(routed_act1=act1 * f / t, routed_act2=g * f / t, routed_io=io)
        else:  # whole experts on the rank's own tokens: 1/t of them with sequence parallelism, all without
            parts.update(routed_act1=act1 * f / rep, routed_act2=g * f / rep, routed_io=io / rep)
    if not flash_attention:
        parts["scores"] = 2.0 * model.n_heads * seq_len / t
    return parts


def selective_freed_bytes_per_token(parts: dict[str, float], modules: frozenset[str], *, moe_layer: bool,
                                    mla: bool) -> float:
    """Activation bytes per token a layer no longer holds under Megatron-core's selective recomputation of
    ``modules`` (``--recompute-modules``; TransformerConfig.recompute_modules) [bytes/token], from its
    ``activation_parts_per_token``:

    - 'layernorm' discards the outputs of the norms that run on their own: an MoE layer's pre-MLP norm
      (its output is the router's bf16 input) and MLA's input norm (whose consumers, the down-projections,
      are told to save that bf16 output, set_for_recompute_input_layernorm, and it is then discarded, FP8
      or not). Transformer Engine fuses the other norms into the next linear (LayerNormLinear), which saves
      its input whatever the setting.
    - 'moe_act': each routed copy's activation output (the second expert GEMM's input).
    - 'mla_up_proj': Q, K and V after MLA's up-projections and rotary embedding.
    - 'mlp': a dense layer's MLP internals and, the norm being fused into its first linear under
      Transformer Engine, the norm's output (the checkpoint keeps only the residual input).
    - 'shared_experts': an MoE layer's shared experts' internals.
    - 'core_attn': nothing more than FlashAttention keeps anyway (unfused attention: its score matrix,
      which the caller handles as before).

    'layernorm', 'moe_act' and 'mla_up_proj' discard their outputs and recompute them before the backward
    that needs them; 'mlp' and 'shared_experts' checkpoint the module (megatron/core/transformer/
    transformer_config.py, recompute_modules)."""
    freed = 0.0
    if "layernorm" in modules:
        freed += parts["mlp_input"] if moe_layer else 0.0
        freed += parts["qkv_input"] if mla else 0.0
    if "moe_act" in modules:
        freed += parts.get("routed_act2", 0.0)
    if "mla_up_proj" in modules and mla:
        freed += parts["qkv"]
    if "mlp" in modules and not moe_layer:
        freed += parts["mlp"] + parts["mlp_input"]
    if "shared_experts" in modules and moe_layer:
        freed += parts["mlp"]
    return freed


def sac_activation_bytes_per_token(model: ModelSpec, *, ffn_hidden: int, tp: int, sp: bool) -> float:
    """Bytes per token per layer kept by torchtitan's op-level selective activation checkpointing [bytes].

    The policy saves the outputs of compute-heavy ops (every other matmul, FlashAttention) and recomputes
    the rest (norms, activation functions, rotary, the other matmuls) (torchtitan
    activation_checkpoint.py, ``_save_list`` and "save every other mm"). Stored: the block input 2D
    (/t with SP), the attention output 2·h_q/t and half of the matmul outputs
    2·(h_q + 2h_kv + D + n_in·F + D)/2, TP-sharded.
    """
    D = model.hidden
    n_in = 2 if model.gated_mlp else 1
    mm_out = 2.0 * (model.n_heads * model.qk_head_dim + 2 * model.kv_dim + D + n_in * ffn_hidden + D)
    return 2.0 * D / (tp if sp else 1) + (2.0 * model.q_dim + 0.5 * mm_out) / tp


def full_recompute_bytes_per_token(*, hidden: int, tp: int, sp: bool) -> float:
    """Bytes per token per layer kept under full recomputation: the layer input, 2D (/t with SP) [4]."""
    return 2.0 * hidden / (tp if sp else 1)


def head_input_bytes_per_token(*, hidden: int, tp: int, sp: bool, gathered: bool, mtp_layers: int = 0) -> float:
    """Bytes per token the last stage saves for the backward beside its layers: the final norm's input (2D,
    /t with sequence parallelism) and the LM head's, which Megatron-core saves as the sequence-parallel shard
    (2D/t, gathered again in the backward) and PyTorch's ColwiseParallel as the all-gather delivered it (2D:
    ``gathered``, as activation_parts_per_token's linears). Neither is under the layers' recomputation
    (torchtitan checkpoints each block; Megatron-core the transformer layers). Without recomputation 0.6-1.3 %
    of a last stage's activations, with full recomputation 10-45 % (eighteenth session's audit,
    docs/crosscheck.md). Each of ``mtp_layers`` multi-token-prediction depths (Megatron-core's
    MultiTokenPredictionLayer) saves as much again for its own final norm and its share of the head's
    stacked input, and three layer inputs more: its embedding norm's input (the shifted tokens' embedding)
    and the concatenation of the two normed inputs its eh_proj saves (2 x 2D); its hidden-state norm's
    input is the previous depth's output, the same storage as that depth's final norm input."""
    shard = full_recompute_bytes_per_token(hidden=hidden, tp=tp, sp=sp)  # a layer's input, as the norm's
    return (1 + mtp_layers) * (shard + (2.0 * hidden if gathered else shard)) + mtp_layers * 3 * shard


LOSS_BYTES_PER_LOGIT = {"eager": 12.0, "vocab_parallel": 6.0, "fused": 4.0, "te": 2.0}
"""Loss working set per logit at its peak [bytes] (key: JobSpec.loss_impl). Eager PyTorch cross-entropy on fp32
logits peaks in its backward: log_softmax's saved fp32 output (4), the fp32 gradient nll_loss hands it (4)
and the fp32 input gradient log_softmax_backward allocates (4); the bf16 logits are freed by then. Measured:
12.25 B per logit (the extra 0.25 the weight gradient) by tracking live tensor storage through a
TorchDispatchMode on CPU, torch 2.13, T=512, V=32000. Fused (the upcast inside one compiled or hand-written
kernel): the bf16 logits (2) and their bf16 gradient (2); torch.compile'd cross-entropy adds "~0 for just
fwd and ~d_input for fw+bw" (PyTorch's StrongerXi in Dao-AILab/quack#48, 2025-10). Megatron-core's
vocab-parallel cross-entropy upcasts the bf16 logits once (2 + 4), takes the exponential and later the
gradient in place in that fp32 copy, and hands back a bf16 gradient (4 + 2): 6 B
(megatron/core/tensor_parallel/cross_entropy.py). Transformer Engine's parallel_cross_entropy (Megatron-core's
cross_entropy_fusion_impl 'te') saves the bf16 logits and three fp32 numbers per token (max, sum, target
logit), and its backward writes the gradient over the logits in place: 2 B
(transformer_engine/pytorch/cross_entropy.py and triton/cross_entropy.py @02965d2).
Chunked losses are not modelled."""

LOSS_SAVED_BYTES_PER_LOGIT = {"eager": 4.0, "vocab_parallel": 4.0, "fused": 0.0, "te": 0.0}
"""What a loss keeps per logit from its forward to its backward beyond the logits themselves [bytes] (key:
JobSpec.loss_impl): eager cross-entropy on the upcast logits saves log_softmax's fp32 output (the upcast
input is freed once it has run; DTensor's loss_parallel, torch/distributed/tensor/parallel/loss.py, saves
its log-softmax the same way, and Megatron-core's vocab-parallel loss its fp32 exponentials, both 4). A
compiled loss saves its bf16 input, the logits, and a few numbers per token (StrongerXi, above: "~0 for just
fwd"), and so does Transformer Engine's (above): none beyond the logits. Measured with saved_tensors_hooks
(torch 2.13, CPU, T=512, V=32000): eager ``cross_entropy(logits.float(), y)`` saves one fp32 storage the
size of the logits (log_softmax's output, which nll_loss saves too); compiled, the bf16 logits themselves
and three numbers per token. It matters where a loss's forward waits for its backward with others in
between: GPipe's under torch.distributed.pipelining."""


def cp_kv_gather_bytes_per_token(*, kv_dim: int, tp: int, cp: int, gathered_grads: bool,
                                 act_bytes: float = 2.0) -> float:
    """Bytes per local token that context parallelism's KV all-gather holds at a layer's backward: the
    full sequence's K and V, gathered again (the forward saves only the local K and V), and with
    ``gathered_grads`` the full sequence's dK and dV, accumulated before their reduce-scatter. Transformer
    Engine's AttnFuncWithCPAndKVAllGather.backward (Megatron-core) holds both: ``k_ag, v_ag =
    gather_along_first_dim(...)``, ``dk = torch.zeros((k.shape[0] * cp_size, ...))``. PyTorch's
    (torch.distributed.tensor.experimental._attention, torchtitan's default rotation) gathers K and V but
    passes dK and dV around a ring (``dkv_rotater``, all-to-all), holding local-sized gradients only. One
    layer's at a time: the buffers are freed with it."""
    return (2 if gathered_grads else 1) * (2 * kv_dim / tp) * act_bytes * cp


LOSS_SAVES_LOGITS = frozenset({"fused", "te"})
"""The losses that save their bf16 input, the logits, for the backward (LOSS_SAVED_BYTES_PER_LOGIT); the
others save an fp32 copy instead and the logits are freed."""


def logits_bytes_per_token(*, vocab: int, tp: int, loss: str = "eager", losses: int = 1) -> float:
    """Loss working set per token on the last stage [bytes/token], vocab-parallel over t
    (LOSS_BYTES_PER_LOGIT), with ``losses`` losses (the main one and each multi-token-prediction depth's):
    every loss keeps what it saves until the backward, and one at a time runs its backward's working set
    (the MTP losses' backwards run after the main one's, each on its own logits). Megatron-core's
    vocab-parallel loss with one MTP depth: (2·4 + 2)·V/t, the two fp32 copies and one bf16 working copy
    (an audit of megatron/core/tensor_parallel/cross_entropy.py, eighteenth session)."""
    kept = LOSS_SAVED_BYTES_PER_LOGIT[loss] + (2.0 if loss in LOSS_SAVES_LOGITS else 0.0)
    return (LOSS_BYTES_PER_LOGIT[loss] + (losses - 1) * kept) * vocab / tp


def loss_graph_bytes_per_token(*, vocab: int, tp: int, loss: str = "eager", logits_bytes: float = 2.0) -> float:
    """What one micro-batch's loss keeps per token on the loss's stage from the forward to the backward
    under torch.distributed.pipelining [bytes/token], over the vocabulary's t shards: its logits, the
    stage's output (``fwd_cache``), and the loss's saved tensors (``_internal_losses`` holds the loss and its
    graph from ``_maybe_compute_loss`` until the backward, LOSS_SAVED_BYTES_PER_LOGIT). The micro-batch at
    the backward's peak has them in the loss's working set (logits_bytes_per_token) instead."""
    return (logits_bytes + LOSS_SAVED_BYTES_PER_LOGIT[loss]) * vocab / tp


def pipelining_boundary_tensors(*, stage_ids: tuple[int, ...], n_stages: int, m: int, alive: tuple[float, ...],
                                grads_kept: tuple[float, ...] | None = None) -> float:
    """Stage-boundary tensors (a stage's input or output, or their gradients, one micro-batch's) that
    torch.distributed.pipelining keeps on a rank beyond its layers' saved tensors, at the activation peak
    [tensors]; ``alive``: the micro-batches each of its ``stage_ids`` holds then (pipeline.stage_alive).
    From torch 2.13's torch/distributed/pipelining:

    - a stage that receives allocates one activation buffer per micro-batch, once, and keeps them across
      steps (``PipelineStage._setup_forward_recv_info``; pytorch#136380 proposes reusing them, open); a
      same-rank neighbour (ZB-V's turn) hands its output over instead, kept the same way
      (``set_local_fwd_input``). A buffer is the stage's input itself, which its first layer saves: for
      the alive micro-batches it is counted with the layers, so m - alive more;
    - a stage that receives gradients keeps one buffer per micro-batch the same way
      (``_create_grad_recv_info``; ``set_local_bwd_input``): m;
    - a stage keeps its output until the micro-batch's backward (``fwd_cache``; until its W under the
      zero-bubble schedules, ``backward_state``): alive more, where a same-rank neighbour's input buffer is
      not already that tensor;
    - under the schedules that split W off, ``stage_backward_input`` leaves each received input's gradient
      on it (``inp.grad``) until the next step's ``clear_runtime_states``: ``grads_kept`` more on each stage
      that receives from another rank, the input-gradient passes it has run at its peak
      (pipeline.stage_input_grads_kept; the full backward clears them at once: None).

    Checked on two CPU ranks under gloo (torch 2.13): the same m buffer addresses in two steps, the forward's
    input being the buffer's storage, and under ScheduleZBVZeroBubble every receive buffer's gradient
    still held after the step. The stage that computes the loss keeps its logits too, through the loss's
    backward: 2 B per logit that eager cross-entropy's working set (LOSS_BYTES_PER_LOGIT), which has freed
    them, does not count. Assumed: ``step(return_outputs=False)``, as torchtitan calls it now; with the
    default (True) the last stage keeps every micro-batch's output, the logits, until the next step. Not
    counted here: the logits and loss graph of every further micro-batch alive on the loss's stage (GPipe's
    m - 1; loss_graph_bytes_per_token) and the logits' gradient a zero-bubble LM head's W keeps until it
    runs are (cost.stage_memory). PyTorch of late
    2024 (2.6) kept more: every stage's outputs (``output_chunks``) and, under every schedule, the received
    activations' gradients until the next step."""
    total = 0.0
    for i, (g, a) in enumerate(zip(stage_ids, alive, strict=True)):
        if g > 0:
            total += max(0.0, m - a)
            if grads_kept is not None and g - 1 not in stage_ids:
                total += grads_kept[i]
        if g < n_stages - 1:
            total += m + (a if g + 1 not in stage_ids else 0.0)
    return total


ZERO3_MAX_LIVE_PARAMETERS = 1e9
"""DeepSpeed ZeRO-3 gathers parameters module by module and releases them beyond this many resident
elements (``stage3_max_live_parameters``, default 1e9, deepspeed/runtime/zero/config.py)."""
ZERO3_REDUCE_BUCKET_ELEMENTS = 5e8
"""DeepSpeed reduces 16-bit gradients through a bucket of this many elements (``reduce_bucket_size``,
default 5e8, same file), allocated whole with ``contiguous_gradients`` (the default), beside the gradient
of the module being computed."""


def zero3_live_params(module_params: float) -> float:
    """Parameters DeepSpeed ZeRO-3 holds gathered at once [elements]: the module being computed (gathered
    whole even beyond the live limit) and, while fewer than ZERO3_MAX_LIVE_PARAMETERS are available, what
    it prefetches. Its prefetch loop (``while numel_prefetching < max_params_to_prefetch``, the bucket
    ``stage3_prefetch_bucket_size`` of 5e7 elements) gathers whole parameters, so the next matrix comes in
    entire: taken as one more module of the same size."""
    return module_params if module_params >= ZERO3_MAX_LIVE_PARAMETERS else 2.0 * module_params


DEEPEP_SMS = 20
"""SMs DeepEP's normal (training) kernels use: deep_ep/buffer.py ``Buffer.num_sms`` and Megatron-core's
``moe_deepep_num_sms`` default; each pair of SMs is one channel."""
DEEPEP_MAX_NVL_PEERS = 8
"""``NUM_MAX_NVL_PEERS`` in DeepEP's csrc/kernels/configs.cuh: NVLink peers of one RDMA rank."""
DEEPEP_META_BYTES = 8 + 128 * 8 + 128 * 4 + 128 * 4
"""Per buffered token beside its hidden bytes: source metadata, top-k indices (int64), weights, scales."""


def deepep_buffer_bytes(*, hidden: int, ep: int, act_bytes: float = 2.0) -> float:
    """NVLink and RDMA communication buffers DeepEP allocates per GPU in normal mode [bytes], as
    Megatron-core sizes them (megatron/core/transformer/moe/fused_a2a.py ``get_buffer``: the larger of
    the dispatch and combine configs' hints). DeepEP's csrc/config.hpp ``get_nvl_buffer_size_hint`` and
    ``get_rdma_buffer_size_hint`` with the deep_ep/buffer.py default configs: 256 (8 ranks) or 288
    buffered tokens per channel and peer over NVLink, 128 per channel and RDMA rank (each twice) over the
    network. DeepSeek-V3 (hidden 7168, BF16): 336 MB on 8 ranks, 378 + 92 MB on 16, 378 + 168 MB on 32
    (340-380 MB of NVLink buffer in every DeepEP release read; the RDMA part within 10 %). HybridEP on
    NVL72 racks preallocates more (about 4 GB per rank at EP=64, DeepEP docs/Hybrid-EP_Implementation.md
    §4.2); it is not modelled."""
    channels = DEEPEP_SMS / 2
    nvl_peers = min(ep, DEEPEP_MAX_NVL_PEERS)
    rdma_ranks = max(1, ep // DEEPEP_MAX_NVL_PEERS)
    token = hidden * max(act_bytes, 2.0)
    nvl_recv = 256 if ep <= DEEPEP_MAX_NVL_PEERS else 288
    nvl = channels * nvl_peers * ((2 * rdma_ranks + 3) * 4 + nvl_recv * (token + DEEPEP_META_BYTES))
    rdma = 0.0
    if ep > DEEPEP_MAX_NVL_PEERS:
        rdma = channels * rdma_ranks * (36 * 4 + 128 * 2 * (token + DEEPEP_META_BYTES + 16))
    return nvl + rdma
