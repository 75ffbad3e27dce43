"""Time to train, GPU-hours, cost, energy and goodput of one estimated plan, as value objects with their
band and a JSON form (units in every key)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshplan.cost.estimate import Band, Estimate
from meshplan.cost.memory import state_bytes_per_param
from meshplan.cost.params import param_counts
from meshplan.economics import formulas as f
from meshplan.economics.settings import Settings, defaults_for
from meshplan.errors import SpecError
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec

MIN_GOODPUT = 1e-6
"""Below this share of wall time training (a million times the failure-free time) a run makes no progress
worth a figure: its time, GPU-hours, cost and energy are not given."""


@dataclass(frozen=True, slots=True)
class Banded:
    """A predicted quantity and the range the step time's uncertainty band carries it to: ``low`` and
    ``high`` are where it lands if measured steps fall at the band's 10th and 90th percentile."""

    value: float
    low: float
    high: float

    @classmethod
    def with_band(cls, value: float, band: Band | None, *, inverse: bool = False) -> Banded:
        """``value`` proportional to the step time (``inverse``: to its reciprocal, as tokens/s is), with the
        band's relative range (none where there is no band)."""
        if band is None:
            return cls(value, value, value)
        if inverse:
            return cls(value, value / (1.0 + band.high), value / (1.0 + band.low))
        return cls(value, value * (1.0 + band.low), value * (1.0 + band.high))

    def scaled(self, k: float) -> Banded:
        return Banded(self.value * k, self.low * k, self.high * k)

    def overlaps(self, other: Banded) -> bool:
        """Whether the two ranges share a value: the difference is within the model's error."""
        return self.low <= other.high and other.low <= self.high

    def to_dict(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high}


def checkpoint_bytes(model: ModelSpec, job: JobSpec, sharding: str) -> float:
    """Bytes of one checkpoint [bytes]: every parameter's weights, fp32 master copy and optimizer state
    once, as its implementation keeps them (cost.memory.state_bytes_per_param: FSDP2's fp32 parameters are
    the master copy, 4 + 8 bytes with AdamW; Megatron's and DeepSpeed's bf16 weights, fp32 master and
    moments, 2 + 4 + 8); gradients are not saved. Replicated states are counted once: PyTorch DCP and
    Megatron's distributed checkpointing write each shard from one rank and spread the writes over the
    replicas."""
    st = state_bytes_per_param(sharding=sharding, optimizer=job.optimizer, dp_sharded=True,
                               reduce_dtype_bytes=job.reduce_dtype_bytes)
    return param_counts(model).total * (st.params + st.master + st.optimizer)


@dataclass(frozen=True, slots=True, kw_only=True)
class Goodput:
    """What failures and checkpoints cost a run [daly2006]: its interruptions, the optimal checkpoint
    interval, and the share of wall time that trains the model."""

    failures_per_gpu_hour: float
    job_mtbf_s: float | None
    """The job's mean time between interruptions; None without failures."""
    interruptions_per_day: float
    checkpoint_bytes: float
    checkpoint_bytes_per_node: float
    checkpoint_write_s: float
    """δ: the checkpoint's bytes over every GPU's write bandwidth together."""
    interval_s: float | None
    """Daly's optimum compute time between checkpoints; None without failures (no checkpoint is needed)."""
    interval_steps: int | None
    young_interval_s: float | None
    restart_s: float
    fraction: float
    """T_s / T_w, in [0, 1]; 0 where the job cannot make progress."""

    def to_dict(self) -> dict[str, float | int | None]:
        return {"failures_per_gpu_hour": self.failures_per_gpu_hour, "job_mtbf_s": self.job_mtbf_s,
                "interruptions_per_day": self.interruptions_per_day, "checkpoint_bytes": self.checkpoint_bytes,
                "checkpoint_bytes_per_node": self.checkpoint_bytes_per_node,
                "checkpoint_write_s": self.checkpoint_write_s, "checkpoint_interval_s": self.interval_s,
                "checkpoint_interval_steps": self.interval_steps, "young_interval_s": self.young_interval_s,
                "restart_s": self.restart_s, "goodput_fraction": self.fraction}


def goodput(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, est: Estimate, settings: Settings) -> Goodput:
    """Goodput of ``est``'s plan on ``cluster`` under ``settings``' failure rate, storage and restart."""
    n = cluster.n_gpus
    ckpt = checkpoint_bytes(model, job, est.plan.sharding)
    delta = ckpt / (n * settings.storage_bytes_per_s_per_gpu)
    m = f.job_mtbf_s(settings.failures_per_gpu_hour, n)
    if math.isinf(m):
        tau, young, g = math.inf, None, 1.0
    else:
        tau, young = f.daly_interval_s(delta, m), f.young_interval_s(delta, m)
        g = f.goodput_fraction(tau, delta, settings.restart_s, m)
    return Goodput(failures_per_gpu_hour=settings.failures_per_gpu_hour, job_mtbf_s=None if math.isinf(m) else m,
                   interruptions_per_day=0.0 if math.isinf(m) else f.SECONDS_PER_DAY / m,
                   checkpoint_bytes=ckpt, checkpoint_bytes_per_node=ckpt / cluster.n_nodes,
                   checkpoint_write_s=delta, interval_s=None if math.isinf(tau) else tau,
                   interval_steps=None if math.isinf(tau) else max(1, round(tau / est.step_time_s)),
                   young_interval_s=young, restart_s=settings.restart_s, fraction=g)


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """Time to train ``train_tokens`` tokens with one plan, what it costs, and what failures take from it.
    Every time, GPU-hour, cost and energy figure carries the step time's band (``Banded``)."""

    accelerator: str
    n_gpus: int
    plan: str
    train_tokens: int
    global_batch_tokens: int
    steps: int
    step_time_s: Banded
    tokens_per_s: Banded
    train_time_s: Banded
    """Failure-free: steps x step time."""
    wall_time_s: Banded | None
    """With interruptions, checkpoints and restarts (train time / goodput); None where the job cannot
    make progress (goodput below MIN_GOODPUT)."""
    gpu_hours: Banded | None
    cost_usd: Banded | None
    """None without a price."""
    energy_j: Banded | None
    """None without a board power."""
    goodput: Goodput
    expected_interruptions: Banded | None
    settings: Settings
    band_basis: str | None

    def to_dict(self) -> dict[str, object]:
        """JSON form: base units, named in each key (seconds, bytes, joules, USD, GPU-hours, tokens)."""
        def opt(b: Banded | None) -> dict[str, float] | None:
            return None if b is None else b.to_dict()

        s = self.settings
        return {"accelerator": self.accelerator, "n_gpus": self.n_gpus, "plan": self.plan,
                "train_tokens": self.train_tokens, "global_batch_tokens": self.global_batch_tokens,
                "steps": self.steps, "step_time_s": self.step_time_s.to_dict(),
                "tokens_per_s": self.tokens_per_s.to_dict(), "train_time_s": self.train_time_s.to_dict(),
                "wall_time_s": opt(self.wall_time_s), "gpu_hours": opt(self.gpu_hours),
                "cost_usd": opt(self.cost_usd), "energy_j": opt(self.energy_j),
                "expected_interruptions": opt(self.expected_interruptions), "goodput": self.goodput.to_dict(),
                "band_basis": self.band_basis,
                "assumptions": {"price_usd_per_gpu_hour": s.price_usd_per_gpu_hour, "board_power_w": s.board_power_w,
                                "pue": s.pue, "failures_per_gpu_hour": s.failures_per_gpu_hour,
                                "storage_bytes_per_s_per_gpu": s.storage_bytes_per_s_per_gpu,
                                "restart_s": s.restart_s, "sources": dict(s.sources)}}


def summarise(estimate: Estimate, model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
              settings: Settings | None = None, train_tokens: int | None = None) -> Summary:
    """Time to train, GPU-hours, cost, energy and goodput of ``estimate`` (a feasible plan) for
    ``train_tokens`` tokens (default ``job.train_tokens``), under ``settings`` (default: the catalog's for
    the cluster's accelerator, economics.defaults_for).

    T_s = ceil(D/B)·t_step; T_w = T_s / G (``formulas.goodput_fraction``); GPU-hours = n·T_w/3600; cost =
    GPU-hours x price; energy = n·T_w·P·PUE (a run pays for, and powers, its GPUs while it recovers too).
    The band of ``estimate.uncertainty`` scales every time-proportional figure; goodput itself does not
    depend on the step time."""
    tokens = train_tokens if train_tokens is not None else job.train_tokens
    if tokens is None:
        raise SpecError("job.train_tokens", "is needed for time to train, cost and energy (e.g. --train-tokens 15.6T)")
    if not estimate.feasible:
        raise SpecError("plan", f"{estimate.plan.label()} does not fit: {'; '.join(estimate.infeasible_reasons)}")
    settings = settings or defaults_for(cluster)
    band, n = estimate.uncertainty, cluster.n_gpus
    steps = f.train_steps(tokens, estimate.global_batch_tokens)
    step = Banded.with_band(estimate.step_time_s, band)
    train = step.scaled(steps)
    good = goodput(model, cluster, job, estimate, settings)
    wall = None if good.fraction < MIN_GOODPUT else train.scaled(1.0 / good.fraction)
    hours = None if wall is None else wall.scaled(n / f.SECONDS_PER_HOUR)
    price, power = settings.price_usd_per_gpu_hour, settings.board_power_w
    return Summary(
        accelerator=cluster.accelerator.name, n_gpus=n, plan=estimate.plan.to_string(), train_tokens=tokens,
        global_batch_tokens=estimate.global_batch_tokens, steps=steps, step_time_s=step,
        tokens_per_s=Banded.with_band(estimate.tokens_per_s, band, inverse=True), train_time_s=train,
        wall_time_s=wall, gpu_hours=hours,
        cost_usd=None if hours is None or price is None else hours.scaled(price),
        energy_j=None if wall is None or power is None else wall.scaled(n * power * settings.pue),
        goodput=good,
        expected_interruptions=None if wall is None else wall.scaled(0.0 if good.job_mtbf_s is None
                                                                     else 1.0 / good.job_mtbf_s),
        settings=settings, band_basis=None if band is None else band.basis)
