"""The calibration files read part by part (``calibration._table``, which a prediction uses so that the first
evaluation in a process does not parse the stored fold fits) hold what the whole file holds."""

from __future__ import annotations

import pytest

from meshplan import calibration
from meshplan.calibration import _load, _sections, _table


@pytest.mark.parametrize("name", ["default", "fitted"])
def test_each_part_is_what_the_whole_file_holds(name: str) -> None:
    whole = _load(name)
    assert whole, f"catalog/calibration/{name}.toml is missing or empty"
    tables = {k for k, v in whole.items() if isinstance(v, dict)}
    keys = {k.strip('"') for k in _sections(name)} - {""}
    assert keys == tables
    for key in tables:
        assert _table(name, key) == whole[key], key
    assert _table(name, "") == {k: v for k, v in whole.items() if k not in tables}


def test_compute_params_read_from_the_parts_equal_those_from_the_whole_file() -> None:
    fitted = _load("fitted")
    for accelerator in ("h100-sxm", "h200", "a100-80gb", "b200", "gb300", "mi300x"):
        for software in ("generic", "megatron", "torchtitan", "llm-foundry", "maxtext"):
            tables = [_load("default"), fitted.get("global", {}),
                      fitted.get("accelerator", {}).get(calibration.family(accelerator), {}),
                      fitted.get("software", {}).get(software, {}),
                      fitted.get("stack", {}).get(calibration.stack_key(software, accelerator), {})]
            expected = calibration.params_from(tables, str(fitted.get("source", "fitted")))
            assert calibration.compute_params_for(accelerator, software) == expected
