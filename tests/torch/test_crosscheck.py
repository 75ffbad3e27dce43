"""Traffic and memory parity: plans applied with PyTorch's FSDP2 / DTensor APIs under a fake process group,
every collective recorded at the dispatcher and compared with meshplan's ledger per (collective, axis).

Tolerance: call counts exact; message bytes exact (rel 1e-9) once FSDP2's dim-0 padding is removed (sized
exactly from the parameter shapes). Two documented differences (docs/crosscheck.md) are sized exactly too:
the SP embedding's backward all-gather meshplan omits, and the last TP collective of a block that
non-reentrant checkpointing does not recompute. Auxiliary TP all-reduces (loss parallel, SP norm-weight
gradients) are listed, not checked.
"""

import pytest
from tests.conftest import requires_torch

import meshplan

pytestmark = requires_torch

PLANS = ["dp_shard=8", "dp_shard=64", "dp_replicate=8,dp_shard=8", "tp=8", "tp=8,sp=false", "tp=4,dp_shard=16"]
N_MICRO = 2


@pytest.fixture(scope="module")
def spec():
    from meshplan.harness.reference_model import scale_down

    return scale_down(meshplan.load_model("seed-70b"))


def _run(spec, plan_text, **kwargs):
    from meshplan.harness.crosscheck import crosscheck

    return crosscheck(spec, meshplan.parse_plan(plan_text), n_micro=N_MICRO, **kwargs)


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("plan", PLANS)
def test_collectives_and_memory_match(spec, plan, recompute):
    result = _run(spec, f"{plan},recompute={recompute}")
    assert result.passed, [r for r in result.rows if not r.ok] + [m for m in result.memory if not m.ok]
    modelled = [r for r in result.rows if r.modelled]
    assert modelled and all(r.recorded_count > 0 for r in modelled)
    for r in modelled:
        if r.axis in ("dp_shard", "dp_replicate"):
            assert r.exact, r  # FSDP2 and HSDP traffic: exact after padding, no other difference
    if "tp=" in plan:
        assert any(r.axis == "tp" and not r.modelled for r in result.rows)  # loss parallel was seen


@pytest.mark.parametrize("plan", ["dp_shard=8", "dp_replicate=8,dp_shard=8"])
def test_fsdp_counts_per_micro_batch(spec, plan):
    """Per micro-batch: every block all-gathers twice (forward, backward), the root once (not resharded after
    forward); every unit reduce-scatters once; HSDP all-reduces each reduce-scattered shard."""
    result = _run(spec, plan)
    rows = {(r.collective, r.axis): r for r in result.rows}
    units = spec.n_layers + 1
    assert rows["all_gather", "dp_shard"].recorded_count == N_MICRO * (2 * spec.n_layers + 1)
    assert rows["reduce_scatter", "dp_shard"].recorded_count == N_MICRO * units
    if "dp_replicate" in plan:
        assert rows["all_reduce", "dp_replicate"].recorded_count == N_MICRO * units


def test_fsdp_padding_is_sized_exactly(spec):
    """64 ranks pad the 32-row wk and wv to 64 rows: the recorded excess is exactly that padding."""
    result = _run(spec, "dp_shard=64")
    ag = next(r for r in result.rows if r.collective == "all_gather")
    assert ag.padding_bytes > 0 and ag.exact
    kv_pad_rows = 64 - spec.kv_dim
    per_gather = 2 * kv_pad_rows * spec.hidden * 2  # wk and wv, bf16
    assert ag.padding_bytes == N_MICRO * 2 * spec.n_layers * per_gather


@pytest.mark.parametrize("plan", ["tp=8", "tp=8,recompute=full", "tp=8,sp=false,recompute=full"])
def test_tp_collectives_match_exactly(spec, plan):
    """Found by this harness and fixed in meshplan: the SP embedding's backward all-gather, and PyTorch's
    early-stopping checkpoint that does not re-run a block's last reduction when recomputing."""
    result = _run(spec, plan)
    assert all(r.exact for r in result.rows if r.modelled), result.rows


def test_recompute_without_early_stop_adds_one_reduction_per_layer(spec):
    """With set_checkpoint_early_stop(False) PyTorch recomputes the whole block forward, as Megatron does:
    one more TP reduction per layer per micro-batch than meshplan's PyTorch model counts."""
    import torch.utils.checkpoint as ckpt

    with ckpt.set_checkpoint_early_stop(False):
        result = _run(spec, "tp=8,sp=false,recompute=full")
    (ar,) = [r for r in result.rows if r.modelled]
    assert ar.recorded_count - ar.predicted_count == N_MICRO * spec.n_layers


def test_mismatch_is_reported():
    from meshplan.harness.crosscheck import Row

    assert not Row("all_gather", "dp_shard", 10, 12, 100.0, 120).ok
    assert not Row("all_gather", "dp_shard", 10, 10, 100.0, 101).ok
    assert Row("all_gather", "dp_shard", 10, 10, 100.0, 104, padding_bytes=4.0).ok


def test_unsupported_plan_is_a_spec_error(spec):
    from meshplan.harness.crosscheck import check_supported

    with pytest.raises(meshplan.SpecError):
        check_supported(spec, meshplan.parse_plan("pp=2,dp_shard=4"))


def test_recorder_sees_c10d_and_functional_collectives():
    import torch
    import torch.distributed as dist
    from torch.distributed._functional_collectives import all_reduce

    from meshplan.harness.crosscheck import _reset_process_group
    from meshplan.harness.recorder import CollectiveRecorder

    _reset_process_group(4)
    try:
        rec = CollectiveRecorder(axis_of_group={dist.group.WORLD.group_name: "dp_shard"})
        with rec:
            out = torch.empty(16)
            gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
            gather(out, torch.ones(4))
            all_reduce(torch.ones(8), "sum", dist.group.WORLD).wait()
        assert [(r.collective, r.axis, r.message_bytes, r.group_size) for r in rec.records] == [
            ("all_gather", "dp_shard", 64, 4), ("all_reduce", "dp_shard", 32, 4)]
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("plan", ["tp=4,dp_shard=2", "dp_shard=8"])
def test_partial_recomputation_matches(spec, plan):
    """Checkpointing only the first layers (recompute_layers): the recomputed TP collectives, and the
    memory, follow the number of layers wrapped."""
    result = _run(spec, f"{plan},recompute=full,recompute_layers={spec.n_layers // 2}")
    assert result.passed, [r for r in result.rows if not r.ok] + [m for m in result.memory if not m.ok]


def test_ddp_gradient_buckets_are_a_second_copy_of_the_gradients(spec):
    """PyTorch DDP (gradient_as_bucket_view=False, its default and torchtitan's) keeps buckets as large as every
    gradient, in storage of their own: meshplan's ``ddp_gradient_buckets`` term, exactly."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from meshplan.harness.crosscheck import _reset_process_group, predict
    from meshplan.harness.reference_model import build_model

    plan = meshplan.parse_plan("dp_replicate=4")
    _reset_process_group(plan.world_size)
    try:
        torch.manual_seed(0)
        model = build_model(spec)
        ddp = DistributedDataParallel(model, bucket_cap_mb=1)
        buffers = {}

        def keep(state, bucket):  # the fake process group's futures carry no tensor: complete them here
            buffers[bucket.index()] = bucket.buffer()
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        ddp.register_comm_hook(None, keep)
        for _ in range(2):  # the second backward runs the rebuilt buckets
            buffers.clear()
            tokens = torch.randint(0, spec.vocab, (1, 17))
            F.cross_entropy(ddp(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
        bucket_bytes = sum(b.numel() * b.element_size() for b in buffers.values())
        grad_storages = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
    finally:
        dist.destroy_process_group()
    assert len(buffers) > 1
    assert not grad_storages & {b.untyped_storage().data_ptr() for b in buffers.values()}
    est = predict(spec, plan, seq_len=16, mbs=1, n_micro=1)
    assert est.memory.terms["ddp_gradient_buckets"] == pytest.approx(bucket_bytes, rel=1e-9)
    assert est.memory.terms["ddp_gradient_buckets"] == pytest.approx(est.memory.terms["grads"], rel=1e-9)
