"""What meshplan assumes of torch.distributed.pipelining, against PyTorch itself.

meshplan's ZB-V order (sim.pipeline._zb_v, which cost.pipeline's closed form is exact for) against the
one PyTorch computes (``ScheduleZBVZeroBubble._calculate_single_rank_operations``,
torch/distributed/pipelining/schedules.py): the same passes in the same order on every rank.

The schedule is built without stages or a process group: the order is a pure function of the pipeline's
ranks, its stages (two per rank) and the micro-batches, the three attributes set here."""

import pytest
from tests.conftest import requires_torch

pytestmark = requires_torch

KINDS = {"F": "F", "I": "B", "W": "W"}  # PyTorch's input-gradient pass 'I' is meshplan's B


class _Keys(dict):
    """Stands for schedule_pipeline's tasks: a task is its (stage, kind, micro-batch, chunk) key."""

    def __missing__(self, key):
        return key


def _torch_order(pp: int, m: int, rank: int) -> list[tuple[int, str, int, int]]:
    from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble

    schedule = object.__new__(ScheduleZBVZeroBubble)
    schedule.pp_group_size, schedule._n_microbatches, schedule.num_stages = pp, m, 2 * pp
    order = []
    for action in schedule._calculate_single_rank_operations(rank):
        if action is None:  # idle slots, and the micro-batches past m that PyTorch plans and drops
            continue
        chunk = 0 if action.stage_index == rank else 1
        assert action.stage_index == (rank if chunk == 0 else 2 * pp - 1 - rank)  # the V
        order.append((rank, KINDS[action.computation_type.value], action.microbatch_index, chunk))
    return order


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 7, 8, 16])
def test_zb_v_runs_pytorch_order_on_every_rank(pp):
    from meshplan.sim.pipeline import _zb_v

    for m in range(1, 4 * pp + 3):
        for rank in range(pp):
            assert _zb_v(pp, rank, m, _Keys()) == _torch_order(pp, m, rank), (pp, m, rank)


def test_pipeline_stages_allocate_a_buffer_per_micro_batch():
    """PyTorch's PipelineStage allocates, once, an activation buffer per micro-batch on every stage that
    receives one and a gradient buffer per micro-batch on every stage that receives gradients, each its own
    storage (memory.pipelining_boundary_tensors counts them; with no micro-batch alive, only them)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining._utils import InferenceMode

    from meshplan.cost.memory import pipelining_boundary_tensors
    from meshplan.harness.crosscheck import _reset_process_group

    stages, m, hidden = 4, 6, 16
    for s in range(stages):
        _reset_process_group(stages)
        try:
            x = torch.zeros(1, 8, hidden, dtype=torch.bfloat16)
            stage = PipelineStage(torch.nn.Linear(hidden, hidden), s, stages, torch.device("cpu"), input_args=x,
                                  output_args=x.clone().requires_grad_())
            stage._inference_mode = InferenceMode.STATIC  # the shapes given, nothing exchanged
            stage._prepare_forward_infra(m, (x,) if s == 0 else None, has_backward=True)
            stage._prepare_backward_infra(m)
            buffers = [i.buffer for infos in (stage.args_recv_info, stage.grad_recv_info)
                       for recv in infos.values() for i in recv if i.buffer is not None]
        finally:
            dist.destroy_process_group()
        assert len({b.untyped_storage().data_ptr() for b in buffers}) == len(buffers)
        assert len(buffers) == pipelining_boundary_tensors(stage_ids=(s,), n_stages=stages, m=m, alive=(0,)), s
