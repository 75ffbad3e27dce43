"""Choosing a plan's micro-batch size, recomputation and activation offloading: the options offered, and
the fastest combination that fits (``Choice``), found by bisection on memory and pruned by lower bounds."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields

from meshplan.cost.batch import micro_batch_sizes, micro_batches
from meshplan.cost.bounds import TrafficFloors, compute_bound_s, traffic_floors
from meshplan.cost.compute import ComputeParams
from meshplan.cost.estimate import Estimate
from meshplan.cost.fixed_plan import Probe, evaluate_fixed, plan_shared, probe, stage_ctxs
from meshplan.cost.offload import offload_runs_with
from meshplan.cost.params import param_counts
from meshplan.cost.pipeline import in_flight_microbatches, plan_stage_layers
from meshplan.cost.stage import chunk_layers
from meshplan.cost.validate import recompute_module_needs
from meshplan.memo import cache_by_identity
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan

_PLAN_FIELDS = tuple(f.name for f in fields(Plan))


OFFLOAD_MODE = "offload"
"""The choice's mode for activation offloading (Plan.offload_layers) instead of recomputation; its layer
count is chosen as full recomputation's is."""


def _with_choice(plan: Plan, mbs: int, recompute: str, layers: int | None) -> Plan:
    """``replace(plan, mbs=..., recompute=..., recompute_modules=..., recompute_layers=...)`` from a
    Plan.recompute_key, or ``offload_layers=layers`` for OFFLOAD_MODE (a plan left to choose its offloading
    offloads none under the other modes), without re-validating the other fields (a valid plan's): the hot
    path of the micro-batch and recompute search, whose values are valid by construction (a divisor of the
    batch, a mode of RECOMPUTE or a key of Megatron's modules, layers only with 'full' or offloading)."""
    new = object.__new__(Plan)
    for name in _PLAN_FIELDS:
        object.__setattr__(new, name, getattr(plan, name))
    object.__setattr__(new, "mbs", mbs)
    offload = recompute == OFFLOAD_MODE
    mode, _, modules = ("none" if offload else recompute).partition(":")  # 'selective:layernorm+moe_act'
    object.__setattr__(new, "recompute", mode)
    object.__setattr__(new, "recompute_modules", modules)
    object.__setattr__(new, "recompute_layers", None if offload else layers)
    if offload or plan.offload_layers is None:
        object.__setattr__(new, "offload_layers", layers if offload else 0)
    return new


def megatron_selective_keys(model: ModelSpec, flash_attention: bool = True,
                            fused_grouped_mlp: bool = False) -> list[str]:
    """The selective recomputations evaluate offers a Megatron plan, least first (Plan.recompute_key): the
    modules that discard cheap outputs (the norms that run on their own, the routed experts' activation,
    unless a fused grouped MLP keeps it inside its kernel, MLA's up-projections), where the model has them;
    then those and the MLPs (dense layers' and shared experts'); without FlashAttention each with core_attn
    too, as plain 'selective' before them. Each frees a superset of the one before, as the choice's
    bisection needs."""
    core = [] if flash_attention else ["core_attn"]
    needs = recompute_module_needs(model, fused_grouped_mlp)
    light = [m for m, has in (("layernorm", model.n_moe_layers > 0 or model.is_mla),
                              ("moe_act", needs["moe_act"][0]), ("mla_up_proj", needs["mla_up_proj"][0])) if has]
    heavy = light + [m for m, has in (("mlp", model.n_layers > model.n_moe_layers),
                                      ("shared_experts", needs["shared_experts"][0])) if has]
    keys = ["selective:" + "+".join(core + mods) for mods in (light, heavy) if mods]
    return list(dict.fromkeys(keys))  # a model without dense layers or shared experts: one key


def recompute_options(model: ModelSpec, job: JobSpec, plan: Plan) -> tuple[list[str], int]:
    """The recompute modes ``evaluate`` chooses among for ``plan``, least recomputation first (and
    OFFLOAD_MODE last where the plan leaves its offloading to the choice), and the largest number of layers
    per stage it may recompute partially (full recomputation of the first 1..L-1 layers of an L-layer
    stage, searched when nothing is fixed; 0: none)."""
    offload = [OFFLOAD_MODE] if plan.offload_layers is None else []  # after the rest: it frees the most
    if plan.recompute:
        return [plan.recompute_key, *offload], 0
    if plan.recompute_layers:
        return ["full"], 0
    if plan.offload_layers:  # Megatron offloads only without recomputation
        return ["none"], 0
    modes = ["none", "sac", "full"] if job.flash_attention else ["none", "selective", "sac", "full"]
    if plan.runs_megatron_layers(job.software):  # Megatron-core has modules, not op-level SAC
        keys = megatron_selective_keys(model, job.flash_attention, job.fused_grouped_mlp)
        modes[modes.index("sac"):modes.index("sac") + 1] = keys
    if plan.ep_overlap:  # Megatron's all-to-all overlap runs without full recomputation (or offloading)
        return modes[:-1], 0
    return modes + offload, max(d + e for d, e in plan_stage_layers(model, plan)) - 1


def _bisect(ok: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The smallest index in [lo, hi] where ``ok`` holds, ``ok`` being monotone; None if nowhere."""
    found = None
    while lo <= hi:
        mid = (lo + hi) // 2
        if ok(mid):
            found, hi = mid, mid - 1
        else:
            lo = mid + 1
    return found


_Key = tuple[str, int, int | None]
"""(recompute mode, micro-batch size, recomputed layers or None)."""


@cache_by_identity(n_specs=4)
def _shared_bounds(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, compute: ComputeParams, *fields: object
                   ) -> dict[_Key, float]:
    """The table of ``compute_bound_s`` values that plans alike in ``fields`` (every plan field the bound
    reads, and the fixed micro-batch size) share: option variants that change only the sharding fill it
    once."""
    return {}


class Choice:
    """Choosing a plan's micro-batch size and recomputation: the fastest combination that fits.

    Memory only shrinks with a smaller micro-batch, with more recomputation (``recomputes`` is ordered
    from least to most) and with more recomputed layers, so each is bisected. Modes are taken from the
    least recomputation on, and a combination whose compute bound (``compute_bound_s``) cannot beat
    the best one timed, or the cutoff, is neither probed nor timed. Every probe and timing is cached.
    """

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, compute: ComputeParams,
                 mfu: float | None, cutoff_s: float | None) -> None:
        self.model, self.cluster, self.job, self.plan = model, cluster, job, plan
        self.compute, self.mfu, self.cutoff_s = compute, mfu, cutoff_s
        self.counts = param_counts(model)
        self.shared = plan_shared(model, self.counts, cluster, job, plan)
        self.mbs_list = [plan.mbs] if plan.mbs else micro_batch_sizes(job, plan.dp)  # largest first
        self.recomputes, self.partial_layers = recompute_options(model, job, plan)
        # the most layers a stage may offload (Megatron: all but one), when the choice includes offloading
        offered = OFFLOAD_MODE in self.recomputes and cluster.host_bytes_per_s is not None and offload_runs_with(job)
        self.offload_max = model.n_layers - 1 if offered else 0
        self.best: Estimate | None = None
        self._plans: dict[_Key, Plan] = {}
        self._probes: dict[_Key, Probe] = {}
        self._timed: dict[_Key, Estimate] = {}
        self._floors: dict[int, TrafficFloors] = {}
        self.largest = 0
        """The index in ``mbs_list`` of the largest micro-batch size at which anything may fit (``choose``
        finds it): the bounds over every size (b = 0) take only it and the smaller ones."""
        self._bounds = _shared_bounds(model, cluster, job, compute, plan.tp, plan.cp, plan.ep, plan.expert_tp,
                                      plan.pp, plan.dp,
                                      plan.schedule, plan.vpp, plan.sequence_parallel, plan.context_impl,
                                      plan.async_tp, plan.runs_megatron_layers(job.software), plan.ep_dispatch,
                                      plan.ep_overlap,
                                      plan.mbs)

    def variant(self, rc: str, b: int, n: int | None = None) -> Plan:
        if (rc, b, n) not in self._plans:
            self._plans[rc, b, n] = _with_choice(self.plan, b, rc, n or self.plan.recompute_layers)
        return self._plans[rc, b, n]

    def probe(self, rc: str, b: int, n: int | None = None) -> Probe:
        if (rc, b, n) not in self._probes:
            self._probes[rc, b, n] = probe(self.model, self.counts, self.cluster, self.job, self.variant(rc, b, n),
                                           self.shared)
        return self._probes[rc, b, n]

    def fits(self, rc: str, b: int, n: int | None = None) -> bool:
        return self.probe(rc, b, n).feasible

    def at(self, rc: str, b: int, n: int | None = None, *, timed: bool = True) -> Estimate:
        if (rc, b, n) not in self._timed:
            self._timed[rc, b, n] = evaluate_fixed(self.model, self.counts, self.cluster, self.job,
                                                   self.variant(rc, b, n), self.compute, self.mfu,
                                                   shared=self.shared, timed=timed)
        return self._timed[rc, b, n]

    def floors(self, b: int) -> TrafficFloors:
        """``traffic_floors`` of the plan at micro-batch size ``b`` and the least recomputation: floors over
        every recomputation at that size (``b`` 0: at the largest that may fit, so at every size that may)."""
        b = b or self.mbs_list[self.largest]
        if b not in self._floors:
            plan = self.variant(self.recomputes[0], b)
            ctxs = stage_ctxs(self.model, self.counts, self.cluster, self.job, plan,
                              micro_batches(self.job, plan.dp, b), self.shared)
            self._floors[b] = traffic_floors(ctxs, self.compute)
        return self._floors[b]

    def fewest_recomputed(self, b: int) -> int:
        """A lower bound on the layers per stage that full recomputation must re-run to fit at micro-batch
        size ``b``: what the plan without recomputation needs beyond the HBM, over the most one recomputed
        layer can free on any stage (its activations less the layer input it keeps, for every micro-batch
        in flight; recomputing also needs a working set, so it frees less)."""
        over = self.probe("none", b).peak_bytes - self.cluster.accelerator.hbm_capacity_bytes
        if over <= 0:
            return 1
        plan = self.plan
        tokens, m = b * self.job.seq_len / plan.cp, micro_batches(self.job, plan.dp, b)
        flash = self.job.flash_attention
        frees = 0.0
        for s, st in self.shared.static.items():
            held = in_flight_microbatches(schedule=plan.schedule, pp=plan.pp, m=m, vpp=plan.vpp, stage=s,
                                          ep_overlap=plan.ep_overlap, layers=sum(self.shared.layout[s]),
                                          chunk_layers=chunk_layers(self.model, plan, s))
            frees = max(frees, held * tokens * (max(st.a_dense[flash], st.a_moe[flash]) - st.full_recompute))
        frees *= 1.0 + self.job.runtime.allocator_fraction
        return self.partial_layers if frees <= 0 else max(1, min(self.partial_layers, math.ceil(over / frees)))

    def pruned(self, rc: str, b: int, n: int | None = None) -> bool:
        """True when this combination cannot beat the cutoff nor the best one timed so far."""
        limit = self.cutoff_s if self.cutoff_s is not None else float("inf")
        if self.best is not None and self.mfu is None:  # with an assumed MFU compute is rescaled: no bound
            limit = min(limit, self.best.step_time_s)
        if limit == float("inf"):
            return False
        bound = self.bound(rc, b, n)
        if bound >= limit:
            return True
        if self.cutoff_s is None:  # a plan evaluated in full: its floors cost about what they save
            return False
        coarse = self.floors(0)  # at the largest size that may fit: floors at every size that may
        if coarse.link_s >= limit or bound + coarse.contention_s >= limit:
            return True
        top = self.mbs_list[self.largest]
        if not b or b >= top:
            return False
        # at a smaller size every call is repeated at most m_b / m_top times as often with no larger a message,
        # so its traffic takes at most that ratio of the time: its own floors only where those could prune
        ratio = micro_batches(self.job, self.plan.dp, b) / micro_batches(self.job, self.plan.dp, top)
        over = self.compute.step_overhead_s
        if (coarse.link_s - over) * ratio + over < limit and bound + coarse.contention_s * ratio < limit:
            return False
        floors = self.floors(b)
        return floors.link_s >= limit or bound + floors.contention_s >= limit

    def bound(self, rc: str, b: int, n: int | None = None) -> float:
        """``compute_bound_s`` of a combination; b = 0: the least over every micro-batch size that may fit
        (``largest``). ``n`` None: the plan's own recompute_layers (as ``variant`` does)."""
        if rc == OFFLOAD_MODE:  # offloading only adds to the compute of the same micro-batch without it
            return self.bound("none", b)
        if b == 0:
            return min(self.bound(rc, x, n) for x in self.mbs_list[self.largest:])
        n = n or self.plan.recompute_layers
        key = (rc, b, n)
        if key not in self._bounds:
            self._bounds[key] = compute_bound_s(self.model, self.cluster, self.job, self.plan, self.compute,
                                                b, rc, n)
        return self._bounds[key]

    def consider(self, rc: str, b: int, n: int | None = None) -> None:
        """Time the combination unless the bound rules it out; keep it if it is the fastest that fits."""
        if self.pruned(rc, b, n):
            return
        est = self.at(rc, b, n)
        if est.feasible and (self.best is None or est.step_time_s < self.best.step_time_s):
            self.best = est

    def tries(self, first_fit: int) -> list[int]:
        """Micro-batch indices to time once the largest that fits is known. Without a pipeline the largest
        is the fastest; with one, fewer and larger micro-batches trade GEMM efficiency against the bubble:
        the largest that fits, the smallest, and the one in the middle (in micro-batch count)."""
        last = len(self.mbs_list) - 1
        return [first_fit] if self.plan.pp == 1 else sorted({first_fit, (first_fit + last) // 2, last})

    def choose(self, *, time_infeasible: bool) -> Estimate | None:
        """The fastest feasible combination. If none fits: with a cutoff None, else the combination that
        needs the least memory, infeasible (timed only if ``time_infeasible``). With a cutoff, also None
        when nothing can beat it."""
        mbs = self.mbs_list
        # the most lenient combinations: the most recomputation, and the most offloading where offered
        lenient = [(rc, None) for rc in self.recomputes if rc != OFFLOAD_MODE][-1:]
        if self.offload_max:
            lenient.append((OFFLOAD_MODE, self.fewest_offloaded(mbs[-1]) or self.offload_max))
        if not any(self.fits(rc, mbs[-1], n) for rc, n in lenient):  # even those do not fit
            if self.cutoff_s is not None:
                return None
            rc, n = min(lenient, key=lambda x: self.probe(x[0], mbs[-1], x[1]).peak_bytes)
            return self.at(rc, mbs[-1], n, timed=time_infeasible)
        if self.cutoff_s is not None:  # no combination can beat the cutoff: the least recomputation at its best
            if self.pruned(self.recomputes[0], 0):  # size, with the floors of the largest size
                return None
            # no combination fits in HBM at a micro-batch larger than the most lenient ones do (with
            # offloading, every layer it may offload): the bounds, their floors and the bisections below
            # start there
            cap = self.cluster.accelerator.hbm_capacity_bytes
            most = [(rc, self.offload_max if rc == OFFLOAD_MODE else n) for rc, n in lenient]
            self.largest = _bisect(lambda i: any(self.probe(rc, mbs[i], n).peak_bytes <= cap for rc, n in most),
                                   0, len(mbs) - 1) or 0
            if self.largest and self.pruned(self.recomputes[0], 0):
                return None
        first_fits: dict[str, int | None] = {}
        smallest: tuple[float, str, int, int | None] | None = None  # (peak, mode, mbs, layers) if none fits
        hi_bound = len(mbs) - 1  # a mode fits no smaller a micro-batch than the one before it (less recompute)
        for rc in self.recomputes:
            best = self.best
            if best is not None and self.plan.pp == 1 and best.plan.mbs == mbs[0] and best.plan.recompute == "none":
                break  # nothing recomputed at the largest micro-batch: recomputing can only be slower
            if rc == OFFLOAD_MODE:
                smallest = self._offload(smallest)
                continue
            # every micro-batch size, and for full recomputation the fewest layers it may recompute
            if self.pruned(rc, 0, 1 if rc == "full" and self.partial_layers else None):
                continue
            first_fit = _bisect(lambda i, rc=rc: self.fits(rc, mbs[i]), self.largest, hi_bound)
            first_fits[rc] = first_fit
            if first_fit is None:
                probe = self.probe(rc, mbs[-1])
                if smallest is None or probe.peak_bytes < smallest[0]:
                    smallest = (probe.peak_bytes, rc, mbs[-1], None)
                continue
            hi_bound = first_fit
            none_fit = first_fits.get("none")
            tries = self.tries(first_fit)
            if rc == "full" and self.partial_layers and self.plan.pp == 1:
                # without a pipeline too, a smaller micro-batch recomputes fewer layers and may so be the
                # faster: every size from the largest that fits recomputing to the largest that fits without
                tries = list(range(first_fit, none_fit if none_fit is not None else len(mbs))) or tries
            for i in tries:
                b = mbs[i]
                if rc == "full" and self.partial_layers and (none_fit is None or i < none_fit):
                    # Partial recomputation at this micro-batch size: time grows and memory shrinks with
                    # the number of recomputed layers, so the fewest that fit is the fastest, faster than
                    # recomputing them all; bisect for it.
                    least = self.fewest_recomputed(b)
                    if self.pruned(rc, b, least):
                        continue
                    n = _bisect(lambda k, b=b: self.fits("full", b, k), least, self.partial_layers)
                    if n is not None:
                        self.consider(rc, b, n)
                        continue
                self.consider(rc, b)
        if self.best is not None or self.cutoff_s is not None:
            return self.best
        assert smallest is not None
        return self.at(*smallest[1:])

    def _offload(self, smallest: tuple[float, str, int, int | None] | None
                 ) -> tuple[float, str, int, int | None] | None:
        """Consider activation offloading at every micro-batch size: the fewest offloaded layers that fit
        in HBM there, which are the fastest (each offloaded layer can only add time) and need the least host
        memory. A smaller micro-batch needs fewer layers offloaded and may so wait less on the copies, so
        no size is skipped but by its bound. Returns ``smallest`` updated where nothing fits."""
        mbs, rc = self.mbs_list, OFFLOAD_MODE
        if self.offload_max < 1 or self.pruned(rc, 0):
            return smallest
        fitted = False
        for b in mbs[self.largest:]:
            if self.pruned(rc, b):
                continue
            n = self.fewest_offloaded(b)
            if n is not None and self.fits(rc, b, n):
                fitted = True
                self.consider(rc, b, n)
        if not fitted:
            probe = self.probe(rc, mbs[-1], self.offload_max)
            if smallest is None or probe.peak_bytes < smallest[0]:
                return probe.peak_bytes, rc, mbs[-1], self.offload_max
        return smallest

    def fewest_offloaded(self, b: int) -> int | None:
        """The fewest layers whose offloading brings micro-batch size ``b`` within HBM, or None (HBM only:
        host memory grows with the layers, so the fewest is also the likeliest to fit there)."""
        cap = self.cluster.accelerator.hbm_capacity_bytes
        return _bisect(lambda k: self.probe(OFFLOAD_MODE, b, k).peak_bytes <= cap, 1, self.offload_max)
