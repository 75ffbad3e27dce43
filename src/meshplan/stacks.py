"""Which software stack a recommendation assumes.

A plan's step time depends on the stack that runs it: its kernels, its overheads, the parallelisms and
schedules it offers (specs.plan.STACK_SHARDINGS, STACK_SCHEDULES) and how well meshplan's predictions of it
have been validated (its uncertainty band). A job that names no stack is therefore answered per stack:
each stack's best plan, searched over what that stack runs and timed with its own calibrated parameters,
side by side with its own band; the recommendation then assumes one of them and says which.

Which one: the fastest leader, unless another stack's leader is within the ranking's tie band of it and
its predictions are better validated (a narrower band), as the tie band prefers the simpler of two plans:
below the model's error, the answer to trust is the better-validated one. The ordering of the table is
by predicted step time alone, so the choice never reverses a comparison the user reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from meshplan.cost.estimate import Estimate
from meshplan.explain import PlanAnalysis, analyse
from meshplan.parallel import available_cores, parallel_map
from meshplan.progress import Progress
from meshplan.search.rank import TIE_BAND
from meshplan.search.search import REFINE_TOP, SearchResult, remember_search, search
from meshplan.search.space import Space
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan
from meshplan.uncertainty import attach_band

COMPARED_STACKS = ("megatron", "torchtitan", "deepspeed")
"""The stacks a job that names none is answered for: Megatron-LM (Megatron-core, NeMo, Megatron-Bridge),
torchtitan (PyTorch FSDP2 and its pipelining) and DeepSpeed (ZeRO with Megatron-DeepSpeed's layers)."""
STACK_NAMES = {"megatron": "Megatron-LM", "torchtitan": "torchtitan", "deepspeed": "DeepSpeed",
               "llm-foundry": "llm-foundry", "maxtext": "MaxText", "generic": "any stack"}


@dataclass(frozen=True, slots=True)
class StackLeader:
    """One stack's answer: its best plan (with its band) and its search, or why it has none."""

    stack: str
    best: Estimate | None
    result: SearchResult | None
    why_none: str = ""

    @property
    def name(self) -> str:
        return STACK_NAMES.get(self.stack, self.stack)

    @property
    def band_width(self) -> float:
        """The width of the best plan's band (high - low), infinite without one."""
        b = self.best.uncertainty if self.best else None
        return b.high - b.low if b else float("inf")


def stack_leaders(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, space: Space | None = None, *,
                  mfu: float | None = None, workers: int | None = None, progress: Progress | None = None,
                  stacks: tuple[str, ...] = COMPARED_STACKS) -> list[StackLeader]:
    """Each of ``stacks``' best plan for this scenario, searched and timed as ``meshplan plan --stack`` would
    (its leading plans re-timed by the simulator), with its band; ordered by predicted step time, stacks
    without a plan that fits last. The stacks' searches run side by side on up to ``workers`` cores (each
    then re-times its plans in order), the progress line counting stacks; on one core, in order, counting
    each search's plans."""
    searched = _searched(model, stacks)
    one_core = min(len(searched), available_cores() if workers is None else workers) <= 1

    def one(stack: str) -> SearchResult:
        count: Callable[[int, int], None] | None = (
            progress.counter(f"searching {STACK_NAMES[stack]}'s plans", "plans") if progress and one_core else None)
        return search(model, cluster, replace(job, software=stack), space or Space(), mfu=mfu, progress=count,
                      refine_top=REFINE_TOP, workers=workers if one_core else 1)

    done = progress.counter("searching each stack's plans", "stacks") if progress and not one_core else None
    results = dict(zip(searched, parallel_map(one, searched, workers, done=done), strict=True))
    for stack, result in results.items():  # searched in workers: kept here for a sweep through this scenario
        remember_search(result, model, cluster, replace(job, software=stack), space or Space(), mfu=mfu,
                        refine_top=REFINE_TOP)
    out = []
    for stack in stacks:
        result = results.get(stack)
        if result is None or result.recommended is None:
            out.append(_no_leader(stack, result))
        else:
            out.append(_leader(model, cluster, stack, result.recommended, result))
    return _by_step_time(out)


def _searched(model: ModelSpec, stacks: tuple[str, ...]) -> list[str]:
    """The ``stacks`` meshplan searches for ``model``: not DeepSpeed for an MoE model (``_no_leader`` says why)."""
    return [s for s in stacks if not (s == "deepspeed" and model.is_moe)]


def _leader(model: ModelSpec, cluster: ClusterSpec, stack: str, best: Estimate, result: SearchResult | None
            ) -> StackLeader:
    """A stack's leader: its best plan with the stack's own band."""
    return StackLeader(stack, attach_band(best, accelerator=cluster.accelerator.name, software=stack,
                                          moe=model.is_moe), result)


def _no_leader(stack: str, result: SearchResult | None) -> StackLeader:
    """A stack with no plan that fits (``result``: its search), or that meshplan does not search (None)."""
    if result is None:
        return StackLeader(stack, None, None, "meshplan does not model DeepSpeed-MoE's expert parallelism")
    return StackLeader(stack, None, result, result.ranked[0].infeasible_reasons[0] if result.ranked
                       else "it runs no plan of this scenario")


def _by_step_time(leaders: list[StackLeader]) -> list[StackLeader]:
    return sorted(leaders, key=lambda s: (s.best is None, s.best.step_time_s if s.best else 0.0))


def _one_class(plan: Plan) -> int:
    """Every plan in one class: a leading search that reads only the recommendation (search.leading)."""
    return 0


def stack_bests(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, space: Space | None = None, *,
                mfu: float | None = None, workers: int | None = None, progress: Progress | None = None,
                stacks: tuple[str, ...] = COMPARED_STACKS) -> list[StackLeader]:
    """``stack_leaders``' leaders, with their bands and in its order, without the searches behind them
    (``StackLeader.result`` None): each stack's recommendation is that of its full search, found by a search
    for the leading plans alone (search.leading.search_leading), which evaluates a fraction of the plans. What
    ``sweep`` and ``compare`` choose their stack with; a stack none of whose plans fits says only that."""
    from meshplan.search.leading import search_leading

    searched = _searched(model, stacks)

    def one(stack: str) -> Estimate | None:
        return search_leading(model, cluster, replace(job, software=stack), space or Space(), mfu=mfu,
                              refine_top=REFINE_TOP, classes=_one_class).recommended

    done = progress.counter("searching each stack's plans", "stacks") if progress else None
    bests = dict(zip(searched, parallel_map(one, searched, workers, done=done), strict=True))
    out = []
    for stack in stacks:
        best = bests.get(stack)
        if best is not None:
            out.append(_leader(model, cluster, stack, best, None))
        else:
            out.append(_no_leader(stack, None) if stack not in bests else
                       StackLeader(stack, None, None, "no plan of it fits"))
    return _by_step_time(out)


def assumed_stack(leaders: list[StackLeader]) -> tuple[StackLeader | None, str]:
    """The leader a recommendation assumes, and one sentence on why (module docstring)."""
    ran = [s for s in leaders if s.best is not None]
    if not ran:
        return None, "no stack runs a plan that fits"
    fastest = ran[0]
    close = [s for s in ran if s.best.step_time_s <= fastest.best.step_time_s * (1 + TIE_BAND)]  # type: ignore
    chosen = min(close, key=lambda s: (s.band_width, s.best.step_time_s))  # type: ignore[union-attr]
    if chosen is fastest:
        return chosen, f"{chosen.name} runs the fastest plan"
    gap = chosen.best.step_time_s / fastest.best.step_time_s - 1  # type: ignore[union-attr]
    return chosen, (f"{chosen.name}'s plan is within the {TIE_BAND:.0%} tie band of {fastest.name}'s ({gap:+.1%}) "
                    "and its predictions are better validated (a narrower band)")


def analyse_by_stack(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, *, space: Space | None = None,
                     mfu: float | None = None, with_conditions: bool = True, progress: Progress | None = None,
                     workers: int | None = None) -> PlanAnalysis:
    """``explain.analyse`` for a job that names no stack: each stack's leader (stack_leaders), and the analysis
    of the stack the recommendation assumes (assumed_stack), from the search already run for it."""
    leaders = stack_leaders(model, cluster, job, space, mfu=mfu, workers=workers, progress=progress)
    chosen, why = assumed_stack(leaders)
    if chosen is None:
        analysis = analyse(model, cluster, job, space=space, mfu=mfu, with_conditions=with_conditions,
                           progress=progress, workers=workers)
    else:
        analysis = analyse(model, cluster, replace(job, software=chosen.stack), space=space, mfu=mfu,
                           with_conditions=with_conditions, progress=progress, workers=workers, result=chosen.result)
    return replace(analysis, stacks=leaders, stack_note=why)


def with_assumed_stack(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, space: Space | None = None, *,
                       mfu: float | None = None, workers: int | None = None, progress: Progress | None = None
                       ) -> tuple[JobSpec, str]:
    """``job`` on the stack ``meshplan plan`` would assume for this scenario (a job that names no stack), and
    a sentence saying so: what sweep and compare run every point or row on, so that a sweep agrees with plan
    at its base value and a comparison compares one stack on every cluster."""
    chosen, why = assumed_stack(stack_bests(model, cluster, job, space, mfu=mfu, workers=workers,
                                            progress=progress))
    if chosen is None:
        return job, (f"no stack runs a plan that fits {cluster.n_gpus} x {cluster.accelerator.name}: searched as any "
                     "stack")
    return (replace(job, software=chosen.stack),
            f"stack {chosen.stack}, which plan assumes for {cluster.n_gpus:,} x {cluster.accelerator.name} "
            f"({why}; --stack to choose)")
