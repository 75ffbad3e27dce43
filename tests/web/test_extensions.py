"""The page's optional panels: hidden where meshplan.frameworks and meshplan.economics are absent, and filled
through their public functions where they are present (stand-ins record what they are given here; the
packages' own tests check what they answer). A Hugging Face config.json upload reads as catalog.hf reads one."""

import json
import sys
import types

import pytest

from meshplan.errors import SpecError
from meshplan.web import extensions
from meshplan.web.scenario import build, normalise

PACKAGES = ("meshplan.frameworks", "meshplan.frameworks.common", "meshplan.economics")


@pytest.fixture
def absent(monkeypatch):
    for name in PACKAGES:
        monkeypatch.setitem(sys.modules, name, None)  # import raises ModuleNotFoundError


@pytest.fixture
def present(monkeypatch):
    calls = []
    frameworks = types.ModuleType("meshplan.frameworks")
    common = types.ModuleType("meshplan.frameworks.common")
    common.STACKS = ("torchtitan", "megatron")

    def export(stack, model, cluster, job, plan, fmt=None):
        calls.append(("export", stack, job.software, plan.to_string()))
        if stack == "torchtitan" and plan.sharding == "megatron":
            raise SpecError("export.torchtitan", "torchtitan has no Megatron-core distributed optimizer")
        return types.SimpleNamespace(format="script", text=f"# {stack}\nrun {plan.to_string()}",
                                     assumptions=("one assumption",))

    frameworks.export = export
    frameworks.stack_job = lambda stack, job: __import__("dataclasses").replace(job, software=stack)
    economics = types.ModuleType("meshplan.economics")

    def summarise(est, model, cluster, job, train_tokens=None):
        calls.append(("summarise", est.plan.to_string(), train_tokens))
        return types.SimpleNamespace(to_dict=lambda: {"train_tokens": train_tokens, "gpu_hours": {"mid": 1.0}})

    economics.summarise = summarise
    economics.summary_lines = lambda s: [f"Time to train {s.to_dict()['train_tokens']:,} tokens"]
    for name, mod in (("meshplan.frameworks", frameworks), ("meshplan.frameworks.common", common),
                      ("meshplan.economics", economics)):
        monkeypatch.setitem(sys.modules, name, mod)
    return calls


def _best(b):
    from meshplan.search.search import search

    return search(b.model, b.cluster, b.job).recommended


def test_panels_are_hidden_without_their_packages(absent):
    assert extensions.available() == {"exports": [], "economics": False}
    b = build(normalise({"model": "llama-2-7b", "nodes": 1, "space": "dp-tp"}))
    best = _best(b)
    assert extensions.exports(b, best) == [] and extensions.economics(b, best, 10**12) is None
    with pytest.raises(SpecError, match=r"meshplan\.frameworks is not installed"):
        extensions.export(b, best.plan, "megatron")


def test_panels_use_the_packages_public_functions(present):
    calls = present
    assert extensions.available() == {"exports": ["torchtitan", "megatron"], "economics": True}
    b = build(normalise({"model": "llama-2-7b", "nodes": 1, "space": "dp-tp"}))
    best = _best(b)
    out = extensions.export(b, best.plan, "megatron")
    assert out["text"].startswith("# megatron") and out["assumptions"] == ["one assumption"]
    assert calls[-1][:3] == ("export", "megatron", "megatron")  # evaluated and exported on the framework's stack
    from meshplan.specs import parse_plan

    with pytest.raises(SpecError, match="torchtitan has no Megatron"):
        extensions.export(b, parse_plan("tp=2,dp_shard=4,sharding=megatron,mbs=1,recompute=full", 8), "torchtitan")
    assert extensions.economics(b, best, None) == {"needs": "train_tokens"}
    eco = extensions.economics(b, best, 15_600_000_000_000)
    assert eco["lines"] == ["Time to train 15,600,000,000,000 tokens"] and eco["summary"]["gpu_hours"] == {"mid": 1.0}
    assert calls[-1] == ("summarise", best.plan.to_string(), 15_600_000_000_000)


def test_a_hugging_face_config_uploads_as_the_catalog_reads_it(tmp_path):
    from meshplan.catalog import load_model

    config = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
              "tie_word_embeddings": False}
    (tmp_path / "my-llama").mkdir()
    path = tmp_path / "my-llama" / "config.json"
    path.write_text(json.dumps(config))
    doc = {"format": "json", "name": "config.json", "text": json.dumps(config)}
    uploaded = build(normalise({"model_spec": doc})).model
    read = load_model(str(path))
    assert (uploaded.n_layers, uploaded.hidden, uploaded.n_kv_heads, uploaded.ffn_hidden, uploaded.vocab) == (
        read.n_layers, read.hidden, read.n_kv_heads, read.ffn_hidden, read.vocab)
    assert uploaded.source == "Hugging Face config.json uploaded as config.json"
    bad = {"format": "json", "name": "x.json", "text": json.dumps({**config, "model_type": "bert"})}
    with pytest.raises(SpecError, match="is not read; supported"):
        build(normalise({"model_spec": bad}))
