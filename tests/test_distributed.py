"""``--ray``: the independent searches and fits (conditions' walks, sweep points, compared scenarios, the
calibration's folds) on a real local Ray instance give exactly what the local process pool gives; without Ray
installed the flag fails in one line naming the extra. The Ray tests skip where Ray is missing, and fail
instead under MESHPLAN_REQUIRE_EXTRAS=1 (.ci/extras installs the ``ray`` extra alone and sets it)."""

from __future__ import annotations

import contextlib
import io
import os
import sys

import pytest

from meshplan import JobSpec, load_cluster, load_model
from meshplan.cli import main
from meshplan.parallel import distributed, distributing

SWEEP = ["sweep", "--model", "llama-3-8b", "--nodes", "2", "--vary", "batch-tokens=512K..4M", "--points", "3",
         "--json"]


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


def test_ray_without_the_extra_fails_in_one_line_naming_it(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed: find_spec and import both fail
    for argv in (SWEEP, ["plan", "--no-conditions"], ["compare", "--model", "llama-3.2-3b", "--nodes", "1"]):
        status, out, err = _cli([*argv, "--ray"])
        assert status == 2 and not out
        assert err.count("\n") == 1 and "--ray" in err and "pip install 'meshplan[ray]'" in err, err


def test_without_ray_the_local_pool_runs_the_maps() -> None:
    assert not distributing()
    from meshplan.parallel import parallel_map

    calls = []
    with distributed(lambda fn, items, done: calls.append(len(items)) or [fn(x) for x in items]):
        assert distributing()
        assert parallel_map(lambda x: x * x, [1, 2, 3], 1, distributable=True) == [1, 4, 9]
        assert parallel_map(lambda x: -x, [1, 2], 1) == [-1, -2]  # not distributable: the local pool
    assert calls == [3] and not distributing()


@pytest.fixture(scope="module")
def ray():
    try:
        import ray
    except ImportError as exc:
        message = f"needs the ray extra (pip install 'meshplan[ray]'): {exc}"
        if os.environ.get("MESHPLAN_REQUIRE_EXTRAS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@contextlib.contextmanager
def _on(ray) -> None:
    from meshplan.distributed import ray_map

    assert ray.is_initialized()
    with distributed(ray_map):
        yield


@pytest.mark.slow
def test_a_sweep_on_ray_is_the_local_sweep(ray) -> None:
    local = _cli(SWEEP)
    on_ray = _cli([*SWEEP, "--ray"])  # Ray already running: the command uses it and leaves it running
    assert local[0] == on_ray[0] == 0 and local[1] == on_ray[1]
    assert ray.is_initialized()


@pytest.mark.slow
def test_conditions_and_compare_on_ray_are_the_local_ones(ray) -> None:
    from meshplan.compare import Scenario, compare
    from meshplan.economics.settings import defaults_for
    from meshplan.explain import analyse

    def conditions() -> list:
        model, cluster, job = load_model("llama-3-8b"), load_cluster("h100-sxm", nodes=2), JobSpec(
            global_batch_tokens=2**20, seq_len=4096)
        a = analyse(model, cluster, job, workers=2)
        return [c.text for c in a.conditions] + [h.text for h in a.held_ranges]

    def rows() -> list:
        items = [Scenario("h100-sxm", 1, None), Scenario("b200", 1, None), Scenario("h100-sxm", 2, None)]
        out = compare(load_model("llama-3.2-3b"), JobSpec(global_batch_tokens=2**19, seq_len=4096), items,
                      load=lambda s: load_cluster(s.cluster, nodes=s.nodes), settings_for=defaults_for,
                      workers=2)
        return [(r.scenario, r.fastest.plan.to_string() if r.fastest else None,
                 r.fastest.step_time_s if r.fastest else None) for r in out]

    local_conditions, local_rows = conditions(), rows()
    with _on(ray):
        assert conditions() == local_conditions
        assert rows() == local_rows


@pytest.mark.slow
def test_cross_validation_folds_on_ray_are_the_local_fits(ray) -> None:
    from tests.snapshots.cases import published_runs_csv

    csv = published_runs_csv()
    if csv is None:
        pytest.skip("no ../shared/data/published_runs.csv beside the checkout")
    from meshplan.validation import calibrate as cal
    from meshplan.validation.validate import load_scenarios, read_rows

    rows = cal.cv_rows(load_scenarios(read_rows(str(csv))))[:24]
    local = cal.cross_validate(rows, k=2, rounds=1)
    with _on(ray):
        assert cal.cross_validate(rows, k=2, rounds=1) == local
