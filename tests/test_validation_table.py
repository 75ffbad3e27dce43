"""docs/validation.md's generated tables are what `meshplan validate ../shared/data/published_runs.csv --json
--by-source` and the catalog's calibration give now (python -m meshplan.validation.table rewrites them)."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from meshplan.errors import SpecError
from meshplan.validation import table

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "validation.md"
SHARED_RUNS = Path(os.environ.get("MESHPLAN_PUBLISHED_RUNS", ROOT.parent / "shared" / "data" / "published_runs.csv"))
"""The published runs beside the repository (MESHPLAN_PUBLISHED_RUNS names another copy)."""


@pytest.mark.skipif(not SHARED_RUNS.is_file(), reason="needs ../shared/data/published_runs.csv beside the repository")
@pytest.mark.parametrize("doc", [DOC, ROOT / "README.md"], ids=["validation.md", "README.md"])
def test_generated_tables_are_current(doc):
    try:
        old, new = table.generate(str(doc), str(SHARED_RUNS))
    except table.StaleFits as exc:
        pytest.skip(f"the tables cannot be regenerated without refitting: {exc}")
    diff = "\n".join(difflib.unified_diff(old.splitlines(), new.splitlines(), doc.name, "regenerated",
                                          lineterm="", n=0))
    assert old == new, f"run python -m meshplan.validation.table to update {doc.name}:\n{diff[:4000]}"


def test_render_replaces_only_between_markers():
    doc = ("intro\n<!-- generated:a -->\nold\n<!-- /generated:a -->\nmiddle\n<!-- generated:b -->\n"
           "<!-- /generated:b -->\nend\n")
    out = table.render(doc, {"a": "| x |", "b": "B"})
    assert out == ("intro\n<!-- generated:a -->\n| x |\n<!-- /generated:a -->\nmiddle\n<!-- generated:b -->\nB\n"
                   "<!-- /generated:b -->\nend\n")
    assert table.render(out, {"a": "| x |", "b": "B"}) == out  # regenerating changes nothing
    with pytest.raises(SpecError, match="generated:c"):
        table.render(doc, {"c": "C"})


def test_table_cells_escape_pipes():
    """A plan's pipeline layout ('Et*1|(t*2|)*62t*1L') must not split a Markdown table's cell."""
    out = table._table(["plan"], [["layout=Et*1|(t*2|)*62t*1L"]])
    assert out.splitlines()[2] == "| layout=Et*1\\|(t*2\\|)*62t*1L |"


def test_every_marker_in_the_document_has_a_table():
    text = DOC.read_text()
    names = {line.split("generated:")[1].split(" ")[0] for line in text.splitlines()
             if line.startswith("<!-- generated:")}
    assert names == {"summary", "by-source", "by-gpu", "by-kind", "bands", "repeats", "largest", "parameters"}


def test_the_moe_curve_table_is_current():
    """docs/moe.md's expert-GEMM table is the model at DeepGEMM's shapes with the catalog's fit (it needs no
    published runs: python -m meshplan.validation.table --doc docs/moe.md rewrites it)."""
    doc = ROOT / "docs" / "moe.md"
    old, new = table.generate(str(doc), "unused.csv")
    assert old == new, "run python -m meshplan.validation.table --doc docs/moe.md"
    assert "| dense | 4,096 | 64% |" in new  # DeepGEMM's 1,265 TFLOP/s of 1,979
