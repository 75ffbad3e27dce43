"""Pipeline, context, expert and sequence parallelism, ZeRO stages: what each adds to the ledger and memory."""

import pytest
from tests.helpers import worked_example

from meshplan import JobSpec, evaluate, load_cluster, load_model, parse_plan
from meshplan.errors import SpecError


def _est(plan: str, model: str = "seed-70b", nodes: int = 8, batch: int = 4_194_304, seq: int = 4096):
    m, c = load_model(model), load_cluster("h100-sxm", nodes=nodes)
    return evaluate(m, c, JobSpec(global_batch_tokens=batch, seq_len=seq), parse_plan(plan, c.n_gpus))


def _p2p(est) -> float:
    return sum(e.bytes_per_gpu for e in est.comm if e.axis == "pp")


def test_interleaved_multiplies_p2p_traffic_by_v():
    """Narayanan et al. 2021 §2.2: interleaving with v chunks sends v times the point-to-point traffic."""
    base = _est("tp=8,pp=8,mbs=1,recompute=full,sharding=megatron")
    inter = _est("tp=8,pp=8,mbs=1,recompute=full,sharding=megatron,schedule=interleaved,vpp=2")
    assert _p2p(inter) == pytest.approx(2 * _p2p(base))
    assert inter.time_breakdown["pipeline bubble"] < base.time_breakdown["pipeline bubble"]


def test_moe_expert_parallel_shows_all_to_all_and_expert_memory():
    est = _est("ep=8,dp_shard=32", model="mixtral-8x7b", nodes=4, batch=1_048_576)
    a2a = [e for e in est.comm if e.collective == "all_to_all"]
    assert a2a and all(e.axis == "ep" for e in a2a)
    assert est.memory.terms["expert_params"] > 0
    dense = _est("dp_shard=32", model="mixtral-8x7b", nodes=4, batch=1_048_576)
    assert est.memory.terms["expert_params"] < dense.memory.terms.get("params", 0) + dense.memory.terms.get(
        "expert_params", 0)


def test_experts_split_over_tp_without_expert_parallelism():
    """Without EP the routed experts are split t ways like a dense MLP (Megatron's ETP defaults to TP,
    torchtitan applies TensorParallel to them): TP=8 x FSDP=4 holds the same expert states per GPU as
    EP=8 x FSDP=4 and as FSDP=32, and does the same expert GEMM FLOPs."""
    tp = _est("tp=8,dp_shard=4,mbs=1,recompute=none", model="mixtral-8x7b", nodes=4, batch=1_048_576)
    ep = _est("ep=8,dp_shard=32,mbs=1,recompute=none", model="mixtral-8x7b", nodes=4, batch=1_048_576)
    fsdp = _est("dp_shard=32,mbs=1,recompute=none", model="mixtral-8x7b", nodes=4, batch=1_048_576)
    def states(est) -> float:
        return est.memory.terms["params"] + est.memory.terms["expert_params"]

    assert states(tp) == pytest.approx(states(fsdp), rel=0.01)
    assert states(tp) == pytest.approx(states(ep), rel=0.01)
    assert tp.flops.hardware_flop_per_step == pytest.approx(fsdp.flops.hardware_flop_per_step)


def test_recomputed_forward_exchanges_context_parallel_kv_in_the_backward():
    """Full recomputation re-runs ring attention inside the backward: its KV passes are booked there, so
    the forward's attention compute is not counted as hiding them."""
    est = _est("cp=4,dp_shard=16,mbs=1,recompute=full,cp_impl=ring")
    by = {e.purpose: e for e in est.comm if e.axis == "cp"}
    fwd, again = by["ring attention KV pass (forward)"], by["ring attention KV pass (recomputed forward)"]
    assert (fwd.phase, again.phase) == ("forward", "backward")
    assert fwd.count == again.count  # every layer recomputed


def test_pytorch_context_parallel_passes_dkv_round_the_ring_in_fp32():
    """PyTorch's _templated_ring_attention_backward rotates dK and dV with an all-to-all permute per ring step
    (the last returns each sum to its owner) in FP32 (convert_to_f32), under either KV exchange; Transformer
    Engine (Megatron) passes dKV beside KV in its ring and reduce-scatters it after its KV all-gather."""
    cp, layers = 4, 80
    by = {}
    for plan in ("cp=4,dp_shard=16,mbs=1,recompute=none,cp_impl=ring",
                 "cp=4,dp_shard=16,mbs=1,recompute=none,cp_impl=allgather",
                 "cp=4,dp_shard=16,mbs=1,recompute=none,cp_impl=ring,sharding=megatron",
                 "cp=4,dp_shard=16,mbs=1,recompute=none,cp_impl=allgather,sharding=megatron"):
        est = _est(plan, seq=32768)
        by[plan] = {e.purpose: e for e in est.comm if e.axis == "cp"}
    ring, gather, te_ring, te_gather = by.values()
    kv = ring["ring attention KV pass (forward)"]
    m = kv.count // (layers * (cp - 1))
    for pytorch in (ring, gather):
        dkv = pytorch["dKV ring pass in FP32 (backward)"]
        assert dkv.collective == "send_recv" and dkv.count == m * layers * cp
        assert dkv.message_bytes == pytest.approx(2 * kv.message_bytes)  # FP32 against BF16
        assert "dKV reduce-scatter (backward)" not in pytorch
    assert ring["ring attention KV pass (backward)"].message_bytes == kv.message_bytes
    assert "dKV reduce-scatter (backward)" in te_gather and "dKV ring pass in FP32 (backward)" not in te_gather
    te_bwd = te_ring["ring attention KV and dKV passes (backward)"]
    assert te_bwd.message_bytes == pytest.approx(2 * kv.message_bytes) and te_bwd.count == kv.count


def test_tp_collectives_of_moe_layers_follow_the_expert_split():
    """A layer issues a TP collective pair for attention and one for its MLP. In Megatron-core under EP the
    routed experts are whole on each rank (ETP = 1) and need none, so an MoE layer without shared experts
    issues one; torchtitan gathers the MoE block's input and reduce-scatters its output all the same
    (apply_moe_ep_tp), two pairs (from a review against its source)."""
    def gathers(plan: str) -> int:
        est = _est(plan, model="mixtral-8x7b", nodes=4, batch=1_048_576)
        return sum(e.count for e in est.comm if e.purpose == "SP all-gather before QKV and MLP (forward)")

    m = 1_048_576 // 4096 // 4  # micro-batches of one sequence per data-parallel rank
    assert gathers("tp=8,dp_shard=4,mbs=1,recompute=none") == 2 * 32 * m
    assert gathers("tp=8,ep=8,dp_shard=4,mbs=1,recompute=none,sharding=megatron") == 32 * m
    assert gathers("tp=8,ep=8,dp_shard=4,mbs=1,recompute=none") == 2 * 32 * m


def test_megatron_mla_gathers_its_latents_and_keeps_its_down_projections_whole():
    """Megatron-core's MLA under SP gathers the query and KV latents and the rotary key (1536 + 512 + 64
    wide for DeepSeek-V3), not the 7168-wide hidden state, and re-gathers only the query latent for its
    weight gradient; its down-projections are replicated over TP (parallel_mode='duplicated'), not split."""
    from meshplan.cost.params import attention_replicated_params, param_counts

    model = load_model("deepseek-v3")
    counts = param_counts(model)
    assert counts.attention_replicated_per_layer == attention_replicated_params(model) == (
        7168 * 1536 + 1536 + 7168 * (512 + 64) + 512)
    assert counts.attention_per_tp_rank(2) == pytest.approx(
        (counts.attention_per_layer - counts.attention_replicated_per_layer) / 2
        + counts.attention_replicated_per_layer)
    est = _est("tp=2,pp=16,ep=32,dp_shard=32,mbs=1,recompute=none,sharding=megatron", model="deepseek-v3",
               nodes=128, batch=4_194_304)
    by = {e.purpose: e for e in est.comm if e.axis == "tp"}
    hidden = by["SP all-gather before QKV and MLP (forward)"]
    latents = by["SP all-gather of MLA latents (forward)"]
    assert latents.message_bytes == pytest.approx(hidden.message_bytes * (1536 + 512 + 64) / 7168)
    assert by["SP reduce-scatter of MLA latent grads (backward)"].message_bytes == latents.message_bytes
    regather = by["SP query-latent re-gather for weight grads (Megatron-core backward)"]
    assert regather.message_bytes == pytest.approx(hidden.message_bytes * 1536 / 7168)
    # one latent gather per layer and micro-batch; the hidden-state ones are the MLPs' (dense and shared)
    assert latents.count == hidden.count == regather.count


def test_megatron_all_reduces_the_sequence_parallel_replicated_grads_over_tp_once_per_step():
    """finalize_model_grads all-reduces over TP, in one coalesced call after the backward, the gradients
    of the parameters every TP rank holds whole under SP: two norms a layer, MLA's duplicated
    down-projections with their norms, the routers, the final norm on the last stage. torchtitan gathers
    those modules' inputs instead and sends nothing."""
    from meshplan.cost.params import param_counts

    model = load_model("deepseek-v3")
    pc = param_counts(model)
    plan = "tp=2,pp=1,ep=32,dp_shard=128,mbs=1,recompute=full,sharding=megatron"
    est = _est(plan, model="deepseek-v3", nodes=32, batch=4_194_304)
    [e] = [e for e in est.comm if e.purpose.startswith("sequence-parallel replicated grads")]
    # the 61 layers and the MTP layer (an MoE layer beside the loss): 62 layers, 59 of them MoE
    n = (62 * (pc.norms_per_layer + pc.attention_replicated_per_layer) + 59 * pc.router_per_moe_layer
         + pc.final_norm)
    assert (e.count, e.group_size, e.window, e.phase) == (1, 2, "none", "step")
    assert e.message_bytes == pytest.approx(n * 4.0)  # the job's FP32 gradient reduction
    assert e.exposed_s == pytest.approx(e.time_s)
    fsdp = _est("tp=2,ep=32,dp_shard=128,mbs=1,recompute=full", model="deepseek-v3", nodes=32,
                batch=4_194_304)
    assert not [e for e in fsdp.comm if e.purpose.startswith("sequence-parallel replicated grads")]


def test_megatron_mla_runs_its_down_projections_on_the_sequence_parallel_share():
    """Under Megatron-core's SP the replicated down-projections take the rank's T/t tokens and the latents
    are gathered after them; torchtitan gathers their input first and runs them on all T."""
    from meshplan.calibration import compute_params_for
    from meshplan.cost.compute import layer_times

    model, accel = load_model("deepseek-v3"), load_cluster("h100-sxm").accelerator
    args = dict(tokens=4096, seq_len=4096, cp=1, tp=4, precision="bf16", sequence_parallel=True)
    params = compute_params_for(accel.name)
    whole = layer_times(model, accel, params, **args)
    local = layer_times(model, accel, params, mla_down_local=True, **args)
    assert local.gemm_fwd_s < whole.gemm_fwd_s
    assert local.mla_up_fwd_s == whole.mla_up_fwd_s
    gqa = load_model("seed-70b")
    assert layer_times(gqa, accel, params, mla_down_local=True, **args) == layer_times(gqa, accel, params, **args)


def test_the_bound_and_the_bubble_take_megatron_mla_as_evaluate_does():
    """The search's lower bound times MLA's down-projections on T/t as Megatron's SP runs them (with wide
    latents, timing them on all T had put the bound 36 % above the step), and the once-a-step TP
    all-reduce after the backward adds its own time to the step, not a stall to every pipeline slot."""
    from meshplan import ModelSpec
    from meshplan.calibration import compute_params_for
    from meshplan.cost.bounds import step_time_lower_bound_s

    toy = ModelSpec(name="mla-toy", n_layers=8, hidden=4096, n_heads=8, n_kv_heads=8, head_dim=64,
                    ffn_hidden=1024, vocab=1024, q_lora_rank=4096, kv_lora_rank=4096, qk_rope_head_dim=64,
                    v_head_dim=64)
    c, job = load_cluster("h100-sxm", nodes=1), JobSpec(global_batch_tokens=8 * 4096, seq_len=4096)
    cp = compute_params_for(c.accelerator.name, job.software)
    for spec in ("tp=8,mbs=1,recompute=none,sharding=megatron",
                 "tp=4,dp_shard=2,mbs=1,recompute=none,sharding=megatron"):
        plan = parse_plan(spec, c.n_gpus)
        assert step_time_lower_bound_s(toy, c, job, plan, cp) <= evaluate(toy, c, job, plan, compute=cp).step_time_s
    est = _est("tp=2,pp=16,ep=32,dp_shard=32,mbs=1,recompute=none,sharding=megatron", model="deepseek-v3",
               nodes=128, batch=2 * 32 * 4096)
    [e] = [e for e in est.comm if e.purpose.startswith("sequence-parallel replicated grads")]
    assert est.time_breakdown["exposed all_reduce (tp)"] == pytest.approx(e.time_s)
    import meshplan.cost.comm as comm

    without = comm._sequence_parallel_grads
    try:
        comm._sequence_parallel_grads = lambda *a: None
        base = _est("tp=2,pp=16,ep=32,dp_shard=32,mbs=1,recompute=none,sharding=megatron", model="deepseek-v3",
                    nodes=128, batch=2 * 32 * 4096)
    finally:
        comm._sequence_parallel_grads = without
    assert est.time_breakdown["pipeline bubble"] == pytest.approx(base.time_breakdown["pipeline bubble"])
    assert est.step_time_s - base.step_time_s == pytest.approx(e.time_s, rel=1e-6)


def test_expert_tp_under_expert_parallelism_splits_states_and_gathers_dispatched_tokens():
    """Megatron's --expert-tensor-parallel-size = tp with EP: each rank holds 1/(ep·tp) of the routed
    experts, the EP ranks sit tp apart, and after each dispatch the received tokens are all-gathered over
    the tp ranks (reduce-scattered before the combine): etp times the dispatched bytes per call."""
    base = "tp=4,ep=8,dp_shard=8,mbs=1,recompute=none,sharding=megatron"
    whole = _est(base, model="mixtral-8x7b", nodes=4, batch=1_048_576)
    split = _est(base + ",etp=4", model="mixtral-8x7b", nodes=4, batch=1_048_576)
    assert split.memory.terms["expert_params"] == pytest.approx(whole.memory.terms["expert_params"] / 4)
    assert not [e for e in whole.comm if e.purpose.startswith("expert-TP")]
    etp = {e.purpose: e for e in split.comm if e.purpose.startswith("expert-TP")}
    dispatch = next(e for e in split.comm if e.purpose == "MoE token dispatch and combine (forward)")
    gather = etp["expert-TP dispatched tokens all-gather (forward)"]
    assert len(etp) == 4 and all(e.axis == "tp" for e in etp.values())
    assert gather.message_bytes == pytest.approx(4 * dispatch.message_bytes)
    assert 2 * gather.count == dispatch.count
    assert (dispatch.group_size, dispatch.link) == (8, "inter_node")  # 8 ranks 4 apart: 32 GPUs, 4 nodes
    assert next(e for e in whole.comm if e.axis == "ep").link == "intra_node"
    # the experts are split, so an MoE layer's only TP pair is still the attention's
    sp = [e for e in split.comm if e.purpose == "SP all-gather before QKV and MLP (forward)"]
    assert sp[0].count == next(e for e in whole.comm if e.purpose == sp[0].purpose).count
    # expert data parallelism over tp·cp·dp_shard / (ep·etp) ranks: 4 with whole experts, none split
    grads = [e for e in whole.comm if e.purpose == "experts grads reduce-scatter"]
    assert [e.group_size for e in grads] == [4] and not [e for e in split.comm if e.axis == "edp"]
    # recomputed forwards dispatch, and gather, again
    full = _est(base.replace("recompute=none", "recompute=full") + ",etp=4", model="mixtral-8x7b", nodes=4,
                batch=1_048_576)
    ag = {e.phase: e.count for e in full.comm if e.purpose.startswith("expert-TP") and "all-gather" in e.purpose}
    assert ag["forward"] == 2 * ag["backward"] == 2 * gather.count


@pytest.mark.parametrize("plan, field", [
    ("tp=4,ep=8,dp_shard=8,etp=2,sharding=megatron", "plan.etp"),  # 1 or tp
    ("tp=4,ep=8,dp_shard=8,etp=4", "plan.etp"),  # a chosen expert-TP is Megatron's
    ("tp=4,ep=8,cp=2,dp_shard=2,dp_replicate=2,etp=4,sharding=megatron", "plan.etp"),  # ep·etp ∤ tp·cp·dp_shard
    ("tp=4,ep=8,dp_shard=8,etp=4,sp=false,sharding=megatron", "plan.sp"),  # expert-TP needs SP tokens
    ("tp=4,ep=8,dp_shard=8,etp=4,ep_dispatch=deepep,sharding=megatron", "plan.ep_dispatch"),  # not modelled
])
def test_expert_tp_rejections_name_the_field(plan, field):
    with pytest.raises(SpecError) as err:
        m, c = load_model("mixtral-8x7b"), load_cluster("h100-sxm", nodes=4)
        evaluate(m, c, JobSpec(global_batch_tokens=1_048_576, seq_len=4096), parse_plan(plan, c.n_gpus))
    assert err.value.field == field


def _ep(extra: str = "", nodes: int = 4):
    """Mixtral 8x7B with its 8 experts over two 4-GPU nodes (the expert-parallel group spans a node)."""
    from meshplan.cost.step import evaluate as evaluate_plan
    cluster = load_cluster("h100-sxm", nodes=nodes, gpus_per_node=4)
    job = JobSpec(global_batch_tokens=1_048_576, seq_len=4096)
    plan = parse_plan("ep=8,dp_shard=16,mbs=1,recompute=selective,sharding=megatron" + extra)
    return evaluate_plan(load_model("mixtral-8x7b"), cluster, job, plan)


def _a2a(est):
    return [e for e in est.comm if e.axis == "ep"]


@pytest.mark.parametrize("n_nodes", [2, 4, 8, 16])
def test_group_limited_routing_reaches_fewer_nodes_as_sampled(n_nodes):
    """DeepSeek-V3-style routing (experts in G groups, a token's from tg of them) against sampling it:
    choose tg groups, then k experts among theirs, and count the other nodes hit."""
    import random

    from meshplan.cost.collectives import remote_nodes_per_token

    E, k, G, tg, trials = 64, 4, 8, 4, 40_000
    rng, per_node, per_group, hits = random.Random(7), E // n_nodes, E // G, 0
    for _ in range(trials):
        groups = rng.sample(range(G), tg)
        experts = rng.sample([g * per_group + i for g in groups for i in range(per_group)], k)
        nodes = {e // per_node for e in experts}
        hits += len(nodes) - (0 in nodes)  # the token sits on node 0; every node is alike
    sampled = hits / trials
    exact = remote_nodes_per_token(E, k, n_nodes, G, tg)
    assert exact == pytest.approx(sampled, rel=0.03, abs=0.01)
    assert exact <= remote_nodes_per_token(E, k, n_nodes) + 1e-12


def test_remote_nodes_per_token_matches_counting():
    """A token's top_k experts lie on (N-1)(1 - C(E-E/N, top_k)/C(E, top_k)) of the other N-1 nodes; with top-1 routing
    that is the (k-1)/k every routed copy of an all-to-all sends off the node."""
    from math import comb

    from meshplan.cost.collectives import remote_nodes_per_token
    assert remote_nodes_per_token(256, 8, 8) == pytest.approx(7 * (1 - comb(224, 8) / comb(256, 8)))
    assert remote_nodes_per_token(64, 1, 4) == pytest.approx(3 / 4)
    assert remote_nodes_per_token(8, 2, 1) == 0.0
    assert remote_nodes_per_token(8, 8, 2) == pytest.approx(1.0)  # every node holds some of all 8 experts


def test_deepep_sends_each_token_once_per_remote_node():
    alltoall, deepep = _ep(), _ep(",ep_dispatch=deepep")
    # Mixtral top-2 of 8 experts over 2 nodes: an all-to-all sends 2 x 1/2 copies off the node per token,
    # DeepEP 1 - C(4,2)/C(8,2) = 11/14 of a token
    for a, d in zip(_a2a(alltoall), _a2a(deepep), strict=True):
        assert d.inter_node_bytes_per_gpu == pytest.approx(a.inter_node_bytes_per_gpu * (11 / 14))
        assert d.time_s < a.time_s
    assert deepep.step_time_s < alltoall.step_time_s


def test_deepep_buffers_are_counted_in_memory():
    """DeepEP allocates NVLink and RDMA buffers (DeepSeek-V3 on 32 ranks: 378 MB + 168 MB per GPU,
    from csrc/config.hpp's size hints with deep_ep/buffer.py's default configs)."""
    from meshplan.cost.memory import deepep_buffer_bytes

    assert deepep_buffer_bytes(hidden=7168, ep=8) == pytest.approx(335.7e6, rel=1e-3)
    assert deepep_buffer_bytes(hidden=7168, ep=32) == pytest.approx(377.7e6 + 168.0e6, rel=1e-3)
    alltoall, deepep = _ep(), _ep(",ep_dispatch=deepep")
    assert "deepep_buffers" not in alltoall.memory.terms
    assert deepep.memory.terms["deepep_buffers"] == pytest.approx(deepep_buffer_bytes(hidden=4096, ep=8))


def test_ep_overlap_leaves_warm_up_exposed_and_shares_its_link():
    """Under an interleaved pipeline the warm-up forwards and cool-down backwards have no partner
    (Megatron's warm-up of (p-s-1)·2 + (v-1)·p + 1 chunks); and the overlap hides only what the link's
    other traffic left of the compute."""
    from meshplan.cost.pipeline import unpaired_microbatches
    assert unpaired_microbatches(schedule="interleaved", pp=8, m=128, vpp=2, stage=0) == (14 + 8 + 1) / 2
    assert unpaired_microbatches(schedule="1f1b", pp=1, m=16, vpp=1, stage=0) == 1
    assert unpaired_microbatches(schedule="interleaved", pp=8, m=4, vpp=2, stage=0) == 4
    slow = _ep(",ep_overlap=true", nodes=4)
    from meshplan.cost.step import evaluate as evaluate_plan
    cluster = load_cluster("h100-sxm", nodes=4, gpus_per_node=4, inter_node_gb_per_s=3)
    job = JobSpec(global_batch_tokens=1_048_576, seq_len=4096)
    starved = evaluate_plan(load_model("mixtral-8x7b"), cluster, job,
                            parse_plan("ep=8,dp_shard=16,mbs=1,recompute=selective,sharding=megatron,ep_overlap=true"))
    windows = sum(e.time_s - e.exposed_s for e in starved.comm if e.link == "inter_node")
    compute = sum(starved.time_breakdown[k] for k in ("compute", "recompute", "comm contention"))
    assert windows <= compute * (1 + 1e-9)  # never more hidden on a link than there is (slowed) compute
    assert sum(e.exposed_s for e in _a2a(slow)) < sum(e.exposed_s for e in _a2a(starved))


def test_contention_runs_inside_traffic_that_exceeds_compute():
    """Where overlapped traffic exceeds the compute that hides it, the slowed compute runs inside the
    traffic's time: the step is the traffic's, whatever the slowdown (as in the simulator). Where compute
    exceeds the traffic, the slowdown lengthens the step by its share of the hidden traffic."""
    from dataclasses import replace

    from meshplan.calibration import compute_params_for
    from meshplan.cost.step import evaluate as evaluate_plan
    job = JobSpec(global_batch_tokens=1_048_576, seq_len=4096)
    plan = parse_plan("ep=8,dp_shard=16,mbs=1,recompute=selective,sharding=megatron,ep_overlap=true")
    base = compute_params_for("h100-sxm", "megatron")

    def step(gb_per_s: float, slowdown: float):
        cluster = load_cluster("h100-sxm", nodes=4, gpus_per_node=4, inter_node_gb_per_s=gb_per_s)
        return evaluate_plan(load_model("mixtral-8x7b"), cluster, job, plan,
                             compute=replace(base, comm_slowdown=slowdown))

    starved = [step(3, s) for s in (0.0, 0.2)]
    assert starved[1].step_time_s == pytest.approx(starved[0].step_time_s, rel=1e-9)
    assert starved[1].time_breakdown["comm contention"] > 0
    fast = [step(400, s) for s in (0.0, 0.2)]
    hidden = sum(e.time_s - e.exposed_s for e in fast[1].comm)
    assert sum(e.exposed_s - e.edge_s for e in fast[1].comm if e.overlappable) == pytest.approx(0.0, abs=1e-12)
    assert fast[1].step_time_s - fast[0].step_time_s == pytest.approx(0.2 * hidden, rel=1e-6)


def test_ep_overlap_hides_all_to_all_behind_another_micro_batch():
    plain, overlap = _ep(), _ep(",ep_overlap=true")
    exposed = [sum(e.exposed_s for e in _a2a(x)) for x in (plain, overlap)]
    assert exposed[0] == pytest.approx(sum(e.time_s for e in _a2a(plain)))  # on the critical path
    assert 0 < exposed[1] < 0.5 * exposed[0]  # only the first forward's and last backward's stay exposed
    assert overlap.memory.peak_bytes > plain.memory.peak_bytes  # two micro-batches alive at once


@pytest.mark.parametrize("plan, message", [
    ("ep=8,dp_shard=16,ep_overlap=true", "sharding=megatron"),
    ("dp_shard=16,sharding=megatron,ep_overlap=true", "ep >= 2"),
    ("ep=8,dp_shard=16,sharding=megatron,ep_overlap=true,recompute=full", "full recomputation"),
    ("ep=8,dp_shard=8,pp=2,sharding=megatron,ep_overlap=true", "interleaved"),
    ("ep=8,dp_shard=16,ep_dispatch=deepep", "alltoall"),
    ("ep=8,dp_shard=16,sharding=megatron,ep_dispatch=nvshmem", "alltoall, deepep"),
])
def test_moe_options_outside_their_framework_are_spec_errors(plan, message):
    with pytest.raises(SpecError, match=message):
        parse_plan(plan)


def test_search_offers_deepep_and_the_overlap_only_where_they_change_something():
    from meshplan.search.space import option_variants
    model, job = load_model("mixtral-8x7b"), JobSpec(global_batch_tokens=1_048_576, seq_len=4096)
    plan = parse_plan("ep=8,dp_shard=16,sharding=megatron")
    across = {(v.ep_dispatch, v.ep_overlap)
              for v in option_variants(model, load_cluster("h100-sxm", nodes=4, gpus_per_node=4), job, plan)
              if v.offload_layers == 0}  # the activation-offloading variant is another test's
    assert across == {("deepep", False), (None, True), ("deepep", True)}
    inside = {(v.ep_dispatch, v.ep_overlap)
              for v in option_variants(model, load_cluster("h100-sxm", nodes=2), job, plan) if v.offload_layers == 0}
    assert inside == {(None, True)}  # one expert per GPU inside a node: DeepEP sends what an all-to-all does
    deepseek = load_model("deepseek-v3")
    inside = {(v.ep_dispatch, v.ep_overlap) for v in option_variants(
        deepseek, load_cluster("b200", nodes=2), job, parse_plan("ep=8,dp_shard=16,sharding=megatron"))}
    assert ("deepep", False) in inside  # 32 experts per GPU: a token's 8 often share one
    piped = parse_plan("ep=8,dp_shard=8,pp=2,sharding=megatron")
    assert not list(option_variants(model, load_cluster("h100-sxm", nodes=2), job, piped))


def test_deepep_sends_each_token_once_per_gpu_inside_a_node():
    """Inside one NVLink domain DeepEP / HybridEP send a token once to each other GPU holding one of its
    experts, not once per routed copy: DeepSeek-V3 (256 experts, top-8, 8 groups of which 4) on 8 GPUs,
    one group per GPU, reaches (by the group-limited count) fewer than 8 x 7/8 GPUs per token."""
    from meshplan.cost.collectives import remote_nodes_per_token
    from meshplan.cost.step import evaluate as evaluate_plan

    model, cluster = load_model("deepseek-v3"), load_cluster("b200", nodes=4)
    job = JobSpec(global_batch_tokens=1_048_576, seq_len=4096)
    base = "ep=8,dp_shard=16,pp=2,mbs=1,recompute=full,sharding=megatron"
    a2a, dedup = (evaluate_plan(model, cluster, job, parse_plan(base + extra))
                  for extra in ("", ",ep_dispatch=deepep"))
    share = remote_nodes_per_token(256, 8, 8, 8, 4) / 8
    # 4 of 8 groups chosen, one group per GPU, reached unless all 8 experts miss it: 7 x 1/2 x (1 - C(96,8)/C(128,8))
    assert share == pytest.approx(0.39692, abs=1e-5)
    for a, d in zip(_a2a(a2a), _a2a(dedup), strict=True):
        assert d.link == a.link and d.inter_node_bytes_per_gpu == a.inter_node_bytes_per_gpu == 0
        assert d.bytes_per_gpu == pytest.approx(a.bytes_per_gpu * share / (7 / 8))
        assert d.time_s < a.time_s


def test_uneven_model_chunks_interleave():
    """Llama 3.1 405B's 126 layers on 8 stages x 8 chunks: Megatron counts the embedding and the loss as a
    layer each (128 = 64 x 2); the search offers that split as its layout, and evaluate accepts any split
    with a layer per chunk."""
    from meshplan.cost.step import evaluate as evaluate_plan
    from meshplan.search.space import Space, _pipeline_options
    model, cluster = load_model("llama-3.1-405b"), load_cluster("h100-sxm", nodes=64)
    job = JobSpec(global_batch_tokens=8192 * 512, seq_len=8192)
    options = {(s, v): layout for s, v, layout in _pipeline_options(model, 8, Space(max_vpp=8))}
    assert options[("interleaved", 8)] == "Et*1|(t*2|)*62t*1L"
    assert options[("interleaved", 2)] == "Et*7|(t*8|)*14t*7L" and ("interleaved", 3) not in options
    base = "tp=8,pp=8,dp_shard=8,mbs=1,recompute=full,sharding=megatron"
    plain, inter = (evaluate_plan(model, cluster, job, parse_plan(base + extra))
                    for extra in ("", ",schedule=interleaved,vpp=8"))
    assert inter.time_breakdown["pipeline bubble"] == pytest.approx(plain.time_breakdown["pipeline bubble"] / 8)


def test_context_parallel_ring_and_ulysses():
    ring = _est("cp=2,dp_shard=32,mbs=1,recompute=full", seq=8192)
    cp = [e for e in ring.comm if e.axis == "cp"]
    assert cp and {e.collective for e in cp} == {"send_recv"} and all(e.window == "attention" for e in cp)
    uly = _est("cp=2,dp_shard=32,mbs=1,recompute=full,sharding=zero3", seq=8192)
    assert {e.collective for e in uly.comm if e.axis == "cp"} == {"all_to_all"}


def test_point_to_point_across_nodes_has_no_ring_to_fill():
    """A send/recv between two nodes (pipeline stages, ring CP's KV passes) follows the two-node H100
    exchange of nccl-tests#232 (18.5-22.5 GB/s at 2 MiB, 36 at 8 MiB, 41 at 32 MiB), not the much larger
    half size of a ring collective across nodes, which the same message on the same ranks still pays."""
    from meshplan.cost.collectives import ALL_GATHER, SEND_RECV, collective_time_s
    from meshplan.cost.mesh import group

    c = load_cluster("h100-sxm", nodes=2)
    pair = group("cp", 2, 8, c.gpus_per_node)  # one rank on each node
    assert pair.n_nodes == 2
    for mib, lo, hi in ((2, 18e9, 24e9), (8, 33e9, 39e9), (32, 39e9, 45e9)):
        msg = mib * 2**20
        assert lo < msg / (collective_time_s(SEND_RECV, msg, pair, c) - c.inter.latency_s) < hi
    assert collective_time_s(ALL_GATHER, 4 * 2**20, pair, c) > 5 * collective_time_s(SEND_RECV, 2 * 2**20, pair, c)


def test_sequence_parallel_replaces_all_reduce_with_gather_and_scatter_of_equal_bytes():
    sp = _est("tp=8,dp_shard=8,mbs=1,recompute=none")
    no_sp = _est("tp=8,dp_shard=8,mbs=1,recompute=none,sp=false")
    tp_sp = {e.collective for e in sp.comm if e.axis == "tp"}
    assert tp_sp == {"all_gather", "reduce_scatter"}
    layer_bytes = sum(e.bytes_per_gpu for e in sp.comm if e.axis == "tp" and "embedding" not in e.purpose
                      and "LM head" not in e.purpose)
    layer_bytes_no_sp = sum(e.bytes_per_gpu for e in no_sp.comm if e.axis == "tp" and "embedding" not in e.purpose
                            and "LM head" not in e.purpose)
    assert layer_bytes == pytest.approx(layer_bytes_no_sp)
    assert sp.memory.activation_bytes < no_sp.memory.activation_bytes


@pytest.mark.parametrize(("sharding", "calls_per_step"), [("zero1", 1), ("zero2", 16), ("zero3", 16 * 2)])
def test_zero_stage_reduce_scatter_frequency(sharding, calls_per_step):
    """DeepSpeed: ZeRO-1 reduces at the accumulation boundary, ZeRO-2/3 every micro-batch; ZeRO-3 in buckets of
    5e8 elements (a 855M-parameter block is 2 reductions) and gathers module by module (6 per block)."""
    est = _est(f"dp_shard=64,mbs=1,recompute=full,sharding={sharding}")
    rs = [e for e in est.comm if e.collective == "reduce_scatter" and "block" in e.purpose]
    assert rs[0].count == calls_per_step * 80
    if sharding == "zero3":
        ag = [e for e in est.comm if e.collective == "all_gather" and "block" in e.purpose and "(forward)" in e.purpose]
        assert ag[0].count == 16 * 80 * 6


def test_zero3_collective_efficiency_slows_only_zero3_data_parallel_traffic():
    """zero3_collective_efficiency divides the time (not the bytes) of DeepSpeed ZeRO-3's gathers and
    reductions; other sharding, and other axes, keep NCCL's bus bandwidth."""
    from meshplan.cost.compute import ComputeParams

    m, c = load_model("seed-70b"), load_cluster("h100-sxm", nodes=8)
    job = JobSpec(global_batch_tokens=4_194_304, seq_len=4096)

    def dp_comm(plan: str, eff: float) -> tuple[float, float]:
        est = evaluate(m, c, job, parse_plan(plan, c.n_gpus), compute=ComputeParams(zero3_collective_efficiency=eff))
        dp = [e for e in est.comm if e.axis == "dp_shard"]
        return sum(e.time_s for e in dp), sum(e.bytes_per_gpu for e in dp)

    full, half = dp_comm("dp_shard=64,mbs=1,recompute=full,sharding=zero3", 1.0), dp_comm(
        "dp_shard=64,mbs=1,recompute=full,sharding=zero3", 0.5)
    assert half[0] == pytest.approx(2 * full[0]) and half[1] == pytest.approx(full[1])
    fsdp = "dp_shard=64,mbs=1,recompute=full"
    assert dp_comm(fsdp, 0.5) == pytest.approx(dp_comm(fsdp, 1.0))


def test_megatron_distributed_optimizer_memory():
    """6 + 12/d bytes per parameter (Megatron dist_optimizer.md)."""
    est = _est("tp=8,pp=8,mbs=1,recompute=full,sharding=megatron")
    t = est.memory.terms
    n_params = t["params"] / 2.0
    assert t["grads"] == pytest.approx(4.0 * n_params)
    assert t["master_params"] + t["optimizer_state"] == pytest.approx(12.0 * n_params / 1)


@pytest.mark.parametrize(("plan", "field"), [
    ("cp=3,dp_shard=1", "plan"),
    ("cp=64", "plan.cp"),
    ("pp=64,dp_shard=1", "plan.vpp"),
    ("pp=8,dp_shard=8,schedule=interleaved,vpp=11", "plan.vpp"),  # 88 chunks, 80 layers
    ("pp=8,dp_shard=8,schedule=zb-h1,sharding=zero1", "plan.schedule"),
    ("dp_shard=64,ep=2", "plan.ep"),
])
def test_bad_plans_raise_spec_errors(plan, field):
    m, c, j = worked_example()
    with pytest.raises(SpecError) as exc:
        p = parse_plan(plan, c.n_gpus)
        if plan == "cp=64":
            j = JobSpec(global_batch_tokens=96 * 1024, seq_len=96)
        if plan.startswith("pp=64"):
            p = parse_plan("pp=64,schedule=interleaved,vpp=2", c.n_gpus)
        evaluate(m, c, j, p)
    assert exc.value.field.startswith(field)


def test_fp8_param_gather_halves_parameter_all_gather_bytes():
    """Megatron MoE README: FP8 parameter gather gives '50% parameter all-gather'."""
    m, c = load_model("seed-70b"), load_cluster("h100-sxm", nodes=8)
    plan = parse_plan("dp_shard=64,mbs=1,recompute=full", c.n_gpus)
    base = evaluate(m, c, JobSpec(global_batch_tokens=4_194_304, seq_len=4096, precision="fp8"), plan)
    fp8 = evaluate(m, c, JobSpec(global_batch_tokens=4_194_304, seq_len=4096, precision="fp8",
                                 fp8_param_gather=True), plan)

    def ag(e):
        return sum(x.bytes_per_gpu for x in e.comm if x.collective == "all_gather")

    assert ag(fp8) == pytest.approx(0.5 * ag(base))
    with pytest.raises(SpecError):
        JobSpec(global_batch_tokens=4096, seq_len=4096, fp8_param_gather=True)


def test_expert_tp_on_a_dense_model_is_rejected():
    with pytest.raises(SpecError) as err:
        _est("tp=8,dp_shard=8,etp=1,sharding=megatron")
    assert err.value.field == "plan.etp"


def test_validation_rows_take_a_stated_expert_tp():
    """A published row's 'expert TP (ETP)=N' note sets the plan's etp; without it the plan keeps the default."""
    from meshplan.validation.rows import _plan

    row = {"tp": "4", "pp": "1", "cp": "1", "ep": "8", "dp": "8", "source_group": "NVIDIA dgxc-benchmarking",
           "micro_batch_size": "1", "notes": "step time = last step; expert TP (ETP)=4; MoE 8 experts top-2"}
    model = load_model("mixtral-8x7b")
    assert _plan(row, model, 32)[0].etp == 4
    assert _plan({**row, "notes": "MoE 8 experts top-2"}, model, 32)[0].etp is None


def test_validation_imputes_virtual_stages_only_from_agreeing_siblings():
    """'VP=NA' rows take the VP their source's other rows of the same model, TP and PP all state."""
    from meshplan.validation.rows import impute_virtual_stages

    base = {"source_group": "dgxc", "model": "M", "tp": "8", "pp": "8", "virtual_pp": "", "notes": ""}
    na = {**base, "notes": "config table lists VP=NA for this release"}
    rows = [{**base, "virtual_pp": "12"}, {**base, "virtual_pp": "12"}, na, base, {**na, "pp": "4"}]
    assert {i: r["virtual_pp"] for i, r in impute_virtual_stages(rows).items()} == {2: "12"}
    assert impute_virtual_stages([*rows, {**base, "virtual_pp": "6"}]) == {}  # siblings disagree


@pytest.mark.parametrize("kw, field", [({"n_expert_groups": 7, "topk_groups": 4}, "model.n_expert_groups"),
                                       ({"n_expert_groups": 8, "topk_groups": 9}, "model.topk_groups"),
                                       ({"topk_groups": 4}, "model.topk_groups")])
def test_group_limited_routing_spec_errors_name_the_field(kw, field):
    from dataclasses import replace

    with pytest.raises(SpecError) as err:
        replace(load_model("deepseek-v3"), **{"n_expert_groups": 0, **kw})
    assert err.value.field == field


@pytest.mark.parametrize("kw", [{"attention_window": 0, "global_attention_every": 2},
                                {"attention_window": 128, "global_attention_every": 1},
                                {"attention_window": -1}])
def test_sliding_window_spec_errors_name_the_field(kw):
    from dataclasses import replace

    with pytest.raises(SpecError) as err:
        replace(load_model("gpt-oss-120b"), **kw)
    assert err.value.field == ("model.attention_window" if kw.get("attention_window", 1) < 0
                               else "model.global_attention_every")


def test_the_loss_implementation_sets_the_logits_working_set():
    """Eager cross-entropy peaks at three fp32 copies of the logits in its backward (12 B per logit),
    Megatron's vocab-parallel one at an fp32 copy and a bf16 gradient (6 B), a fused (compiled) loss at the
    bf16 logits and their bf16 gradient (4 B). 'auto' takes the stack's; a fused loss also runs faster."""
    m, c = load_model("llama-3-8b"), load_cluster("h100-sxm")
    plan = parse_plan("dp_shard=8,mbs=2,recompute=full", c.n_gpus)

    def est(**kw):
        return evaluate(m, c, JobSpec(global_batch_tokens=131_072, seq_len=8192, **kw), plan)

    eager, vp, fused = (est(loss=x) for x in ("eager", "vocab_parallel", "fused"))
    logits = 2 * 8192 * m.vocab
    for e, per_logit in ((eager, 12), (vp, 6), (fused, 4)):
        assert e.memory.terms["logits_and_loss"] == pytest.approx(per_logit * logits, rel=1e-9)
    assert fused.step_time_s < eager.step_time_s
    assert est().memory.terms["logits_and_loss"] == eager.memory.terms["logits_and_loss"]  # generic: eager
    assert est(software="megatron").memory.terms["logits_and_loss"] == vp.memory.terms["logits_and_loss"]
    # a plan that runs Megatron-core's layers (its distributed optimizer) runs its loss too, whatever the stack
    megatron = evaluate(m, c, JobSpec(global_batch_tokens=131_072, seq_len=8192),
                        parse_plan("dp_shard=8,mbs=2,recompute=full,sharding=megatron", c.n_gpus))
    assert megatron.memory.terms["logits_and_loss"] == vp.memory.terms["logits_and_loss"]
    with pytest.raises(SpecError, match=r"job\.loss"):
        est(loss="chunked")


def test_pipeline_warm_up_stalls_on_the_layers_unhidden_collectives():
    """The warm-up and cool-down micro-batches wait on the layers' exposed collectives (TP without async
    TP here) as the steady ones do: a stage's 1F1B bubble is the other ranks' whole per-micro-batch times,
    the last stage's LM head and loss counted once, not on every rank."""
    est = _est("tp=8,pp=8,mbs=1,recompute=full,sharding=megatron")
    whole = {}
    for st in est.stages:
        stall = sum(e.exposed_s for e in st.comm if e.window == "none" and e.axis == "tp"
                    and e.phase != "step") / est.n_microbatches  # not the once-a-step grads all-reduce
        assert stall > 0
        whole[st.stage] = st.t_f_s + st.head_f_s + st.t_b_s + st.head_b_s + st.t_r_s + st.t_w_s + stall
        assert sum(st.passes_s) == pytest.approx(whole[st.stage])
    assert sorted(whole) == [0, 7]  # 80 layers on 8 stages: the middle ones are the first's
    for s, other in ((0, 7), (7, 0)):
        bubble = est.stages[[d.stage for d in est.stages].index(s)].breakdown["pipeline bubble"]
        assert bubble == pytest.approx(6 * whole[0] + whole[other])
    assert whole[7] > whole[0]  # the head's


def test_a_middle_stage_of_heavier_layers_is_timed():
    """DeepSeek-V3 at PP=16: 3 dense and 1 MoE layer first, 4 MoE layers in the middle (as many layers,
    heavier ones), 1 MoE layer and MTP last; uniform and remainder-first splits add no middle stage."""
    from meshplan.cost.stage import bounding_stages
    assert bounding_stages([(3, 1)] + [(0, 4)] * 14 + [(0, 1)]) == [0, 1, 15]
    assert bounding_stages([(3, 1), (0, 4), (1, 4), (0, 4), (0, 2)]) == [0, 1, 2, 4]
    assert bounding_stages([(10, 0)] * 8) == [0, 7]
    assert bounding_stages([(11, 0), (11, 0), (10, 0), (10, 0)]) == [0, 3]
    # a shape an earlier middle stage covers is not timed again; a later, larger one is
    assert bounding_stages([(3, 5), (0, 8), (0, 8), (0, 7), (0, 7)]) == [0, 1, 4]
    assert bounding_stages([(10, 0), (10, 0), (11, 0), (10, 0)]) == [0, 2, 3]


def test_pipeline_neighbours_in_one_nvlink_domain_send_over_nvlink():
    """PP=8 over 256 GB200s (stride 32, 72-GPU NVLink domains of 64 used): stages 0-1, 2-3, ... share a
    domain. The first and last stages send only to such neighbours under 1F1B; a middle stage's other
    neighbour is across the network; with interleaving the last stage also sends to the first."""
    from meshplan.cost.mesh import stage_links_intra
    plan = parse_plan("dp_shard=32,pp=8,mbs=1,sharding=megatron")
    assert [stage_links_intra(plan, s, 64) for s in range(8)] == [True, False, False, False, False, False,
                                                                   False, True]
    inter = parse_plan("dp_shard=32,pp=8,mbs=1,sharding=megatron,schedule=interleaved,vpp=2")
    assert not stage_links_intra(inter, 7, 64) and not stage_links_intra(inter, 0, 64)
    assert stage_links_intra(parse_plan("dp_shard=32,pp=8,mbs=1,schedule=zb-v"), 7, 64)
    assert not stage_links_intra(plan, 0, 8)  # 8-GPU nodes: every stage on its own node
    m, c = load_model("seed-70b"), load_cluster("gb200", nodes=4, gpus_per_node=64)
    est = evaluate(m, c, JobSpec(global_batch_tokens=4_194_304, seq_len=4096), plan)
    assert [st.stage for st in est.stages] == [0, 7]
    nvlink, ib = (evaluate(m, load_cluster("gb200", nodes=n, gpus_per_node=g), JobSpec(global_batch_tokens=4_194_304,
                                                                                      seq_len=4096), plan)
                  for n, g in ((1, 256), (32, 8)))
    for st in est.stages:  # its own sends over NVLink; the pipeline's fill over 4 NVLink and 3 network hops
        p2p = [e for e in st.comm if e.axis == "pp"]
        assert {e.link for e in p2p} == {"intra_node"}
        one = next(e.edge_s / 7 for e in nvlink.stages[0].comm if e.axis == "pp")
        other = next(e.edge_s / 7 for e in ib.stages[0].comm if e.axis == "pp")
        assert all(e.edge_s == pytest.approx(4 * one + 3 * other) for e in p2p)


def test_torchtitan_context_parallelism_passes_k_and_v_at_every_query_head():
    """torchtitan's Llama repeats K and V to every query head (repeat_kv) before the SDPA call that
    context parallelism replaces, so its ring passes n_heads/n_kv_heads times the GQA chunk: 4x for
    Llama 3 8B (32 query heads, 8 KV heads)."""
    m, c = load_model("llama-3-8b"), load_cluster("h100-sxm", nodes=1)
    plan = parse_plan("cp=8,mbs=1,recompute=full,cp_impl=ring", 8)
    passes = {}
    for software in ("generic", "torchtitan"):
        job = JobSpec(global_batch_tokens=2**20, seq_len=65536, software=software)
        est = evaluate(m, c, job, plan)
        passes[software] = next(e for e in est.comm if e.purpose == "ring attention KV pass (forward)")
    assert passes["torchtitan"].message_bytes == pytest.approx(4 * passes["generic"].message_bytes)
    assert passes["generic"].message_bytes == pytest.approx(65536 / 8 * 2 * m.kv_dim * 2)


def test_torchtitan_ddp_all_reduces_every_micro_batch_and_keeps_bucket_copies():
    """torchtitan's DDP has no no_sync: its default plan all-reduces each micro-batch (m calls per unit where a
    no_sync loop issues 1), and the search offers it no other sync. PyTorch's DDP buckets hold a second copy
    of the gradients; Megatron's own DDP reduces its gradient buffer in place."""
    from meshplan import Space, search

    model, cluster = load_model("llama-3.2-3b"), load_cluster("h100-sxm", nodes=1)

    def est(software: str, plan: str = "dp_replicate=8,mbs=1"):
        job = JobSpec(global_batch_tokens=64 * 2048, seq_len=2048, software=software)
        return evaluate(model, cluster, job, parse_plan(plan))

    def ddp_calls(e) -> int:
        return sum(x.count for x in e.comm if x.axis == "dp_replicate")

    titan, generic = est("torchtitan"), est("generic")
    assert titan.n_microbatches == generic.n_microbatches == 8
    assert titan.grad_sync == "every" and generic.grad_sync == "last"
    assert ddp_calls(titan) == 8 * ddp_calls(generic)
    # the stack's default is not an option the plan chose: same plan, label and tie-break as elsewhere
    assert titan.plan == generic.plan and titan.plan.grad_sync is None and "sync" not in titan.plan.label()
    written = est("torchtitan", "dp_replicate=8,mbs=1,grad_sync=last")
    assert written.grad_sync == written.plan.grad_sync == "last" and ddp_calls(written) == ddp_calls(generic)
    grads = titan.memory.terms["grads"]
    assert titan.memory.terms["ddp_gradient_buckets"] == pytest.approx(grads)
    assert "ddp_gradient_buckets" not in est("megatron").memory.terms
    job = JobSpec(global_batch_tokens=64 * 2048, seq_len=2048, software="torchtitan")
    ddp = [e for e in search(model, cluster, job, Space()).ranked if e.plan.dp_replicate == 8 and e.plan.dp_shard == 1]
    assert ddp and all(e.grad_sync == "every" and e.plan.grad_sync is None for e in ddp)


def test_ddp_gradients_keep_the_parameters_fp32_whatever_the_reduce_dtype():
    """DDP's param.grad (and so its buckets) are fp32 like the parameters; a bf16 reduce dtype is a comm hook's
    cast copy: it halves the all-reduce, not the gradients. FSDP2's sharded gradients stay in the reduce dtype."""
    from dataclasses import replace

    model, cluster = load_model("llama-3.2-3b"), load_cluster("h100-sxm", nodes=1)
    job = JobSpec(global_batch_tokens=64 * 2048, seq_len=2048)
    fp32, bf16 = (evaluate(model, cluster, replace(job, reduce_dtype_bytes=r), parse_plan("dp_replicate=8,mbs=1"))
                  for r in (4, 2))
    assert bf16.memory.terms["grads"] == fp32.memory.terms["grads"] == pytest.approx(fp32.memory.terms["params"])
    assert bf16.memory.terms["ddp_gradient_buckets"] == pytest.approx(fp32.memory.terms["grads"])
    ar = [sum(e.count * e.message_bytes for e in x.comm if e.axis == "dp_replicate") for x in (fp32, bf16)]
    assert ar[1] == pytest.approx(ar[0] / 2)
    sharded = evaluate(model, cluster, replace(job, reduce_dtype_bytes=2), parse_plan("dp_shard=8,mbs=1"))
    assert sharded.memory.terms["grads"] == pytest.approx(sharded.memory.terms["params"] / 2)
