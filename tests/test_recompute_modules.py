"""Megatron-core's selective recomputation modules (Plan.recompute_modules) and Transformer Engine's
in-place cross-entropy (JobSpec.loss='te')."""

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplan import JobSpec, Plan, evaluate, load_cluster, load_model, parse_plan
from meshplan.cost import memory as mem
from meshplan.errors import SpecError
from meshplan.specs.plan import RECOMPUTE_MODULES, recompute_modules_of

DSV3 = "dp_shard=16,pp=16,ep=8,mbs=1,sharding=megatron"


def _dsv3(recompute: str, **job):
    cluster = load_cluster("b200", nodes=32)
    return evaluate(load_model("deepseek-v3"), cluster,
                    JobSpec(global_batch_tokens=2048 * 4096, seq_len=4096, software="megatron", **job),
                    parse_plan(f"{DSV3},{recompute}"))


def test_plan_string_round_trips_and_orders_modules():
    plan = parse_plan("dp_shard=8,recompute=selective,recompute_modules=moe_act+layernorm")
    assert parse_plan(plan.to_string()) == plan
    assert plan.recompute_key == "selective:layernorm+moe_act"  # RECOMPUTE_MODULES order
    assert recompute_modules_of(plan.recompute_key) == {"layernorm", "moe_act"}
    # Megatron's default, core_attn, is plain 'selective'
    assert parse_plan("recompute=selective,recompute_modules=core_attn").recompute_key == "selective"
    assert Plan(recompute="sac").recompute_key == "sac" and Plan().recompute_key == "none"


@pytest.mark.parametrize(("text", "needle"), [
    ("recompute=full,recompute_modules=mlp", "needs recompute=selective"),
    ("recompute_modules=mlp", "needs recompute=selective"),
    ("recompute=selective,recompute_modules=moe", "must be one of core_attn, layernorm"),
    ("recompute=selective,recompute_modules=mlp+mlp", "names a module twice"),
])
def test_bad_modules_name_the_field_and_the_allowed_values(text, needle):
    with pytest.raises(SpecError, match=r"plan\.recompute_modules") as info:
        parse_plan(text)
    assert needle in str(info.value)


def test_mla_up_projection_frees_q_k_v_and_re_runs_its_gemms():
    """DeepSeek-V3 (MLA, 128 heads of 192/128): discarding the up-projections' outputs frees Q, K and V,
    2·128·(192 + 192 + 128) bytes per token per layer, and re-runs the q and kv up-projections."""
    plain, mla = _dsv3("recompute=none"), _dsv3("recompute=selective,recompute_modules=mla_up_proj")
    model = load_model("deepseek-v3")
    parts = mem.activation_parts_per_token(model, ffn_hidden=model.ffn_hidden, tp=1, sp=True, flash_attention=True,
                                           seq_len=4096)
    assert parts["qkv"] == 2.0 * 128 * (192 + 192 + 128)
    assert mla.memory.peak_bytes < plain.memory.peak_bytes
    assert mla.time_breakdown["recompute"] > 0 and plain.time_breakdown["recompute"] == 0
    # the extra executed FLOPs are the up-projections' forward: 2·L·N·(r_q·H_qk + r_kv·(H + H_v)) per token
    extra = 2.0 * 61 * 128 * (1536 * 192 + 512 * (128 + 128))
    per_token = (mla.flops.hardware_flop_per_step - plain.flops.hardware_flop_per_step) / (2048 * 4096)
    assert per_token == pytest.approx(extra, rel=1e-9)
    assert mla.flops.model_flop_per_step == plain.flops.model_flop_per_step


def test_modules_cost_less_than_full_recomputation_and_save_less():
    none, every, full = (_dsv3(rc) for rc in (
        "recompute=none", "recompute=selective,recompute_modules=" + "+".join(RECOMPUTE_MODULES), "recompute=full"))
    assert none.step_time_s < every.step_time_s < full.step_time_s
    assert none.memory.peak_bytes > every.memory.peak_bytes > full.memory.peak_bytes


def test_moe_act_frees_the_activation_output_of_each_routed_copy():
    model = load_model("mixtral-8x7b")
    parts = mem.activation_parts_per_token(model, ffn_hidden=model.ffn_hidden, tp=1, sp=False, flash_attention=True,
                                           seq_len=4096, moe_tokens_factor=2.0, moe_ffn_hidden=14336)
    assert parts["routed_act2"] == 2.0 * 2 * 14336  # top-2 copies, bf16
    freed = mem.selective_freed_bytes_per_token(parts, frozenset({"moe_act"}), moe_layer=True, mla=False)
    assert freed == parts["routed_act2"]
    # layernorm: only the MoE layer's pre-MLP norm output (the router's bf16 input) runs on its own
    layernorm = mem.selective_freed_bytes_per_token(parts, frozenset({"layernorm"}), moe_layer=True, mla=False)
    assert layernorm == 2.0 * model.hidden
    dense = mem.activation_parts_per_token(model, ffn_hidden=model.ffn_hidden, tp=1, sp=False, flash_attention=True,
                                           seq_len=4096)
    assert mem.selective_freed_bytes_per_token(dense, frozenset({"layernorm", "moe_act"}), moe_layer=False,
                                               mla=False) == 0.0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["deepseek-v3", "mixtral-8x7b", "llama-3-8b"]), st.sampled_from([1, 2, 4]), st.booleans(),
       st.booleans(), st.sets(st.sampled_from(RECOMPUTE_MODULES)), st.sets(st.sampled_from(RECOMPUTE_MODULES)))
def test_more_modules_never_hold_more_and_never_hold_below_zero(name, tp, sp, fp8, a, b):
    model = load_model(name)
    for moe_layer in (False, True) if model.n_experts else (False,):
        parts = mem.activation_parts_per_token(
            model, ffn_hidden=model.ffn_hidden, tp=tp, sp=sp, flash_attention=True, seq_len=4096,
            moe_tokens_factor=float(model.top_k) if moe_layer else 0.0, moe_ffn_hidden=model.expert_ffn_hidden,
            n_shared=model.n_shared_experts if moe_layer else 0, fp8_inputs=fp8)
        total = sum(parts.values())

        def freed(mods, parts=parts, moe_layer=moe_layer):
            return mem.selective_freed_bytes_per_token(parts, frozenset(mods), moe_layer=moe_layer,
                                                       mla=model.is_mla)
        assert 0.0 <= freed(a) <= freed(a | b) <= total


def test_selective_step_time_grows_with_the_modules_re_run():
    plans = ["recompute=selective,recompute_modules=" + "+".join(mods)
             for mods in itertools.accumulate([("layernorm",), ("moe_act",), ("mla_up_proj",), ("mlp",)])]
    times = [_dsv3(p).time_breakdown["recompute"] for p in plans]
    assert times == sorted(times) and times[0] > 0


def test_transformer_engine_loss_holds_the_logits_once():
    """TE's parallel_cross_entropy writes the gradient over the bf16 logits in its forward: 2 B per logit
    against Megatron's vocab-parallel 6 B, so the last stage of a big-vocabulary model holds less."""
    assert mem.logits_bytes_per_token(vocab=128000, tp=1, loss="te") == 2.0 * 128000
    model, cluster = load_model("llama-3-8b"), load_cluster("h100-sxm", nodes=1)
    plan = parse_plan("dp_shard=8,mbs=2,recompute=full,sharding=megatron")
    est = {loss: evaluate(model, cluster, JobSpec(global_batch_tokens=64 * 8192, seq_len=8192, software="megatron",
                                                  loss=loss), plan) for loss in ("vocab_parallel", "te")}
    logits = {k: e.memory.terms["logits_and_loss"] for k, e in est.items()}
    assert logits["te"] == pytest.approx(logits["vocab_parallel"] / 3)
    with pytest.raises(SpecError, match=r"job\.loss"):
        JobSpec(global_batch_tokens=8192, seq_len=8192, loss="liger")


def test_modules_the_model_lacks_or_the_stack_lacks_are_refused():
    cluster = load_cluster("h100-sxm", nodes=1)
    job = JobSpec(global_batch_tokens=64 * 4096, seq_len=4096, software="megatron")
    with pytest.raises(SpecError, match=r"plan\.recompute_modules") as info:
        evaluate(load_model("llama-3-8b"), cluster, job, parse_plan("dp_shard=8,recompute=selective,"
                                                                    "recompute_modules=mla_up_proj"))
    assert "multi-latent attention" in str(info.value) and "mlp" in str(info.value)
    titan = JobSpec(global_batch_tokens=64 * 4096, seq_len=4096, software="torchtitan")
    with pytest.raises(SpecError, match=r"plan\.recompute_modules"):
        evaluate(load_model("llama-3-8b"), cluster, titan, parse_plan("dp_shard=8,recompute=selective,"
                                                                      "recompute_modules=mlp"))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["deepseek-v3", "mixtral-8x7b", "llama-3-8b", "gpt-oss-120b"]), st.booleans(),
       st.sampled_from([1, 2]), st.sampled_from([1, 2]))
def test_a_megatron_plans_recompute_modes_hold_ever_less_memory(name, flash, tp, mbs):
    """evaluate bisects over the recompute modes in order, so each must hold no more than the one before:
    Megatron's take its selective modules (with core_attn where attention is unfused) in place of SAC."""
    from meshplan.cost.choice import recompute_options
    model = load_model(name)
    cluster = load_cluster("h100-sxm", nodes=8)
    job = JobSpec(global_batch_tokens=256 * 4096, seq_len=4096, software="megatron", flash_attention=flash)
    ep = 8 if model.n_experts else 1
    plan = parse_plan(f"tp={tp},dp_shard={64 // tp},ep={ep},mbs={mbs},sharding=megatron")
    modes, _ = recompute_options(model, job, plan)
    assert "sac" not in modes and len(modes) == len(set(modes))
    peaks = [evaluate(model, cluster, job, plan.with_recompute(m), time_infeasible=False).memory.peak_bytes
             for m in modes]
    assert all(b <= a * (1 + 1e-12) for a, b in itertools.pairwise(peaks))


def test_a_fused_grouped_mlp_has_no_separate_activation_to_recompute():
    """With JobSpec.fused_grouped_mlp the routed activation runs inside the experts' fused GEMMs: a plan
    that names moe_act is refused with the modules allowed, and evaluate's own choices leave it out."""
    from meshplan.cost.choice import megatron_selective_keys

    with pytest.raises(SpecError, match="moe_act needs MoE layers whose activation runs on its own"):
        _dsv3("recompute=selective,recompute_modules=moe_act", precision="fp8", fused_grouped_mlp=True)
    model = load_model("deepseek-v3")
    assert all("moe_act" in k for k in megatron_selective_keys(model))
    assert not any("moe_act" in k for k in megatron_selective_keys(model, fused_grouped_mlp=True))
    fused = _dsv3("recompute=selective,recompute_modules=mla_up_proj", precision="fp8", fused_grouped_mlp=True)
    plain = _dsv3("recompute=selective,recompute_modules=mla_up_proj", precision="fp8")
    assert fused.step_time_s < plain.step_time_s  # the routed activation's traffic is gone


def test_megatron_selective_core_attention_re_runs_the_fused_kernel():
    """Megatron-core checkpoints the core attention whenever 'core_attn' is among its modules
    (checkpoint_core_attention), FlashAttention's fused kernel too: plain recompute=selective runs the
    attention forward again in the backward, with CP its exchanges, and it counts in the hardware FLOPs (a
    review found it priced at nothing). PyTorch plans keep the convention that FlashAttention recomputes
    the scores in its own backward."""
    from meshplan import JobSpec, evaluate, load_cluster, load_model, parse_plan
    from meshplan.cost.flops import attention_recomputed

    assert attention_recomputed("selective", True, megatron=True)
    assert not attention_recomputed("selective", True, megatron=False)
    assert attention_recomputed("selective", False, megatron=False)
    assert not attention_recomputed("selective:layernorm", True, megatron=True)
    m, c = load_model("seed-70b"), load_cluster("h100-sxm", nodes=8)
    j = JobSpec(global_batch_tokens=4_194_304, seq_len=32768)
    est = {rc: evaluate(m, c, j, parse_plan(f"cp=4,tp=8,pp=2,sharding=megatron,mbs=1,recompute={rc}", 64))
           for rc in ("none", "selective")}
    none, sel = est["none"], est["selective"]
    assert sel.time_breakdown["recompute"] > 0 == none.time_breakdown.get("recompute", 0.0)
    attn = sum(d.attention_fwd_s for d in sel.stages[-1:]) * sel.n_microbatches
    assert sel.time_breakdown["recompute"] == pytest.approx(attn, rel=1e-6)
    assert sel.flops.hardware_flop_per_step > sel.flops.model_flop_per_step == none.flops.hardware_flop_per_step

    def cp_calls(e):
        return sum(x.count for x in e.comm if x.axis == "cp")
    assert cp_calls(sel) == cp_calls(none) * 3 // 2  # the forward's passes once more, in the backward


def test_the_bound_keys_megatron_selective_attention_exchanges_by_the_plan_s_recomputation():
    """The memoised per-layer traffic of the bound depends on whether selective recomputation re-runs the
    CP exchanges: a plan without recomputation evaluated after one with it keeps a bound below its step
    time (a review found the cache shared, and the bound above the step)."""
    from meshplan import JobSpec, evaluate, load_cluster, load_model, parse_plan
    from meshplan.calibration import compute_params_for
    from meshplan.cost.bounds import step_time_lower_bound_s

    m, c = load_model("seed-70b"), load_cluster("h100-sxm", nodes=8)
    j = JobSpec(global_batch_tokens=4_194_304, seq_len=32768)
    cp = compute_params_for(c.accelerator.name, j.software)
    for rc in ("selective", "none"):
        plan = parse_plan(f"cp=8,pp=8,sharding=megatron,cp_impl=a2a,mbs=1,recompute={rc}", 64)
        assert step_time_lower_bound_s(m, c, j, plan, cp) <= evaluate(m, c, j, plan).step_time_s
