"""parallel.parallel_map: the same results, in the same order, on any number of workers."""

from meshplan.parallel import parallel_map


def test_results_keep_the_order_of_the_items_and_closures_reach_the_workers():
    offset = {"k": 7}  # a closure over local state: inherited by the forked workers, never pickled
    items = list(range(23))
    expected = [x * x + offset["k"] for x in items]
    for workers in (1, 2, 4):
        assert parallel_map(lambda x: x * x + offset["k"], items, workers) == expected
    assert parallel_map(lambda x: x, [], 4) == []


def test_the_work_runs_in_other_processes_and_errors_come_back_as_raised():
    import os
    import sys

    import pytest

    from meshplan.errors import SpecError

    if sys.platform == "linux":
        assert set(parallel_map(lambda _: os.getpid(), range(4), 2)) - {os.getpid()}

    def bad(x):
        if x == 2:
            raise SpecError("plan.tp", "must divide n_heads=5")
        return x

    with pytest.raises(SpecError, match=r"plan\.tp: must divide n_heads=5") as caught:
        parallel_map(bad, range(4), 2)
    assert caught.value.field == "plan.tp"


def test_the_plan_is_the_same_on_one_core_and_on_several():
    from meshplan import JobSpec, load_cluster, load_model
    from meshplan.search.sweep import sweep

    model, cluster = load_model("seed-70b"), load_cluster("h100-sxm", nodes=2)
    job = JobSpec(global_batch_tokens=2**20, seq_len=4096)
    values = [2**19, 2**20, 2**21]
    two, one = (sweep(model, cluster, job, "batch-tokens", values, workers=w) for w in (2, 1))  # cold caches first
    assert [(p.value, p.best.plan.to_string(), p.best.step_time_s) for p in one] == [
        (p.value, p.best.plan.to_string(), p.best.step_time_s) for p in two]
