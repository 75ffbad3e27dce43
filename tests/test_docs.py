"""Every command the documentation shows runs.

Each fenced block marked ```console in README.md and docs/*.md is one case: its lines that start with
``$ `` are run in order, with bash, in a fresh folder holding copies of the repository's examples/, docs/,
benchmarks/, tests/, src/ and pyproject.toml (commands may refer to them) and, where the published runs lie beside the
repository, ``../shared`` (MESHPLAN_PUBLISHED_RUNS names another copy of published_runs.csv). A command
must exit 0, or the status a trailing ``# exit N`` comment gives, within COMMAND_TIMEOUT_S, and print no
traceback. A trailing ``# needs ...`` comment says what else it needs:
- ``# needs GPUs`` or ``# needs several nodes``: hardware; the command is not run;
- ``# needs MODULE`` (a Python module): skipped where it is not installed.
Commands that need an optional extra are recognised without a comment too (EXTRA_COMMANDS). With
MESHPLAN_REQUIRE_EXTRAS=1 a missing extra fails the case instead of skipping it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHARED = ROOT.parent / "shared"
COMMAND_TIMEOUT_S = 300
COPIED = ("examples", "docs", "benchmarks", "tests", "src")
"""The repository's folders a documented command may read, copied into its working folder (with
pyproject.toml, so that a documented ``pytest`` runs as in the repository)."""
HARDWARE = ("GPUs", "several nodes")
"""What a ``# needs`` comment may name that no test machine has: such commands are shown, not run."""
EXTRA_COMMANDS = {
    "torch": (r"\bmeshplan crosscheck\b", r"\bmeshplan measure (gemm|collectives|step|moe)\b", r"\btorchrun\b",
              r"-m meshplan\.harness\."),
    "matplotlib": (r"--plot\b",),
    "starlette": (r"\bmeshplan serve\b",),
    "uvicorn": (r"\bmeshplan serve\b",),
}
"""The optional extras' modules, by the commands that need them (a ``# needs MODULE`` comment adds others)."""
REQUIRE_EXTRAS = os.environ.get("MESHPLAN_REQUIRE_EXTRAS") == "1"


@dataclass
class Command:
    line: int
    text: str
    status: int = 0
    needs: list[str] = field(default_factory=list)


@dataclass
class Block:
    path: Path
    line: int
    commands: list[Command]

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


_COMMENT = re.compile(r"\s+#\s*(exit\s+(\d+)|needs\s+(.+?))\s*$")


def parse_command(text: str, line: int) -> Command:
    """A ``$ `` line's command, its expected status and what it needs, from its trailing comment."""
    cmd = Command(line, text)
    m = _COMMENT.search(text)
    if m:
        cmd.text = text[:m.start()]
        if m.group(2) is not None:
            cmd.status = int(m.group(2))
        else:
            cmd.needs.append(m.group(3))
    for module, patterns in EXTRA_COMMANDS.items():
        if any(re.search(p, cmd.text) for p in patterns) and module not in cmd.needs:
            cmd.needs.append(module)
    return cmd


def console_blocks(path: Path) -> list[Block]:
    """The ```console blocks of a Markdown file, each with its ``$ `` commands (a line ending in a backslash
    continues on the next)."""
    blocks: list[Block] = []
    current: Block | None = None
    pending = ""
    for i, raw in enumerate(path.read_text().splitlines(), start=1):
        stripped = raw.strip()
        if current is None:
            if stripped.startswith("```console"):
                current = Block(path, i, [])
            continue
        if stripped.startswith("```"):
            blocks.append(current)
            current = None
            continue
        if pending or stripped.startswith("$ "):
            text = (pending + " " + stripped if pending else stripped[2:]).strip()
            if text.endswith("\\"):
                pending = text[:-1]
                continue
            pending = ""
            current.commands.append(parse_command(text, i))
    return blocks


BLOCKS = [b for path in DOCS if path.is_file() for b in console_blocks(path) if b.commands]


def _missing(need: str) -> tuple[str, str] | None:
    """Why ``need`` (a ``# needs`` argument or an extra's module) is not met here, as (kind, reason): kind
    'hardware' or 'extra'; None where it is met."""
    if need in HARDWARE:
        return "hardware", f"needs {need}"
    if re.fullmatch(r"[A-Za-z_][\w.]*", need) and importlib.util.find_spec(need.split(".")[0]) is None:
        return "extra", f"needs the Python module {need} (an optional extra)"
    return None


def _workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    for name in COPIED:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, work / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc",
                                                                                    "*.egg-info"))
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    runs = os.environ.get("MESHPLAN_PUBLISHED_RUNS")
    if runs and Path(runs).is_file():
        (tmp_path / "shared" / "data").mkdir(parents=True)
        (tmp_path / "shared" / "data" / "published_runs.csv").symlink_to(Path(runs).resolve())
    elif SHARED.is_dir():
        (tmp_path / "shared").symlink_to(SHARED.resolve())
    return work


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("MESHPLAN_DEBUG", None)
    return env


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_documented_commands_run(block: Block, tmp_path: Path):
    work = _workdir(tmp_path)
    skipped = []
    for cmd in block.commands:
        where = f"{block.path.relative_to(ROOT)}:{cmd.line}: $ {cmd.text}"
        missing = [m for m in map(_missing, cmd.needs) if m]
        if "../shared" in cmd.text and not (tmp_path / "shared").exists():
            missing.append(("data", "needs ../shared/data/published_runs.csv beside the repository"))
        if missing:
            reasons = "; ".join(reason for _, reason in missing)
            if REQUIRE_EXTRAS and any(kind == "extra" for kind, _ in missing):
                pytest.fail(f"{where}: {reasons} (MESHPLAN_REQUIRE_EXTRAS=1)")
            skipped.append(f"{where} ({reasons})")
            continue
        try:
            done = subprocess.run(["bash", "-c", cmd.text], cwd=work, env=_env(), capture_output=True, text=True,
                                  timeout=COMMAND_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{where}: still running after {COMMAND_TIMEOUT_S} s")
        assert done.returncode == cmd.status, (f"{where}: exit {done.returncode}, expected {cmd.status}\n"
                                               f"{done.stderr[-2000:]}")
        assert "Traceback" not in done.stderr, f"{where}: printed a traceback\n{done.stderr[-2000:]}"
    if skipped and len(skipped) == len(block.commands):
        pytest.skip("; ".join(skipped))


def test_console_blocks_are_found():
    """The parser sees the documentation's commands (a renamed fence or a lost ``$ `` would hide them)."""
    assert len(BLOCKS) >= 20
    assert sum(len(b.commands) for b in BLOCKS) >= 50


def test_parse_command_reads_the_trailing_comment():
    assert parse_command("meshplan evaluate --plan tp=3  # exit 2", 1).status == 2
    c = parse_command("meshplan measure step --nproc 8 --plan dp_shard=8  # needs GPUs", 1)
    assert c.text == "meshplan measure step --nproc 8 --plan dp_shard=8" and c.needs == ["GPUs", "torch"]
    assert parse_command("meshplan report --out r", 1).needs == []  # the HTML report needs no matplotlib
    assert parse_command("meshplan sweep --vary gpus=8..64 --plot s.png", 1).needs == ["matplotlib"]
    assert parse_command("meshplan evaluate --plan 'layout=Et*4|(t*4|)*14tmL'", 1).needs == []


def test_every_page_is_in_the_index():
    """docs/README.md links every page of docs/, so that a reader finds it."""
    index = (ROOT / "docs" / "README.md").read_text()
    pages = [p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"]
    assert [p for p in pages if f"]({p})" not in index] == []


def test_pages_say_what_they_are_for():
    """Each page opens with a title and, before any section, a paragraph saying what it holds."""
    for path in (ROOT / "docs").glob("*.md"):
        lines = path.read_text().splitlines()
        assert lines[0].startswith("# "), path.name
        first = next(line for line in lines[1:] if line.strip())
        assert not first.startswith(("#", "```", "|", "-")), f"{path.name} opens with {first!r}"
