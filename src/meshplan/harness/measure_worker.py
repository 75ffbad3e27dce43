"""The process torchrun starts for ``meshplan measure``: ``python -m meshplan.harness.measure_worker
{gemm,collectives,step,moe} [flags]`` takes the flags of ``meshplan measure`` (docs/measure-and-crosscheck.md).

It parses them as ``meshplan measure`` does and runs them on this rank (harness.measure.rank): every rank
joins the process group, measures, and rank 0 writes the profile and prints the summary. A rank that
fails prints one line ``meshplan: error: rank R: ...`` and exits 1 (2 for bad input); torchrun then stops
the other ranks.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point under torchrun. Every rank leaves with ``os._exit`` once its output is written and
    flushed: a failed rank because tearing down a process group whose peers are gone can block, a
    successful one because the interpreter's own teardown can abort in C++ destructors after the work is
    done ("terminate called without an active exception": gloo and profiler threads still joinable),
    which torchrun would report as a failed rank."""
    from meshplan.cli import main as cli_main

    code = cli_main(["measure", *(sys.argv[1:] if argv is None else argv)])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
