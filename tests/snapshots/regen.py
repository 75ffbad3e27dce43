"""Rewrite the behaviour snapshot: ``python -m tests.snapshots.regen [NAME ...]`` (every case by default).

Only for a deliberate change of what meshplan predicts or prints, named in the commit that carries the new
files (README.md in this folder). A case that cannot run here (no published runs beside the checkout, no
torch, stored fold fits that no longer match) is left as it is, with the reason.
"""

from __future__ import annotations

import sys

from tests.snapshots.cases import CASES, dumps


def main(names: list[str]) -> int:
    unknown = set(names) - {c.name for c in CASES}
    if unknown:
        print(f"unknown case(s) {sorted(unknown)}; cases: {', '.join(c.name for c in CASES)}", file=sys.stderr)
        return 2
    for case in CASES:
        if names and case.name not in names:
            continue
        out = case.make(case.argv)
        if isinstance(out, str) and not case.path.name.endswith(".txt.gz"):
            print(f"{case.name}: left as it is ({out})", file=sys.stderr)
            continue
        data = dumps(out)
        changed = not case.path.exists() or case.path.read_bytes() != data
        if changed:
            case.path.write_bytes(data)
        print(f"{case.name}: {'rewritten' if changed else 'unchanged'} ({case.path.name}, {len(data):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
