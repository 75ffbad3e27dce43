"""``meshplan serve``: the command (registered by meshplan.cli from this module's ``register``). It imports
neither Starlette nor uvicorn until it runs, and says how to install the ``web`` extra where they are missing.
"""

from __future__ import annotations

import argparse
import ipaddress
from typing import Any

from meshplan.errors import SpecError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
SCENARIO_FLAGS = ("model", "cluster", "nodes", "gpus_per_node", "inter_node_bandwidth", "batch_tokens", "seq_len",
                  "job")
"""The scenario flags serve reads (the page opens on that scenario); --mfu and --json it refuses."""


def register(sub: Any, add_scenario: Any) -> None:
    """Add ``serve`` to the ``meshplan`` command's subparsers; ``add_scenario`` adds the scenario flags."""
    from meshplan.argtypes import positive_float, whole_in

    p = sub.add_parser("serve", help="a local web page for what-if planning (needs the web extra)",
                       description="Serve a what-if planning page on this machine. Without flags the page opens "
                                   "on the worked example; scenario flags choose the scenario it opens on.")
    add_scenario(p)
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}: this machine only)")
    p.add_argument("--port", type=whole_in(1, 65535), default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--workers", type=whole_in(1, 64), default=None,
                   help="searches run at once, each in its own process (default: the cores available, at most 4)")
    p.add_argument("--time-limit", type=positive_float, default=60.0, metavar="S",
                   help="seconds a search may take before it is stopped (default 60; the conditions of change "
                        "get five times as long)")
    p.add_argument("--cache", type=whole_in(0, 10_000), default=64, metavar="N",
                   help="answers kept for identical requests (default 64; 0 keeps none)")
    p.set_defaults(func=cmd_serve, parser=p)


def _initial_scenario(args: argparse.Namespace) -> dict[str, Any]:
    """The page's opening scenario from the scenario flags: catalog names as they are, and a model or job
    spec file (read here, by the person starting the server) sent to the page as the document's text."""
    from pathlib import Path

    from meshplan.catalog import list_accelerators, list_models
    from meshplan.web.scenario import DEFAULTS, normalise

    s: dict[str, Any] = dict(DEFAULTS)
    if args.model in list_models():
        s["model"] = args.model
    else:
        path = Path(args.model)
        if not path.is_file():
            raise SpecError("model", f"unknown name {args.model!r}; catalog has: {', '.join(list_models())} "
                                     "(or give a path to a .toml spec file)")
        s["model_spec"] = {"format": "json" if path.suffix == ".json" else "toml",
                           "text": path.read_text(encoding="utf-8"), "name": path.name}
    if args.cluster not in list_accelerators():
        raise SpecError("cluster", f"serve takes a catalog accelerator ({', '.join(list_accelerators())}); the "
                                   "page sets nodes, GPUs per node and inter-node bandwidth")
    s["accelerator"] = args.cluster
    for key, value in (("nodes", args.nodes), ("gpus_per_node", args.gpus_per_node),
                       ("inter_node_gb_per_s", args.inter_node_bandwidth), ("batch_tokens", args.batch_tokens),
                       ("seq_len", args.seq_len)):
        if value is not None:
            s[key] = value
    if args.job:
        path = Path(args.job)
        if not path.is_file():
            raise SpecError("job", f"spec file {args.job!r} not found")
        s["job_spec"] = {"format": "json" if path.suffix == ".json" else "toml",
                         "text": path.read_text(encoding="utf-8"), "name": path.name}
    s = normalise(s)
    from meshplan.web.scenario import build

    built = build(s)  # a bad spec is said now, on the command line, not in the page
    if args.job:  # the page's controls start at the job file's values (its controls win over the file)
        s.update(batch_tokens=args.batch_tokens or built.job.global_batch_tokens,
                 seq_len=args.seq_len or built.job.seq_len, optimizer=built.job.optimizer,
                 precision=built.job.precision, software=built.job.software)
    return s


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cmd_serve(args: argparse.Namespace) -> int:
    from meshplan.argtypes import reject_unused
    from meshplan.extras import require

    require("starlette", "web", "serve")
    require("uvicorn", "web", "serve")
    reject_unused(args, args.parser, SCENARIO_FLAGS, "serve")
    import uvicorn

    from meshplan.parallel import available_cores
    from meshplan.web.app import LOOPBACK_HOSTS, Config, create_app

    loopback = _is_loopback(args.host)
    config = Config(workers=args.workers or max(1, min(4, available_cores())), time_limit_s=args.time_limit,
                    conditions_time_limit_s=5 * args.time_limit, defaults=_initial_scenario(args),
                    cache_entries=args.cache,
                    allowed_hosts=(*LOOPBACK_HOSTS, args.host) if loopback else ("*",))
    shown = f"[{args.host}]" if ":" in args.host else args.host
    workers = f"{config.workers} search worker" + ("s" if config.workers != 1 else "")
    print(f"meshplan serve: http://{shown}:{args.port}/  ({workers}, {config.time_limit_s:g} s limit per search; "
          "Ctrl-C stops)", flush=True)
    if not loopback:
        print("meshplan serve: listening beyond this machine: anyone who can reach this port can run searches "
              "(there is no login)", flush=True)
    uvicorn.run(create_app(config), host=args.host, port=args.port, log_level="warning", server_header=False,
                timeout_keep_alive=5, limit_concurrency=256)
    return 0
