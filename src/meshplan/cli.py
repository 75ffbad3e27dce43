"""The `meshplan` command: the parser of every subcommand (meshplan.commands, the validation's, the
frameworks', the harness's and the web page's) and the one place errors become a line and an exit status.

Exit status: 0 done; 1 a check failed (crosscheck, validate thresholds) or a file could not be written;
2 bad input (one line on stderr naming the field and what is allowed, no traceback); 70 an internal error
(one line; MESHPLAN_DEBUG=1 shows the traceback); 130 interrupted (Ctrl-C); 143 terminated (SIGTERM).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from typing import Any

from meshplan.commands.common import (  # noqa: F401  (the defaults, as the harness and tests read them)
    DEFAULT_BATCH_TOKENS,
    DEFAULT_CLUSTER,
    DEFAULT_MODEL,
    DEFAULT_NODES,
    DEFAULT_SEQ_LEN,
    Parser,
    add_scenario,
)
from meshplan.errors import SpecError
from meshplan.fileio import WriteError

COMMANDS = ("plan", "evaluate", "compare", "sweep", "report", "frameworks", "catalog")
"""meshplan.commands modules, in the order --help lists them."""
OPTIONAL_COMMANDS = ("meshplan.harness.crosscheck_cli", "meshplan.harness.measure_cli", "meshplan.web.command")
"""Commands whose module may be absent or need an extra: they import it only when they run, and say how to
install it."""
MAX_ERROR_CHARS = 2000
"""The longest error line the command prints."""


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="meshplan", description="Plan how to parallelise transformer training on a GPU cluster.")
    sub = p.add_subparsers(dest="command", parser_class=Parser)
    for name in COMMANDS:
        importlib.import_module(f"meshplan.commands.{name}").register(sub)
    from meshplan.validation.command import register as register_validate

    register_validate(sub)
    for name in OPTIONAL_COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise
            continue
        module.register(sub, add_scenario)
    return p


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that the work unwinds (workers killed, no partial file)."""


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated


def _fail(message: str, code: int) -> int:
    """One line on stderr (cut to MAX_ERROR_CHARS), and the exit status."""
    line = " ".join(message.split())
    if len(line) > MAX_ERROR_CHARS:
        line = line[:MAX_ERROR_CHARS - 30] + f"... ({len(line):,} characters)"
    print(f"meshplan: {line}", file=sys.stderr)
    return code


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        args = parser.parse_args(["plan", *(argv or [])])
    from meshplan.distributed import on_ray

    with on_ray(getattr(args, "ray", None)):  # --ray: the independent work on Ray (meshplan.distributed)
        return int(args.func(args))


def main(argv: list[str] | None = None) -> int:
    """Run one command; the exit status of the module docstring."""
    in_main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, _terminate) if in_main else None
    try:
        return _run(argv)
    except SpecError as exc:
        return _fail(f"error: {exc}", 2)
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Terminated:
        return _fail("terminated", 143)
    except WriteError as exc:
        return _fail(f"error: {exc}", 1)
    except OSError as exc:  # a file the checks before the work could not foresee (a read-only file system)
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"error: {where}{exc.strerror or exc}", 1)
    except (RecursionError, MemoryError) as exc:
        return _fail(f"error: the input is too large or nested too deeply ({type(exc).__name__})", 2)
    except Exception as exc:  # a bug: one line, the traceback on request
        if os.environ.get("MESHPLAN_DEBUG"):
            raise
        return _fail(f"internal error: {type(exc).__name__}: {exc} (set MESHPLAN_DEBUG=1 for the traceback, and "
                     "please report it)", 70)
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


if __name__ == "__main__":
    sys.exit(main())
