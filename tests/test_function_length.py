"""No function in src/ longer than MAX_LINES (docs/architecture.md, "Size"): a longer one is split into the
steps or questions it is made of. Tables (data laid out as code) may be listed in ALLOWED with the reason."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 80
"""Lines from ``def`` to the function's last line, docstring included, decorators not."""

ALLOWED_FILES = {
    "meshplan/cli.py": "being rewritten; to be cleared",
    "meshplan/fileio.py": "being rewritten; to be cleared",
    "meshplan/argtypes.py": "being rewritten; to be cleared",
}
"""Files not checked yet, with the reason."""
ALLOWED = {}
"""Functions allowed to be longer, as "path:qualified name": reason (a table, for instance)."""


def _long_functions() -> list[tuple[str, int]]:
    out = []
    for path in sorted((SRC / "meshplan").rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in ALLOWED_FILES:
            continue

        def visit(node: ast.AST, prefix: str, rel: str = rel) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    name = f"{prefix}{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        lines = child.end_lineno - child.lineno + 1
                        if lines > MAX_LINES and f"{rel}:{name}" not in ALLOWED:
                            out.append((f"{rel}:{name}", lines))
                    visit(child, f"{name}.")

        visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return out


def test_no_function_is_longer_than_the_limit():
    long = _long_functions()
    assert not long, (f"functions over {MAX_LINES} lines (split them, or list a table in ALLOWED): "
                      + ", ".join(f"{name} ({n} lines)" for name, n in long))


def test_the_allowances_name_what_exists():
    for rel in ALLOWED_FILES:
        assert (SRC / rel).is_file(), f"ALLOWED_FILES names {rel}, which is gone: clear it"
    for key in ALLOWED:
        assert (SRC / key.partition(":")[0]).is_file(), f"ALLOWED names {key}, whose file is gone: clear it"
