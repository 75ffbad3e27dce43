"""``meshplan crosscheck``: JSON output and exit codes, and the message when torch is missing."""

import json

from tests.conftest import requires_torch

from meshplan.cli import main


def test_missing_torch_exits_2_with_install_hint(capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    code = main(["crosscheck", "--model", "seed-70b", "--scale-down", "--plan", "dp_shard=8"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == ("meshplan crosscheck needs the torch extra: pip install torch==2.13.0 && "
                           "pip install 'meshplan[torch]'")


@requires_torch
def test_crosscheck_json_passes(capsys):
    code = main(["crosscheck", "--model", "seed-70b", "--scale-down", "--plan", "dp_shard=64", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and d["passed"] is True
    assert d["world_size"] == 64 and d["n_micro"] == 2
    assert {(r["collective"], r["axis"]) for r in d["rows"]} == {("all_gather", "dp_shard"),
                                                                ("reduce_scatter", "dp_shard")}


@requires_torch
def test_crosscheck_text_and_unsupported_plan(capsys):
    code = main(["crosscheck", "--model", "llama-3-8b", "--scale-down", "--plan", "tp=4,dp_shard=2,recompute=full"])
    out = capsys.readouterr().out
    assert code == 0 and "PASS" in out
    code = main(["crosscheck", "--model", "seed-70b", "--scale-down", "--plan", "pp=2,dp_shard=4"])
    assert code == 2 and "pp" in capsys.readouterr().err


@requires_torch
def test_full_size_model_needs_scale_down(capsys):
    code = main(["crosscheck", "--model", "seed-70b", "--plan", "dp_shard=8"])
    assert code == 2 and "--scale-down" in capsys.readouterr().err
