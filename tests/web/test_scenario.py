"""The web page's scenarios, checked without a server: any JSON value a request can carry either builds
specs or raises one SpecError naming a field (the app answers it 422), and catalog names are the only
names looked up, so a request cannot make the server read a file."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.errors import SpecError
from meshplan.web.scenario import DEFAULTS, build, cache_key, normalise

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8)
plausible = {
    "model": st.sampled_from(["seed-70b", "llama-3-8b", "nope", "/etc/passwd", "../x.toml"]) | json_values,
    "accelerator": st.sampled_from(["h100-sxm", "b200", "mi300x", "x"]) | json_values,
    "nodes": st.integers(-2, 70000) | json_values,
    "gpus_per_node": st.none() | st.integers(-1, 2000) | json_values,
    "inter_node_gb_per_s": st.none() | st.floats(-1, 1e6) | json_values,
    "batch_tokens": st.integers(0, 2**42) | json_values,
    "seq_len": st.sampled_from([1, 128, 4096, 4097, 2**33]) | json_values,
    "optimizer": st.sampled_from(["adamw", "sgd", "lion"]) | json_values,
    "software": st.sampled_from(["megatron", "generic", "x"]) | json_values,
    "model_spec": st.none() | st.fixed_dictionaries(
        {"text": st.sampled_from(["name='m'\nn_layers=2\nhidden=64\nn_heads=4\nn_kv_heads=4\nffn_hidden=128\nvocab=100",
                                  "n_layers = [[[", "{\"name\": 1}", "name = 1e400", ""]) | st.text(max_size=40),
         "format": st.sampled_from(["toml", "json", "yaml"])}) | json_values,
    "job_spec": st.none() | st.fixed_dictionaries(
        {"text": st.sampled_from(["seq_len = 2048", "runtime = 3", "[runtime]\ncuda_context_bytes = -1",
                                  "compiled = 'yes'", "moe_capacity_factor = 1e999"]) | st.text(max_size=40)})
    | json_values,
}


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({}, optional=plausible))
def test_any_request_builds_or_names_a_field(raw):
    try:
        s = normalise(raw)
        build(s)
    except SpecError as exc:
        assert exc.field and exc.message and "\n" not in exc.message


@settings(max_examples=100, deadline=None)
@given(json_values)
def test_any_json_value_as_a_scenario_is_refused_cleanly(raw):
    try:
        s = normalise(raw)
    except SpecError as exc:
        assert exc.field and "\n" not in exc.message
    else:  # an empty object, or one whose keys are all None: the defaults
        assert set(s) == set(DEFAULTS)


def test_names_never_reach_the_file_system(monkeypatch, tmp_path):
    """A name that is a path of a file that exists is refused by name, before the catalog is asked."""
    spec = tmp_path / "model.toml"
    spec.write_text("name='x'\nn_layers=2\nhidden=64\nn_heads=4\nn_kv_heads=4\nffn_hidden=128\nvocab=100\n")
    import meshplan.catalog as catalog

    opened = []
    real = catalog._read_toml
    monkeypatch.setattr(catalog, "_read_toml", lambda what, ref, kind: opened.append(ref) or real(what, ref, kind))
    for field in ("model", "accelerator"):
        with pytest.raises(SpecError, match="must be one of"):
            normalise({field: str(spec)})
    assert opened == []
    build(normalise({}))
    assert opened == ["seed-70b", "h100-sxm"]


def test_equal_scenarios_share_a_key():
    a = normalise({"nodes": 8, "model": "seed-70b"})
    b = normalise({**DEFAULTS, "nodes": 8.0})
    assert cache_key(a) == cache_key(b) and json.loads(cache_key(a))["nodes"] == 8
    assert cache_key(normalise({"nodes": 4})) != cache_key(a)


def test_the_default_scenario_is_the_plan_command_default():
    from meshplan.cli import DEFAULT_BATCH_TOKENS, DEFAULT_CLUSTER, DEFAULT_MODEL, DEFAULT_NODES, DEFAULT_SEQ_LEN

    b = build(normalise({}))
    assert (b.model.name, b.cluster.accelerator.name, b.cluster.n_nodes, b.job.global_batch_tokens,
            b.job.seq_len) == (DEFAULT_MODEL, "h100-sxm", DEFAULT_NODES, DEFAULT_BATCH_TOKENS, DEFAULT_SEQ_LEN)
    assert DEFAULT_CLUSTER == "h100-sxm"
