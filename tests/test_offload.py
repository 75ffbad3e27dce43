"""Activation offloading (Plan.offload_layers): what it frees, what it costs, where it can run, and the
choice between it and recomputation."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan import JobSpec, evaluate, load_cluster, load_model, search
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


def test_offloaded_layers_leave_hbm_and_only_add_time():
    none = _at("dp_shard=64,mbs=2,recompute=none")
    off = _at("dp_shard=64,mbs=2,offload_layers=40")
    per_layer = none.memory.terms["activations"] / LLAMA.n_layers
    assert none.memory.terms["activations"] - off.memory.terms["activations"] == pytest.approx(40 * per_layer)
    assert off.step_time_s >= none.step_time_s
    assert off.time_breakdown["activation offload"] == pytest.approx(off.step_time_s - none.step_time_s, rel=1e-6)


def test_a_copy_longer_than_the_next_layers_compute_holds_it_up():
    """Each offloaded layer's tensors cross the host link while the next layer computes, forward and
    backward: over a slow link each waits for what its copy takes beyond the mean layer's compute."""
    host = 32e9
    slow = _gb200(host_bytes_per_s=host)
    none = _at("dp_shard=64,mbs=2,recompute=none", slow)
    off = _at("dp_shard=64,mbs=2,offload_layers=40", slow)
    copy_s = (none.memory.terms["activations"] - off.memory.terms["activations"]) / 40 / host
    st = none.stages[0]
    per_mb = 40 * sum(max(0.0, copy_s - phase / LLAMA.n_layers)
                      for phase in (st.t_f_s, st.t_b_s + st.t_w_s + st.t_r_s))
    assert off.time_breakdown["activation offload"] == pytest.approx(off.n_microbatches * per_mb, rel=1e-9)
    fast = _at("dp_shard=64,mbs=2,offload_layers=40")  # NVLink-C2C: about one layer's compute per copy
    assert off.time_breakdown["activation offload"] > 10 * fast.time_breakdown["activation offload"] > 0


def test_offloading_needs_a_known_host_link_no_cuda_graphs_and_a_layer_left():
    assert not _at("dp_shard=64,mbs=2,offload_layers=80").feasible  # every layer: Megatron keeps one
    reasons = _at("dp_shard=64,mbs=2,offload_layers=79").infeasible_reasons
    assert not any("offload" in r for r in reasons)
    no_link = _at("dp_shard=64,mbs=2,offload_layers=40", _gb200(host_bytes_per_s=None))
    assert any("host_gb_per_s" in r for r in no_link.infeasible_reasons)
    graphs = evaluate(LLAMA, _gb200(), replace(JOB, cuda_graphs=True),
                      parse_plan("dp_shard=64,mbs=2,offload_layers=40"))
    assert any("CUDA graphs" in r for r in graphs.infeasible_reasons)


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
    generic = search(LLAMA, _gb200(), replace(JOB, software="generic"))  # torchtitan's FSDP2: no such option
    assert all(not e.plan.offload_layers or e.plan.sharding == "megatron" for e in generic.ranked)


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
