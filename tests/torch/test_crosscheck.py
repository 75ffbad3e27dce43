"""Traffic and memory parity: plans applied with PyTorch's FSDP2 / DTensor APIs under a fake process group,
every collective recorded at the dispatcher and compared with meshplan's ledger per (collective, axis).

Tolerance: call counts exact; message bytes exact (rel 1e-9) once FSDP2's dim-0 padding is removed (sized
exactly from the parameter shapes), the SP embedding's backward all-gather and the last TP collective of a
block that non-reentrant checkpointing does not recompute included (docs/measure-and-crosscheck.md).
Auxiliary TP all-reduces (loss parallel, SP norm-weight gradients) are listed, not checked.
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
    """Including the SP embedding's backward all-gather, and PyTorch's early-stopping checkpoint, which does
    not re-run a block's last reduction when recomputing."""
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


DDP_BUCKETS = {100.0: 1, 1.0: 5, 0.25: 12}
"""Buckets per sync of the scaled-down seed-70b (7.7 MB of fp32 gradients) at each cap, as DDP formed them. At
1 MiB, in registration order the rule would form 6: the buckets follow the gradients' ready order."""


@pytest.mark.parametrize("cap_mb", list(DDP_BUCKETS))
@pytest.mark.parametrize("plan", ["dp_replicate=8", "dp_replicate=8,grad_sync=every", "dp_replicate=4,recompute=full"])
def test_ddp_traffic_and_bucket_memory_match(spec, plan, cap_mb):
    """PyTorch's DDP as torchtitan runs it: the all-reduced bytes exactly, the calls as DDP's buckets form
    (crosscheck.ddp_bucket_count: below 1 MiB several per sync, against the ledger's one per block), and its
    buckets a second copy of the gradients in storage of their own (memory.ddp_bucket_bytes)."""
    result = _run(spec, plan, ddp_bucket_cap_mb=cap_mb)
    assert result.passed, [r for r in result.rows if not r.ok] + [m for m in result.memory if not m.ok]
    (row,) = [r for r in result.rows if r.modelled]
    assert (row.collective, row.axis) == ("all_reduce", "dp_replicate")
    assert row.recorded_bytes == pytest.approx(row.predicted_bytes, rel=1e-9)
    syncs = N_MICRO if "every" in plan else 1
    assert row.recorded_count == syncs * DDP_BUCKETS[cap_mb]
    memory = {m.term: m for m in result.memory}
    assert memory["ddp_gradient_buckets"].recorded_bytes == memory["grads"].recorded_bytes > 0


def test_ddp_buckets_close_once_they_reach_the_cap():
    from meshplan.harness.crosscheck import ddp_bucket_count

    mib = 2**20
    assert ddp_bucket_count([3 * mib, 1, 1], mib) == 2  # a matrix above the cap closes the bucket it opens
    assert ddp_bucket_count([mib // 2, mib // 2, mib // 2], mib) == 2
    assert ddp_bucket_count([mib // 2] * 4, mib) == 2
    assert ddp_bucket_count([], mib) == 0


def test_ddp_with_tensor_parallelism_is_refused(spec):
    from meshplan.errors import SpecError
    from meshplan.harness.crosscheck import check_supported

    with pytest.raises(SpecError, match=r"plan\.tp"):
        check_supported(spec, meshplan.parse_plan("dp_replicate=2,tp=4"))


@pytest.mark.parametrize("model", ["mixtral-8x7b", "deepseek-v3"])
@pytest.mark.parametrize("plan", ["dp_shard=4", "dp_replicate=2,dp_shard=2,recompute=full", "dp_replicate=4,mbs=2"])
def test_moe_models_match_under_fsdp_and_ddp(model, plan):
    """A MoE block without expert parallelism is one FSDP2 unit (experts and the rest gathered together, one
    call, not two), the expert states count in the memory rows, the plan's micro-batch size is the run's,
    and the reference model builds no MTP module (predicted without it)."""
    from meshplan.harness.reference_model import scale_down

    result = _run(scale_down(meshplan.load_model(model)), plan)
    assert result.passed, [r for r in result.rows if not r.ok] + [m for m in result.memory if not m.ok]
    assert result.mbs == (2 if "mbs=2" in plan else 1)
