"""The torch-free parts of `meshplan measure`: the alpha-beta fit, nccl-tests bandwidths, GEMM and
attention shapes, exposed communication and kernel time from a trace, the profile file (merge, schema),
and the comparison of measured kernels and steps with the model (on the profiles measured on an H200)."""

import json
from pathlib import Path

import pytest

from meshplan import load_model, parse_plan
from meshplan.calibration import compute_params_for
from meshplan.catalog import load_accelerator
from meshplan.cost.compute import gemm_curve, gemm_time_s, layer_times
from meshplan.harness.measure.compare import accelerator_for_device, kernel_rows
from meshplan.harness.measure.fit import busbw_bytes_per_s, fit_alpha_beta
from meshplan.harness.measure.profile_io import check_profile, merge_profiles, new_profile
from meshplan.harness.measure.shapes import plan_attention_shape, plan_gemm_shapes
from meshplan.harness.measure.trace import exposed_comm_s, kernel_time_s, union


def test_fit_alpha_beta_recovers_exact_model():
    """t = 50 us + S·2(n-1)/n / 10 GB/s for an all-reduce on 4 ranks is fitted back exactly."""
    sizes = [2**k for k in range(10, 27, 2)]
    times = [50e-6 + s * 2 * 3 / 4 / 10e9 for s in sizes]
    fit = fit_alpha_beta("all_reduce", 4, sizes, times)
    assert fit.alpha_s == pytest.approx(50e-6, rel=1e-9)
    assert fit.busbw_bytes_per_s == pytest.approx(10e9, rel=1e-9)
    assert fit.n_points == len(sizes) and fit.max_rel_error < 1e-9


def test_fit_alpha_beta_clamps_negative_alpha():
    sizes = [1e3, 1e6, 1e9]
    times = [1e-7, 1.2e-4, 0.1]  # a line through these has a negative intercept
    fit = fit_alpha_beta("all_gather", 2, sizes, times)
    assert fit.alpha_s == 0.0 and fit.busbw_bytes_per_s > 0


@pytest.mark.parametrize(("op", "n", "factor"), [("all_reduce", 8, 2 * 7 / 8), ("all_gather", 8, 7 / 8),
                                                 ("reduce_scatter", 4, 3 / 4), ("all_to_all", 2, 1 / 2),
                                                 ("send_recv", 2, 1.0)])
def test_busbw_nccl_tests_factors(op, n, factor):
    """nccl-tests doc/PERFORMANCE.md: busbw = algbw · factor (formulas.md §1.1)."""
    assert busbw_bytes_per_s(op, n, 1e9, 0.5) == pytest.approx(2e9 * factor, rel=1e-12)


def test_plan_gemm_shapes_llama3_8b_tp2():
    """Llama-3-8B (D 4096, 32/8 heads of 128, F 14336, V 128256) under tp=2, cp=2, mbs=2 at S=4096:
    T = 2·4096/2 = 4096 tokens; qkv (4096+2·1024)/2 = 3072, out 4096/2, MLP 2·14336/2 and 14336/2."""
    shapes = plan_gemm_shapes(load_model("llama-3-8b"), parse_plan("tp=2,cp=2,mbs=2"), seq_len=4096)
    got = {s.name: (s.m, s.k, s.n) for s in shapes}
    assert got == {"attention.qkv": (4096, 4096, 3072), "attention.out": (4096, 2048, 4096),
                   "mlp.in": (4096, 4096, 14336), "mlp.out": (4096, 7168, 4096), "lm_head": (4096, 4096, 64128)}
    assert shapes[0].flop == 2 * 4096 * 4096 * 3072


def test_plan_gemm_shapes_rejects_indivisible_tp():
    with pytest.raises(ValueError, match="tp=3"):
        plan_gemm_shapes(load_model("llama-3-8b"), parse_plan("tp=3"), seq_len=128)


def _x(name, ts, dur, tid=1, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "cat": cat}


def test_exposed_comm_gpu_kernels():
    """NCCL kernel [0, 10] us against compute [5, 20] us: 5 us exposed out of 10."""
    trace = {"traceEvents": [_x("ncclDevKernel_AllGather_RING_LL", 0, 10, tid=7, cat="kernel"),
                             _x("sm90_gemm_bf16", 5, 15, tid=8, cat="kernel")]}
    exposed, total = exposed_comm_s(trace)
    assert exposed == {"all_gather": pytest.approx(5e-6)} and total == {"all_gather": pytest.approx(10e-6)}


def test_exposed_comm_gloo_threads_typed_by_launch():
    """gloo runs reduce-scatter as 'gloo:all_reduce' on its own thread; the launching c10d op names it.
    Compute is the leaf ops of the step thread: aten::mm [10, 40] and [45, 50] hide 35 of [2, 52] us."""
    trace = {"traceEvents": [
        _x("meshplan.step", 0, 100, cat="user_annotation"),
        _x("c10d::_reduce_scatter_base_", 0, 1),
        _x("gloo:all_reduce", 2, 50, tid=2, cat="user_annotation"),
        _x("aten::linear", 10, 30), _x("aten::mm", 10, 30),
        _x("aten::mm", 45, 5)]}
    exposed, total = exposed_comm_s(trace)
    assert total == {"reduce_scatter": pytest.approx(50e-6)}
    assert exposed == {"reduce_scatter": pytest.approx(15e-6)}


def test_union_merges_overlaps():
    assert union([(5, 7), (0, 2), (1, 3), (7, 8)]) == [(0, 3), (5, 8)]


def _profile(**kw):
    p = new_profile(device="cpu", backend="gloo", world_size=2, nproc_per_node=2)
    p.update(kw)
    return p


def test_merge_profiles_replaces_remeasured_entries_and_keeps_the_rest():
    g1 = {"m": 1, "n": 2, "k": 3, "dtype": "bf16", "median_s": 1.0, "p10_s": 1.0, "p90_s": 1.0, "flop_per_s": 12.0}
    g2 = {**g1, "m": 4, "flop_per_s": 5.0}
    c = {"op": "all_reduce", "link": "intra_node", "group_size": 2, "message_bytes": 1024, "median_s": 1e-4,
         "algbw_bytes_per_s": 1.0, "busbw_bytes_per_s": 1.0}
    fit = {"alpha_s": 1e-4, "busbw_bytes_per_s": 1e9, "group_size": 2, "n_points": 9}
    old = _profile(gemm=[g1, g2], collectives=[c], collective_fits={"all_reduce@intra_node": fit})
    new = _profile(gemm=[{**g1, "flop_per_s": 20.0}])
    merged = merge_profiles(old, new)
    assert sorted(g["flop_per_s"] for g in merged["gemm"]) == [5.0, 20.0]
    assert merged["gemm_best_flop_per_s"] == 20.0
    assert merged["collectives"] == [c] and merged["collective_fits"] == {"all_reduce@intra_node": fit}
    assert check_profile(merged) == []


def test_check_profile_names_every_problem():
    bad = _profile(collective_fits={"all_reduce@nvlink": {"alpha_s": -1.0}})
    bad["backend"] = "mpi"
    errors = check_profile(bad)
    assert any("backend" in e for e in errors)
    assert any("all_reduce@nvlink" in e for e in errors)


def test_kernel_time_by_kind_and_busy_union():
    """GEMM [0, 10] and attention [5, 15] overlap (streams); optimizer [20, 24], NCCL [30, 31], copies
    [40, 43], cuDNN's backward helper [43, 44], a split-K reduction [44, 45]: sums per kind, busy = the
    union 15 + 4 + 1 + 5 = 25 us; a CPU trace has no kernels."""
    trace = {"traceEvents": [
        _x("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 0, 10, cat="kernel"),
        _x("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16", 5, 10, tid=2, cat="kernel"),
        _x("void at::native::multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata<4>, "
           "FusedAdamMathFunctor<float, 4>>", 20, 4, cat="kernel"),
        _x("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 30, 1, cat="kernel"),
        _x("void at::native::vectorized_elementwise_kernel<8, bfloat16_copy_kernel_cuda>", 40, 2, cat="kernel"),
        _x("void at::native::multi_tensor_apply_kernel<TensorListMetadata<2>, CopyFunctor<float, 2>>", 42, 1,
           cat="kernel"),  # FSDP2's foreach copy-in: a copy, not the optimizer
        _x("cudnn::fusion::compute_dot_do_o_specialized", 43, 1, cat="kernel"),
        _x("void cublasLt::splitKreduce_kernel<32, 16, int, float>", 44, 1, cat="kernel"),
        _x("aten::mm", 0, 50)]}
    got = kernel_time_s(trace)
    assert got == pytest.approx({"gemm": 11e-6, "attention": 11e-6, "optimizer": 4e-6, "communication": 1e-6,
                                 "other": 3e-6, "busy": 25e-6})
    assert kernel_time_s({"traceEvents": [_x("aten::mm", 0, 50)]}) is None


def test_plan_attention_shape():
    """Llama-3-8B under tp=2, mbs=2: 32/2 query heads of 128, whole sequences; cp and MLA refused."""
    shape = plan_attention_shape(load_model("llama-3-8b"), parse_plan("tp=2,mbs=2"), seq_len=4096)
    assert (shape.b, shape.s, shape.heads, shape.head_dim) == (2, 4096, 16, 128)
    assert shape.flop_fwd == 4 * 2 * 4096**2 * 16 * 128 / 2
    with pytest.raises(ValueError, match="cp"):
        plan_attention_shape(load_model("llama-3-8b"), parse_plan("cp=2"), seq_len=4096)
    with pytest.raises(ValueError, match="MLA"):
        plan_attention_shape(load_model("deepseek-v3"), parse_plan("tp=8"), seq_len=4096)


def test_kernel_rows_agree_with_the_layer_model():
    """The kernel comparison's predictions are the compute model's: a QKV GEMM entry gets gemm_time_s on
    the calibrated curve, and an attention entry of Llama-3-8B's shape gets layer_times' attention
    forward for the same tokens (and 3.5x that with the backward)."""
    model, accel = load_model("llama-3-8b"), load_accelerator("h200")
    params = compute_params_for("h200")
    g = {"m": 4096, "n": 6144, "k": 4096, "dtype": "bf16", "median_s": 1e-4}
    a = {"b": 2, "s": 4096, "heads": 32, "head_dim": 128, "causal": True, "fwd_median_s": 1e-3,
         "fwd_bwd_median_s": 3e-3}
    rows = kernel_rows(_profile(gemm=[g], attention=[a]), accel)
    lt = layer_times(model, accel, params, tokens=2 * 4096, seq_len=4096, cp=1, tp=1, precision="bf16")
    peak, e_max, hd = gemm_curve(accel, params, "bf16")
    assert [r.kernel.split()[0] for r in rows] == ["gemm", "attention", "attention"]
    assert rows[0].predicted_s == pytest.approx(gemm_time_s(4096, 6144, 4096, peak_flop_per_s=peak, e_max=e_max,
                                                            half_dim=hd))
    assert rows[1].predicted_s == pytest.approx(lt.attention_fwd_s, rel=1e-12)
    assert rows[2].predicted_s == pytest.approx(3.5 * lt.attention_fwd_s, rel=1e-12)
    assert rows[2].ratio == pytest.approx(3e-3 / rows[2].predicted_s)


@pytest.mark.parametrize(("device", "accel"), [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100-sxm"),
                                               ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
                                               ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA GB200", "gb200"),
                                               ("NVIDIA B200", "b200"), ("cpu", None)])
def test_accelerator_for_device(device, accel):
    assert accelerator_for_device(device) == accel


def test_merge_and_check_attention_entries():
    a = {"b": 1, "s": 4096, "heads": 32, "head_dim": 128, "causal": True, "fwd_median_s": 1.0,
         "fwd_bwd_median_s": 3.0}
    merged = merge_profiles(_profile(attention=[a, {**a, "s": 1024}]), _profile(attention=[{**a, "fwd_median_s": 2.0}]))
    assert sorted((e["s"], e["fwd_median_s"]) for e in merged["attention"]) == [(1024, 1.0), (4096, 2.0)]
    assert check_profile(merged) == []
    errors = check_profile(_profile(attention=[{"b": 1}]))
    assert any(e.startswith("attention[0] lacks") and "fwd_bwd_median_s" in e for e in errors)


H200_RESULTS = Path(__file__).parents[2] / "benchmarks" / "results" / "h200-2026-11-29"


@pytest.mark.parametrize("name", ["kernels", "kernels_3b_repeat", "step_3b_mbs2", "step_3b_acc4", "step_3b_mbs4_full",
                                  "step_8b_full", "step_3b_mb1x1", "step_3b_mb1x4_run3"])
def test_measured_h200_profiles_conform_and_compare(name, capsys):
    """The profiles measured on an H200 (benchmarks/gpu_check.sh; docs/measure-and-crosscheck.md) are valid
    profiles, and `measure compare` reads them: kernels against the compute model (the device names the accelerator),
    steps against evaluate."""
    from meshplan.cli import main

    path = H200_RESULTS / f"{name}.json"
    assert check_profile(json.loads(path.read_text())) == []
    assert main(["measure", "compare", "--profile", str(path)]) == 0
    out = capsys.readouterr().out
    assert ("kernels measured against meshplan's compute model (h200" in out) == name.startswith("kernels")
    assert ("peak reserved (max rank)" in out) == name.startswith("step")


def test_compare_refuses_a_profile_with_nothing_to_compare(tmp_path, capsys):
    from meshplan.cli import main

    path = tmp_path / "empty.json"
    path.write_text(json.dumps(_profile()))
    assert main(["measure", "compare", "--profile", str(path)]) == 2
    assert "no step, GEMM or attention measurement" in capsys.readouterr().err


def test_compare_json_has_kernels_and_step_sections(capsys):
    """`measure compare --json`: a "kernels" section (accelerator, rows) for GEMM/attention timings and a
    "step" section (cluster, figures) for a step, each only where the profile has it."""
    from meshplan.cli import main

    assert main(["measure", "compare", "--json", "--profile", str(H200_RESULTS / "kernels.json")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"kernels", "notes"} and out["kernels"]["accelerator"] == "h200"
    assert out["kernels"]["note"] is None and isinstance(out["notes"], list)  # the profile's own notes
    assert len(out["kernels"]["rows"]) == 86 + 2 * 7  # every GEMM, and each attention shape fwd and fwd+bwd
    assert main(["measure", "compare", "--json", "--profile", str(H200_RESULTS / "step_8b_full.json")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"step", "notes"} and out["step"]["cluster"] == "h200"
    assert {f["figure"] for f in out["step"]["figures"]} >= {"step time", "optimizer step (kernels)",
                                                             "peak reserved (max rank)"}


def test_compare_kernels_of_an_unknown_device_say_so(tmp_path, capsys):
    from meshplan.cli import main

    g = {"m": 4096, "n": 4096, "k": 4096, "dtype": "bf16", "median_s": 2e-4, "p10_s": 2e-4, "p90_s": 2e-4,
         "flop_per_s": 6.9e14}
    path = tmp_path / "gh200.json"
    path.write_text(json.dumps(_profile(device="NVIDIA GH200 480GB", gemm=[g])))
    assert main(["measure", "compare", "--profile", str(path)]) == 0
    assert "is not a catalog accelerator" in capsys.readouterr().out
    assert main(["measure", "compare", "--profile", str(path), "--cluster", "h200"]) == 0
    assert "not a catalog accelerator" not in capsys.readouterr().out


def test_compare_times_the_step_as_evaluate_does_and_names_a_malformed_field(tmp_path, capsys):
    """`measure compare` predicts with the simulator's re-timing, as `evaluate` and `plan` do (without it the
    exposed all-gather is 44 % apart between the two), and a hand-edited step section is one line naming
    its field, exit 2, never a traceback."""
    import copy

    from meshplan.cli import main
    from meshplan.harness.measure.compare import predict

    profile = json.loads((H200_RESULTS / "step_8b_full.json").read_text())
    est, _, _ = predict(profile, "h200")
    assert est.closed_form_step_time_s is not None and "timeline simulator" in est.compute_source
    cases = [(lambda p: p["step"].pop("model_spec"), "step.model_spec must be an object"),
             (lambda p: p["step"]["model_spec"].update(bogus=1), "profile.step.model_spec"),
             (lambda p: p["step"].update(step_time_s="fast"), "step.step_time_s must be a positive"),
             (lambda p: p.update(nproc_per_node=0), "nproc_per_node must be a positive integer"),
             (lambda p: p.update(step=[1]), "step must be an object"),
             (lambda p: p["step"].update(exposed_comm_s_by_collective={"all_gather": float("inf")}),
              "step.exposed_comm_s_by_collective"),
             (lambda p: p.update(attention=[{"b": 1, "s": 4096, "heads": 32, "head_dim": 128, "causal": True,
                                              "fwd_median_s": "fast", "fwd_bwd_median_s": 1.0}]), "attention[0]")]
    path = tmp_path / "bad.json"
    for mutate, says in cases:
        bad = copy.deepcopy(profile)
        mutate(bad)
        path.write_text(json.dumps(bad))
        assert main(["measure", "compare", "--profile", str(path)]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err, (says, err)


def test_a_profile_says_what_it_replaces_and_when_it_replaces_nothing():
    """Collective fits measured with gloo on a CPU replace the cluster's links with loopback rates, and the
    notes say so (a 57 s step becomes 8,826 s); a profile with nothing the planner applies says so too."""
    from meshplan.catalog import load_cluster
    from meshplan.profile import apply_profile

    cluster = load_cluster("h100-sxm", nodes=8)
    gloo = _profile()
    gloo["collective_fits"] = {"all_gather@intra_node": {"alpha_s": 1e-4, "busbw_bytes_per_s": 3e8, "group_size": 2,
                                                         "n_points": 5}}
    _, notes = apply_profile(cluster, gloo)
    assert any("measured with gloo on cpu" in n and "h100-sxm" in n for n in notes)
    _, notes = apply_profile(cluster, _profile())
    assert notes == ["profile: nothing in it applies to the planner (no collective fit over two or more message "
                     "sizes, no BF16 GEMM figure, no MoE kernel): the catalog's figures stand"]


def test_measure_rejects_ignored_flags_and_bad_outputs_before_it_starts(tmp_path, capsys):
    """A scenario flag a measurement does not read, an unknown cluster and an --out that is a folder or not a
    profile are errors before any process starts, neither ignored nor caught after the run."""
    from meshplan.cli import main

    def err(*argv: str) -> str:
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's one-line error
            code = exc.code
        assert code == 2, argv
        return capsys.readouterr().err

    step = ["measure", "step", "--plan", "dp_shard=1", "--nproc", "1", "--scale-down"]
    assert "does not use --mfu" in err(*step, "--mfu", "0.5")
    assert "does not use --cluster" in err("crosscheck", "--model", "llama-3-8b", "--scale-down", "--plan",
                                           "dp_shard=2", "--cluster", "nope")
    assert "cluster" in err(*step, "--cluster", "nope")
    assert "is a folder" in err(*step, "--out", str(tmp_path))
    other = tmp_path / "notes.json"
    other.write_text("{}")
    assert "refusing to overwrite" in err(*step, "--out", str(other))


@pytest.mark.parametrize("change, says", [
    ({"gemm": [5]}, "gemm[0] lacks"),
    ({"collectives": [5]}, "collectives[0] lacks"),
    ({"collective_fits": {"all_gather@intra_node": 5}}, "collective_fits[all_gather@intra_node] lacks"),
    ({"collective_fits": {"all_gather@intra_node": {"alpha_s": "1", "busbw_bytes_per_s": "2", "group_size": 2,
                                                    "n_points": 3}}}, "busbw must be positive"),
])
def test_check_profile_reports_values_of_the_wrong_kind_instead_of_raising(change, says):
    """Values of the wrong kind are reported, not raised as a TypeError from inside the check."""
    errors = check_profile(_profile(**change))
    assert any(says in e for e in errors), errors


def test_plan_expert_shapes_deepseek_v3_ep8():
    """DeepSeek-V3 at EP=8, micro-batch 1, 4,096 tokens: 32 experts a rank, 8·4096·8/256 = 1,024 tokens each."""
    from meshplan.harness.measure.shapes import plan_expert_shapes, plan_routing_shape

    model = load_model("deepseek-v3")
    plan = parse_plan("ep=8,dp_shard=8,mbs=1", world_size=8)
    shapes = plan_expert_shapes(model, plan, seq_len=4096)
    at_plan = [s for s in shapes if s.m == 1024]
    assert [(s.name, s.groups, s.n, s.k) for s in at_plan] == [("expert.in", 32, 2 * 2048, 7168),
                                                               ("expert.out", 32, 7168, 2048)]
    assert sorted({s.m for s in shapes}) == [128, 256, 512, 1024, 2048]
    assert plan_routing_shape(model, plan, seq_len=4096).tokens == 4096
    assert plan_routing_shape(model, parse_plan("tp=2,ep=8,dp_shard=4", world_size=64), seq_len=4096).tokens == 2048
    with pytest.raises(ValueError):
        plan_routing_shape(load_model("llama-3-8b"), plan, seq_len=4096)


def _moe_section():
    return {"reference_gemm": {"m": 1024, "n": 1024, "k": 1024, "dtype": "bf16", "median_s": 0.01, "flop_per_s": 2e11},
            "expert_gemm": [{"kernel": "per_expert", "dtype": "bf16", "groups": 8, "m": m, "n": 1024, "k": 512,
                             "median_s": 1e-3, "p10_s": 1e-3, "p90_s": 1e-3, "flop_per_s": 1e11,
                             "relative_efficiency": r} for m, r in ((64, 0.3), (512, 0.8))],
            "passes": [{"pass": p, "tokens": 512, "hidden": 512, "top_k": 8, "n_experts": 64, "bytes": b,
                        "median_s": 1e-3, "p10_s": 1e-3, "p90_s": 1e-3, "bytes_per_s": b / 1e-3}
                       for p, b in (("router", 1e5), ("permute", 4e6), ("unpermute", 6e6))]}


def test_moe_profile_section_checks_merges_and_applies():
    from meshplan.catalog import load_cluster
    from meshplan.harness.measure.profile_io import merge_moe
    from meshplan.profile import apply_profile

    p = {**new_profile(device="NVIDIA H100 80GB HBM3", backend="nccl", world_size=1, nproc_per_node=1),
         "moe": _moe_section()}
    assert check_profile(p) == []
    bad = _moe_section()
    del bad["expert_gemm"][0]["relative_efficiency"]
    bad["passes"][1]["bytes"] = -1
    errors = check_profile({**p, "moe": bad})
    assert any("moe.expert_gemm[0] lacks relative_efficiency" in e for e in errors)
    assert any("moe.passes[1]" in e for e in errors)
    again = _moe_section()
    again["expert_gemm"] = again["expert_gemm"][:1]
    again["expert_gemm"][0]["relative_efficiency"] = 0.35
    merged = merge_moe(_moe_section(), again)
    assert sorted(e["relative_efficiency"] for e in merged["expert_gemm"]) == [0.35, 0.8]
    cluster, notes = apply_profile(load_cluster("h100-sxm", nodes=1), p)
    accel = cluster.accelerator
    assert accel.expert_gemm_points("per_expert", "bf16", 1024, 512) == ((64.0, 0.3), (512.0, 0.8))
    assert accel.expert_gemm_points("grouped", "bf16", 1024, 512) == ()
    assert accel.moe_pass_bytes_per_s == pytest.approx(10e6 / 2e-3)  # permute and unpermute, not the router
    assert any("2 measured expert-GEMM points" in n for n in notes)


def test_catalog_expert_gemm_points_need_a_source(tmp_path):
    from meshplan.catalog import load_accelerator as load
    from meshplan.errors import SpecError

    base = Path(__file__).parents[2] / "src/meshplan/catalog/accelerators/h100-sxm.toml"
    text = base.read_text().replace('name = "h100-sxm"', 'name = "h100-measured"')
    point = ('kernel = "per_expert"\ndtype = "bf16"\nn = 4096\nk = 7168\ntokens_per_expert = 1024\n'
             'relative_efficiency = 0.8\n')
    good = tmp_path / "good.toml"
    good.write_text(text + "\n[[expert_gemm]]\n" + point + 'source = "H100 SXM, driver 570, torch 2.13"\n')
    assert load(str(good)).expert_gemm_points("per_expert", "bf16", 4096, 7168) == ((1024.0, 0.8),)
    bad = tmp_path / "bad.toml"
    bad.write_text(text + "\n[[expert_gemm]]\n" + point)
    with pytest.raises(SpecError, match="needs a source"):
        load(str(bad))


def test_measured_moe_kernels_are_compared_with_the_model():
    from meshplan.cost.grouped_gemm import grouped_gemm_time_s
    from meshplan.harness.measure.compare import kernel_comparison

    profile = {**new_profile(device="NVIDIA H100 80GB HBM3", backend="nccl", world_size=1, nproc_per_node=1),
               "moe": _moe_section()}
    accel, rows, note = kernel_comparison(profile, None)
    assert accel.name == "h100-sxm" and note is None
    experts = [r for r in rows if r.kernel.startswith("experts per_expert bf16 8x64x1024x512")]
    params = compute_params_for("h100-sxm", "generic")
    peak, e_max, hd = gemm_curve(accel, params, "bf16")
    expected = grouped_gemm_time_s(64, 8, 1024, 512, kernel="per_expert", peak_flop_per_s=peak, e_max=e_max,
                                   half_dim=hd, hbm_bytes_per_s=accel.hbm_bytes_per_s * params.memory_efficiency)
    assert experts[0].predicted_s == pytest.approx(expected / params.moe_gemm_efficiency)
    permute = next(r for r in rows if r.kernel.startswith("moe permute"))
    assert permute.predicted_s == pytest.approx(4e6 / (accel.hbm_bytes_per_s * params.memory_efficiency))
    assert permute.measured_s == 1e-3
