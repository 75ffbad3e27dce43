"""The calibration files read part by part (``calibration._table``, which a prediction uses so that the first
evaluation in a process does not parse the stored fold fits) hold what the whole file holds."""

from __future__ import annotations

import re
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


_BARE = st.text("abcdefghijklmnopqrstuvwxyz_-0123456789", min_size=1, max_size=12)
_VALUES = st.one_of(st.integers(-10**12, 10**12), st.floats(allow_nan=False, allow_infinity=False),
                    st.text(st.characters(blacklist_characters="'\"\\\n\r", blacklist_categories=("Cs", "Cc")),
                            max_size=20))


def _toml_value(v: object) -> str:
    if isinstance(v, str):
        return f"'{v}'"
    return repr(v) if isinstance(v, int) else f"{v:.6g}" if abs(v) > 1e-300 or v == 0 else repr(v)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_BARE, _VALUES, max_size=4),
       st.dictionaries(_BARE, st.dictionaries(_BARE, _VALUES, max_size=4), max_size=3),
       st.booleans())
def test_the_fast_reader_reads_what_tomllib_reads(top: dict, tables: dict, comments: bool) -> None:
    """calibration.flat_toml, which reads the calibration files' subset without the general parser, gives
    tomllib's tables wherever it reads a text, and leaves the rest (None) to tomllib."""
    lines = ["# a comment"] if comments else []
    lines += [f"{k} = {_toml_value(v)}" for k, v in top.items()]
    for name, table in tables.items():
        quoted = f'"{name}/x"' if comments else name
        lines += ["", f"[section.{quoted}]"] + [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    text = "\n".join(lines) + "\n"
    try:
        expected = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        assert calibration.flat_toml(text) is None  # e.g. a key of the top table named 'section'
        return
    got = calibration.flat_toml(text)
    assert got is None or got == expected


@pytest.mark.parametrize("text", [
    "x = [1, 2]\n", "x = 1 # note\n", "a.b = 1\n", "x = 1_000\n", "x = inf\n", "x = 'a\\b'\n", 'x = "a\\"b"\n',
    "x = 1\nx = 2\n", "[a]\n[a]\n", "x = 01\n", "x = 1.\n", "x = true\n", "x = '''a'''\n",
    # TOML's line breaks and spaces, not Python's; control characters
    "# note\u2028x = 1\n", "# note\x85x = 1\n", "a = 1\rb = 2\n", "a = 1\x0bb = 2\n", "a = 1\r", "a = 1\r\nb = 2\r\n",
    "\xa0a = 1\n", "a\u2003= 1\n", "[\u3000a]\n", "x = 1\xa0\n", "# a\x01b\n", "# \x7f\n", "x = 'a\x01b'\n",
    'x = "a\x7fb"\n', '"a\x01" = 1\n', "x = 'a\tb'\n", "x = 'é'\n",
])
def test_the_fast_reader_reads_only_what_tomllib_reads_the_same(text: str) -> None:
    got = calibration.flat_toml(text)
    try:
        expected = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        assert got is None
        return
    assert got is None or got == expected


def _reference_sections(text: str) -> dict[str, str]:
    """The parts where a table header starts a line, found by a regular expression anchored at line starts."""
    header = re.compile(r'^\[\s*("[^"]*"|[^\s.\]]+)', re.MULTILINE)
    parts: dict[str, list[str]] = {}
    starts = [(m.start(), m.group(1)) for m in header.finditer(text)]
    for (begin, key), end in zip([(0, ""), *starts], [*(b for b, _ in starts), len(text)], strict=True):
        parts.setdefault(key, []).append(text[begin:end])
    return {key: "".join(chunks) for key, chunks in parts.items()}


@pytest.mark.parametrize("text", ["", "[a]\nx = 1", "x = 1\n[a]\ny = 2\n[b.c]\nz = 3\n",
                                  "[a]\nv = [\n  [1],\n]\n[b]\n", "\n[a]\n", '["q.r".s]\nx = 1\n[q]\n[q.t]\n',
                                  "[a]\nv = [\n[\n[1]]]\n[b]\nx=1\n"],
                         ids=["empty", "one", "nested", "array", "blank", "quoted", "array-split"])
def test_a_file_splits_into_its_tables_at_their_headers(text: str, monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path) -> None:
    """_sections splits a file where a regular expression over the whole text finds its table headers, and each
    table's part parses as the whole file's table of that name."""
    (tmp_path / "calibration").mkdir()
    (tmp_path / "calibration" / "probe.toml").write_text(text)
    monkeypatch.setattr(calibration.resources, "files", lambda _package: tmp_path)
    _sections.cache_clear()
    _table.cache_clear()
    try:
        parts = _sections("probe")
        assert parts == _reference_sections(text)
        if "[\n[1]]]" in text:  # a line of an array that the header pattern takes for a table: split where
            return  # the reference splits it, which no table of the file's parses
        whole = tomllib.loads(text)
        for key in parts:
            if key:
                assert _table("probe", key) == whole[key.strip('"')]
    finally:
        _sections.cache_clear()
        _table.cache_clear()
