"""Hugging Face config.json files read as model specs: small local fixtures written from the published
configs' values (hf_configs/*/config.json: Llama 3.1 8B and 3.2 3B, Mistral 7B, Mixtral 8x7B, Qwen2.5 7B,
Qwen3 8B, Qwen3-30B-A3B, DeepSeek-V3, GPT-OSS-120B, Gemma 7B, Gemma 2 2B, Gemma 3; nothing is downloaded).
transformers' own config classes load each, and meshplan's parameter count equals the count of the model
transformers builds from it on the meta device (no weights), exactly."""

import json
from pathlib import Path

import pytest
from tests.frameworks.extras import require

from meshplan.catalog import load_model
from meshplan.cost.params import param_counts
from meshplan.errors import SpecError
from meshplan.frameworks.hf import model_from_hf

FIXTURES = sorted(p.parent for p in Path(__file__).with_name("hf_configs").glob("*/config.json"))
ARCHITECTURES = {"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3", "gpt_oss", "gemma",
                 "gemma2", "gemma3_text"}


def test_every_supported_architecture_has_a_fixture():
    assert {json.loads((d / "config.json").read_text())["model_type"] for d in FIXTURES} == ARCHITECTURES


@pytest.mark.parametrize("name", ["deepseek-v3", "gpt-oss-120b", "mixtral-8x7b"])
def test_a_config_json_gives_the_catalog_model_of_the_same_architecture(name):
    spec = load_model(str(Path(__file__).with_name("hf_configs") / name / "config.json"))
    assert param_counts(spec).total == param_counts(load_model(name)).total + (
        36 * (128 + 64) if name == "gpt-oss-120b" else 0)  # the catalog's GPT-OSS leaves out router biases and sinks


def test_what_meshplan_cannot_model_is_an_error_naming_the_key():
    with pytest.raises(SpecError, match=r"model\.mlp_only_layers"):
        model_from_hf({"model_type": "qwen3_moe", "num_hidden_layers": 4, "mlp_only_layers": [2]})
    with pytest.raises(SpecError, match=r"model\.layer_types"):
        model_from_hf({"model_type": "gpt_oss", "num_hidden_layers": 4,
                       "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]})
    with pytest.raises(SpecError, match=r"model\.model_type"):
        model_from_hf({"model_type": "mamba"})


@pytest.mark.slow
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_parameter_count_equals_the_model_transformers_builds(path):
    transformers = require("transformers")
    torch = require("torch")
    config = transformers.AutoConfig.from_pretrained(str(path))  # its own config class reads the file
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for p in model.parameters())
    spec = load_model(str(path / "config.json"))
    assert param_counts(spec).total == expected
