"""Training job: batch, sequence, optimizer, precision, FLOP convention, runtime overheads."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.errors import SpecError
from meshplan.specs._validate import (
    MAX_BYTES,
    boolean,
    fraction,
    instance,
    non_negative_number,
    one_of,
    positive_int,
    positive_number,
)
from meshplan.specs.plan import RECOMPUTE
from meshplan.units import GiB

TOKEN_DROPS = ("dropless", "drop", "pad")
"""How an expert treats tokens beyond its capacity (JobSpec.moe_token_drop): 'dropless' keeps them all,
'drop' drops them, 'pad' drops them and pads every expert up to its capacity (static shapes)."""

OPTIMIZERS = ("adamw", "adamw-bf16-moments", "adam-8bit", "sgd-momentum", "sgd", "adafactor")
PRECISIONS = ("bf16", "fp8")
FLOP_CONVENTIONS = ("palm", "causal")
SOFTWARE = ("generic", "megatron", "torchtitan", "llm-foundry", "maxtext", "deepspeed")
LOSSES = ("auto", "eager", "vocab_parallel", "fused", "te")
CUDA_GRAPH_SCOPES = ("layers", "full_iteration")
RECOMPUTE_CHOICES = ("auto", *RECOMPUTE)
"""What ``JobSpec.recompute`` takes: 'auto' (the search chooses among every mode the plan's framework has)
or one mode that every searched plan then runs (specs.plan.RECOMPUTE)."""
MAX_TRAIN_TOKENS = 10**17
"""The largest token budget a job may name (10^17 tokens, some thousand times the largest published runs)."""
STACK_LOSS = {"megatron": "vocab_parallel", "llm-foundry": "fused"}
"""The cross-entropy a stack runs unless told: Megatron-core's vocab-parallel cross-entropy
(tensor_parallel/cross_entropy.py); llm-foundry's MPT defaults to flash_attn's fused one (``loss_fn:
fused_crossentropy`` in ComposerMPTCausalLM, llmfoundry/models/mpt/modeling_mpt.py); others eager."""
KV_EXPANDING_STACKS = ("torchtitan",)
"""Stacks whose attention receives K and V repeated to every query head: torchtitan's Llama calls
``repeat_kv`` on them before ``F.scaled_dot_product_attention`` (torchtitan/models/llama3/model/model.py,
and torchtitan/models/llama/model.py of 2024), so its context parallelism, which runs inside that call,
passes and gathers K and V at the query heads' width."""
FUSED_GLU_STACKS = ("megatron", "maxtext")
"""Stacks whose gated MLP keeps its two input halves and recomputes the activation in backward:
Megatron-core's fused bias-SwiGLU (``bias_swiglu_fusion``, on by default: megatron/core/fusions/
fused_bias_swiglu.py saves the input alone) and MaxText (XLA fuses the elementwise chain). Eager PyTorch
(torchtitan, llm-foundry's Hugging Face models, the generic stack) saves silu's input, its output and the
other half for the product, and the product for the down projection: 8 bytes per FFN element, not 6
(memory.activation_parts_per_token). torch.compile (JobSpec.compiled) saves 6, as measured."""
TE_FP8_STACKS = ("megatron", "llm-foundry")
"""Stacks whose FP8 linears are Transformer Engine's, which save the FP8 copy of a GEMM's input for the
weight gradient (memory.layer_activation_bytes_per_token); llm-foundry's FP8 runs use TE (``amp_fp8``).
torchao's Float8Linear (torchtitan) saves the bf16 input and casts again in backward."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeOverheads:
    """Memory outside the model's tensors, reported as its own terms. All [bytes] except the fraction."""

    cuda_context_bytes: float = 0.5 * GiB
    """CUDA context with lazy module loading: ~300-400 MB (pytorch#107667); 0.5 GiB stated."""
    nccl_bytes_per_group: float = 0.25 * GiB
    """NCCL channel buffers per process group a rank belongs to (heuristic: 0.5-2 GB for several
    groups, formulas.md §4.2; nccl#864)."""
    allocator_fraction: float = 0.05
    """Caching-allocator fragmentation and workspace, as a fraction of the tensor peak (heuristic,
    formulas.md §4.2: max(5 %, 2 GB) suggested)."""

    def __post_init__(self) -> None:
        non_negative_number("job.runtime.cuda_context_bytes", self.cuda_context_bytes, most=MAX_BYTES)
        non_negative_number("job.runtime.nccl_bytes_per_group", self.nccl_bytes_per_group, most=MAX_BYTES)
        fraction("job.runtime.allocator_fraction", self.allocator_fraction, allow_zero=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSpec:
    """What is trained and how: batch per optimizer step, sequence, optimizer, precision."""

    global_batch_tokens: int
    """Tokens per optimizer step (summed over all data-parallel replicas)."""
    seq_len: int
    """S, tokens per sequence."""
    optimizer: str = "adamw"
    precision: str = "bf16"
    """Compute precision of the GEMMs: 'bf16' or 'fp8' (FP8 linears, BF16 elsewhere)."""
    fp8_param_gather: bool = False
    """All-gather parameters in FP8 (1 byte) where the stack supports it (Megatron --fp8-param-gather,
    torchao Float8 with FSDP2 enable_fsdp_float8_all_gather); needs precision='fp8'."""
    loss: str = "auto"
    """The cross-entropy's implementation, for its memory (memory.LOSS_BYTES_PER_LOGIT) and time: 'eager'
    (PyTorch on fp32 logits), 'vocab_parallel' (Megatron-core's, softmax and gradient in place on one fp32
    copy), 'fused' (the upcast inside one kernel: torch.compile'd, as torchtitan does under
    --training.compile since PR #1033 of 2025-04, or flash_attn's), 'te' (Transformer Engine's
    parallel_cross_entropy, Megatron-core's --cross-entropy-fusion-impl te: it keeps the bf16 logits and
    writes their gradient over them in place) or 'auto' (the stack's: STACK_LOSS)."""
    reduce_dtype_bytes: float = 4.0
    """Bytes per element of gradient reduction (FSDP2 MixedPrecisionPolicy.reduce_dtype; fp32 = 4)."""
    flash_attention: bool = True
    fp8_attention: bool = False
    """The fused attention kernel runs its two batched GEMMs in FP8, forward and backward (Transformer
    Engine's ``fp8_dot_product_attention``, Megatron-core's ``--fp8-dot-product-attention``; cuDNN's FP8
    SDPA): cost.compute.FP8_ATTENTION_SPEEDUP over the BF16 kernel. Needs precision='fp8' and
    flash_attention; meant for Transformer Engine stacks (FlashAttention-2 has no FP8 path). The FP8
    copies of Q, K, V and O the backward keeps are not modelled (BF16 assumed)."""
    fused_grouped_mlp: bool = False
    """The routed experts run as one fused grouped MLP with the activation inside its GEMMs (Transformer
    Engine's op fuser with ``NVTE_CUTEDSL_FUSED_GROUPED_MLP=1``: cuDNN frontend's CuTe DSL grouped GEMM
    with a GLU epilogue forward and the GLU's gradient fused into the backward's grouped GEMM, on Blackwell
    (SM100) under an MXFP8 or NVFP4 recipe; transformer_engine/pytorch/ops/fused/, forward and
    backward_grouped_mlp.py): the activation's elementwise traffic over every routed copy is not paid
    (cost.compute.layer_times), and there is no separate activation for Megatron's ``moe_act``
    recomputation to re-run. Needs precision='fp8'; a Blackwell feature, which meshplan does not check
    against the cluster's GPU."""
    compiled: bool = False
    """The transformer blocks run under torch.compile: Inductor fuses each chain of elementwise ops (norms
    with their residual adds, rotary, the activation, casts) into one kernel, so their memory traffic is
    the fused minimum instead of the stack's ``elementwise_passes`` (eager PyTorch moves about 2.7x that,
    measured on an H200, docs/measure-and-crosscheck.md). Stacks with hand-fused kernels (Megatron-core) are
    there already."""
    cuda_graphs: bool = False
    """The transformer layers are captured in CUDA graphs and replayed (Megatron-core's
    ``--enable-cuda-graph`` or ``--cuda-graph-scope full_iteration``, Transformer Engine's
    ``make_graphed_callables``): the host launches one graph instead of each kernel, so MoE layers are not
    held to the host's pace (ComputeParams.moe_layer_host_s). A MoE layer is captured whole only with
    static shapes: tokens dropped and padded to a capacity, or a fixed per-rank expert capacity; a dropless
    dispatcher that waits on the host for its token counts keeps its experts outside the graph."""
    cuda_graph_scope: str = "layers"
    """With ``cuda_graphs``: 'layers' (each layer a graph the host launches, Megatron-core's
    ``--enable-cuda-graph``, TE's per-layer graphs) or 'full_iteration' (Megatron-core's
    ``--cuda-graph-scope full_iteration``: every micro-batch's forward and backward in one graph, with a
    fixed per-rank expert capacity). A whole-iteration graph also leaves out the per-MoE-layer gaps the
    per-layer graphs keep (ComputeParams.moe_layer_overhead_s)."""
    flop_convention: str = "palm"
    """Attention FLOPs for MFU: 'palm' (non-causal, 12·L·h_q·S per token) or 'causal' (half)."""
    moe_token_drop: str = "dropless"
    """What an expert does with tokens beyond its capacity (meshplan.cost.moe_routing): 'dropless' keeps
    them all (Megatron-core's default, ``moe_expert_capacity_factor`` unset), so the busiest rank of a
    micro-batch processes more than the mean; 'drop' drops them (``moe_expert_capacity_factor`` set); 'pad'
    drops them and pads every expert up to its capacity (``moe_pad_expert_input_to_capacity``: static
    shapes, every rank processes exactly the capacity)."""
    moe_capacity_factor: float = 1.0
    """With ``moe_token_drop`` 'drop' or 'pad': an expert's capacity relative to its balanced share
    (Megatron-core's ``moe_expert_capacity_factor``). At least 1: below it an expert would process fewer
    tokens than are routed to it on average, which drops tokens every step and which the model FLOPs (and
    so MFU) do not describe. Dropless runs have no capacity: 1 there."""
    moe_routing_imbalance: float = 1.0
    """A learned router's systematic skew: the busiest expert-parallel rank's expected tokens over the mean,
    beyond the sampling spread of a micro-batch that meshplan computes (meshplan.cost.moe_routing). 1.0
    where the router's expected loads are equal, as under Megatron-core's forced balancing
    (``moe_router_force_load_balancing``, which NVIDIA's published MoE benchmarks set); no public
    measurement gives it for a trained router per micro-batch, so it is the user's to set (docs/moe.md)."""
    runtime: RuntimeOverheads = RuntimeOverheads()
    software: str = "generic"
    """Software stack, for its calibrated overheads: 'megatron' (Megatron-LM / NeMo, fused kernels),
    'torchtitan' (PyTorch FSDP2), 'llm-foundry' (Composer / FSDP1), 'maxtext' (JAX / XLA), 'deepspeed'
    (DeepSpeed ZeRO-1/2/3 on PyTorch's layers; no fitted tables: it carries the unseen-stack band) or
    'generic'."""
    recompute: str = "auto"
    """The activation recomputation the search may choose (RECOMPUTE_CHOICES): 'auto', every mode the plan's
    framework has, partial recomputation included; or one of 'none', 'selective', 'sac', 'full' (every
    layer), which every searched plan then runs. A plan string's own ``recompute`` wins for that plan."""
    train_tokens: int | None = None
    """Tokens the whole run trains on (a dataset's 15.6T), for time to train, GPU-hours, cost, energy and
    goodput (meshplan.economics); None where the question is not asked."""

    def __post_init__(self) -> None:
        instance("job.runtime", self.runtime, RuntimeOverheads, "a RuntimeOverheads")
        positive_int("job.global_batch_tokens", self.global_batch_tokens)
        positive_int("job.seq_len", self.seq_len, 1 << 32)
        one_of("job.optimizer", self.optimizer, OPTIMIZERS)
        one_of("job.precision", self.precision, PRECISIONS)
        one_of("job.flop_convention", self.flop_convention, FLOP_CONVENTIONS)
        one_of("job.software", self.software, SOFTWARE)
        one_of("job.recompute", self.recompute, RECOMPUTE_CHOICES)
        if self.recompute == "sac" and self.software == "megatron":
            raise SpecError("job.recompute", "Megatron-core has no op-level selective checkpointing (sac); use "
                                             "selective, full, none or auto")
        if self.train_tokens is not None:
            positive_int("job.train_tokens", self.train_tokens, MAX_TRAIN_TOKENS)
        one_of("job.loss", self.loss, LOSSES)
        positive_number("job.reduce_dtype_bytes", self.reduce_dtype_bytes, most=8.0)
        for f in ("fp8_param_gather", "flash_attention", "fp8_attention", "fused_grouped_mlp", "compiled",
                  "cuda_graphs"):
            boolean(f"job.{f}", getattr(self, f))
        one_of("job.cuda_graph_scope", self.cuda_graph_scope, CUDA_GRAPH_SCOPES)
        if self.cuda_graph_scope != "layers" and not self.cuda_graphs:
            raise SpecError("job.cuda_graph_scope", f"{self.cuda_graph_scope!r} needs cuda_graphs=true")
        if self.fp8_param_gather and self.precision != "fp8":
            raise SpecError("job.fp8_param_gather", "needs precision='fp8'")
        if self.fp8_attention and (self.precision != "fp8" or not self.flash_attention):
            raise SpecError("job.fp8_attention", "needs precision='fp8' and flash_attention=true (a fused kernel)")
        if self.fused_grouped_mlp and self.precision != "fp8":
            raise SpecError("job.fused_grouped_mlp", "needs precision='fp8' (an MXFP8 or NVFP4 recipe)")
        one_of("job.moe_token_drop", self.moe_token_drop, TOKEN_DROPS)
        positive_number("job.moe_capacity_factor", self.moe_capacity_factor, least=1.0, most=1e3)
        if self.moe_token_drop == "dropless" and self.moe_capacity_factor != 1.0:
            raise SpecError("job.moe_capacity_factor", "applies where tokens are dropped or padded "
                                                       "(job.moe_token_drop 'drop' or 'pad'); a dropless job has "
                                                       f"none, got {self.moe_capacity_factor:g}")
        positive_number("job.moe_routing_imbalance", self.moe_routing_imbalance, most=1e3)
        if self.moe_routing_imbalance < 1.0:
            raise SpecError("job.moe_routing_imbalance", f"must be >= 1.0, got {self.moe_routing_imbalance}")
        if self.global_batch_tokens % self.seq_len:
            raise SpecError("job.global_batch_tokens",
                            f"must be a multiple of seq_len={self.seq_len}; got {self.global_batch_tokens}")

    @property
    def fp8_saves_fp8_inputs(self) -> bool:
        """Whether saved GEMM inputs are FP8 copies (TE_FP8_STACKS under precision='fp8')."""
        return self.precision == "fp8" and self.software in TE_FP8_STACKS

    @property
    def attention_kv_expanded(self) -> bool:
        """Whether attention's K and V are repeated to every query head before it runs
        (KV_EXPANDING_STACKS)."""
        return self.software in KV_EXPANDING_STACKS

    def loss_impl(self, megatron_layers: bool) -> str:
        """The cross-entropy implementation, 'auto' resolved by the software stack, or by Megatron-core's
        where the plan runs its layers (``megatron_layers``: Plan.runs_megatron_layers) whatever the stack."""
        if self.loss != "auto":
            return self.loss
        return STACK_LOSS["megatron"] if megatron_layers else STACK_LOSS.get(self.software, "eager")

    def glu_saves_activation(self, megatron_layers: bool) -> bool:
        """Whether a gated MLP also saves its activation's output (FUSED_GLU_STACKS): eager PyTorch, unless
        compiled or the plan runs Megatron-core's layers (``megatron_layers``)."""
        return not (megatron_layers or self.compiled or self.software in FUSED_GLU_STACKS)

    @property
    def global_batch_seqs(self) -> int:
        return self.global_batch_tokens // self.seq_len
