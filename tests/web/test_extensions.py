"""The page's optional panels: hidden where meshplan.frameworks and meshplan.economics are absent, and filled
through their public functions where they are present (stand-ins record what they are given here; the
packages' own tests check what they answer)."""

import sys
import types

import pytest

from meshplan.errors import SpecError
from meshplan.web import extensions
from meshplan.web.scenario import build, normalise

PACKAGES = ("meshplan.frameworks", "meshplan.frameworks.common", "meshplan.frameworks.command",
            "meshplan.frameworks.hf", "meshplan.economics")


@pytest.fixture
def absent(monkeypatch):
    for name in PACKAGES:
        monkeypatch.setitem(sys.modules, name, None)  # import raises ModuleNotFoundError


@pytest.fixture
def present(monkeypatch):
    calls = []
    common = types.ModuleType("meshplan.frameworks.common")
    common.STACKS = ("torchtitan", "megatron")
    command = types.ModuleType("meshplan.frameworks.command")

    def export(stack, model, cluster, job, plan, fmt=None):
        calls.append(("export", stack, job.software, plan.to_string()))
        if stack == "torchtitan" and plan.sharding == "megatron":
            raise SpecError("export.torchtitan", "torchtitan has no Megatron-core distributed optimizer")
        return types.SimpleNamespace(format="script", text=f"# {stack}\nrun {plan.to_string()}",
                                     assumptions=("one assumption",))

    command.export = export
    command.stack_job = lambda stack, job: __import__("dataclasses").replace(job, software=stack)
    hf = types.ModuleType("meshplan.frameworks.hf")

    def model_from_hf(data, *, name, source):
        calls.append(("hf", name, source))
        from meshplan.catalog import load_model
        return load_model("llama-3-8b")

    hf.model_from_hf = model_from_hf
    economics = types.ModuleType("meshplan.economics")

    def summarise(est, model, cluster, job, train_tokens=None):
        calls.append(("summarise", est.plan.to_string(), train_tokens))
        return types.SimpleNamespace(to_dict=lambda: {"train_tokens": train_tokens, "gpu_hours": {"mid": 1.0}})

    economics.summarise = summarise
    economics.summary_lines = lambda s: [f"Time to train {s.to_dict()['train_tokens']:,} tokens"]
    for name, mod in (("meshplan.frameworks", types.ModuleType("meshplan.frameworks")),
                      ("meshplan.frameworks.common", common), ("meshplan.frameworks.command", command),
                      ("meshplan.frameworks.hf", hf), ("meshplan.economics", economics)):
        monkeypatch.setitem(sys.modules, name, mod)
    return calls


def test_panels_are_hidden_without_their_packages(absent):
    assert extensions.available() == {"exports": [], "economics": False, "hf_config": False}
    b = build(normalise({"model": "llama-2-7b", "nodes": 1, "space": "dp-tp"}))
    from meshplan.search.search import search

    best = search(b.model, b.cluster, b.job).recommended
    assert extensions.exports(b, best) == [] and extensions.economics(b, best, 10**12) is None
    with pytest.raises(SpecError, match=r"meshplan\.frameworks is not installed"):
        extensions.export(b, best.plan, "megatron")
    hf_doc = {"format": "json", "name": "config.json", "text": '{"model_type": "llama", "hidden_size": 4096}'}
    with pytest.raises(SpecError, match=r"read where meshplan\.frameworks is installed"):
        build(normalise({"model_spec": hf_doc}))


def test_panels_use_the_packages_public_functions(present):
    calls = present
    assert extensions.available() == {"exports": ["torchtitan", "megatron"], "economics": True, "hf_config": True}
    b = build(normalise({"model": "llama-2-7b", "nodes": 1, "space": "dp-tp"}))
    from meshplan.search.search import search

    best = search(b.model, b.cluster, b.job).recommended
    out = extensions.export(b, best.plan, "megatron")
    assert out["text"].startswith("# megatron") and out["assumptions"] == ["one assumption"]
    assert calls[-1][:3] == ("export", "megatron", "megatron")  # evaluated and exported on the framework's stack
    with pytest.raises(SpecError, match="torchtitan has no Megatron"):
        from meshplan.specs import parse_plan
        extensions.export(b, parse_plan("tp=2,dp_shard=4,sharding=megatron,mbs=1,recompute=full", 8), "torchtitan")
    assert extensions.economics(b, best, None) == {"needs": "train_tokens"}
    eco = extensions.economics(b, best, 15_600_000_000_000)
    assert eco["lines"] == ["Time to train 15,600,000,000,000 tokens"] and eco["summary"]["gpu_hours"] == {"mid": 1.0}
    assert calls[-1] == ("summarise", best.plan.to_string(), 15_600_000_000_000)
    hf_doc = {"format": "json", "name": "my-llama.json", "text": '{"model_type": "llama", "hidden_size": 4096}'}
    assert build(normalise({"model_spec": hf_doc})).model.name == "llama-3-8b"
    assert calls[-1] == ("hf", "my-llama", "Hugging Face config.json uploaded as my-llama.json")
