"""meshplan's ZB-V order (sim.pipeline._zb_v, which cost.pipeline's closed form is exact for) against the
one PyTorch itself computes (``ScheduleZBVZeroBubble._calculate_single_rank_operations``,
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
