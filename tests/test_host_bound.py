"""MoE layers held to the host's kernel-launch pace (ComputeParams.moe_layer_host_s, JobSpec.cuda_graphs)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan import JobSpec, load_cluster, load_model
from meshplan.cost.compute import ComputeParams
from meshplan.cost.stage_time import HOST_BOUND
from meshplan.cost.step import evaluate
from meshplan.explain import binding_resource, measure_first
from meshplan.specs.plan import parse_plan

CLUSTER = load_cluster("b200", nodes=1)
MOE = load_model("mixtral-8x7b")
PLAN = parse_plan("ep=8,dp_shard=8,mbs=1,recompute=none,sharding=megatron")


def _est(host_s: float, *, graphs: bool = False, model=MOE, plan=PLAN, seq: int = 1024):
    job = JobSpec(global_batch_tokens=64 * seq, seq_len=seq, cuda_graphs=graphs, software="megatron")
    return evaluate(model, CLUSTER, job, plan, compute=ComputeParams(moe_layer_host_s=host_s))


def test_a_slow_host_sets_the_pace_of_small_moe_layers():
    free, slow = _est(0.0), _est(0.05)
    assert HOST_BOUND not in free.time_breakdown
    # 32 MoE layers at 50 ms each per micro-batch, 8 micro-batches: the host needs 12.8 s
    host = slow.n_microbatches * MOE.n_layers * 0.05
    assert slow.time_breakdown[HOST_BOUND] > 0.0
    assert slow.step_time_s >= host
    layers = sum(v for k, v in slow.time_breakdown.items()
                 if k in ("compute", "recompute", HOST_BOUND) or k.startswith("exposed all_to_all"))
    # the layers, a2a included, take what the host takes, not more (an addition would add 5 %; the LM head's
    # compute, counted in "compute" but not launched by the MoE layers, is the rest)
    assert abs(layers - host) < 0.01 * host
    assert "waiting for the host" in binding_resource(slow)
    assert any("launch" in m.what for m in measure_first(slow, []))


def test_cuda_graphs_take_the_host_out_of_the_step():
    assert _est(0.05, graphs=True).step_time_s == _est(0.0).step_time_s


def test_a_fast_host_changes_nothing():
    """A launch time below the layers' own GPU time is hidden: the floor is not an addition."""
    free = _est(0.0, seq=4096)
    per_layer = free.time_breakdown["compute"] / free.n_microbatches / MOE.n_layers
    assert _est(0.5 * per_layer, seq=4096).step_time_s == free.step_time_s


def test_dense_models_are_not_host_bound():
    dense = load_model("llama-3-8b")
    plan = parse_plan("dp_shard=8,mbs=1,recompute=none")
    assert _est(0.05, model=dense, plan=plan).step_time_s == _est(0.0, model=dense, plan=plan).step_time_s


@settings(max_examples=25, deadline=None)
@given(h1=st.floats(0.0, 0.04), h2=st.floats(0.0, 0.04), pp=st.sampled_from([1, 2, 4]),
       mbs=st.sampled_from([1, 2]))
def test_step_time_grows_with_the_host_time_and_never_falls_below_the_free_step(h1, h2, pp, mbs):
    plan = parse_plan(f"ep={8 // pp},dp_shard={8 // pp},pp={pp},mbs={mbs},recompute=none,sharding=megatron")
    lo, hi = sorted((h1, h2))
    t_lo, t_hi = _est(lo, plan=plan).step_time_s, _est(hi, plan=plan).step_time_s
    assert _est(0.0, plan=plan).step_time_s <= t_lo <= t_hi * (1 + 1e-12)


def test_the_simulated_step_names_the_host_wait_too():
    from meshplan.sim.simulate import simulate

    for rc in ("none", "full"):
        est = _est(0.05, plan=parse_plan(f"ep=4,dp_shard=4,pp=2,mbs=1,recompute={rc},sharding=megatron"))
        sim = simulate(est, slowdown=0.0, step_overhead_s=0.0)
        assert sim.breakdown[HOST_BOUND] > 0.5 * sim.step_time_s
        assert abs(sum(sim.breakdown.values()) - sim.step_time_s) < 1e-6 * sim.step_time_s
        assert abs(sim.step_time_s / est.step_time_s - 1) < 0.1
        # the wait is taken from compute and recomputation as the closed form takes it
        closed = est.time_breakdown
        for k in ("compute", "recompute", HOST_BOUND):
            if closed.get(k):
                assert abs(sim.breakdown[k] / closed[k] - sim.step_time_s / est.step_time_s) < 0.1


def test_recomputed_forwards_stall_the_backward_not_the_forward():
    """The expert all-to-alls of recomputed forwards run in the backward (their ledger entry is the
    forward's): the forward, host-bound alike with and without recomputation, keeps its length."""
    def forward_s(rc: str) -> float:
        est = _est(0.05, plan=parse_plan(f"ep=8,dp_shard=8,mbs=1,recompute={rc},sharding=megatron"))
        assert est.time_breakdown[HOST_BOUND] > 0.0
        return est.stages[0].t_f_s
    assert abs(forward_s("full") / forward_s("none") - 1) < 1e-9


def test_ranks_holding_more_experts_launch_for_longer():
    """Per-expert launches (ComputeParams.moe_expert_host_s): EP=4 holds two experts per rank, EP=8 one."""
    def wait(ep: int) -> float:
        plan = parse_plan(f"ep={ep},dp_shard=8,mbs=1,recompute=none,sharding=megatron")
        job = JobSpec(global_batch_tokens=64 * 1024, seq_len=1024, software="megatron")
        est = evaluate(MOE, CLUSTER, job, plan, compute=ComputeParams(moe_expert_host_s=0.02))
        return est.time_breakdown.get(HOST_BOUND, 0.0) + est.time_breakdown["compute"]
    assert wait(4) > 1.5 * wait(8)


def test_a_whole_iteration_graph_also_drops_the_per_moe_layer_gaps():
    """moe_layer_overhead_s runs in every MoE layer's forward, per-layer graphs or not; a graph of the
    whole iteration leaves it out (JobSpec.cuda_graph_scope)."""
    import pytest

    from meshplan.errors import SpecError
    params = ComputeParams(moe_layer_overhead_s=0.001)
    seq = 1024
    steps = {}
    for graphs, scope in ((False, "layers"), (True, "layers"), (True, "full_iteration")):
        job = JobSpec(global_batch_tokens=64 * seq, seq_len=seq, cuda_graphs=graphs, cuda_graph_scope=scope,
                      software="megatron")
        steps[graphs, scope] = evaluate(MOE, CLUSTER, job, PLAN, compute=params)
    free = evaluate(MOE, CLUSTER, JobSpec(global_batch_tokens=64 * seq, seq_len=seq, software="megatron"), PLAN,
                    compute=ComputeParams())
    per_layer = steps[True, "layers"].n_microbatches * MOE.n_moe_layers * 0.001
    assert steps[False, "layers"].step_time_s == steps[True, "layers"].step_time_s  # no host floor here
    assert steps[True, "layers"].time_breakdown["compute"] - free.time_breakdown["compute"] == pytest.approx(
        per_layer)
    assert steps[True, "full_iteration"].step_time_s == free.step_time_s
    with pytest.raises(SpecError, match="cuda_graph_scope"):
        JobSpec(global_batch_tokens=64 * seq, seq_len=seq, cuda_graph_scope="full_iteration")
    with pytest.raises(SpecError, match="cuda_graph_scope"):
        JobSpec(global_batch_tokens=64 * seq, seq_len=seq, cuda_graphs=True, cuda_graph_scope="attn")
