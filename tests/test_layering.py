"""The import direction of docs/architecture.md, checked on the source: every module of src/meshplan imports
only from its own layer or the layers below it (function-level imports included), no two modules import
each other round a circle, no two packages of one layer import each other both ways, and torch is imported
only in the harness. A new top-level module or package must be placed in LAYERS before it can pass.

Run: pytest -q tests/test_layering.py
"""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "meshplan"

LAYERS = (
    # bottom to top: a unit (a top-level module or package of meshplan) imports from its layer and below
    ("foundation", {"errors", "units", "memo", "references", "parallel", "progress", "extras", "fileio",
                    "argtypes"}),
    ("specs", {"specs"}),
    ("catalog", {"catalog"}),
    ("cost", {"cost"}),
    ("calibration", {"calibration"}),
    ("timeline, bands and profiles", {"sim", "uncertainty", "profile"}),
    ("search", {"search"}),
    ("analysis", {"explain", "validation", "economics", "frameworks"}),
    ("reports", {"report"}),
    ("commands", {"cli", "compare", "web", "harness"}),
)
"""The layers of docs/architecture.md, bottom to top."""

ALLOWED = {
    ("meshplan.cost.step", "meshplan.calibration"):
        "evaluate() loads the calibrated compute parameters when its caller gives none (lazily, at call time)",
}
"""Imports against the layering that are allowed, with the reason: (importing module, imported unit)."""

FACADE = "meshplan"
"""The package's own __init__: the public API, which re-exports from every layer."""


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(module: str) -> list[tuple[str, int]]:
    """Every meshplan module or package ``module`` imports (at any depth of its code), with the line."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "meshplan"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            if base.split(".")[0] != "meshplan":
                continue
            for a in node.names:  # `from meshplan.cost import memory` imports the module meshplan.cost.memory
                name = f"{base}.{a.name}"
                out.append((name if name in MODULES else base, node.lineno))
    return out


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else FACADE


def _layer_of(unit: str) -> int | None:
    return next((i for i, (_, units) in enumerate(LAYERS) if unit in units), None)


def test_every_unit_has_a_layer():
    units = {_unit(m) for m in MODULES} - {FACADE}
    missing = sorted(u for u in units if _layer_of(u) is None)
    assert not missing, (f"meshplan.{missing[0]} is in no layer: place it in tests/test_layering.py LAYERS and "
                         "docs/architecture.md")


def test_imports_go_down_the_layers():
    wrong = []
    for module in MODULES:
        if module == FACADE:
            continue
        mine = _layer_of(_unit(module))
        for target, line in _imports(module):
            theirs = _layer_of(_unit(target)) if target != FACADE else len(LAYERS)
            if mine is not None and theirs is not None and theirs > mine \
                    and (module, f"meshplan.{_unit(target)}") not in ALLOWED:
                wrong.append(f"{MODULES[module].relative_to(SRC.parent)}:{line}: {module} ({LAYERS[mine][0]}) imports "
                             f"{target} ({LAYERS[theirs][0] if theirs < len(LAYERS) else 'the public facade'})")
    assert not wrong, "imports against the layering (docs/architecture.md):\n" + "\n".join(wrong)


def test_packages_of_a_layer_do_not_import_each_other_both_ways():
    edges = {(_unit(m), _unit(t)) for m in MODULES if m != FACADE for t, _ in _imports(m)}
    both = sorted((a, b) for a, b in edges if a < b and (b, a) in edges and _layer_of(a) == _layer_of(b))
    assert not both, f"meshplan.{both[0][0]} and meshplan.{both[0][1]} import each other"


def test_no_module_imports_round_a_circle():
    graph = {m: {t for t, _ in _imports(m) if t in MODULES and t != m} for m in MODULES if m != FACADE}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, f"modules that import each other round a circle: {circles}"


def test_torch_is_imported_only_in_the_harness():
    outside = []
    for module, path in MODULES.items():
        if _unit(module) == "harness":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            outside += [f"{module}:{node.lineno}" for n in names if n.split(".")[0] == "torch"]
    assert not outside, f"torch imported outside meshplan.harness: {outside}"


@pytest.mark.parametrize(("source", "expected"), [
    ("from meshplan.search.search import search\n", "meshplan.search.search"),
    ("from meshplan.cost import memory as mem\n", "meshplan.cost.memory"),
    ("def f():\n    import meshplan.report.text\n", "meshplan.report.text"),
])
def test_the_scan_sees_every_kind_of_import(tmp_path, monkeypatch, source, expected):
    path = tmp_path / "probe.py"
    path.write_text(source)
    monkeypatch.setitem(MODULES, "meshplan.cost.probe", path)
    assert [t for t, _ in _imports("meshplan.cost.probe")] == [expected]
