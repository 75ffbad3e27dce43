"""How the global batch splits: over data-parallel replicas into micro-batches of a given size."""

from __future__ import annotations

import functools
import math

from meshplan.specs import JobSpec, Plan


def batch_split_reasons(job: JobSpec, plan: Plan) -> tuple[list[str], int]:
    """Why the batch does not split as ``plan`` says (empty if it does), and the micro-batch count."""
    reasons: list[str] = []
    seqs, dp = job.global_batch_seqs, plan.dp
    mbs = plan.mbs or 1
    if seqs % dp:
        reasons.append(f"global batch of {seqs} sequences does not split evenly over {dp} data-parallel "
                       f"replicas")
    per_replica = max(1, seqs // dp)
    if seqs < dp:
        reasons.append(f"global batch of {seqs} sequences is smaller than {dp} data-parallel replicas")
    if per_replica % mbs:
        reasons.append(f"micro-batch size {mbs} does not divide the {per_replica} sequences per replica")
    m = micro_batches(job, dp, mbs)
    if plan.schedule == "interleaved" and plan.pp > 1 and m % plan.pp:
        reasons.append(f"interleaved schedule needs micro-batches ({m}) to be a multiple of pp={plan.pp}")
    return reasons, m


def micro_batch_sizes(job: JobSpec, dp: int) -> list[int]:
    """Micro-batch sizes that divide each of ``dp`` replicas' share of the batch, largest first (a shared
    list: do not modify)."""
    return divisors_descending(job.global_batch_seqs // dp if job.global_batch_seqs >= dp else 1)


@functools.lru_cache(maxsize=4096)
def divisors_descending(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]  # O(sqrt n): batches may be huge
    return sorted({*small, *(n // d for d in small)}, reverse=True) or [1]


def micro_batches(job: JobSpec, dp: int, mbs: int) -> int:
    """Micro-batches per step of each data-parallel replica (as ``batch_split_reasons`` counts them)."""
    return max(1, max(1, job.global_batch_seqs // dp) // mbs)
