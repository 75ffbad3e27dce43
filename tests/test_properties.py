"""Invariants of the cost model, checked on generated scenarios (hypothesis)."""

import itertools
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.strategies import clusters, jobs, models

from meshplan import Plan, evaluate
from meshplan.cost.choice import OFFLOAD_MODE
from meshplan.cost.collectives import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    REDUCE_SCATTER,
    SEND_RECV,
    busbw_factor,
    bytes_sent_per_rank,
    collective_time_s,
)
from meshplan.cost.mesh import group
from meshplan.cost.pipeline import bubble_fraction
from meshplan.errors import SpecError

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _eval(model, cluster, job, plan):
    try:
        return evaluate(model, cluster, job, replace(plan, mbs=1, recompute="full"))
    except SpecError:
        return None


@SETTINGS
@given(models(), clusters(), jobs(), st.sampled_from(["dp_shard", "tp", "pp", "cp"]))
def test_static_memory_never_grows_with_a_sharding_degree(model, cluster, job, axis):
    """Moving a factor 2 from dp_replicate to a sharding axis never increases model-state bytes, and
    activation bytes never grow either (TP and CP split them, PP holds fewer layers per stage)."""
    n = cluster.n_gpus
    if n < 2:
        return
    small = Plan(dp_replicate=n)
    big = replace(small, dp_replicate=n // 2, **{axis: 2})
    a, b = _eval(model, cluster, job, small), _eval(model, cluster, job, big)
    if a is None or b is None:
        return
    assert b.memory.static_bytes <= a.memory.static_bytes * (1 + 1e-12)
    if axis in ("tp", "cp"):
        assert b.memory.activation_bytes <= a.memory.activation_bytes * (1 + 1e-12)


@SETTINGS
@given(models(moe=True), clusters(nodes=st.sampled_from([1, 2])), jobs())
def test_expert_parallel_shards_expert_states(model, cluster, job):
    n = cluster.n_gpus
    a = _eval(model, cluster, job, Plan(dp_shard=n))
    b = _eval(model, cluster, job, Plan(dp_shard=n, ep=min(8, n)))
    if a is None or b is None or n < 2:
        return
    assert b.memory.static_bytes <= a.memory.static_bytes * (1 + 1e-12)


@SETTINGS
@given(models(), clusters(), jobs(), st.data())
def test_no_traffic_on_an_axis_of_degree_one(model, cluster, job, data):
    n = cluster.n_gpus
    tp = data.draw(st.sampled_from([t for t in (1, 2, 4, 8) if n % t == 0 and t <= cluster.gpus_per_node]))
    rest = n // tp
    ds = data.draw(st.sampled_from([d for d in (1, 2, 4, 8, 16, 32, 64) if rest % d == 0]))
    plan = Plan(tp=tp, dp_shard=ds, dp_replicate=rest // ds)
    est = _eval(model, cluster, job, plan)
    if est is None:
        return
    degree = {"tp": plan.tp, "cp": plan.cp, "pp": plan.pp, "ep": plan.ep, "dp_shard": plan.shard_degree,
              "dp_replicate": plan.dp_replicate, "edp": plan.shard_degree}
    for e in est.comm:
        assert degree[e.axis] > 1, e


@SETTINGS
@given(models(), clusters(), jobs())
def test_model_flops_do_not_depend_on_the_plan(model, cluster, job):
    n = cluster.n_gpus
    flops = set()
    for plan in (Plan(dp_replicate=n), Plan(dp_shard=n), Plan(tp=min(n, 2), dp_shard=max(1, n // 2))):
        est = _eval(model, cluster, job, plan)
        if est is not None:
            flops.add(round(est.flops.model_flop_per_step))
    assert len(flops) <= 1


@SETTINGS
@given(models(), clusters(), jobs())
def test_breakdown_sums_to_step_time(model, cluster, job):
    est = _eval(model, cluster, job, Plan(dp_shard=cluster.n_gpus))
    if est is None:
        return
    assert sum(est.time_breakdown.values()) == pytest.approx(est.step_time_s, rel=1e-3)


@given(st.floats(1e3, 1e11), st.integers(2, 1024))
def test_ring_all_reduce_bytes_equal_reduce_scatter_plus_all_gather(size, n):
    ar = bytes_sent_per_rank(ALL_REDUCE, size, n)
    assert ar == pytest.approx(bytes_sent_per_rank(REDUCE_SCATTER, size, n) + bytes_sent_per_rank(ALL_GATHER, size, n))


@given(st.integers(2, 4096))
def test_bus_factor_is_n_minus_one_over_n(n):
    for op in (ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL):
        assert busbw_factor(op, n) == pytest.approx((n - 1) / n)
    assert busbw_factor(ALL_REDUCE, n) == pytest.approx(2 * (n - 1) / n)
    assert busbw_factor(ALL_REDUCE, 1) == 0.0


@SETTINGS
@given(clusters(), st.sampled_from([ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE, ALL_TO_ALL, SEND_RECV]),
       st.sampled_from([2, 4, 8, 16, 64]), st.sampled_from([1, 8]), st.floats(1e4, 1e10), st.floats(1.01, 10))
def test_collective_time_grows_with_message_size(cluster, op, size, stride, msg, factor):
    g = group("x", size, stride, cluster.gpus_per_node)
    assert collective_time_s(op, msg * factor, g, cluster) >= collective_time_s(op, msg, g, cluster)


@SETTINGS
@given(clusters(nodes=st.just(2)), st.floats(1e3, 1e10))
def test_a_send_inside_a_node_is_never_slower_than_one_across_nodes(cluster, msg):
    """Placing a pipeline or ring-CP pair inside a node must never be predicted slower than across nodes."""
    inside = group("pp", 2, 1, cluster.gpus_per_node)
    across = group("pp", 2, cluster.gpus_per_node, cluster.gpus_per_node)
    assert inside.n_nodes == 1 and across.n_nodes == 2
    assert collective_time_s(SEND_RECV, msg, inside, cluster) <= collective_time_s(SEND_RECV, msg, across, cluster)


@SETTINGS
@given(clusters(), st.sampled_from([ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE, ALL_TO_ALL, SEND_RECV]),
       st.sampled_from([2, 4, 8, 16, 64]), st.sampled_from([1, 8]), st.floats(1e4, 1e10), st.integers(2, 64))
def test_fewer_larger_calls_are_never_slower(cluster, op, size, stride, msg, k):
    """The same bytes in k times fewer calls take no longer: what makes the search's communication floor
    (step._critical_comm_s, taken at the largest micro-batch size) a lower bound."""
    g = group("x", size, stride, cluster.gpus_per_node)
    assert collective_time_s(op, msg * k, g, cluster) <= k * collective_time_s(op, msg, g, cluster) * (1 + 1e-12)


@given(st.sampled_from(["1f1b", "interleaved", "zb-h1", "gpipe"]), st.integers(2, 32), st.integers(1, 256))
def test_bubble_shrinks_with_more_microbatches(schedule, p, m):
    v = 2 if schedule == "interleaved" else 1
    assert bubble_fraction(schedule=schedule, pp=p, m=m + 1, vpp=v) <= bubble_fraction(schedule=schedule, pp=p,
                                                                                         m=m, vpp=v)


@SETTINGS
@given(models(), clusters(), jobs(), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]), st.data())
def test_partial_recompute_trades_memory_for_time(model, cluster, job, tp, pp, data):
    """More recomputed layers: never more memory, never less time; all of a stage's layers is 'full'."""
    plan = Plan(tp=tp, pp=pp, dp_shard=max(1, cluster.n_gpus // (tp * pp)), mbs=1, recompute="full")
    if plan.world_size != cluster.n_gpus or model.n_heads % tp or model.n_kv_heads % tp:
        return
    layers = -(-model.n_layers // pp)
    ests = [_eval(model, cluster, job, replace(plan, recompute_layers=n)) for n in range(1, layers + 1)]
    if any(e is None for e in ests):
        return
    for a, b in itertools.pairwise(ests):
        assert b.memory.activation_bytes <= a.memory.activation_bytes * (1 + 1e-9)
        assert b.time_breakdown["recompute"] >= a.time_breakdown["recompute"] * (1 - 1e-9)
        assert b.flops.hardware_flop_per_step >= a.flops.hardware_flop_per_step * (1 - 1e-9)
    whole = _eval(model, cluster, job, plan)
    assert ests[-1].step_time_s == pytest.approx(whole.step_time_s, rel=1e-9)
    assert ests[-1].memory.peak_bytes == pytest.approx(whole.memory.peak_bytes, rel=1e-9)


@SETTINGS
@given(models(), clusters(), jobs(), st.data())
def test_step_time_lower_bound_never_exceeds_the_step_time(model, cluster, job, data):
    """The search prunes option variants with this bound: it must hold for every plan it could meet."""
    from meshplan.calibration import compute_params_for
    from meshplan.cost.bounds import step_time_lower_bound_s
    from meshplan.search.space import Space, enumerate_plans, option_variants

    plans = list(enumerate_plans(model, cluster, job, Space(max_vpp=2)))
    if not plans:
        return
    plan = data.draw(st.sampled_from(plans))
    plan = data.draw(st.sampled_from([plan, *option_variants(model, cluster, job, plan)]))
    compute = compute_params_for(cluster.accelerator.name, job.software)
    est = evaluate(model, cluster, job, plan, compute=compute)
    assert step_time_lower_bound_s(model, cluster, job, plan, compute) <= est.step_time_s * (1 + 1e-9)


def _draw_combination(model, cluster, job, data):
    """A plan of the search space (a structure or one of its option variants) with one of its micro-batch
    sizes and recompute modes, or None where the space is empty."""
    from meshplan.cost.batch import micro_batch_sizes
    from meshplan.cost.choice import recompute_options
    from meshplan.search.space import Space, enumerate_plans, option_variants

    plans = list(enumerate_plans(model, cluster, job, Space(max_vpp=2)))
    if not plans:
        return None
    plan = data.draw(st.sampled_from(plans))
    plan = data.draw(st.sampled_from([plan, *option_variants(model, cluster, job, plan)]))
    b = data.draw(st.sampled_from(micro_batch_sizes(job, plan.dp)))
    rc = data.draw(st.sampled_from(recompute_options(model, job, plan)[0]))
    if rc == OFFLOAD_MODE:  # a plan left to choose its offloading: some number of offloaded layers
        n = data.draw(st.integers(1, max(1, model.n_layers - 1)))
        return replace(plan, offload_layers=n), b, "none"
    return (replace(plan, offload_layers=0) if plan.offload_layers is None else plan), b, rc


@SETTINGS
@given(models(), clusters(), jobs(), st.data())
def test_combination_bound_never_exceeds_its_step_time(model, cluster, job, data):
    """evaluate skips a micro-batch size and recompute mode whose bound (compute, bubble and the
    communication no compute hides) cannot beat the best one timed: the bound must hold for each."""
    from meshplan.calibration import compute_params_for
    from meshplan.cost.bounds import compute_bound_s

    drawn = _draw_combination(model, cluster, job, data)
    if drawn is None:
        return
    plan, b, rc = drawn
    compute = compute_params_for(cluster.accelerator.name, job.software)
    est = evaluate(model, cluster, job, replace(plan, mbs=b).with_recompute(rc), compute=compute)
    assert compute_bound_s(model, cluster, job, plan, compute, b, rc) <= est.step_time_s * (1 + 1e-9)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(models(), clusters(), jobs(), st.data())
def test_traffic_floors_never_exceed_the_step_time(model, cluster, job, data):
    """A search prunes an option variant whose busiest link, or whose compute bound plus the contention
    its traffic must add, is past the tie band (step.traffic_floors, taken at the least recomputation of
    a micro-batch size, or of the largest for every size): both floors must hold for every recomputation
    at that size, and the largest size's for every combination the plan could choose."""
    from meshplan.calibration import compute_params_for
    from meshplan.cost.bounds import compute_bound_s
    from meshplan.cost.choice import Choice

    drawn = _draw_combination(model, cluster, job, data)
    if drawn is None:
        return
    plan, b, rc = drawn
    compute = compute_params_for(cluster.accelerator.name, job.software)
    choice = Choice(model, cluster, job, plan, compute, None, None)
    est = evaluate(model, cluster, job, replace(plan, mbs=b).with_recompute(rc), compute=compute)
    for floors in (choice.floors(b), choice.floors(0)):
        assert floors.link_s <= est.step_time_s * (1 + 1e-9)
        assert compute_bound_s(model, cluster, job, plan, compute, b, rc) + floors.contention_s <= (
            est.step_time_s * (1 + 1e-9))
    # and the largest micro-batch size choose finds anything may fit at (for a search: with a cutoff) holds
    # every one that does
    searching = Choice(model, cluster, job, plan, compute, None, float("inf"))
    searching.choose(time_infeasible=False)
    assert not est.feasible or b <= searching.mbs_list[searching.largest]


def test_traffic_floor_is_taken_where_the_compute_bound_is():
    """The compute bound takes the busiest stage; the contention floor added to it must then be one every
    stage reaches. Here the last stage, holding a huge vocabulary's LM head, computes the most, while the
    first, with 20 layers to its 8, carries the most traffic: the sum of the two maxima exceeds the step,
    and evaluate_within had pruned the plan below its cutoff (found by a review)."""
    from meshplan import JobSpec, load_cluster, load_model
    from meshplan.calibration import compute_params_for
    from meshplan.cost.bounds import compute_bound_s
    from meshplan.cost.choice import Choice
    from meshplan.cost.step import evaluate_within

    model = replace(load_model("llama-3.2-3b"), vocab=1_048_576)
    cluster = load_cluster("h100-sxm", nodes=2)
    job = JobSpec(global_batch_tokens=64 * 4096, seq_len=4096)
    compute = compute_params_for(cluster.accelerator.name, job.software)
    plan = Plan(pp=2, tp=8, async_tp=True, sp=True, sharding="megatron", layout="Et*20|t*8L")
    floors = Choice(model, cluster, job, plan, compute, None, None).floors(8)
    fixed = evaluate(model, cluster, job, replace(plan, mbs=8, recompute="none"), compute=compute)
    assert compute_bound_s(model, cluster, job, plan, compute, 8, "none") + floors.contention_s <= fixed.step_time_s
    best = evaluate(model, cluster, job, plan, compute=compute)
    assert best.feasible
    within = evaluate_within(model, cluster, job, plan, cutoff_s=best.step_time_s * 1.02, compute=compute)
    assert within is not None and within.step_time_s == best.step_time_s


@SETTINGS
@given(models(), clusters(), jobs(), st.data())
def test_choice_bound_respects_a_fixed_partial_recomputation(model, cluster, job, data):
    """A plan that fixes recompute='full' with recompute_layers=k is timed with k layers recomputed; the
    bound that prunes its micro-batch sizes must charge those k, not every layer."""
    from meshplan.calibration import compute_params_for
    from meshplan.cost.batch import micro_batch_sizes
    from meshplan.cost.choice import Choice
    from meshplan.search.space import Space, enumerate_plans

    plans = [p for p in enumerate_plans(model, cluster, job, Space(max_vpp=2)) if not p.ep_overlap]
    if not plans:
        return
    plan = replace(data.draw(st.sampled_from(plans)), recompute="full", recompute_layers=1)
    b = data.draw(st.sampled_from(micro_batch_sizes(job, plan.dp)))
    compute = compute_params_for(cluster.accelerator.name, job.software)
    choice = Choice(model, cluster, job, plan, compute, None, None)
    est = evaluate(model, cluster, job, replace(plan, mbs=b), compute=compute)
    assert choice.bound("full", b) <= est.step_time_s * (1 + 1e-9)


@SETTINGS
@given(models(), clusters(), jobs(), st.sampled_from([6, 12, 24]), st.data())
def test_evaluate_finds_the_fastest_recomputation_that_fits(model, cluster, job, hbm_gib, data):
    """With the micro-batch size fixed, evaluate chooses the recompute mode and the number of partially
    recomputed layers by bounds and bisection: it must find what timing every one of them finds. Small
    memories force the choice."""
    from meshplan.cost.batch import micro_batch_sizes
    from meshplan.cost.choice import recompute_options
    from meshplan.search.space import Space, enumerate_plans, option_variants

    cluster = replace(cluster, accelerator=replace(cluster.accelerator, hbm_capacity_bytes=hbm_gib * 2**30))
    plans = list(enumerate_plans(model, cluster, job, Space(max_vpp=2)))
    if not plans:
        return
    plan = data.draw(st.sampled_from(plans))
    plan = data.draw(st.sampled_from([plan, *option_variants(model, cluster, job, plan)]))
    plan = replace(plan, mbs=data.draw(st.sampled_from(micro_batch_sizes(job, plan.dp))))
    chosen = evaluate(model, cluster, job, plan)
    modes, partial = recompute_options(model, job, plan)
    fixed = replace(plan, offload_layers=0) if plan.offload_layers is None else plan
    tried = [fixed.with_recompute(rc) for rc in modes if rc != OFFLOAD_MODE]
    tried += [replace(fixed, recompute="full", recompute_layers=n) for n in range(1, partial + 1)]
    if OFFLOAD_MODE in modes:  # every number of offloaded layers, where offloading can run at all
        tried += [replace(plan, recompute="none", offload_layers=n)
                  for n in range(1, model.n_layers)]
    times = [e.step_time_s for e in (evaluate(model, cluster, job, p) for p in tried) if e.feasible]
    if times:
        assert chosen.feasible
        assert chosen.step_time_s <= min(times) * (1 + 1e-9)


@SETTINGS
@given(models(), clusters(), jobs(), st.data())
def test_option_variants_said_to_need_more_memory_do(model, cluster, job, data):
    """The search skips such a variant when its default plan does not fit (search.needs_more_memory)."""
    from meshplan.search.space import Space, enumerate_plans, needs_more_memory, option_variants

    plans = [p for p in enumerate_plans(model, cluster, job, Space(max_vpp=2))
             if any(True for _ in option_variants(model, cluster, job, p))]
    if not plans:
        return
    plan = data.draw(st.sampled_from(plans))
    variant = data.draw(st.sampled_from(list(option_variants(model, cluster, job, plan))))
    if variant.offload_layers is None:  # frees memory (not said to need more); recomputes nothing
        variant = replace(variant, offload_layers=data.draw(st.integers(1, max(1, model.n_layers - 1))))
    sel = "selective" if variant.sharding == "megatron" else "sac"  # Megatron-core has modules, not op-level SAC
    rc = data.draw(st.sampled_from(["none"] if variant.offload_layers else ["none", sel] if variant.ep_overlap
                                   else ["none", sel, "full"]))
    fixed = {"mbs": 1, "recompute": rc}
    base, other = (evaluate(model, cluster, job, replace(p, **fixed)) for p in (plan, variant))
    if needs_more_memory(variant):
        assert other.memory.peak_bytes >= base.memory.peak_bytes * (1 - 1e-12)


@SETTINGS
@given(models(), clusters(), jobs(), st.data())
def test_unhidden_in_layer_traffic_is_m_times_one_micro_batchs(model, cluster, job, data):
    """The bound memoises the communication no compute hides for one micro-batch and scales it by the
    micro-batch count: it must equal that traffic in the step's whole ledger, stage by stage."""
    from meshplan.cost.batch import micro_batches
    from meshplan.cost.bounds import critical_comm_s
    from meshplan.cost.comm import StageTraffic, Unit, comm_ledger
    from meshplan.cost.mesh import axis_groups
    from meshplan.cost.pipeline import head_stage, round_robin_chunks, stage_layers
    from meshplan.cost.stage import recomputed_layers

    drawn = _draw_combination(model, cluster, job, data)
    if drawn is None:
        return
    plan, b, rc = drawn
    m = micro_batches(job, plan.dp, b)
    stages = stage_layers(model, plan.pp, plan.layout, round_robin_chunks(plan.schedule, plan.vpp))
    whole = []
    for s in sorted({0, plan.pp - 1}):
        n_dense, n_moe = stages[s]
        units = (Unit("blocks", 1e8, n_dense + n_moe, "dp_shard"), Unit("experts", 1e8, n_moe, "edp"),
                 Unit("root", 1e8, 1, "dp_shard", root=True))  # data-parallel traffic: once per step at most
        traffic = StageTraffic(units=units, n_layers=n_dense + n_moe, n_moe_layers=n_moe, has_embedding=s == 0,
                               has_lm_head=s == head_stage(plan.schedule, plan.pp), tokens=b * job.seq_len / plan.cp,
                               m=m,
                               recomputed=recomputed_layers(rc, None, n_dense, n_moe), stage=s)
        whole.append(sum(e.time_s for e in comm_ledger(model, cluster, job, plan, axis_groups(plan, cluster), traffic)
                         if e.window == "none" and not e.blocks_after_step))  # ZeRO-1/2's gather after the step
    assert critical_comm_s(model, cluster, job, plan, b, m, rc, None) == pytest.approx(min(whole), rel=1e-9)


@given(st.integers(1, 5000))
def test_micro_batch_divisors_are_every_divisor_largest_first(n):
    """The divisors are found up to sqrt(n) (a review: a 1e15-token batch had hung the linear scan)."""
    from meshplan.cost.batch import divisors_descending

    assert divisors_descending(n) == [d for d in range(n, 0, -1) if n % d == 0]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(models(), clusters(nodes=st.sampled_from([1, 2])), st.sampled_from([1000, 1025, 2049, 4095, 4100, 4096]),
       st.sampled_from([16, 64]))
def test_the_search_finds_plans_at_any_sequence_length(model, cluster, seq_len, seqs):
    """Whatever the sequence length (odd, or not a multiple of TP), the search enumerates plans, evaluates
    them without raising (each passes validate_plan), and finds the data-parallel plans at least: an odd
    length had emptied it (the review of the twenty-first session)."""
    from meshplan import JobSpec, Space, search

    job = JobSpec(global_batch_tokens=seqs * seq_len, seq_len=seq_len)
    result = search(model, cluster, job, Space())
    assert result.n_plans > 0
    assert any(e.plan.tp == 1 and e.plan.pp == 1 and e.plan.cp == 1 for e in result.ranked)
    for e in result.ranked:
        if e.plan.sequence_parallel:
            assert (seq_len // e.plan.cp) % e.plan.tp == 0
