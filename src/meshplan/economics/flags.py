"""Command-line flags for the job fields people change most and for the economic assumptions. A job file
(--job) still sets every job field; a flag given wins over it. Each bad value exits 2 with one line naming
the flag and what it allows (argparse, through these types)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from meshplan.cost.estimate import Estimate
from meshplan.economics.settings import MAX_PRICE_USD_PER_GPU_HOUR, MAX_PUE, Settings, defaults_for, failure_rate
from meshplan.economics.summary import Summary
from meshplan.errors import SpecError
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan
from meshplan.specs.job import MAX_TRAIN_TOKENS, OPTIMIZERS, PRECISIONS, RECOMPUTE_CHOICES, SOFTWARE
from meshplan.units import GB, parse_token_count

JOB_FLAGS = {"stack": "software", "precision": "precision", "optimizer": "optimizer", "recompute": "recompute",
             "train_tokens": "train_tokens"}
"""Flag destination -> the JobSpec field it overrides."""


def _one_of(allowed: tuple[str, ...]) -> Callable[[str], str]:
    def check(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(allowed)}; got {text!r}")
        return text
    return check


def _number_in(lo: float, hi: float, what: str) -> Callable[[str], float]:
    def check(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not (math.isfinite(v) and lo <= v <= hi):
            raise argparse.ArgumentTypeError(f"must be {what} from {lo:g} to {hi:g}, got {text!r}")
        return v
    return check


def train_tokens(text: str) -> int:
    """A token budget: '15.6T', '2B', '1e12' (decimal multiples)."""
    try:
        v = parse_token_count(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of tokens such as 15.6T, 2B or 1e12 (decimal "
                                         f"multiples), got {text!r}") from None
    if not 0 < v <= MAX_TRAIN_TOKENS:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_TRAIN_TOKENS:.0e} tokens, got {text!r}")
    return v


def _failure_rate(text: str) -> str:
    try:
        failure_rate(text)
    except SpecError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


def add_job_flags(group: Any) -> None:
    """The job and economics flags, on an argparse group (the scenario group of every command)."""
    group.add_argument("--stack", type=_one_of(SOFTWARE), default=None, metavar="NAME",
                       help=f"software stack ({', '.join(SOFTWARE)}); the search then runs only what it offers "
                            "(default: the job file's, else generic)")
    group.add_argument("--precision", type=_one_of(PRECISIONS), default=None, metavar="NAME",
                       help=f"GEMM precision ({', '.join(PRECISIONS)})")
    group.add_argument("--optimizer", type=_one_of(OPTIMIZERS), default=None, metavar="NAME",
                       help=f"optimizer ({', '.join(OPTIMIZERS)})")
    group.add_argument("--recompute", type=_one_of(RECOMPUTE_CHOICES), default=None, metavar="MODE",
                       help=f"activation recomputation the search may use ({', '.join(RECOMPUTE_CHOICES)}; "
                            "auto: the fastest that fits, partial included)")
    group.add_argument("--train-tokens", type=train_tokens, default=None, metavar="N",
                       help="tokens the run trains on, for time to train, cost, energy and goodput (15.6T, 1e12; "
                            "decimal multiples)")
    group.add_argument("--price-per-gpu-hour", type=_number_in(1e-6, MAX_PRICE_USD_PER_GPU_HOUR, "US dollars"),
                       default=None, metavar="USD",
                       help="price of one GPU-hour (default: the catalog's dated on-demand list price)")
    group.add_argument("--pue", type=_number_in(1.0, MAX_PUE, "a power usage effectiveness"), default=None,
                       help="facility power usage effectiveness (default 1.56, Uptime Institute 2024 average)")
    group.add_argument("--failure-rate", type=_failure_rate, default=None, metavar="RATE",
                       help="interruptions per GPU-hour, or a published fleet's: llama3-405b (default), meta-rsc1, "
                            "meta-rsc2, opt-175b")
    group.add_argument("--storage-bandwidth", type=_number_in(1e-6, 1e4, "GB/s per GPU"), default=None,
                       metavar="GB_PER_S",
                       help="checkpoint write bandwidth per GPU, decimal GB/s (default 0.122, Llama 3's storage)")
    group.add_argument("--restart-minutes", type=_number_in(0.0, 7 * 24 * 60, "minutes"), default=None,
                       metavar="MIN", help="time to restart after an interruption (default 10)")


def job_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The JobSpec fields the flags set (for catalog.load_job, whose overrides win over the job file)."""
    return {field: getattr(args, dest, None) for dest, field in JOB_FLAGS.items()}


def settings_from_args(args: argparse.Namespace, cluster: ClusterSpec) -> Settings:
    """The catalog's assumptions for ``cluster`` with every economics flag given applied."""
    settings = defaults_for(cluster)
    if getattr(args, "failure_rate", None) is not None:
        rate, source = failure_rate(args.failure_rate)
        settings = settings.override(failures_per_gpu_hour=rate, sources={"failures_per_gpu_hour": source})
    restart = getattr(args, "restart_minutes", None)
    storage = getattr(args, "storage_bandwidth", None)
    return settings.override(price_usd_per_gpu_hour=getattr(args, "price_per_gpu_hour", None),
                             pue=getattr(args, "pue", None),
                             storage_bytes_per_s_per_gpu=None if storage is None else storage * GB,
                             restart_s=None if restart is None else restart * 60.0)


def plan_with_job_recompute(plan: Plan, job: JobSpec) -> Plan:
    """An explicit plan (``evaluate --plan``) with the job's recomputation where the plan leaves it open
    (search.space.with_job_recompute); SpecError where the plan cannot run it."""
    from meshplan.search.space import with_job_recompute

    out = with_job_recompute(plan, job)
    if out is None:
        raise SpecError("--recompute", f"{plan.to_string()} cannot run recompute={job.recompute} (op-level SAC needs "
                                       "PyTorch's layers; MoE all-to-all overlap and activation offloading run "
                                       "without full recomputation)")
    return out


def evaluate_economics(args: argparse.Namespace, est: Estimate, model: ModelSpec, cluster: ClusterSpec,
                       job: JobSpec) -> Summary | None:
    """``evaluate``'s time to train, cost, energy and goodput: where --train-tokens (or the job file's
    train_tokens) is given and the plan fits; None otherwise."""
    if job.train_tokens is None or not est.feasible or est.mode != "faithful":
        return None
    from meshplan.economics.summary import summarise

    return summarise(est, model, cluster, job, settings_from_args(args, cluster))

