"""Result types of an evaluation: the communication ledger, memory and the estimate of one plan."""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.specs import Plan

OTHER_MICROBATCH = "other_microbatch"
"""The window of traffic that runs beside another micro-batch's compute (Megatron's MoE all-to-all overlap)."""


@dataclass(slots=True)
class CommEntry:
    """One kind of collective a step issues on one GPU, all its calls summed.

    ``message_bytes`` is the payload of one call as nccl-tests defines it; ``bytes_per_gpu`` what the
    GPU sends per step over all calls; ``time_s`` the time of all calls; ``window`` the compute that
    can hide it ('forward', 'backward', 'first_forward', 'last_backward', 'attention', 'pipeline',
    OTHER_MICROBATCH for the compute of another micro-batch, or 'none' for collectives on the critical
    path); ``edge_s`` the part no compute can hide (the first all-gather before any compute, the last
    reduce-scatter after it).
    """

    collective: str
    axis: str
    purpose: str
    phase: str
    count: int
    message_bytes: float
    group_size: int
    link: str
    bytes_per_gpu: float
    inter_node_bytes_per_gpu: float
    time_s: float
    window: str
    edge_s: float = 0.0
    exposed_s: float = 0.0

    @property
    def overlappable(self) -> bool:
        return self.window != "none"

    @property
    def blocks_after_step(self) -> bool:
        """Issued once per step, with nothing to hide it (DeepSpeed ZeRO-1/2's all-gather of the updated
        parameters inside the optimizer step): off the micro-batches' timeline, added to the step."""
        return self.phase == "step" and self.window == "none"

    def group_name(self, cp: int) -> str:
        """The axis as a user reads it under context parallelism ``cp``: the data-parallel shard group then
        spans the CP ranks too (torchtitan's ``dp_shard_cp`` mesh, Megatron's data-and-context group)."""
        return "dp_shard_cp" if cp > 1 and self.axis == "dp_shard" and self.group_size % cp == 0 else self.axis

    @property
    def breakdown_key(self) -> str:
        """The key of this entry's exposed time in a step-time breakdown (one key per collective and axis)."""
        return f"exposed {self.collective} ({self.axis})"

    def breakdown_label(self, cp: int) -> str:
        """``breakdown_key`` with the group named as a user reads it (``group_name``)."""
        return f"exposed {self.collective} ({self.group_name(cp)})"


@dataclass(frozen=True, slots=True)
class MemoryReport:
    """Peak memory of the most loaded GPU (pipeline stage ``stage``), by term [bytes, binary GiB shown]."""

    terms: dict[str, float]
    static_bytes: float
    activation_bytes: float
    transient_bytes: float
    runtime_bytes: float
    peak_bytes: float
    capacity_bytes: float
    stage: int

    @property
    def headroom_bytes(self) -> float:
        return self.capacity_bytes - self.peak_bytes


@dataclass(frozen=True, slots=True)
class FlopReport:
    """FLOPs per step [FLOP]: model FLOPs (MFU convention) and those the hardware executes (HFU)."""

    model_flop_per_step: float
    hardware_flop_per_step: float
    model_flop_per_token: float
    convention: str
    model_flop_per_step_palm: float
    model_flop_per_step_causal: float


@dataclass(frozen=True, slots=True)
class StageDetail:
    """What the timeline simulator needs of one pipeline stage (not part of the JSON schema).

    Times are per micro-batch on one GPU of the stage [s]: the transformer layers' forward, input-gradient,
    weight-gradient and recomputation parts, the attention core's forward, and the LM head's forward and
    backward (last stage only)."""

    stage: int
    n_layers: int
    t_f_s: float
    t_b_s: float
    t_w_s: float
    t_r_s: float
    attention_fwd_s: float
    head_f_s: float
    head_b_s: float
    comm: list[CommEntry]
    optimizer_s: float
    breakdown: dict[str, float]
    time_s: float
    passes_s: tuple[float, float, float]
    """(t_F, t_B, t_W) of one micro-batch as the pipeline's bubble takes them (cost.pipeline.bubble_time_s):
    the forward with its LM head and unhidden in-layer collectives, the input-gradient part with those and
    the recomputation, and the weight-gradient part."""


@dataclass(frozen=True, slots=True)
class Band:
    """Where measured steps of published runs fell against predictions like this one: the 10th and 90th
    percentile of (measured step / predicted step - 1) over ``rows`` runs (calibration.uncertainty_band)."""

    low: float
    high: float
    rows: int
    basis: str
    """Which runs and residuals: '177 similar published runs (h100-sxm/dense; cross-validated residuals)'."""

    def sentence(self, of: str) -> str:
        """'measured steps fell within -6% .. +7% of ``of`` (10th-90th percentile) for <basis>'."""
        return (f"measured steps fell within {self.low:+.0%} .. {self.high:+.0%} of {of} (10th-90th percentile) "
                f"for {self.basis}")


@dataclass(frozen=True, slots=True)
class Estimate:
    """Everything meshplan predicts for one plan. Infeasible plans carry reasons, not exceptions."""

    model: str
    cluster: str
    n_gpus: int
    plan: Plan
    n_microbatches: int
    global_batch_tokens: int
    seq_len: int
    feasible: bool
    infeasible_reasons: list[str]
    memory: MemoryReport
    flops: FlopReport
    step_time_s: float
    time_breakdown: dict[str, float]
    mfu: float
    hfu: float
    comm: list[CommEntry]
    mode: str = "faithful"
    notes: list[str] = field(default_factory=list)
    bubble_fraction: float = 0.0
    compute_source: str = "kernel model"
    uncertainty: Band | None = None
    """Relative band on step time from out-of-fold residuals of published runs, where known."""
    stages: tuple[StageDetail, ...] = ()
    """Per-stage detail for the simulator: the stages that bound the step (cost.stage.bounding_stages)."""
    closed_form_step_time_s: float | None = None
    """The closed form's step time when ``step_time_s`` comes from the timeline simulator."""
    comm_stage: int = 0
    """The pipeline stage whose ledger ``comm`` is: the slowest in the closed form, the busiest rank's under
    the simulator (the one ``time_breakdown`` is told from)."""
    stack_grad_sync: str | None = None
    """The gradient sync the job's stack runs where the plan leaves it and the stack fixes it otherwise
    than ``Plan.effective_grad_sync`` says (specs.plan.stack_defaults); None elsewhere."""

    @property
    def grad_sync(self) -> str:
        """The gradient sync the step runs: 'every' or 'last' micro-batch."""
        return self.stack_grad_sync or self.plan.effective_grad_sync

    @property
    def tokens_per_s(self) -> float:
        return self.global_batch_tokens / self.step_time_s if self.step_time_s > 0 else 0.0

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.n_gpus

    def breakdown_name(self, key: str) -> str:
        """A ``time_breakdown`` key as the user reads it: an exposed collective's group named as the
        communication table names it (``CommEntry.group_name``: 'dp_shard_cp' where the shard group spans
        the CP ranks); other keys unchanged."""
        entry = next((e for e in self.comm if e.breakdown_key == key), None)
        return entry.breakdown_label(self.plan.cp) if entry is not None else key

    def named_breakdown(self) -> dict[str, float]:
        """``time_breakdown`` under ``breakdown_name``'s keys, in its order."""
        return {self.breakdown_name(k): v for k, v in self.time_breakdown.items()}

    def comm_time_s(self, *, exposed: bool = False) -> float:
        return sum(e.exposed_s if exposed else e.time_s for e in self.comm)
