"""Conditions of change: for the recommended plan, vary one condition at a time and find where a
different plan becomes best, by walking a geometric grid and bisecting between the last value where
the recommendation holds and the first where it does not. Every point is a full search."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from meshplan.cost.estimate import Estimate
from meshplan.cost.pipeline import plan_stage_layers
from meshplan.cost.validate import without_unsplit_sp
from meshplan.errors import SpecError
from meshplan.parallel import parallel_map
from meshplan.search.rank import TIE_BAND
from meshplan.search.screen import Screen, changed, screen
from meshplan.specs import ClusterSpec, JobSpec, ModelSpec, Plan
from meshplan.specs.layout import is_embedding_loss_layout, resplit
from meshplan.units import GB, format_tokens

Scenario = tuple[ModelSpec, ClusterSpec, JobSpec]

SearchFn = Callable[[ModelSpec, ClusterSpec, JobSpec, Callable[[Plan], bool]], list[Estimate]]
"""The feasible plans of a full search of a scenario, ranked as ``plan`` ranks them (with the leading plans
re-timed by the simulator): what confirms a condition of change. Its last argument tells the plans of
another layout than the recommendation's (True) from the others: the walk reads the first and the fastest
of them, and the search may leave out what cannot be either (search.leading.search_leading)."""
TimeFn = Callable[[ModelSpec, ClusterSpec, JobSpec, Plan], Estimate | None]
"""A plan evaluated in a scenario and timed as that search times its leading plans (None where it cannot be
built)."""


@dataclass(frozen=True, slots=True)
class Condition:
    condition: str
    """'batch_tokens', 'inter_node_bandwidth', 'gpus', 'seq_len' or 'model_layers'."""
    direction: str
    """'below' or 'above' the threshold the other plan wins."""
    value: float
    """First value (in the condition's unit) at which ``plan`` is best."""
    last_same_value: float
    """Last value checked at which the recommendation still holds."""
    unit: str
    base_value: float
    plan: str
    plan_string: str
    speedup: float
    """Step time of the recommendation over the new plan's, at ``value``."""
    text: str


@dataclass(frozen=True, slots=True)
class HeldRange:
    """The range of one condition, around the scenario's own value, over which the recommendation was checked
    and held: no other plan re-evaluated there was more than the tie band faster."""

    condition: str
    low_value: float
    """Lowest value checked at which the recommendation holds (in the condition's unit)."""
    high_value: float
    """Highest value checked at which the recommendation holds."""
    base_value: float
    unit: str
    low_end: str
    """Why the range ends below: 'change' (a condition of change follows), 'range' (the sweep's last step),
    'not built' (the scenario cannot be built lower: whole sequences, nodes or layers) or 'none fits' (no plan
    of the full search fits there)."""
    high_end: str
    """The same, above."""
    text: str


def held_sentence(held: list[HeldRange], any_change: bool) -> str:
    """One sentence: the ranges over which the recommendation was checked and held."""
    if not held:
        return ""
    lead = "Short of those changes it holds" if any_change else "The recommendation holds over every range swept"
    return (f"{lead} (re-evaluated with the leading plans at each halving and doubling, none more than "
            f"{TIE_BAND:.0%} faster): " + "; ".join(h.text for h in held) + f". Within these ranges `meshplan sweep` "
            f"may name other plans: it lists every change of the recommended plan, those within the {TIE_BAND:.0%} "
            "tie band too, which are no reason to change a plan.")


def structural_key(plan: Plan) -> str:
    """A plan without its micro-batch size and recompute mode (those follow from memory)."""
    return plan.unfixed().to_string()


@dataclass(frozen=True, slots=True)
class _Knob:
    name: str
    unit: str
    base: float
    apply: Callable[[float], tuple[ModelSpec, ClusterSpec, JobSpec] | None]
    integer: bool
    continuous: bool
    read: Callable[[tuple[ModelSpec, ClusterSpec, JobSpec]], float]
    """The condition's value in a scenario ``apply`` built: what was evaluated, which ``apply`` may have
    rounded (whole sequences, whole nodes)."""
    short: Callable[[float], str]
    """The bare value, for a range ('1M', '6.25', '512')."""
    noun: str
    """What the bare values count, after a value or a range ('tokens per step')."""
    phrase: Callable[[float], str] | None = None
    """One value in words where that is not the bare value and the noun ('sequence length 8192')."""

    def fmt(self, v: float) -> str:
        return self.phrase(v) if self.phrase else f"{self.short(v)} {self.noun}"

    def range_text(self, low: float, high: float) -> str:
        return f"{self.short(low)} to {self.short(high)} {self.noun}"

    def applied(self, v: float) -> float:
        """The value ``apply(v)`` evaluates (``v`` where it builds no scenario)."""
        scenario = self.apply(v)
        return v if scenario is None else self.read(scenario)


KNOB_NAMES = {"batch-tokens": "batch_tokens", "inter-node-bandwidth": "inter_node_bandwidth", "gpus": "gpus",
              "seq-len": "seq_len", "layers": "model_layers"}


def knob(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, name: str) -> _Knob:
    """The condition called ``name`` (CLI spelling, e.g. 'batch-tokens'), around this scenario."""
    key = KNOB_NAMES.get(name, name)
    for k in _knobs(model, cluster, job):
        if k.name == key:
            return k
    raise SpecError("sweep.vary", f"unknown condition {name!r}; allowed: {', '.join(KNOB_NAMES)}")


def _knobs(model: ModelSpec, cluster: ClusterSpec, job: JobSpec) -> list[_Knob]:
    def batch(v: float) -> tuple[ModelSpec, ClusterSpec, JobSpec] | None:
        # whole sequences, in steps that every data-parallel degree of the cluster divides (a multiple of
        # the GPU count; a power of two below it): other batches would only be "infeasible" by arithmetic
        seqs = int(v) // job.seq_len
        n = cluster.n_gpus
        seqs = (seqs // n) * n if seqs >= n else (2 ** int(math.log2(seqs)) if seqs >= 1 else 0)
        return None if seqs < 1 else (model, cluster, replace(job, global_batch_tokens=seqs * job.seq_len))

    def bandwidth(v: float) -> tuple[ModelSpec, ClusterSpec, JobSpec]:
        return model, replace(cluster, inter=replace(cluster.inter, nic_bytes_per_s=v * GB)), job

    def gpus(v: float) -> tuple[ModelSpec, ClusterSpec, JobSpec] | None:
        nodes = round(v / cluster.gpus_per_node)
        return None if nodes < 1 else (model, replace(cluster, n_nodes=nodes), job)

    def seq(v: float) -> tuple[ModelSpec, ClusterSpec, JobSpec] | None:
        s = int(v)
        if s < 128 or job.global_batch_tokens % s:
            return None
        return model, cluster, replace(job, seq_len=s)

    def layers(v: float) -> tuple[ModelSpec, ClusterSpec, JobSpec] | None:
        n = int(v)
        if n < 1 or n <= model.n_dense_layers or n <= model.mtp_layers:
            return None
        return replace(model, n_layers=n, nominal_params=None), cluster, job

    def whole(v: float) -> str:
        return f"{int(v):,}"

    def built(apply: Callable[[float], Scenario | None]) -> Callable[[float], Scenario | None]:
        """``apply``, None where the specs refuse the value (more GPUs than meshplan plans for, a link
        below 1 MB/s, fewer layers than the model's MTP depths): a scenario that cannot be built."""
        def checked(v: float) -> Scenario | None:
            try:
                return apply(v)
            except SpecError:
                return None
        return checked

    batch, bandwidth, gpus, seq, layers = (built(f) for f in (batch, bandwidth, gpus, seq, layers))
    return [
        _Knob("batch_tokens", "tokens per step", job.global_batch_tokens, batch, True, True,
              lambda sc: sc[2].global_batch_tokens, format_tokens, "tokens per step"),
        _Knob("inter_node_bandwidth", "GB/s per GPU", cluster.inter.nic_bytes_per_s / GB, bandwidth, False, True,
              lambda sc: sc[1].inter.nic_bytes_per_s / GB, lambda v: f"{v:,.4g}",
              "GB/s of inter-node bandwidth per GPU"),
        _Knob("gpus", "GPUs", cluster.n_gpus, gpus, True, False, lambda sc: sc[1].n_gpus, whole, "GPUs",
              lambda v: f"{whole(v)} GPUs"),
        _Knob("seq_len", "tokens", job.seq_len, seq, True, False, lambda sc: sc[2].seq_len, whole,
              "tokens per sequence", lambda v: f"sequence length {whole(v)}"),
        _Knob("model_layers", "layers", model.n_layers, layers, True, False, lambda sc: sc[0].n_layers, whole,
              "layers", lambda v: f"{int(v)} layers (model size x{v / model.n_layers:.2g})"),
    ]


def layout_key(plan: Plan) -> str:
    """A plan's shape independent of the GPU count: its degrees except the data-parallel ones, which are
    replaced by whether they are in use (so FSDP=64 and FSDP=128 are the same layout), and without
    Megatron's embedding-and-loss split, which follows from the layer count."""
    p = unsplit(plan).unfixed(dp_replicate=2 if plan.dp_replicate > 1 else 1,
                              dp_shard=2 if plan.dp_shard > 1 else 1)
    return p.to_string()


def unsplit(plan: Plan) -> Plan:
    """``plan`` without Megatron's embedding-and-loss split, which follows from the layer count: the same
    plan for a model with more or fewer layers."""
    return replace(plan, layout="") if is_embedding_loss_layout(plan.layout) else plan


_EFFECTIVE = {"cp_impl": "context_impl", "sp": "sequence_parallel", "etp": "expert_tp",
              "reshard_after_forward": "effective_reshard_after_forward", "grad_sync": "effective_grad_sync"}
"""Plan options whose unset value (None) takes effect as a property of the plan."""


def changed_label(plan: Plan, recommended: Plan) -> str:
    """``plan``'s label, with the options in which it differs from ``recommended`` where the two have the
    same degrees ('PP=16 x TP=4 (schedule=zb-h1)'): otherwise the change would read as no change; where
    the degrees differ, with its schedule and options as the ranked table shows them ('PP=8 x TP=4 x DDP=2
    (zb-v, async-TP)'), since two plans of one label may differ in those alone."""
    label = plan.label()
    degrees = label.split(" (")[0]  # without a sharding note such as '(ZERO1 over CP)'
    if degrees != recommended.label().split(" (")[0]:
        opts = ", ".join(o for o in plan.option_labels() if o != plan.sharding)
        if not opts:
            return label
        return f"{label[:-1]}; {opts})" if label.endswith(")") else f"{label} ({opts})"

    def options(p: Plan) -> dict[str, str]:
        return dict(item.split("=", 1) for item in structural_key(p).split(",") if "=" in item)

    mine, theirs = options(recommended), options(plan)

    def in_effect(k: str) -> str:  # an option the plan leaves unset, as it takes effect (sharding=fsdp)
        v = getattr(plan, _EFFECTIVE.get(k, k), None)
        return "default" if v is None else str(v).lower()

    differing = [f"{k}={theirs[k] if k in theirs else in_effect(k)}"
                 for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
    return f"{degrees} ({','.join(differing)})" if differing else label


def rescale(plan: Plan, n_gpus: int) -> Plan | None:
    """``plan`` on ``n_gpus`` GPUs: the data-parallel degree absorbs the change (HSDP keeps its shard
    group and changes its replicas); None when the other degrees do not divide the GPUs."""
    other = plan.tp * plan.pp * plan.cp
    if n_gpus % other:
        return None
    dp = n_gpus // other
    if plan.dp_replicate > 1 and plan.dp_shard > 1:
        if dp % plan.dp_shard or dp == plan.dp_shard:
            return None
        return plan.unfixed(dp_replicate=dp // plan.dp_shard)
    if plan.dp_replicate > 1:
        return plan.unfixed(dp_replicate=dp)
    return plan.unfixed(dp_shard=dp)


def _resplit(plan: Plan, model: ModelSpec, job: JobSpec) -> Plan:
    """``plan`` for ``model``'s layer count: Megatron's embedding-and-loss split redone for it, and partial
    recomputation of more layers than a stage now holds made full (the plan with its layers changed is
    the same plan); and for ``job``'s sequence, without sequence parallelism (nor async TP, which rides on
    it) where the sequence does not split over TP, as the search runs it there."""
    plan = without_unsplit_sp(plan, job.seq_len)
    layout = resplit(plan.layout, model.n_layers)
    if layout != plan.layout:
        plan = replace(plan, layout=layout)
    most = max(d + e for d, e in plan_stage_layers(model, plan)) if plan.recompute_layers else 0
    if plan.recompute_layers and plan.recompute_layers >= most:
        plan = replace(plan, recompute_layers=None)
    return plan


def find_conditions(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, recommended: Estimate,
                    search_best: SearchFn, *, candidates: list[Plan] | None = None, steps: int = 3,
                    bisections: int = 4, only: tuple[str, ...] | None = None, mfu: float | None = None,
                    workers: int | None = None, timed: TimeFn | None = None,
                    progress: Callable[[int, int], None] | None = None, exhaustive: bool = False
                    ) -> tuple[list[Condition], list[HeldRange]]:
    """Thresholds, one per condition and direction where the recommendation changes within ``steps``
    doublings (halvings) of the condition, and for each condition the range checked over which it holds.

    The recommendation changes where some plan of another layout is more than the tie band faster than it,
    or where it no longer fits (or cannot be built) and another plan does. The walk and the bisection
    screen ``candidates`` (the leading plans of the base search and the best of each family, re-sized to
    the GPU count) with the closed form at each value (search.screen: by their lower bounds, as few
    evaluated as the answer needs; ``exhaustive``: every one), and a value where none of them fits is treated
    as a possible change; the value where the answer changes is then confirmed by a full search
    (``search_best``) against the recommendation timed as that search times its leading plans
    (``timed``; default the closed form), and the full search's recommendation is the one reported. The
    walks are independent and run on up to ``workers`` cores (default: all; parallel.parallel_map);
    ``progress(done, total)`` counts the walks as they end."""
    # on one node nothing crosses the network: its bandwidth is no condition there
    knobs = [knob for knob in _knobs(model, cluster, job) if (not only or knob.name in only)
             and not (knob.name == "inter_node_bandwidth" and cluster.n_nodes == 1)]
    walks = [(knob, direction, factor) for knob in knobs for direction, factor in (("below", 0.5), ("above", 2.0))]

    def walk(i: int) -> _WalkEnd:
        knob, direction, factor = walks[i]
        return _walk(knob, direction, factor, recommended, search_best, candidates, steps, bisections, mfu, timed,
                     exhaustive)

    order = sorted(range(len(walks)), key=lambda i: _dispatch_rank(walks[i][0].name, walks[i][1]))
    ends_by_walk = dict(zip(order, parallel_map(walk, order, workers, done=progress, distributable=True),
                            strict=True))
    ends = [ends_by_walk[i] for i in range(len(walks))]
    conditions = [e.condition for e in ends if e.condition]
    held = [_held_range(knob, ends[2 * i], ends[2 * i + 1]) for i, knob in enumerate(knobs)]
    return conditions, [h for h in held if h.low_value != h.high_value]


WALK_DISPATCH = (("inter_node_bandwidth", "below"), ("model_layers", "above"), ("gpus", "above"),
                 ("seq_len", "above"), ("batch_tokens", "below"), ("batch_tokens", "above"),
                 ("model_layers", "below"), ("inter_node_bandwidth", "above"), ("seq_len", "below"),
                 ("gpus", "below"))
"""The order in which the walks are handed to the workers, the likely longest first, so that a long walk does
not start last while the other cores idle (longest-first scheduling); the answer is in the walks' own order
whatever this is. A walk's time is that of its confirming searches: the walks up in layers, GPUs and sequence
length search larger scenarios, and the bandwidth's walk down is where the closed form most often screens a
change that the simulator does not bear out, each confirmed by a search. On the eight scenarios of
docs/performance.md ("The conditions' walks on the cores") the walks' wall time on two cores comes within 2 %
of what handing them out longest first, their times known, gives (8 % in the walks' own order)."""


def _dispatch_rank(name: str, direction: str) -> int:
    key = (name, direction)
    return WALK_DISPATCH.index(key) if key in WALK_DISPATCH else len(WALK_DISPATCH)


@dataclass(frozen=True, slots=True)
class _WalkEnd:
    """Where one direction's walk stopped: the last value (as evaluated) at which the recommendation held,
    why it stopped there (HeldRange.low_end), and the condition of change if that is why."""

    held: float
    why: str
    condition: Condition | None = None
    at: float | None = None
    """The value (as evaluated) at which none of the plans fitted, where that is why it stopped."""


def _held_range(knob: _Knob, below: _WalkEnd, above: _WalkEnd) -> HeldRange:
    text = knob.range_text(below.held, above.held)
    notes = [f"at {knob.short(end.at)} {knob.noun} no plan fits"
             for end in (below, above) if end.why == "none fits" and end.at is not None]
    if notes:
        text += f" ({'; '.join(notes)})"
    return HeldRange(condition=knob.name, low_value=below.held, high_value=above.held, base_value=knob.base,
                     unit=knob.unit, low_end=below.why, high_end=above.why, text=text)


def _sized(candidates: list[Plan], model: ModelSpec, cluster: ClusterSpec, job: JobSpec) -> list[Plan]:
    """The ``candidates`` re-sized to the scenario's GPU count and re-split for its layers and sequence (those
    that cannot be re-sized left out), each with its micro-batch size and recomputation to be chosen afresh: a
    longer sequence or a deeper model changes what fits (the candidates differ only in those then collapse
    into one)."""
    out = []
    for plan in dict.fromkeys(p.unfixed() for p in candidates):
        sized = rescale(plan, cluster.n_gpus) if plan.world_size != cluster.n_gpus else plan
        if sized is not None:
            out.append(_resplit(sized, model, job))
    return out


def _between(knob: _Knob, lo: float, hi: float) -> float | None:
    """A value between ``lo`` and ``hi`` whose scenario (as ``apply`` rounds it) lies strictly between theirs:
    the geometric mean, else the arithmetic one (the batch moves in whole sequences per GPU, so between 2 and
    4 per GPU the geometric mean rounds back to 2); None where there is none."""
    a_lo, a_hi = sorted((knob.applied(lo), knob.applied(hi)))
    for mid in (math.sqrt(lo * hi), (lo + hi) / 2):
        if knob.integer:
            mid = float(round(mid))
        if mid not in (lo, hi) and a_lo < knob.applied(mid) < a_hi:
            return mid
    return None


def _walk(knob: _Knob, direction: str, factor: float, base: Estimate, search_best: SearchFn,
          candidates: list[Plan] | None, steps: int, bisections: int, mfu: float | None,
          timed: TimeFn | None = None, exhaustive: bool = False) -> _WalkEnd:
    """Walk ``knob`` from the scenario's value by ``factor`` a step at a time, up to ``steps`` steps, until
    another plan is recommended (bisected ``bisections`` times where the knob is continuous), none fits, or
    the scenario can no longer be built."""
    return _Walk(knob, direction, base, search_best, candidates, mfu, timed, exhaustive).run(factor, steps, bisections)


class _Walk:
    """One direction's walk of a knob (``_walk``): the recommendation ``base`` and how plans are found at a
    value (the ``candidates`` re-evaluated, else a full search)."""

    def __init__(self, knob: _Knob, direction: str, base: Estimate, search_best: SearchFn,
                 candidates: list[Plan] | None, mfu: float | None, timed: TimeFn | None,
                 exhaustive: bool = False) -> None:
        self.knob, self.direction, self.base, self.search_best = knob, direction, base, search_best
        self.candidates, self.mfu, self.timed, self.exhaustive = candidates, mfu, timed, exhaustive
        self.base_key = layout_key(base.plan)

    def key_at(self, v: float) -> str:
        """The recommendation's layout key as it runs at ``v``: without sequence parallelism where the
        sequence no longer splits over TP (_resplit), so that the same plan is not taken for another."""
        scenario = self.knob.apply(v)
        return self.base_key if scenario is None else layout_key(_resplit(self.base.plan, scenario[0], scenario[2]))

    def held(self, v: float) -> float:
        """``v`` as evaluated; the base is the scenario's own value, not rounded."""
        return self.knob.base if v == self.knob.base else self.knob.applied(v)

    def full(self, v: float) -> list[Estimate]:
        scenario = self.knob.apply(v)
        if scenario is None:
            return []
        mine_key = self.key_at(v)
        return self.search_best(*scenario, lambda p: layout_key(p) != mine_key)

    def screen(self, v: float) -> Screen:
        """Whether any plan can be built at ``v``, whether any fits, and whether the recommendation changes
        there: the ``candidates`` screened (search.screen), else a full search."""
        scenario = self.knob.apply(v)
        if scenario is None:
            return Screen(False, False, False)
        if self.candidates is None:
            ranked = self.full(v)
            return Screen(True, bool(ranked), self.changed(v, ranked))
        model, cluster, job = scenario
        mine_plan = _sized_mine(self.base.plan, model, cluster, job)
        return screen(model, cluster, job, _sized(self.candidates, model, cluster, job), self.mine_at(v, False),
                      mine_plan, layout_key, self.key_at(v), mfu=self.mfu, exhaustive=self.exhaustive)

    def mine_at(self, v: float, confirming: bool) -> Estimate | None:
        return _evaluate_at(self.knob, v, self.base, self.mfu, self.timed if confirming else None)

    def changed(self, v: float, fitting: list[Estimate], confirming: bool = False) -> bool:
        """Whether a plan of another layout than the recommendation's is more than the tie band faster at
        ``v``, or the recommendation does not fit there while another plan does."""
        mine_key = self.key_at(v)
        others = [e for e in fitting if layout_key(e.plan) != mine_key]
        return bool(others) and changed(self.mine_at(v, confirming), others)

    def run(self, factor: float, steps: int, bisections: int) -> _WalkEnd:
        knob = self.knob
        same = knob.base
        for i in range(1, steps + 1):
            v = knob.base * factor**i
            if knob.integer:
                v = float(round(v))
            at = self.screen(v)
            if not at.built:
                return _WalkEnd(self.held(same), "not built")
            if at.fits and not at.changed:
                same = v
                continue
            # a change, or none of the plans re-evaluated fits (the full search below may find one that does)
            lo, hi = self.bisect(same, v, bisections)
            ranked = self.full(hi)
            if not ranked:
                return _WalkEnd(self.held(lo), "none fits", at=knob.applied(hi))
            if not self.changed(hi, ranked, confirming=True):  # the full search keeps it at hi; past hi only
                same = hi  # the candidates were seen
                continue
            end = self.change(lo, hi, ranked)
            if end is not None:
                return end
        return _WalkEnd(self.held(same), "range")

    def bisect(self, lo: float, hi: float, bisections: int) -> tuple[float, float]:
        """Narrow [``lo``, ``hi``] (the recommendation holds at ``lo``, not at ``hi``) where the knob is
        continuous."""
        if not self.knob.continuous:
            return lo, hi
        for _ in range(bisections):
            mid = _between(self.knob, lo, hi)
            if mid is None:
                break
            at = self.screen(mid)
            if not at.built:
                break
            if not at.fits or at.changed:
                hi = mid
            else:
                lo = mid
        return lo, hi

    def change(self, lo: float, hi: float, ranked: list[Estimate]) -> _WalkEnd | None:
        """The condition of change at ``hi`` (``ranked``: the plans that fit there), or None where rounding
        took the changed value back across the base."""
        knob, direction = self.knob, self.direction
        mine_key = self.key_at(hi)
        other = next((e for e in ranked if layout_key(e.plan) != mine_key), ranked[0])  # what plan recommends
        fastest = min((e for e in ranked if layout_key(e.plan) != mine_key), key=lambda e: e.step_time_s)
        base_then = self.mine_at(hi, True)
        mine_s = base_then.step_time_s if (base_then and base_then.feasible) else float("inf")
        speedup = mine_s / other.step_time_s
        gain = _gain_text(speedup, base_then)
        hi, lo = knob.applied(hi), self.held(lo)  # as evaluated (whole sequences, whole nodes)
        if (hi - knob.base) * (1 if direction == "above" else -1) <= 0:
            return None  # rounding took the changed value back across the base: no condition there
        text = f"at {knob.fmt(hi)}" + (f" or {'less' if direction == 'below' else 'more'}" if knob.continuous else "")
        recommended = base_then.plan if base_then else self.base.plan
        text += f", {changed_label(other.plan, recommended)} is best ({gain}"
        if fastest is not other and math.isfinite(speedup):  # the recommendation there is a simpler plan in
            # the tie band of a faster one
            text += (f"; {changed_label(fastest.plan, recommended)} is {mine_s / fastest.step_time_s:.2f}x faster, "
                     "and within the tie band the simpler plan wins")
        text += ")"
        if math.isinf(speedup) and base_then is not None and base_then.infeasible_reasons:
            reason = base_then.infeasible_reasons[0]  # the recommendation's, not the new plan's
            text += f": the recommendation {reason}" if reason.startswith("needs ") else f": {reason}"
        return _WalkEnd(lo, "change", Condition(
            condition=knob.name, direction=direction, value=hi, last_same_value=lo, unit=knob.unit,
            base_value=knob.base, plan=other.plan.label(), plan_string=structural_key(other.plan), speedup=speedup,
            text=text))


def _gain_text(speedup: float, base_then: Estimate | None) -> str:
    """What the new answer gains over the recommendation re-evaluated at the condition (``base_then``):
    a speed-up, or why the recommendation is out: it cannot be built, or breaks a rule of its schedule or
    batch (``base_then``'s first reason, which the condition's text quotes), or memory alone rules it out."""
    if not math.isinf(speedup):
        return f"{speedup:.2f}x faster"
    if base_then is None:
        return "the recommendation cannot be built there"
    memory_only = base_then.memory.headroom_bytes < 0 and len(base_then.infeasible_reasons) == 1
    return "the recommendation no longer fits" if memory_only else "the recommendation cannot run there"


def _sized_mine(plan: Plan, model: ModelSpec, cluster: ClusterSpec, job: JobSpec) -> Plan | None:
    """The recommended ``plan`` re-sized to the scenario's GPU count and re-split for it (None where it cannot
    be re-sized), its micro-batch size and recomputation to be chosen afresh."""
    sized = rescale(plan, cluster.n_gpus) if plan.world_size != cluster.n_gpus else plan.unfixed()
    return None if sized is None else _resplit(sized, model, job)


def _evaluate_at(knob: _Knob, value: float, base: Estimate, mfu: float | None, timed: TimeFn | None = None
                 ) -> Estimate | None:
    """The recommended plan itself, re-evaluated at ``value`` and re-sized to its GPU count (None where it
    cannot be built there); by ``timed`` where given, else by the closed form."""
    from meshplan.cost.step import evaluate
    scenario = knob.apply(value)
    if scenario is None:
        return None
    model, cluster, job = scenario
    plan = _sized_mine(base.plan, model, cluster, job)
    if plan is None:
        return None
    if timed is not None:
        return timed(model, cluster, job, plan)
    try:
        return evaluate(model, cluster, job, plan, mfu=mfu)
    except SpecError:
        return None
