"""The per-operation compute model."""

import pytest

from meshplan import load_cluster, load_model
from meshplan.cost.compute import ComputeParams, gemm_efficiency, layer_times


def _lt(**kw):
    m, c = load_model("llama-2-7b"), load_cluster("a100-80gb")
    args = {"tokens": 2048, "seq_len": 2048, "cp": 1, "tp": 1, "precision": "bf16"} | kw
    return layer_times(m, c.accelerator, ComputeParams(), **args)


def test_gemm_efficiency_grows_with_size_and_stays_below_best_case():
    small = gemm_efficiency(256, 256, 256, e_max=0.8, half_dim=128)
    big = gemm_efficiency(8192, 8192, 8192, e_max=0.8, half_dim=128)
    assert small < big < 0.8


def test_unfused_attention_is_slower_and_pays_for_the_score_matrix():
    fa, unfused = _lt(), _lt(flash_attention=False)
    assert unfused.attention_fwd_s > fa.attention_fwd_s
    longer = _lt(tokens=8192, seq_len=8192, flash_attention=False)
    # scores grow with S per token: the unfused attention of 4x longer sequences costs ~16x
    assert longer.attention_fwd_s / unfused.attention_fwd_s == pytest.approx(16, rel=0.2)


def test_tensor_parallel_splits_gemm_time():
    one, eight = _lt(), _lt(tp=8)
    assert 7 < one.gemm_fwd_s / eight.gemm_fwd_s < 9


def test_kernel_scale_slows_kernels_of_a_stack_on_its_gpu_family_only():
    """kernel_scale is fitted per (stack, GPU family) against Megatron-core, which keeps 1."""
    from dataclasses import replace

    from meshplan.calibration import compute_params_for

    ref = compute_params_for("h100-sxm", "megatron")
    assert ref.kernel_scale == 1.0
    assert compute_params_for("h200", "torchtitan").kernel_scale == compute_params_for("h100-sxm",
                                                                                       "torchtitan").kernel_scale
    m, a = load_model("llama-3-8b"), load_cluster("h100-sxm").accelerator
    base = layer_times(m, a, ref, tokens=8192, seq_len=8192, cp=1, tp=1, precision="bf16")
    slow = layer_times(m, a, replace(ref, kernel_scale=0.8), tokens=8192, seq_len=8192, cp=1, tp=1,
                       precision="bf16")
    assert slow.gemm_fwd_s == pytest.approx(base.gemm_fwd_s / 0.8)
    assert slow.attention_fwd_s == pytest.approx(base.attention_fwd_s / 0.8)


def test_fp8_gemms_need_larger_shapes_for_their_peak():
    """fp8_half_dim_ratio scales the shape constant of FP8 GEMMs only: with a ratio above 1 a small FP8
    layer loses more of its FP8 speed-up than a large one, and BF16 layers do not change."""
    from dataclasses import replace

    m, a = load_model("llama-3-8b"), load_cluster("h100-sxm").accelerator
    base, wide = ComputeParams(), replace(ComputeParams(), fp8_half_dim_ratio=3.0)

    def gemm(params, tokens, precision):
        return layer_times(m, a, params, tokens=tokens, seq_len=4096, cp=1, tp=1, precision=precision).gemm_fwd_s

    assert gemm(wide, 4096, "bf16") == gemm(base, 4096, "bf16")
    small, large = gemm(wide, 512, "fp8") / gemm(base, 512, "fp8"), gemm(wide, 16384, "fp8") / gemm(base, 16384, "fp8")
    assert small > large > 1.0


def test_fsdp2_copies_per_micro_batch():
    """FSDP2 over 8 ranks, Llama-3-8B on one H100 node, 4 micro-batches: each micro-batch gathers twice
    (forward, and backward after resharding), copying 4 bytes per local parameter out, and reduce-scatters
    once, copying 2 + 4 in, all at the calibrated HBM rate. The step grows by exactly that over FSDP1 (llm-foundry,
    whose flat parameters need no copies) with the same parameters; DDP and Megatron sharding copy nothing."""
    import dataclasses

    from meshplan import JobSpec, evaluate, parse_plan
    from meshplan.cost.params import param_counts

    model, cluster = load_model("llama-3-8b"), load_cluster("h100-sxm", nodes=1)
    params = ComputeParams(comm_slowdown=0.0)
    job = JobSpec(global_batch_tokens=8 * 4 * 4096, seq_len=4096)
    plan = parse_plan("dp_shard=8,mbs=1,recompute=full")

    def step(job: JobSpec, plan) -> float:
        return evaluate(model, cluster, job, plan, compute=params).step_time_s

    fsdp2 = step(job, plan)
    fsdp1 = step(dataclasses.replace(job, software="llm-foundry"), plan)
    n = param_counts(model).total
    expected = 4 * n * (2 * 4 + (2 + 4)) / (cluster.accelerator.hbm_bytes_per_s * params.memory_efficiency)
    assert fsdp2 - fsdp1 == pytest.approx(expected, rel=1e-6)
    for other in ("dp_replicate=8,mbs=1,recompute=full", "dp_shard=8,mbs=1,recompute=full,sharding=zero1"):
        p = parse_plan(other)
        assert step(job, p) == pytest.approx(step(dataclasses.replace(job, software="llm-foundry"), p), rel=1e-12)
