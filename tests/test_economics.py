"""Time to train, cost, energy and goodput (meshplan.economics): golden values from the papers the rates and
formulas come from, the arithmetic of a summary, the catalog's strictness, and properties of goodput."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.catalog import load_cluster, load_job, load_model
from meshplan.cost.step import evaluate
from meshplan.economics import Settings, checkpoint_bytes, defaults_for, failure_rate, failure_rates, summarise
from meshplan.economics import formulas as f
from meshplan.economics.settings import check_catalog
from meshplan.errors import SpecError
from meshplan.specs import parse_plan
from meshplan.uncertainty import attach_band
from meshplan.units import parse_token_count

MIN = 60.0
HOUR = 3600.0


@pytest.mark.parametrize(("mtbf_s", "expected_min"), [(24 * HOUR, 117), (6 * HOUR, 57), (15 * MIN, 9.1)])
def test_daly_interval_matches_the_papers_figures(mtbf_s, expected_min):
    """Daly (2006), Figures 3-5: δ = 5 min, R = 10 min; the model predicts τ_opt = 117, 57 and 9.1 min."""
    tol = 0.5 if expected_min > 10 else 0.05  # the figures' rounding
    assert f.daly_interval_s(5 * MIN, mtbf_s) / MIN == pytest.approx(expected_min, abs=tol)


def test_young_interval():
    """Young (1974): τ = sqrt(2 δ M); δ = 5 min, M = 24 h gives 120 min."""
    assert f.young_interval_s(5 * MIN, 24 * HOUR) == pytest.approx(120 * MIN)
    assert f.daly_interval_s(10 * MIN, 4 * MIN) == 4 * MIN  # δ ≥ 2M: τ = M


def test_llama3_failure_rate_and_interruptions_per_day():
    """The Llama 3 paper: 419 unexpected interruptions in 54 days on 16,384 H100s, 7.8 per day."""
    rate, source = failure_rates()["llama3-405b"]
    assert rate == pytest.approx(419 / (54 * 24 * 16384))
    assert "2407.21783" in source
    assert f.SECONDS_PER_DAY / f.job_mtbf_s(rate, 16384) == pytest.approx(419 / 54)


def test_meta_rsc1_projects_the_papers_mttf_at_16k_gpus():
    """Kokolis et al. (HPCA 2025): 6.50 failures per 1000 node-days project an MTTF of 1.8 h at 16,384 GPUs."""
    rate, _ = failure_rates()["meta-rsc1"]
    assert f.job_mtbf_s(rate, 16384) / HOUR == pytest.approx(1.8, abs=0.05)


def test_failure_rate_by_name_or_number():
    assert failure_rate("meta-rsc2")[0] == pytest.approx(2.34 / (1000 * 24 * 8))
    assert failure_rate("2e-5") == (2e-5, "given by the user")
    for bad in ("often", "-1", "nan", "2"):
        with pytest.raises(SpecError, match="--failure-rate"):
            failure_rate(bad)


@pytest.mark.parametrize(("text", "value"), [("15.6T", 15_600_000_000_000), ("1e12", 10**12), ("2B", 2 * 10**9),
                                             ("300M", 300 * 10**6), ("1,000", 1000)])
def test_token_budgets_are_decimal(text, value):
    assert parse_token_count(text) == value


@pytest.mark.parametrize("text", ["abc", "1.5", "15.6Q", "inf", ""])
def test_token_budget_rejects(text):
    with pytest.raises(ValueError):
        parse_token_count(text)


def test_job_file_train_tokens(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('global_batch_tokens = "16M"\nseq_len = 8192\ntrain_tokens = "15.6T"\nrecompute = "full"\n')
    j = load_job(str(job))
    assert j.train_tokens == 15_600_000_000_000 and j.recompute == "full"
    job.write_text('global_batch_tokens = "16M"\nseq_len = 8192\ntrain_tokens = "lots"\n')
    with pytest.raises(SpecError, match=r"job.train_tokens"):
        load_job(str(job))


def test_checkpoint_bytes_by_implementation():
    """Weights, fp32 master copy and AdamW moments once: 2 + 4 + 8 = 14 bytes a parameter under Megatron's
    distributed optimizer, 4 + 8 = 12 under FSDP2 (whose fp32 parameters are the master copy)."""
    from meshplan.cost.params import param_counts

    m, j = load_model("llama-3.1-405b"), load_job(None, global_batch_tokens=2**24, seq_len=8192)
    n = param_counts(m).total
    assert checkpoint_bytes(m, j, "megatron") == 14 * n
    assert checkpoint_bytes(m, j, "fsdp") == 12 * n
    sgd = load_job(None, global_batch_tokens=2**24, seq_len=8192, optimizer="sgd")
    assert checkpoint_bytes(m, sgd, "fsdp") == 4 * n


def _summary(price=None, band=True, tokens=10**11):
    m, c = load_model("llama-3.2-3b"), load_cluster("h100-sxm", nodes=2)
    j = load_job(None, global_batch_tokens=2**20, seq_len=4096, train_tokens=tokens)
    est = evaluate(m, c, j, parse_plan("dp_shard=16", world_size=16))
    if band:
        est = attach_band(est, accelerator="h100-sxm", software="generic")
    s = defaults_for(c)
    if price is not None:
        s = s.override(price_usd_per_gpu_hour=price)
    return est, c, summarise(est, m, c, j, s)


def test_summary_arithmetic():
    """T_s = ceil(D/B)·t; T_w = T_s/G; GPU-hours = n·T_w/3600; cost = GPU-hours x price; energy = n·T_w·P·PUE."""
    est, _, s = _summary(price=2.0)
    steps = math.ceil(10**11 / 2**20)
    assert s.steps == steps
    assert s.train_time_s.value == pytest.approx(steps * est.step_time_s)
    assert s.wall_time_s.value == pytest.approx(s.train_time_s.value / s.goodput.fraction)
    assert s.gpu_hours.value == pytest.approx(s.wall_time_s.value * 16 / 3600)
    assert s.cost_usd.value == pytest.approx(s.gpu_hours.value * 2.0)
    assert s.energy_j.value == pytest.approx(s.wall_time_s.value * 16 * 700 * 1.56)
    assert s.settings.sources["price_usd_per_gpu_hour"] == "given by the user"
    # the band scales every time-proportional figure, and inverts for tokens/s
    b = est.uncertainty
    assert s.train_time_s.low == pytest.approx(s.train_time_s.value * (1 + b.low))
    assert s.cost_usd.high == pytest.approx(s.cost_usd.value * (1 + b.high))
    assert s.tokens_per_s.high == pytest.approx(est.tokens_per_s / (1 + b.low))
    g = s.goodput
    assert g.checkpoint_write_s == pytest.approx(g.checkpoint_bytes / (16 * 0.122e9))
    assert g.interval_s == pytest.approx(f.daly_interval_s(g.checkpoint_write_s, g.job_mtbf_s))
    assert s.expected_interruptions.value == pytest.approx(s.wall_time_s.value / g.job_mtbf_s)


def test_summary_json_is_strict_and_names_units():
    from meshplan.fileio import strict_json

    _, _, s = _summary(band=False)
    d = s.to_dict()
    strict_json(d)
    assert d["step_time_s"]["low"] == d["step_time_s"]["value"]  # no band: an empty range
    assert {"wall_time_s", "gpu_hours", "cost_usd", "energy_j", "goodput", "assumptions"} <= set(d)
    assert set(d["assumptions"]["sources"]) >= {"price_usd_per_gpu_hour", "board_power_w", "pue",
                                                "failures_per_gpu_hour", "storage_bytes_per_s_per_gpu", "restart_s"}


def test_summary_without_failures_and_without_price():
    m, c = load_model("llama-3.2-3b"), load_cluster("gb300", nodes=1)
    j = load_job(None, global_batch_tokens=72 * 4096 * 4, seq_len=4096, train_tokens=10**10)
    est = evaluate(m, c, j, parse_plan("dp_shard=72", world_size=72))
    s = summarise(est, m, c, j, defaults_for(c).override(failures_per_gpu_hour=0.0))
    assert s.cost_usd is None and s.goodput.fraction == 1.0 and s.goodput.interval_s is None
    assert s.wall_time_s.value == s.train_time_s.value and s.expected_interruptions.value == 0


def test_summary_when_the_job_cannot_progress():
    """Failures far more often than a restart takes: goodput all but 0, no time, cost or energy, no NaN."""
    m, c = load_model("llama-3.2-3b"), load_cluster("h100-sxm", nodes=2)
    j = load_job(None, global_batch_tokens=2**20, seq_len=4096, train_tokens=10**10)
    est = evaluate(m, c, j, parse_plan("dp_shard=16", world_size=16))
    s = summarise(est, m, c, j, defaults_for(c).override(failures_per_gpu_hour=1.0, restart_s=86400.0))
    assert s.goodput.fraction < 1e-100 and s.wall_time_s is None and s.cost_usd is None and s.energy_j is None
    from meshplan.fileio import strict_json

    strict_json(s.to_dict())


def test_summary_needs_tokens_and_a_feasible_plan():
    m, c = load_model("llama-3.2-3b"), load_cluster("h100-sxm", nodes=2)
    j = load_job(None, global_batch_tokens=2**20, seq_len=4096)
    est = evaluate(m, c, j, parse_plan("dp_shard=16", world_size=16))
    with pytest.raises(SpecError, match=r"job.train_tokens"):
        summarise(est, m, c, j)
    big = load_model("llama-3.1-405b")
    est = evaluate(big, c, j, parse_plan("dp_replicate=16", world_size=16))
    with pytest.raises(SpecError, match="does not fit"):
        summarise(est, big, c, j, train_tokens=10**9)


def test_settings_validation_and_sources():
    s = defaults_for(load_cluster("h100-sxm"))
    assert s.price_usd_per_gpu_hour == pytest.approx(49.24 / 8) and s.board_power_w == 700 and s.pue == 1.56
    for field, value in (("pue", 0.5), ("price_usd_per_gpu_hour", -1.0), ("failures_per_gpu_hour", 2.0),
                         ("restart_s", -5.0)):
        with pytest.raises(SpecError, match=rf"economics\.{field}"):
            s.override(**{field: value})
    with pytest.raises(SpecError, match=r"economics.sources"):
        Settings(price_usd_per_gpu_hour=1.0, board_power_w=700.0, pue=1.2, failures_per_gpu_hour=0.0,
                 storage_bytes_per_s_per_gpu=1e8, restart_s=60.0, sources={})


def test_every_catalog_accelerator_has_economics():
    from meshplan.catalog import list_accelerators

    for name in list_accelerators():
        s = defaults_for(load_cluster(name))
        assert s.board_power_w and s.sources["board_power_w"]
        assert s.price_usd_per_gpu_hour is None or "20" in s.sources["price_usd_per_gpu_hour"]  # dated


def test_cluster_file_storage_bandwidth(tmp_path):
    spec = tmp_path / "c.toml"
    spec.write_text('accelerator = "h100-sxm"\nnodes = 4\n[node]\nstorage_gb_per_s = 2.5\n')
    assert defaults_for(load_cluster(str(spec))).storage_bytes_per_s_per_gpu == 2.5e9


def test_catalog_loader_rejects_a_number_without_source():
    good = {"pue": {"value": 1.5, "source": "s"}, "storage": {"write_gb_per_s_per_gpu": 1, "source": "s"},
            "restart": {"seconds": 60, "source": "s"},
            "accelerator": {"x": {"board_power_w": 700, "sources": {"board_power_w": "datasheet"}}}}
    check_catalog(good)
    bad = {**good, "accelerator": {"x": {"board_power_w": 700, "price_usd_per_gpu_hour": 2.0,
                                         "sources": {"board_power_w": "datasheet"}}}}
    with pytest.raises(SpecError, match="every number needs a source"):
        check_catalog(bad)
    with pytest.raises(SpecError, match=r"economics.pue"):
        check_catalog({**good, "pue": {"value": 1.5}})


# ---- properties of goodput -------------------------------------------------------------------------------

rates = st.floats(min_value=1e-7, max_value=1e-3)
gpus = st.sampled_from([8, 64, 1024, 16384, 131072])
deltas = st.floats(min_value=0.1, max_value=3600.0)
restarts = st.floats(min_value=0.0, max_value=3600.0)


@given(rates, gpus, deltas, restarts)
@settings(max_examples=200, deadline=None)
def test_goodput_in_unit_interval(rate, n, delta, restart):
    m = f.job_mtbf_s(rate, n)
    g = f.goodput_fraction(f.daly_interval_s(delta, m), delta, restart, m)
    assert 0.0 <= g <= 1.0 and math.isfinite(g)
    if m > 10 * (delta + restart):  # a job that progresses at all keeps a positive share
        assert g > 0.0


@given(rates, rates, gpus, deltas, restarts)
@settings(max_examples=200, deadline=None)
def test_goodput_falls_as_failures_rise(r1, r2, n, delta, restart):
    lo, hi = sorted((r1, r2))

    def g(rate):
        m = f.job_mtbf_s(rate, n)
        return f.goodput_fraction(f.daly_interval_s(delta, m), delta, restart, m)

    assert g(hi) <= g(lo) + 1e-12


@given(st.floats(min_value=1e-5, max_value=5.0), restarts)
@settings(max_examples=100, deadline=None)
def test_daly_interval_minimises_the_expected_wall_time(ratio, restart):
    """The interval Daly's formula gives is within 0.5 % of the numerically minimal expected wall time of his
    complete model, for checkpoint times from 1e-5 to 5 times the mean time between interruptions."""
    m = 1000.0
    delta = ratio * m

    def wall(tau):
        return f.expected_wall_time_s(1.0, tau, delta, restart, m)

    taus = [m * 10 ** (k / 400) for k in range(-4000, 1200)]
    best = min(wall(t) for t in taus)
    assert wall(f.daly_interval_s(delta, m)) <= best * 1.005
