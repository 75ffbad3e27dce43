"""The parallelism plan: degrees of each mesh axis and the options of each parallelism.

Mesh axes, outermost to innermost (torchtitan's order, `ParallelDims`): pp, dp_replicate, dp_shard,
cp, tp. Inner axes get consecutive ranks, so an inner axis stays inside a node when it fits.
The world size is dp_replicate·dp_shard·cp·tp·pp. Expert parallelism folds onto the same ranks:
expert layers use ep ranks of the tp·cp·dp ranks of a pipeline stage, spaced etp apart (Megatron's
parallel folding: expert-TP innermost, then EP); expert weights are data-parallel over the remaining
tp·cp·dp/(ep·etp) ranks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace

from meshplan.errors import SpecError
from meshplan.specs._validate import MAX_INT, ascii_int, boolean, one_of, positive_int, shown_list, text
from meshplan.specs.layout import layers_per_stage, parse_layout

DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep")
RECOMPUTE = ("none", "selective", "sac", "full")
RECOMPUTE_MODULES = ("core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp", "shared_experts")
"""Megatron-core's --recompute-modules that meshplan models (its 'moe', the whole MoE layer, is not)."""
SHARDING = ("fsdp", "zero1", "zero2", "zero3", "megatron")
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v")
CP_IMPLS = ("ring", "a2a", "allgather")
GRAD_SYNC = ("every", "last")
EP_DISPATCH = ("alltoall", "deepep")

# What each implementation of the data-parallel axis runs with: the features of its framework.
# PyTorch (FSDP2, torchtitan): every schedule in torch.distributed.pipelining, ring (all-gather based)
# context parallelism. Megatron-LM: 1F1B and interleaved schedules, p2p / all-gather / a2a CP.
# DeepSpeed ZeRO: its pipeline engine runs 1F1B with ZeRO-1 only; sequence parallelism is Ulysses (a2a).
FRAMEWORK_SCHEDULES = {"fsdp": SCHEDULES, "megatron": ("1f1b", "interleaved"), "zero1": ("1f1b",),
                       "zero2": ("1f1b",), "zero3": ("1f1b",)}
STACK_SHARDINGS = {"megatron": ("megatron", "fsdp"), "torchtitan": ("fsdp",), "llm-foundry": ("fsdp",),
                   "maxtext": ("fsdp",), "deepspeed": ("zero1", "zero2", "zero3")}
"""The shardings the search gives a named stack (job.software; 'generic' gets every one): Megatron-core's
distributed optimizer and Megatron-FSDP; torchtitan's FSDP2 (with HSDP and DDP as its replicate axis);
Composer's FSDP; MaxText's fsdp mesh axis; DeepSpeed's ZeRO stages 1 to 3 (its pipeline engine with
ZeRO-1 only, FRAMEWORK_SCHEDULES). Where nothing is sharded a plan is plain data parallelism, timed as
PyTorch's DDP on every stack."""
STACK_SCHEDULES = {"megatron": FRAMEWORK_SCHEDULES["megatron"], "llm-foundry": (), "deepspeed": ("1f1b",)}
"""The pipeline schedules the search gives a named stack, where they are fewer than its shardings allow:
Megatron-core runs 1F1B and interleaved 1F1B (not torchtitan's zero-bubble schedules); llm-foundry's
training configurations (Composer's FSDP and DDP) have no pipeline parallelism; DeepSpeed's pipeline
engine runs 1F1B."""
FRAMEWORK_CP = {"fsdp": ("ring", "allgather"), "megatron": CP_IMPLS, "zero1": ("a2a",), "zero2": ("a2a",),
                "zero3": ("a2a",)}
# MoE token dispatch: NCCL all-to-all everywhere; Megatron-core's flex dispatcher also runs DeepEP / HybridEP
# (--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep|hybridep), and only Megatron overlaps
# the all-to-all of one micro-batch with another's compute (--overlap-moe-expert-parallel-comm).
FRAMEWORK_EP_DISPATCH = {"fsdp": ("alltoall",), "megatron": EP_DISPATCH, "zero1": ("alltoall",),
                         "zero2": ("alltoall",), "zero3": ("alltoall",)}

MAX_VPP = 1024
"""The most virtual stages (model chunks) per pipeline rank a plan may have; each holds at least a layer."""
MAX_LAYOUT_CHARS = 10_000
"""The longest --pipeline-model-parallel-layout string a plan may give."""
MAX_PLAN_CHARS = 20_000
"""The longest plan string parse_plan reads."""

# What a plan string may say, and what each key means; aliases on the right.
_ALIASES = {"fsdp": "dp_shard", "ddp": "dp_replicate", "dp": "dp_replicate", "vp": "vpp",
            "micro_batch_size": "mbs", "ac": "recompute"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """A parallel layout and its options. Degrees of 1 switch a parallelism off."""

    dp_replicate: int = 1
    """Replicas that all-reduce gradients (DDP; the replicate axis of HSDP)."""
    dp_shard: int = 1
    """Ranks that shard parameters, gradients and optimizer state (FSDP / ZeRO)."""
    cp: int = 1
    """Context parallel: ranks that split each sequence."""
    tp: int = 1
    """Tensor parallel (Megatron column/row split of every block)."""
    pp: int = 1
    """Pipeline stages."""
    ep: int = 1
    """Expert parallel: ranks that split the experts of an MoE layer."""
    etp: int | None = None
    """Expert tensor parallel (Megatron --expert-tensor-parallel-size): ranks of the tp group that split
    each routed expert's FFN, 1 or tp. None: tp without expert parallelism, 1 with it (what
    Megatron-Bridge's MoE recipes set and torchtitan does; Megatron-LM's own command line defaults to tp)."""
    mbs: int | None = None
    """Micro-batch size in sequences; None: the largest that fits in memory."""
    recompute: str | None = None
    """Activation recomputation: 'none'; 'selective' (Megatron: the attention core only, which
    FlashAttention already recomputes); 'sac' (torchtitan selective activation checkpointing, op
    policy: keep every other matmul output and the attention output, recompute the rest); 'full'
    (whole block from its input). None: the fastest that fits."""
    recompute_layers: int | None = None
    """With recompute='full': recompute only the first this-many layers of each pipeline stage and keep
    the activations of the rest (Megatron --recompute-method block --recompute-num-layers N; torchtitan's
    layer AC with a period). None: every layer, or, when recompute is also None, the fewest that fit."""
    recompute_modules: str = ""
    """With recompute='selective': Megatron-core's --recompute-modules, '+'-separated (plan strings are
    comma-separated), from RECOMPUTE_MODULES, e.g. 'layernorm+moe_act'. Empty: Megatron's default,
    core_attn. What each frees and re-runs: memory.selective_freed_bytes_per_token and
    compute.selective_recompute_s."""
    offload_layers: int | None = 0
    """Activation offloading (Megatron-core --cpu-offloading-num-layers, Transformer Engine's CPU offload
    context): the saved activations of the first this-many layers are copied to host memory during the
    forward and back during the backward, asynchronously, instead of staying in HBM. Megatron runs it
    without pipeline parallelism and without recomputation, on up to the layers less one. 0: none. None
    ('auto' in a plan string): evaluate weighs the fewest offloaded layers that fit against recomputation
    and keeps the faster."""
    sharding: str = "fsdp"
    """Semantics of the dp_shard axis: 'fsdp' (PyTorch FSDP2 fully_shard), 'zero1'/'zero2'/'zero3'
    (DeepSpeed), 'megatron' (Megatron-LM distributed optimizer)."""
    reshard_after_forward: bool | int | None = None
    """FSDP2: free gathered parameters after forward (True), keep them (False), or keep a shard of
    this many ranks (an int, e.g. the node size) so the backward all-gather stays small. None: True,
    except under a pipeline, where torch.distributed.pipelining keeps a stage's parameters gathered (and
    its gradients unsharded) from the first micro-batch to the last."""
    grad_sync: str | None = None
    """'every': reduce gradients after every micro-batch; 'last': only after the last (DDP no_sync,
    FSDP2 set_requires_gradient_sync(False), which holds unsharded gradients). None: what each
    implementation does by default: 'every' for FSDP2 and ZeRO-2/3, 'last' for DDP (a loop with
    ``no_sync``; Megatron's own DDP accumulates so), ZeRO-1 and Megatron's gradient buffer;
    under job.software 'torchtitan', whose DDP loop has no ``no_sync``, 'every' (stack_defaults)."""
    sp: bool | None = None
    """Megatron sequence parallelism on the tp axis; None: on whenever tp > 1."""
    schedule: str = "1f1b"
    """Pipeline schedule: 'gpipe', '1f1b', 'interleaved', 'zb-h1', 'zb-v'."""
    vpp: int = 1
    """Virtual stages (model chunks) per pipeline rank for 'interleaved'."""
    cp_impl: str | None = None
    """Context parallel exchange: 'ring' (p2p KV passes), 'allgather' (KV all-gather) or 'a2a'
    (Ulysses all-to-all). None: the framework's own (ring; a2a for DeepSpeed)."""
    async_tp: bool = False
    """Overlap TP/SP collectives with the GEMMs they feed (micro-pipelined async-TP)."""
    ep_dispatch: str | None = None
    """MoE token dispatch across the ep ranks: 'alltoall' (NCCL all-to-all: every routed copy of a token
    travels to its expert's rank) or 'deepep' (DeepEP / HybridEP: a token crosses the network once per
    destination node and is fanned out over NVLink there). None: the framework's own (alltoall)."""
    layout: str = ""
    """Decoder layers per model chunk as Megatron-core's --pipeline-model-parallel-layout string (specs.layout:
    e.g. 'Et*4|(t*4|)*14tmL', 16 chunks, the last holding one layer, the MTP layer and the loss), pp x
    chunks of them, chunk c on pipeline rank c mod pp; no commas (plan strings are comma-separated). Empty:
    layers split evenly, the remainder to the first ranks, except that a model with MTP layers splits as
    NVIDIA's DeepSeek-V3 recipes do (cost.pipeline.mtp_chunk_layers), its MTP layers on the last rank. The
    interleaved schedule's bubble and memory are modelled as for equal chunks."""
    ep_overlap: bool = False
    """Hide the MoE all-to-all of one micro-batch behind the compute of another (Megatron-core
    --overlap-moe-expert-parallel-comm: merged forward and backward of consecutive micro-batches). Needs
    sharding='megatron', no full recomputation, and with pipelining the interleaved schedule."""

    def __post_init__(self) -> None:
        for d in DEGREES:
            positive_int(f"plan.{d}", getattr(self, d))
        positive_int("plan.vpp", self.vpp, MAX_VPP)
        for name in ("async_tp", "ep_overlap"):
            boolean(f"plan.{name}", getattr(self, name))
        if self.sp is not None:
            boolean("plan.sp", self.sp)
        for name in ("layout", "recompute_modules"):
            text(f"plan.{name}", getattr(self, name))
        if len(self.layout) > MAX_LAYOUT_CHARS:
            raise SpecError("plan.layout", f"is {len(self.layout):,} characters; at most {MAX_LAYOUT_CHARS:,}")
        if self.etp is not None:
            self._check_etp()
        if self.mbs is not None:
            positive_int("plan.mbs", self.mbs)
        self._check_recompute()
        if self.offload_layers != 0:
            self._check_offload()
        one_of("plan.sharding", self.sharding, SHARDING)
        one_of("plan.schedule", self.schedule, SCHEDULES)
        if self.cp_impl is not None:
            one_of("plan.cp_impl", self.cp_impl, CP_IMPLS)
        if self.grad_sync is not None:
            one_of("plan.grad_sync", self.grad_sync, GRAD_SYNC)
        raf = self.reshard_after_forward
        if raf is not None and not isinstance(raf, bool):
            positive_int("plan.reshard_after_forward", raf)
        self._check_framework()
        if self.ep_overlap:
            self._check_ep_overlap()
        if self.layout:
            self._check_layout()
        self._check_axis_options()

    def _check_etp(self) -> None:
        """Expert-TP is 1 or tp, and a choice of it is Megatron-core's."""
        positive_int("plan.etp", self.etp)
        if self.etp not in (1, self.tp):
            raise SpecError("plan.etp", f"splits each routed expert over the tp ranks; allowed: 1 or "
                                        f"tp={self.tp}, got {self.etp}")
        if self.etp != self._framework_expert_tp() and self.sharding != "megatron":
            raise SpecError("plan.etp", f"a choice of expert-TP is Megatron-core's; with sharding="
                                        f"{self.sharding} the experts are split over tp without ep and whole "
                                        f"with it: leave etp out, or use sharding=megatron")

    def _check_recompute(self) -> None:
        """The recompute mode, Megatron's modules (spelled one way per set) and the partially recomputed
        layers."""
        if self.recompute is not None:
            one_of("plan.recompute", self.recompute, RECOMPUTE)
        if self.recompute_modules:
            if self.recompute != "selective":
                raise SpecError("plan.recompute_modules", f"needs recompute=selective; got recompute={self.recompute}")
            mods = self.recompute_modules.split("+")
            for mod in mods:
                one_of("plan.recompute_modules", mod, RECOMPUTE_MODULES)
            if len(set(mods)) < len(mods):
                raise SpecError("plan.recompute_modules", f"names a module twice: {self.recompute_modules!r}")
            # one spelling per set: RECOMPUTE_MODULES order, Megatron's default (core_attn alone) as empty
            canonical = "+".join(m for m in RECOMPUTE_MODULES if m in mods)
            object.__setattr__(self, "recompute_modules", "" if canonical == "core_attn" else canonical)
        if self.recompute_layers is not None:
            positive_int("plan.recompute_layers", self.recompute_layers)
            if self.recompute not in (None, "full"):
                raise SpecError("plan.recompute_layers", f"needs recompute=full; got recompute={self.recompute}")

    def _check_framework(self) -> None:
        """The schedule, context-parallel variant and MoE dispatcher are ones the sharding's framework runs."""
        if self.pp > 1 and self.schedule not in FRAMEWORK_SCHEDULES[self.sharding]:
            raise SpecError("plan.schedule", f"sharding={self.sharding} runs with schedule "
                                             f"{' or '.join(FRAMEWORK_SCHEDULES[self.sharding])}; got {self.schedule}")
        if self.cp > 1 and self.context_impl not in FRAMEWORK_CP[self.sharding]:
            raise SpecError("plan.cp_impl", f"sharding={self.sharding} runs context parallelism as "
                                            f"{' or '.join(FRAMEWORK_CP[self.sharding])}; got {self.cp_impl}")
        if self.ep_dispatch is not None:
            one_of("plan.ep_dispatch", self.ep_dispatch, EP_DISPATCH)
            if self.ep < 2:
                raise SpecError("plan.ep_dispatch", f"dispatches to expert-parallel ranks; needs ep >= 2, "
                                                    f"got {self.ep}")
            if self.ep_dispatch == "deepep" and self.expert_tp > 1:
                raise SpecError("plan.ep_dispatch", "DeepEP with expert-TP (one fused dispatch over the ep x etp "
                                                    "ranks) is not modelled; use etp=1 or ep_dispatch=alltoall")
            if self.ep_dispatch not in FRAMEWORK_EP_DISPATCH[self.sharding]:
                raise SpecError("plan.ep_dispatch", f"sharding={self.sharding} dispatches MoE tokens with "
                                                    f"{' or '.join(FRAMEWORK_EP_DISPATCH[self.sharding])}; "
                                                    f"got {self.ep_dispatch}")

    def _check_axis_options(self) -> None:
        """Each option applies to an axis the plan has: async TP to tp, cp_impl to cp, a schedule, layout and
        virtual stages to a pipeline; Megatron has no op-level SAC."""
        if self.recompute == "sac" and self.sharding == "megatron":
            raise SpecError("plan.recompute", "Megatron-core has no op-level selective checkpointing (sac); use "
                                              "recompute=selective with recompute_modules, or full")
        if self.async_tp and self.tp < 2:
            raise SpecError("plan.async_tp", f"overlaps tensor-parallel collectives; needs tp >= 2, got tp={self.tp}")
        if self.cp_impl is not None and self.cp < 2:
            raise SpecError("plan.cp_impl", f"chooses how context parallelism exchanges K and V; needs cp >= 2, got "
                                            f"cp={self.cp}")
        if self.pp == 1 and self.schedule != "1f1b":
            raise SpecError("plan.schedule", f"applies to a pipeline; needs pp >= 2, got pp=1 ({self.schedule} is a "
                                             "pipeline schedule: without a pipeline leave it at 1f1b)")
        if self.pp == 1 and self.layout:
            raise SpecError("plan.layout", "applies to a pipeline; needs pp >= 2, got pp=1")
        if self.vpp > 1 and self.schedule != "interleaved":
            raise SpecError("plan.vpp", f"virtual stages need schedule=interleaved; got schedule={self.schedule}")
        if self.schedule == "interleaved" and self.pp > 1 and self.vpp < 2:
            raise SpecError("plan.vpp", "schedule=interleaved needs vpp >= 2")

    def _check_layout(self) -> None:
        chunks = parse_layout(self.layout)
        if self.schedule == "zb-v":
            raise SpecError("plan.layout", "places chunks round-robin over the ranks; ZB-V's V-shaped placement "
                                           "takes no layout (leave it empty)")
        if len(chunks) != self.pp * self.model_chunks:
            raise SpecError("plan.layout", f"has {len(chunks)} chunks; pp x chunks per rank = {self.pp} x "
                                           f"{self.model_chunks} = {self.pp * self.model_chunks} needed")
        if any(c.mtp for i, c in enumerate(chunks) if i % self.pp != self.pp - 1):
            raise SpecError("plan.layout", "meshplan runs MTP layers (m) on the last pipeline rank: put them in a "
                                           f"chunk c with c mod pp = {self.pp - 1}")
        empty = [r for r, n in enumerate(layers_per_stage([c.layers for c in chunks], self.pp)) if n == 0]
        if empty and not (empty == [self.pp - 1] and any(c.mtp for c in chunks)):
            raise SpecError("plan.layout", f"leaves pipeline rank(s) {empty} without a decoder layer (t); meshplan "
                                           "needs one on every rank but a last rank that holds MTP layers")

    def _check_offload(self) -> None:
        """Megatron-core's conditions for activation offloading (TransformerConfig.__post_init__; Megatron
        Bridge's CPU-offloading guide: "PP must be 1", recomputation off)."""
        if self.offload_layers is not None and (not isinstance(self.offload_layers, int) or self.offload_layers < 0):
            raise SpecError("plan.offload_layers", f"must be a whole number of layers >= 0, or "
                                                   f"auto; got {self.offload_layers!r}")
        if self.pp > 1:
            raise SpecError("plan.offload_layers", f"offloads activations without pipeline parallelism only; "
                                                   f"needs pp=1, got pp={self.pp}")
        if self.recompute not in (None, "none") or self.recompute_layers is not None:
            raise SpecError("plan.offload_layers", f"runs without activation recomputation; use recompute=none or "
                                                   f"leave it out, got recompute={self.recompute}")
        if self.ep_overlap:  # TE keeps one offload state per layer; the overlap runs two micro-batches at once
            raise SpecError("plan.offload_layers", "is not modelled with the MoE all-to-all overlap (ep_overlap), "
                                                   "which runs a second micro-batch's forward before the first's "
                                                   "backward has reloaded its layers")

    def _check_ep_overlap(self) -> None:
        """Megatron-core's conditions for --overlap-moe-expert-parallel-comm (TransformerConfig.__post_init__,
        megatron/core/transformer/transformer_config.py)."""
        if self.sharding != "megatron":
            raise SpecError("plan.ep_overlap", f"is Megatron-core's; needs sharding=megatron, got {self.sharding}")
        if self.ep < 2:
            raise SpecError("plan.ep_overlap", f"overlaps the expert-parallel all-to-all; needs ep >= 2, got {self.ep}")
        if self.recompute == "full" or self.recompute_layers is not None:
            raise SpecError("plan.ep_overlap", "does not run with full recomputation; use recompute=none, "
                                               "selective or sac")
        if self.pp > 1 and self.schedule != "interleaved":
            raise SpecError("plan.ep_overlap", f"with pipelining needs schedule=interleaved; got {self.schedule}")

    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.cp * self.tp * self.pp

    @property
    def dp(self) -> int:
        """Data-parallel replicas of the batch: dp_replicate·dp_shard."""
        return self.dp_replicate * self.dp_shard

    @property
    def sequence_parallel(self) -> bool:
        return self.tp > 1 and (self.sp is None or self.sp)

    @property
    def expert_tp(self) -> int:
        """Tensor-parallel degree of the routed experts in effect (``etp``, or its default)."""
        return self.etp if self.etp is not None else self._framework_expert_tp()

    def _framework_expert_tp(self) -> int:
        """The expert-TP every framework runs by default: tp without expert parallelism, 1 with it."""
        return self.tp if self.ep == 1 else 1

    def runs_megatron_layers(self, software: str) -> bool:
        """Whether the plan runs Megatron-core's layers and recomputation (its tensor- and context-parallel
        linears and attention, recomputation modules, activation offloading) rather than PyTorch's own
        (DTensor tensor parallelism, ``context_parallel``, ``torch.utils.checkpoint``): a plan with Megatron's
        distributed optimizer, or any plan of a job on the Megatron stack (``software`` 'megatron':
        Megatron-FSDP, the plain data parallelism of the Megatron papers)."""
        return self.sharding == "megatron" or software == "megatron"

    def torch_pipelined(self, software: str) -> bool:
        """Whether the plan's pipeline runs on torch.distributed.pipelining (PyTorch's schedules, torchtitan)
        rather than Megatron-core's: pipelined and not running Megatron's layers (runs_megatron_layers)."""
        return self.pp > 1 and not self.runs_megatron_layers(software)

    @property
    def context_impl(self) -> str:
        """The context-parallel exchange in effect."""
        return self.cp_impl or FRAMEWORK_CP[self.sharding][0]

    @property
    def shard_degree(self) -> int:
        """Ranks that shard dense model states: dp_shard·cp (torchtitan's dp_shard_cp mesh)."""
        return self.dp_shard * self.cp

    @property
    def is_ddp(self) -> bool:
        """Data parallelism by replicas alone, nothing sharded (sharding 'fsdp' at shard degree 1): DDP."""
        return self.sharding == "fsdp" and self.shard_degree == 1 and self.dp_replicate > 1

    @property
    def fsdp_pipelined(self) -> bool:
        """PyTorch FSDP2 under torch.distributed.pipelining: a stage keeps its parameters gathered and its
        gradients unsharded across the micro-batches of a step (set_reshard_after_backward(False),
        set_requires_gradient_sync(False) until the last), unless the plan says otherwise."""
        return (self.sharding == "fsdp" and self.pp > 1 and self.shard_degree > 1
                and self.reshard_after_forward is None and self.grad_sync is None)

    @property
    def effective_reshard_after_forward(self) -> bool | int:
        if self.reshard_after_forward is not None:
            return self.reshard_after_forward
        return not self.fsdp_pipelined

    @property
    def effective_grad_sync(self) -> str:
        if self.grad_sync is not None:
            return self.grad_sync
        if self.fsdp_pipelined:
            return "last"
        if self.sharding in ("zero1", "megatron"):
            return "last"
        if self.sharding == "fsdp" and self.shard_degree == 1:
            return "last"  # DDP with no_sync()
        return "every"

    @property
    def model_chunks(self) -> int:
        """Model chunks per pipeline rank: vpp for interleaved, 2 for ZB-V, else 1."""
        if self.schedule == "zb-v":
            return 2
        return self.vpp if self.schedule == "interleaved" else 1

    def unfixed(self, **changes: object) -> Plan:
        """This plan (with ``changes``) whose micro-batch size, recomputation and, if it offloads, number of
        offloaded layers evaluate chooses."""
        offload = {"offload_layers": None} if self.offload_layers != 0 and "offload_layers" not in changes else {}
        return replace(self, mbs=None, recompute=None, recompute_layers=None, recompute_modules="",
                       **offload, **changes)  # type: ignore[arg-type]

    def with_recompute(self, key: str) -> Plan:
        """This plan recomputing as a ``recompute_key`` says ('full', 'selective:layernorm+moe_act')."""
        mode, _, modules = key.partition(":")
        return replace(self, recompute=mode, recompute_modules=modules)

    @property
    def recompute_key(self) -> str:
        """The recomputation as the cost model reads it: the mode ('none' when unset), and Megatron's
        selective modules other than its default, as ``__post_init__`` spells them (RECOMPUTE_MODULES
        order): 'selective:layernorm+moe_act'."""
        rc = self.recompute or "none"
        return f"{rc}:{self.recompute_modules}" if rc == "selective" and self.recompute_modules else rc

    @property
    def recompute_label(self) -> str:
        """The recompute mode for tables: 'full:N' when only the first N layers of a stage recompute,
        'selective:MODULES' with Megatron's modules."""
        rc = self.recompute or "none"
        return f"{rc}:{self.recompute_layers}" if self.recompute_layers and rc == "full" else self.recompute_key

    def explicit_options(self) -> list[str]:
        """The options set here rather than left to the framework's default (None or False)."""
        out = [name for name in ("sp", "cp_impl", "reshard_after_forward", "grad_sync", "ep_dispatch", "etp")
               if getattr(self, name) is not None]
        return out + [name for name in ("async_tp", "ep_overlap") if getattr(self, name)] + (
            ["offload_layers"] if self.offload_layers != 0 else [])

    def option_labels(self) -> list[str]:
        """The plan's options in short form for tables: sharding, schedule, and every non-default option."""
        out = [self.sharding] if self.shard_degree > 1 else []
        if self.pp > 1:
            out.append(self.schedule + (f"/v{self.vpp}" if self.vpp > 1 else ""))
        if self.tp > 1 and not self.sequence_parallel:
            out.append("no-SP")
        if self.async_tp:
            out.append("async-TP")
        if self.cp > 1:
            out.append(f"cp:{self.context_impl}")
        if self.reshard_after_forward is not None:
            out.append(f"reshard:{str(self.reshard_after_forward).lower()}")
        if self.grad_sync is not None:
            out.append(f"sync:{self.grad_sync}")
        if self.ep > 1 and self.ep_dispatch is not None:
            out.append(f"ep:{self.ep_dispatch}")
        if self.etp is not None:
            out.append(f"etp:{self.etp}")
        if self.ep_overlap:
            out.append("ep-overlap")
        if self.offload_layers != 0:
            out.append(f"offload:{'auto' if self.offload_layers is None else self.offload_layers}")
        return out

    def label(self) -> str:
        """Short human name, e.g. 'TP=8 x FSDP=8' or 'HSDP 8x8'."""
        parts = []
        if self.pp > 1:
            parts.append(f"PP={self.pp}")
        if self.tp > 1:
            parts.append(f"TP={self.tp}")
        if self.cp > 1:
            parts.append(f"CP={self.cp}")
        if self.ep > 1:
            parts.append(f"EP={self.ep}")
        shard_name = "FSDP" if self.sharding == "fsdp" else self.sharding.upper()
        if self.dp_replicate > 1 and self.dp_shard > 1:
            parts.append(f"HSDP={self.dp_replicate}x{self.dp_shard}")
        elif self.dp_shard > 1:
            parts.append(f"{shard_name}={self.dp_shard}")
        elif self.dp_replicate > 1:
            parts.append(f"DDP={self.dp_replicate}")
        label = " x ".join(parts) if parts else "single GPU"
        if self.dp_shard == 1 and self.cp > 1 and self.sharding != "fsdp":
            label += f" ({shard_name} over CP)"  # model states sharded over the cp ranks
        elif self.shard_degree == 1 and self.sharding == "megatron" and parts:
            label += " (Megatron)"  # nothing sharded: Megatron-core's layers and schedules (runs_megatron_layers)
        return label

    def to_string(self) -> str:
        """The plan string that parses back to this plan (non-default fields only)."""
        out = []
        default = Plan()
        for f in fields(self):
            v = getattr(self, f.name)
            if v != getattr(default, f.name):
                text = "auto" if v is None else str(v).lower() if isinstance(v, bool) else v  # None: offload_layers
                out.append(f"{f.name}={text}")
        return ",".join(out) or "dp_replicate=1"


SHARDING_IMPL = {"fsdp": "PyTorch FSDP2", "zero1": "DeepSpeed ZeRO-1", "zero2": "DeepSpeed ZeRO-2",
                 "zero3": "DeepSpeed ZeRO-3", "megatron": "Megatron-core's distributed optimizer"}
"""The implementation a plan's sharding is estimated as (Plan.sharding)."""


def partial_reshard_blocked(plan: Plan) -> bool:
    """Whether ``plan`` reshards to a partial group after forward (an int reshard_after_forward) where FSDP2
    cannot: its parameters are DTensors under tensor or expert parallelism, and
    FSDPParam.to_sharded_post_forward raises NotImplementedError ("Resharding to smaller mesh is not
    supported for DTensor parameters yet", torch/distributed/fsdp/_fully_shard/_fsdp_param.py)."""
    raf = plan.reshard_after_forward
    return raf is not None and not isinstance(raf, bool) and (plan.tp > 1 or plan.ep > 1)


def stack_defaults(software: str, plan: Plan) -> Plan:
    """``plan`` with the options the named stack ``software`` fixes where the plan leaves them to the
    implementation: torchtitan runs PyTorch's DDP (``replicate(model, bucket_cap_mb=100)``) with gradient
    accumulation as plain backwards, no ``no_sync`` (torchtitan/trainer.py
    ``train_step``, @003fe280), so it all-reduces after every micro-batch (grad_sync 'every') where a
    DDP loop written with ``no_sync`` ('last', ``Plan.effective_grad_sync``) reduces once. Under a pipeline
    torch.distributed.pipelining runs DDP's ``no_sync`` itself (``backward_maybe_with_nosync``): 'last'.
    ``evaluate`` runs the plan so, and names it as given (``Estimate.grad_sync`` says what ran)."""
    if software == "torchtitan" and plan.grad_sync is None and plan.is_ddp and plan.pp == 1:
        return replace(plan, grad_sync="every")
    return plan


def stack_mismatch(software: str, plan: Plan) -> str | None:
    """What an explicit ``plan`` runs that the named stack ``software`` does not offer (STACK_SHARDINGS,
    STACK_SCHEDULES), as a note for its estimate; None where it runs only what the stack offers, or for
    'generic'. The plan is still estimated as written (Megatron-DeepSpeed, for one, runs ZeRO stages with
    Megatron's layers): the note says which implementation its figures assume."""
    out = []
    shardings = STACK_SHARDINGS.get(software)
    if shardings is not None and plan.sharding not in shardings:
        out.append(f"sharding={plan.sharding} (it runs {' or '.join(shardings)}; estimated as "
                   f"{SHARDING_IMPL[plan.sharding]})")
    schedules = STACK_SCHEDULES.get(software)
    if schedules is not None and plan.pp > 1 and plan.schedule not in schedules:
        out.append(f"schedule={plan.schedule} (it runs " + (" or ".join(schedules) or "no pipeline") + ")")
    return f"job.software '{software}' does not offer " + " nor ".join(out) if out else None


def _parse_value(key: str, raw: str) -> object:
    ftype = {f.name: f.type for f in fields(Plan)}[key]
    low = raw.strip().lower()
    if key == "reshard_after_forward":
        if low in ("true", "false"):
            return low == "true"
        return _int(key, raw, "true, false or a group size")
    if key == "etp" and low == "tp":
        return "tp"  # the plan's tp, resolved once every key is read
    if "bool" in str(ftype):
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise SpecError(f"plan.{key}", f"must be true or false; got {raw!r}")
    if key == "offload_layers" and low == "auto":
        return None
    if "int" in str(ftype):
        return _int(key, raw)
    if key == "layout":  # case matters: E and L, t and m
        return raw.strip()
    return low


@functools.lru_cache(maxsize=64)
def recompute_modules_of(recompute_key: str) -> frozenset[str]:
    """Megatron's selective modules in a Plan.recompute_key: core_attn for plain 'selective', none for the
    other modes."""
    if recompute_key == "selective":
        return frozenset({"core_attn"})
    if recompute_key.startswith("selective:"):
        return frozenset(recompute_key.split(":", 1)[1].split("+"))
    return frozenset()


def _int(key: str, raw: str, allowed: str = "an integer") -> int:
    try:
        return ascii_int(raw)
    except ValueError:
        if raw.strip().isascii() and raw.strip().isdigit():  # digits, too many of them
            raise SpecError(f"plan.{key}", f"must be a whole number from 1 to {MAX_INT:,}; got a number of "
                                           f"{len(raw.strip()):,} digits") from None
        raise SpecError(f"plan.{key}", f"must be {allowed}; got {shown_list([repr(raw)])}") from None


def parse_plan(text: str, world_size: int | None = None) -> Plan:
    """Parse 'tp=8,dp_shard=8,mbs=1,recompute=full'. One degree may be -1: it takes what is left of
    ``world_size``. Unknown keys and malformed items raise SpecError listing what is allowed."""
    allowed = [f.name for f in fields(Plan)]
    values: dict[str, object] = {}
    if not isinstance(text, str) or not text.strip():
        raise SpecError("plan", "is empty; write e.g. 'dp_shard=64' or 'tp=8,dp_shard=8'")
    if len(text) > MAX_PLAN_CHARS:
        raise SpecError("plan", f"is {len(text):,} characters; at most {MAX_PLAN_CHARS:,}")
    for item in text.split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise SpecError("plan", f"item {item.strip()!r} is not key=value; keys: {', '.join(allowed)}")
        key, raw = (s.strip() for s in item.split("=", 1))
        key = _ALIASES.get(key.lower(), key.lower())
        if key not in allowed:
            raise SpecError("plan", f"unknown key {key!r}; allowed: {', '.join(allowed)}")
        if key in values:
            raise SpecError(f"plan.{key}", "given twice")
        values[key] = _parse_value(key, raw)
    fill = [k for k in DEGREES if values.get(k) == -1]
    if "ep" in fill:
        raise SpecError("plan.ep", "cannot be -1: expert parallelism folds onto tp x cp x dp_shard rather than "
                                   "taking GPUs of its own; give its degree (a divisor of n_experts)")
    if fill:
        if len(fill) > 1 or world_size is None:
            raise SpecError("plan", "at most one degree may be -1, and only when the GPU count is known")
        rest = 1
        for k in DEGREES:
            if k != "ep" and k not in fill:
                degree = int(values.get(k, 1))  # type: ignore[call-overload]
                if degree < 1:
                    raise SpecError(f"plan.{k}", f"must be a whole number of at least 1 (one degree may be -1, to "
                                                 f"fill the GPUs), got {degree}")
                rest *= degree
        if world_size % rest:
            raise SpecError(f"plan.{fill[0]}", f"cannot fill: {world_size} GPUs is not a multiple of {rest}")
        values[fill[0]] = world_size // rest
    if values.get("etp") == "tp":
        values["etp"] = values.get("tp", 1)
    return Plan(**values)  # type: ignore[arg-type]


def with_degrees(plan: Plan, **degrees: int) -> Plan:
    return replace(plan, **degrees)
