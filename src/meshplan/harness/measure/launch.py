"""Start a measurement on this machine's processes under torchrun, relay their output, stop them on a
timeout, and report the first rank that failed in one line (``meshplan measure ... --nproc N``).

Each rank runs ``python -m meshplan.harness.measure_worker`` (WORKER_MODULE), which reports a failure by
writing ``rank<R>.txt`` into the folder named by ERRDIR_ENV.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

WORKER_MODULE = "meshplan.harness.measure_worker"


ERRDIR_ENV = "MESHPLAN_MEASURE_ERRDIR"


_LAUNCH_GRACE_S = 30.0


_MIN_GRACE_S = 10.0


def forward_argv(args: argparse.Namespace) -> list[str]:
    """The command-line flags of ``args`` that differ from their defaults, minus ``--nproc``."""
    parser: argparse.ArgumentParser = args._parser
    out: list[str] = []
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help", "nproc"):
            continue
        value = getattr(args, action.dest, None)
        if value is None or value == action.default:
            continue
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            out.append(flag)
        elif isinstance(value, tuple):
            out += [flag, ",".join(map(str, value))]
        else:
            out += [flag, str(value)]
    return out


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc; empty elsewhere). torchrun starts each worker in a
    session of its own, so killing torchrun's process group does not reach them."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _stop(proc: subprocess.Popen) -> None:
    """Stop torchrun and every worker it started: SIGTERM, then SIGKILL whatever is left after 5 s."""
    pids = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)
    for pid in [proc.pid, *pids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    proc.wait()


def _rank_errors(errdir: Path) -> list[tuple[int, int, str]]:
    """(rank, exit code, message) of every rank that failed, the first to fail first (the root cause;
    the others usually fail because it left)."""
    out = []
    for f in errdir.glob("rank*.txt"):
        try:
            code, line = f.read_text().split("\n", 1)
            out.append((f.stat().st_mtime_ns, int(f.stem[4:]), int(code), line.strip()))
        except ValueError:
            continue
    return [(rank, code, line) for _, rank, code, line in sorted(out)]


_TORCHRUN_LOG = re.compile(r"^[DIWE]\d{4} \d\d:\d\d:\d\d|^USDT:")


def _relay(stream: Any, out: Any, *, everything: bool) -> None:
    """Copy the workers' stderr to ``out`` line by line, leaving out torchrun's own log lines, its
    tracebacks and its failure report (meshplan prints one line instead); ``everything`` keeps all."""
    held: list[str] = []
    state = "pass"  # 'traceback': holding a traceback; 'report': inside torchrun's ==== failure report
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        if everything:
            out.write(line)
        elif state == "report":
            if line.startswith("===="):
                state = "pass"
        elif state == "traceback":
            held.append(line)
            if line.strip() and not line[0].isspace() and not line.startswith("Traceback"):
                if "torch.distributed.elastic" not in line:
                    out.write("".join(held))
                held, state = [], "pass"
        elif line.startswith("Traceback (most recent call last)"):
            held, state = [line], "traceback"
        elif line.startswith("===="):
            state = "report"
        elif not _TORCHRUN_LOG.match(line):
            out.write(line)
        out.flush()
    if held:
        out.write("".join(held))


def launch(args: argparse.Namespace) -> int:
    """Run this measurement on ``args.nproc`` local processes under torchrun; one clear line on failure."""
    sub, n = args.measure_command, args.nproc
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
           "-m", WORKER_MODULE, sub, *forward_argv(args)]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    grace_s = max(_MIN_GRACE_S, min(_LAUNCH_GRACE_S, args.timeout / 2))  # start-up and a rank's own timeout
    limit_s = args.timeout + grace_s
    with tempfile.TemporaryDirectory(prefix="meshplan-measure-") as tmp:
        env[ERRDIR_ENV] = tmp
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, stderr=subprocess.PIPE)
        relay = threading.Thread(target=_relay, args=(proc.stderr, sys.stderr),
                                 kwargs={"everything": bool(os.environ.get("MESHPLAN_DEBUG"))}, daemon=True)
        relay.start()
        try:
            rc = proc.wait(timeout=limit_s)
            relay.join(timeout=5.0)
        except subprocess.TimeoutExpired:
            _stop(proc)
            print(f"meshplan: error: measure {sub} did not finish within {limit_s:g} s (--timeout {args.timeout:g} "
                  f"plus {grace_s:g} s); stopped its {n} processes", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            _stop(proc)
            print(f"meshplan: error: measure {sub} interrupted; stopped its {n} processes", file=sys.stderr)
            return 130
        if rc == 0:
            return 0
        errors = _rank_errors(Path(tmp))
    if errors:
        rank, code, line = errors[0]
        print(f"meshplan: error: measure {sub} failed on rank {rank} of {n}: {line}", file=sys.stderr)
        return code if code in (1, 2) else 1
    print(f"meshplan: error: measure {sub} failed: torchrun exited with status {rc} (a rank died; its output is "
          "above)", file=sys.stderr)
    return 1
