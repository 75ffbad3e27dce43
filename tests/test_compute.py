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


def test_unfused_attention_backward_does_not_recompute_the_scores():
    """FlashAttention's backward is 2.5x its forward (it recomputes QKᵀ); unfused attention's backward
    runs twice the forward's batched GEMMs (memory-bound on the score matrix) and 11 B of elementwise
    traffic per score against 9 B."""
    fa, unfused = _lt(), _lt(flash_attention=False)
    # bwd_input - fwd = attention backward - attention forward + one elementwise pass (the same in both)
    ew = (fa.bwd_input_s - fa.fwd_s) - 1.5 * fa.attention_fwd_s
    attn_bwd = (unfused.bwd_input_s - unfused.fwd_s) - ew + unfused.attention_fwd_s
    assert 11 / 9 < attn_bwd / unfused.attention_fwd_s < 2.0


def test_moe_layer_overhead_is_paid_once_per_moe_layer_forward():
    """moe_layer_overhead_s adds to the forward of an MoE layer (so also to its recomputation), not to
    its backward, and not to dense layers."""
    m, c = load_model("mixtral-8x7b"), load_cluster("h100-sxm")
    args = {"tokens": 4096, "seq_len": 4096, "cp": 1, "tp": 1, "precision": "bf16", "moe": True,
            "expert_tokens": 1024, "local_experts": 8}
    base = layer_times(m, c.accelerator, ComputeParams(), **args)
    slow = layer_times(m, c.accelerator, ComputeParams(moe_layer_overhead_s=1e-3), **args)
    assert slow.fwd_s - base.fwd_s == pytest.approx(1e-3)
    assert (slow.bwd_input_s, slow.bwd_weight_s) == (base.bwd_input_s, base.bwd_weight_s)
    dense = {**args, "moe": False}
    assert layer_times(m, c.accelerator, ComputeParams(moe_layer_overhead_s=1e-3), **dense) == layer_times(
        m, c.accelerator, ComputeParams(), **dense)


def test_tensor_parallel_splits_gemm_time():
    one, eight = _lt(), _lt(tp=8)
    assert 7 < one.gemm_fwd_s / eight.gemm_fwd_s < 9


def test_kernel_scale_slows_kernels_of_a_stack_on_its_gpu_family_only():
    """kernel_scale (GEMMs) and attention_kernel_scale are fitted per (stack, GPU family) against
    Megatron-core, which keeps 1."""
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
    assert slow.attention_fwd_s == pytest.approx(base.attention_fwd_s)  # its GEMMs only
    fa2 = layer_times(m, a, replace(ref, attention_kernel_scale=0.6), tokens=8192, seq_len=8192, cp=1, tp=1,
                      precision="bf16")
    assert fa2.attention_fwd_s == pytest.approx(base.attention_fwd_s / 0.6)
    assert fa2.gemm_fwd_s == pytest.approx(base.gemm_fwd_s)


def test_fitted_attention_kernel_scales_separate_flashattention_2_from_fused_attention_on_hopper():
    """On Hopper, Megatron-core's fused attention runs well ahead of the FlashAttention-2 that llm-foundry
    and torchtitan ran: the fit must find that gap, not be told it. On A100, where every stack ran
    FlashAttention-2, there is no such parameter (1 by construction)."""
    from meshplan.calibration import compute_params_for
    from meshplan.validation.calibrate import ATTENTION_SPLIT_FAMILIES

    assert ATTENTION_SPLIT_FAMILIES == ("h100-sxm",)
    assert compute_params_for("h100-sxm", "megatron").attention_kernel_scale == 1.0
    assert compute_params_for("h100-sxm", "llm-foundry").attention_kernel_scale < 0.8
    assert compute_params_for("h100-sxm", "torchtitan").attention_kernel_scale < 0.8
    assert compute_params_for("a100-80gb", "llm-foundry").attention_kernel_scale == 1.0


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


def _fsdp2_minus_fsdp1_s(plan: str, *, m: int = 4, mfu: float | None = None, in_place: str = "llm-foundry"
                         ) -> tuple[float, float, float]:
    """(step time of FSDP2 minus a stack that shards in place (FSDP1 by default) with the same parameters,
    all parameters, non-root parameters) for Llama-3-8B on one H100 node with ``m`` micro-batches of one
    sequence per data-parallel rank."""
    import dataclasses

    from meshplan import JobSpec, evaluate, parse_plan
    from meshplan.cost.params import param_counts

    model, cluster = load_model("llama-3-8b"), load_cluster("h100-sxm", nodes=1)
    params = ComputeParams(comm_slowdown=0.0)
    p = parse_plan(plan)
    job = JobSpec(global_batch_tokens=p.dp * m * 4096, seq_len=4096, loss="eager")  # one loss for both stacks

    def step(job: JobSpec) -> float:
        return evaluate(model, cluster, job, p, compute=params, mfu=mfu).step_time_s

    counts = param_counts(model)
    root = counts.embedding + counts.lm_head + counts.final_norm
    bw = cluster.accelerator.hbm_bytes_per_s * params.memory_efficiency
    return (step(job) - step(dataclasses.replace(job, software=in_place))) * bw, counts.total, counts.total - root


def test_fsdp2_copies_per_micro_batch():
    """FSDP2 over 8 ranks, 4 micro-batches: each copies the forward gather out (4 bytes per parameter),
    the backward re-gather of every unit but the root, which stays gathered (4), and the gradients into
    the FP32 reduce buffer (2 + 4). FSDP1 (llm-foundry) and Megatron-FSDP (megatron), with the same
    parameters, copy nothing; neither do DDP and ZeRO-1. The copies survive an assumed MFU (which scales
    the kernels only)."""
    diff, n, n_blocks = _fsdp2_minus_fsdp1_s("dp_shard=8,mbs=1,recompute=full")
    assert diff == pytest.approx(4 * (4 * n + 4 * n_blocks + 6 * n), rel=1e-6)
    assert _fsdp2_minus_fsdp1_s("dp_shard=8,mbs=1,recompute=full", in_place="megatron")[0] == pytest.approx(diff)
    diff_mfu, _, _ = _fsdp2_minus_fsdp1_s("dp_shard=8,mbs=1,recompute=full", mfu=0.4)
    assert diff_mfu == pytest.approx(diff, rel=1e-6)
    for other in ("dp_replicate=8,mbs=1,recompute=full", "dp_shard=8,mbs=1,recompute=full,sharding=zero1"):
        assert _fsdp2_minus_fsdp1_s(other)[0] == pytest.approx(0.0, abs=1e-3)


def test_fsdp2_copies_without_per_micro_batch_reduction():
    """grad_sync=last: FSDP2 accumulates unsharded gradients in FP32 (cast 6 bytes per parameter, then 10
    per later micro-batch, then 8 into the reduce buffer), and reshard_after_forward=False gathers once
    per micro-batch: 4 m n + (6 + 10 (m - 1) + 8) n."""
    m = 4
    diff, n, _ = _fsdp2_minus_fsdp1_s("dp_shard=8,mbs=1,recompute=full,grad_sync=last,reshard_after_forward=false",
                                      m=m)
    assert diff == pytest.approx(4 * m * n + (6 + 10 * (m - 1) + 8) * n, rel=1e-6)


def test_sliding_window_attention_runs_only_its_band_of_key_tiles():
    """GPT-OSS alternates 128-token windows and global layers: at 4k tokens its mean attention costs a bit
    over half the all-global one (the windowed half runs 2 key tiles per query tile of 128, against ~16 of
    the causal 32, at a worse amortisation of each thread block's fixed cost); at the window's length the
    window saves nothing."""
    from dataclasses import replace
    m, c = load_model("gpt-oss-120b"), load_cluster("h100-sxm")
    full = replace(m, attention_window=0, global_attention_every=0)

    def attn(model, seq):
        return layer_times(model, c.accelerator, ComputeParams(), tokens=seq, seq_len=seq, cp=1, tp=1,
                           precision="bf16").attention_fwd_s

    ratio = attn(m, 4096) / attn(full, 4096)
    assert 0.5 < ratio < 0.65
    assert attn(m, 128) == pytest.approx(attn(full, 128))
    assert attn(m, 65536) / attn(full, 65536) == pytest.approx(0.5, abs=0.01)


@pytest.mark.parametrize(("window", "seq"), [(128, 4096), (129, 4096), (256, 4096), (1000, 4096), (2048, 4096),
                                             (4096, 8192), (128, 100), (5000, 4096), (1, 1024)])
def test_window_key_span_counts_the_key_tiles_each_query_tile_runs(window, seq):
    """Brute force: query tile i covers queries i·128 .. i·128+127, which attend keys q-w+1 .. q; a key tile
    runs whole when any of its keys is attended by any query of the tile."""
    from meshplan.cost.compute import FLASH_TILE, window_key_span
    n = -(-seq // FLASH_TILE)
    tiles = 0
    for i in range(n):
        first_key = max(0, i * FLASH_TILE - window + 1)
        tiles += i - first_key // FLASH_TILE + 1
    assert window_key_span(window, seq) == pytest.approx(tiles / n * FLASH_TILE)


def test_windowed_attention_never_costs_more_than_global_and_the_default_key_length_is_the_block():
    from dataclasses import replace

    from meshplan.cost.compute import attention_length_efficiency
    m, c = load_model("gpt-oss-120b"), load_cluster("h100-sxm")
    for seq in (256, 1024, 4096, 16384):
        for w in (64, 128, 1000, 4096, 20000):
            for cp in (1, 2, 4):
                kw = {"tokens": seq / cp, "seq_len": seq, "cp": cp, "tp": 1, "precision": "bf16"}
                windowed = layer_times(replace(m, attention_window=w), c.accelerator, ComputeParams(), **kw)
                full = layer_times(replace(m, attention_window=0, global_attention_every=0), c.accelerator,
                                   ComputeParams(), **kw)
                assert windowed.attention_fwd_s <= full.attention_fwd_s * (1 + 1e-12)
    for block in (100.0, 2048.0, 65536.0):
        assert attention_length_efficiency(block, 256.0) == (block / (block + 256.0)) ** 2
        assert attention_length_efficiency(block, 256.0, key_len=block) == attention_length_efficiency(block, 256.0)


def test_compiled_blocks_move_the_fused_minimum_of_elementwise_traffic():
    """torch.compile (JobSpec.compiled) takes a stack's elementwise passes to 1: a step with eager blocks at
    2.7 passes (measured on an H200) is slower, by exactly the extra elementwise traffic; at 1 pass the two
    agree, and the search's lower bound holds for compiled jobs too."""
    from dataclasses import replace

    from meshplan import JobSpec, parse_plan
    from meshplan.cost.bounds import step_time_lower_bound_s
    from meshplan.cost.step import evaluate
    m, c = load_model("llama-3-8b"), load_cluster("h100-sxm")
    job = JobSpec(global_batch_tokens=8 * 2 * 8192, seq_len=8192, software="torchtitan")
    plan = parse_plan("dp_shard=8,mbs=1,recompute=full")
    eager_params = replace(ComputeParams(), elementwise_passes=2.7)
    eager = evaluate(m, c, job, plan, compute=eager_params)
    assert eager.feasible
    compiled = evaluate(m, c, replace(job, compiled=True), plan, compute=eager_params)
    fused = evaluate(m, c, job, plan, compute=replace(eager_params, elementwise_passes=1.0))
    assert compiled.step_time_s < eager.step_time_s
    assert compiled.time_breakdown["compute"] == pytest.approx(fused.time_breakdown["compute"], rel=1e-12)
    assert step_time_lower_bound_s(m, c, replace(job, compiled=True), plan, eager_params) <= compiled.step_time_s


def test_fp8_attention_runs_the_attention_core_faster_by_its_cited_ratio():
    """JobSpec.fp8_attention divides the fused attention kernel's time by FP8_ATTENTION_SPEEDUP, forward
    and backward, and nothing else: the step saves exactly what a BF16 attention kernel that much faster
    saves, the search's lower bound still holds, and the job refuses it without FP8 or a fused kernel."""
    from dataclasses import replace

    from meshplan import JobSpec, parse_plan
    from meshplan.cost.bounds import step_time_lower_bound_s
    from meshplan.cost.compute import FP8_ATTENTION_SPEEDUP
    from meshplan.cost.step import evaluate
    from meshplan.errors import SpecError
    m, c = load_model("llama-3-8b"), load_cluster("h100-sxm")
    job = JobSpec(global_batch_tokens=8 * 2 * 8192, seq_len=8192, precision="fp8", software="megatron")
    plan = parse_plan("dp_shard=8,mbs=1,recompute=none")
    params = ComputeParams()
    bf16_attn = evaluate(m, c, job, plan, compute=params)
    fp8_attn = evaluate(m, c, replace(job, fp8_attention=True), plan, compute=params)
    faster_kernel = evaluate(m, c, job, plan, compute=replace(
        params, attention_kernel_scale=params.attention_kernel_scale * FP8_ATTENTION_SPEEDUP))
    assert fp8_attn.step_time_s < bf16_attn.step_time_s
    assert fp8_attn.step_time_s == pytest.approx(faster_kernel.step_time_s, rel=1e-12)
    assert step_time_lower_bound_s(m, c, replace(job, fp8_attention=True), plan, params) <= fp8_attn.step_time_s
    for bad in ({"precision": "bf16"}, {"flash_attention": False}):
        with pytest.raises(SpecError, match=r"job\.fp8_attention"):
            replace(job, fp8_attention=True, **bad)


def test_a_fused_grouped_mlp_drops_only_the_routed_activation_traffic():
    """JobSpec.fused_grouped_mlp: the routed experts' activation runs in the first GEMM's epilogue, so an MoE
    layer's elementwise time falls by exactly that activation's traffic (act elements per routed copy), its
    GEMMs and attention unchanged; a dense layer does not change."""
    from meshplan.cost.compute import BF16_BYTES
    m, c = load_model("mixtral-8x7b"), load_cluster("b200")
    p = ComputeParams()
    args = {"tokens": 8192, "seq_len": 4096, "cp": 1, "tp": 1, "precision": "fp8", "moe": True,
            "expert_tokens": 8192 * m.top_k / m.n_experts * 8, "local_experts": m.n_experts / 8}
    plain = layer_times(m, c.accelerator, p, **args)
    fused = layer_times(m, c.accelerator, p, **args, fused_grouped_mlp=True)
    hbm = c.accelerator.hbm_bytes_per_s * p.memory_efficiency
    act_s = BF16_BYTES * 8192 * 3 * m.expert_ffn_hidden * m.top_k * p.elementwise_passes / hbm
    assert plain.fwd_s - fused.fwd_s == pytest.approx(act_s, rel=1e-9)
    assert plain.bwd_input_s - fused.bwd_input_s == pytest.approx(2 * act_s, rel=1e-9)
    assert fused.gemm_fwd_s == plain.gemm_fwd_s and fused.attention_fwd_s == plain.attention_fwd_s
    assert fused.routed_act_fwd_s == 0.0 < plain.routed_act_fwd_s
    dense = {k: v for k, v in args.items() if k not in ("moe", "expert_tokens", "local_experts")}
    assert (layer_times(m, c.accelerator, p, **dense, fused_grouped_mlp=True)
            == layer_times(m, c.accelerator, p, **dense))
