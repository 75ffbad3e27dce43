"""Activation offloading (Plan.offload_layers): what it frees, what it costs, where it can run, and the
choice between it and recomputation."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan import JobSpec, evaluate, load_cluster, load_model, search
from meshplan.cost import memory as mem
from meshplan.errors import SpecError
from meshplan.specs.plan import parse_plan

# Llama 3 70B as NVIDIA's GB200 recipe runs it: Megatron-FSDP over 64 GPUs, micro-batch 2, FP8
LLAMA = load_model("llama-3-70b")
JOB = JobSpec(global_batch_tokens=256 * 8192, seq_len=8192, precision="fp8", software="megatron")


def _gb200(**node):
    cluster = load_cluster("gb200", nodes=1, gpus_per_node=64)
    return replace(cluster, **node) if node else cluster


def _at(plan: str, cluster=None, job=JOB):
    return evaluate(LLAMA, cluster or _gb200(), job, parse_plan(plan))


@pytest.mark.parametrize("host", [256e9, 16e9])
def test_offloaded_layers_leave_hbm_and_only_add_time(host):
    cluster = _gb200(host_bytes_per_s=host)
    none = _at("dp_shard=64,mbs=2,recompute=none", cluster)
    off = _at("dp_shard=64,mbs=2,offload_layers=40", cluster)
    # the final norm's and the LM head's inputs are held beside the layers', and never offloaded
    head = 2 * 8192 * mem.head_input_bytes_per_token(hidden=LLAMA.hidden, tp=1, sp=False, gathered=False)
    per_layer = (none.memory.terms["activations"] - head) / LLAMA.n_layers
    assert none.memory.terms["activations"] - off.memory.terms["activations"] == pytest.approx(40 * per_layer)
    assert off.step_time_s >= none.step_time_s
    wait = off.time_breakdown.get("activation offload", 0.0)
    assert wait == pytest.approx(off.step_time_s - none.step_time_s, rel=1e-6, abs=1e-9)
    assert (wait > 0) == (host < 100e9)


def test_the_copies_wait_only_where_the_link_cannot_keep_up_with_the_layers():
    """Transformer Engine's default schedule runs the copies on one stream and makes layer L - N + i wait
    for layer i's: with N <= L - 2 uniform layers of time t and copies of time c >= t, the forward waits
    N·c - (L-2)·t, and so does the backward with its own layer time; with N = L - 1 each layer waits for
    the copy before it, however fast the link."""
    from meshplan.cost.offload import offload_stalls_s

    fwd, bwd = offload_stalls_s(0.0145, 0.0286, [0.122] * 40, 80)
    assert fwd == pytest.approx(40 * 0.122 - 78 * 0.0145) and bwd == pytest.approx(40 * 0.122 - 78 * 0.0286)
    assert offload_stalls_s(0.0145, 0.0286, [0.02] * 40, 80) == (0.0, 0.0)  # 40 copies fit in 78 layers
    fwd, bwd = offload_stalls_s(0.0145, 0.0286, [0.001] * 79, 80)  # all but the last: each layer waits
    assert fwd == pytest.approx(79 * 0.001) and bwd == pytest.approx(79 * 0.001)


def test_a_slow_host_link_holds_the_layers_up():
    host = 16e9
    slow = _gb200(host_bytes_per_s=host)
    none = _at("dp_shard=64,mbs=2,recompute=none", slow)
    off = _at("dp_shard=64,mbs=2,offload_layers=40", slow)
    copy_s = (none.memory.terms["activations"] - off.memory.terms["activations"]) / 40 / host
    st = none.stages[0]
    per_mb = sum(max(0.0, 40 * copy_s - 78 * phase / LLAMA.n_layers)
                 for phase in (st.t_f_s, st.t_b_s + st.t_w_s + st.t_r_s))
    assert off.time_breakdown["activation offload"] == pytest.approx(off.n_microbatches * per_mb, rel=1e-9)
    fast = _at("dp_shard=64,mbs=2,offload_layers=40")  # NVLink-C2C keeps up with the layers
    assert "activation offload" not in fast.time_breakdown
    assert fast.step_time_s == pytest.approx(none.step_time_s, rel=1e-9)


def test_offloading_needs_a_known_host_link_no_cuda_graphs_and_a_layer_left():
    every = _at("dp_shard=64,mbs=2,offload_layers=80").infeasible_reasons  # Megatron keeps one layer
    assert any("at most the decoder layers less one" in r for r in every)
    reasons = _at("dp_shard=64,mbs=2,offload_layers=79").infeasible_reasons
    assert not any("at most the decoder layers" in r for r in reasons)
    # 79 layers of 3.9 GB do not fit in a GPU's half of the Grace CPU's 480 GB either
    assert any("of host memory per GPU" in r for r in reasons)
    assert not any("host memory" in r for r in _at("dp_shard=64,mbs=2,offload_layers=40").infeasible_reasons)
    torchtitan = evaluate(LLAMA, _gb200(), replace(JOB, software="generic"), parse_plan("dp_shard=64,offload_layers=8"))
    assert any("Megatron-core's" in r for r in torchtitan.infeasible_reasons)
    no_link = _at("dp_shard=64,mbs=2,offload_layers=40", _gb200(host_bytes_per_s=None))
    assert any("host_gb_per_s" in r for r in no_link.infeasible_reasons)
    graphs = evaluate(LLAMA, _gb200(), replace(JOB, cuda_graphs=True),
                      parse_plan("dp_shard=64,mbs=2,offload_layers=40"))
    assert any("CUDA graphs" in r for r in graphs.infeasible_reasons)
    whole = evaluate(LLAMA, _gb200(), replace(JOB, cuda_graphs=True, cuda_graph_scope="full_iteration"),
                     parse_plan("dp_shard=64,mbs=2,offload_layers=40"))
    assert not any("CUDA graphs" in r for r in whole.infeasible_reasons)  # Megatron allows a whole-step graph


@pytest.mark.parametrize("plan, message", [
    ("dp_shard=32,pp=2,offload_layers=4", "pp=1"),
    ("dp_shard=64,recompute=full,offload_layers=4", "recomputation"),
    ("dp_shard=64,recompute=selective,offload_layers=auto", "recomputation"),
    ("dp_shard=64,offload_layers=-1", "whole number"),
    ("dp_shard=64,offload_layers=many", "integer"),
])
def test_offloading_outside_megatrons_conditions_is_a_spec_error(plan, message):
    with pytest.raises(SpecError, match=message):
        parse_plan(plan)


def test_auto_round_trips_and_labels():
    plan = parse_plan("dp_shard=64,offload_layers=auto")
    assert plan.offload_layers is None and parse_plan(plan.to_string()) == plan
    assert "offload:auto" in plan.option_labels() and "offload:40" in parse_plan(
        "dp_shard=64,offload_layers=40").option_labels()


def test_evaluate_weighs_the_fewest_offloaded_layers_against_recomputation():
    recompute = _at("dp_shard=64,mbs=2")
    auto = _at("dp_shard=64,mbs=2,offload_layers=auto")
    assert recompute.plan.offload_layers == 0 and recompute.time_breakdown["recompute"] > 0
    n = auto.plan.offload_layers
    assert auto.feasible and auto.plan.recompute == "none" and 0 < n < LLAMA.n_layers
    assert auto.step_time_s < recompute.step_time_s
    assert not _at(f"dp_shard=64,mbs=2,offload_layers={n - 1}").feasible  # the fewest that fit
    # over a slow host link recomputation wins again
    slow = _at("dp_shard=64,mbs=2,offload_layers=auto", _gb200(host_bytes_per_s=4e9))
    assert slow.plan.offload_layers == 0 and slow.plan.recompute == "full"


def test_the_search_offers_offloading_to_megatron_plans_without_a_pipeline():
    result = search(LLAMA, _gb200(), JOB)
    best = result.recommended
    assert best is not None and best.plan.pp == 1 and best.plan.offload_layers
    assert all(e.plan.pp == 1 for e in result.ranked if e.plan.offload_layers)
    from meshplan.search.space import option_variants

    generic = replace(JOB, software="generic")  # PyTorch's FSDP2 has no such option; Megatron's optimizer has
    offered = {sharding: [v for v in option_variants(LLAMA, _gb200(), generic, parse_plan(f"dp_shard=64,"
                                                                                         f"sharding={sharding}"))
                          if v.offload_layers is None] for sharding in ("fsdp", "megatron")}
    assert not offered["fsdp"] and len(offered["megatron"]) == 1
    piped = parse_plan("dp_shard=32,pp=2,sharding=megatron")
    assert not any(v.offload_layers != 0 for v in option_variants(LLAMA, _gb200(), JOB, piped))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 79), st.sampled_from([1, 2]), st.sampled_from([16e9, 64e9, 256e9]))
def test_more_offloaded_layers_never_need_more_memory_nor_less_time(n, mbs, host):
    cluster = _gb200(host_bytes_per_s=host)
    fewer, more = (_at(f"dp_shard=64,mbs={mbs},recompute=none,offload_layers={k}", cluster) for k in (n - 1, n))
    assert more.memory.peak_bytes <= fewer.memory.peak_bytes
    assert more.step_time_s >= fewer.step_time_s * (1 - 1e-12)


def test_the_memory_question_names_offloading_where_megatron_could_use_it():
    from meshplan.explain import analyse

    analysis = analyse(LLAMA, _gb200(), JOB, with_conditions=False)
    memory = " ".join(analysis.questions[0].lines)
    assert "activation checkpointing is required" in memory and "offloading the activations of" in memory
    assert analysis.result.recommended is not None and analysis.result.recommended.plan.offload_layers
    generic = analyse(LLAMA, _gb200(), replace(JOB, software="generic"), with_conditions=False)
    generic = " ".join(generic.questions[0].lines)
    assert "offloading" not in generic  # PyTorch's FSDP2 has no offload option


def test_auto_finds_the_fastest_micro_batch_and_offloaded_layers():
    """A smaller micro-batch needs fewer layers offloaded, and so may wait less on a slow link: the choice
    must find what timing every micro-batch size and layer count finds."""
    slow = _gb200(host_bytes_per_s=64e9)
    auto = _at("dp_shard=64,recompute=none,offload_layers=auto", slow)
    times = [e.step_time_s for e in (_at(f"dp_shard=64,mbs={b},recompute=none,offload_layers={n}", slow)
                                     for b in (1, 2, 4) for n in range(LLAMA.n_layers)) if e.feasible]
    assert auto.feasible and auto.step_time_s <= min(times) * (1 + 1e-9)


def test_a_plan_left_to_choose_again_chooses_its_offloading_again():
    """The conditions of change re-run a plan's structure elsewhere: the count it offloaded here is
    chosen again there, and a plan that did not offload still does not."""
    assert parse_plan("dp_shard=64,mbs=2,offload_layers=40").unfixed().offload_layers is None
    assert parse_plan("dp_shard=64,mbs=2,recompute=full").unfixed().offload_layers == 0


def test_recomputation_is_weighed_at_every_micro_batch_size_too():
    """Without a pipeline a smaller micro-batch recomputes fewer layers: the choice must find what timing
    every micro-batch size and partial recomputation finds, or offloading would be weighed against a
    slower recomputation than there is."""
    chosen = _at("dp_shard=64,offload_layers=0")
    times = [e.step_time_s for e in (_at(f"dp_shard=64,mbs={b},recompute=full,recompute_layers={n}")
                                     for b in (1, 2, 4) for n in range(1, LLAMA.n_layers)) if e.feasible]
    assert chosen.feasible and chosen.step_time_s <= min(times) * (1 + 1e-9)


def test_offloading_is_not_modelled_with_the_moe_overlap():
    with pytest.raises(SpecError, match="ep_overlap"):
        parse_plan("ep=8,dp_shard=64,sharding=megatron,ep_overlap=true,offload_layers=auto")
