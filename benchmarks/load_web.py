"""Load test of `meshplan serve` on loopback: concurrent clients planning different scenarios, every
answer checked against the library's own for the same scenario, latency percentiles reported.

Each client runs a what-if session: it starts from one of ten base scenarios (small to 70B models, 8 to
128 GPUs, five accelerators, both plan spaces) and steps the global batch up and down a ladder of six
values, so the clients ask for 60 different scenarios, more than the server caches by default. Every
fifth request it also loads the page, its script and the catalog; every tenth it sends a malformed
request, which must get a 4xx with an error message. A plan answer is correct when its recommendation
(plan string, step time), plan count and feasible count equal what meshplan.web.compute.plan gives in
this process.

    python benchmarks/load_web.py                       # 20 clients for 60 s, a server it starts
    python benchmarks/load_web.py --cache 0             # every request searched (no cached answers)
    python benchmarks/load_web.py --url http://127.0.0.1:8765   # a server already running (loopback only)

Traffic goes to loopback addresses only; the loops end at the deadline (and after --max-requests).
Exit status 1 if any answer was wrong or failed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BASES: list[dict[str, Any]] = [
    {"model": "llama-3.2-3b", "nodes": 1, "batch_tokens": 1 << 20, "space": "dp-tp"},
    {"model": "llama-3-8b", "nodes": 2, "batch_tokens": 1 << 21, "space": "dp-tp"},
    {"model": "llama-2-7b", "nodes": 2, "batch_tokens": 1 << 19},
    {"model": "seed-70b", "nodes": 8, "batch_tokens": 1 << 22, "space": "dp-tp"},
    {"model": "llama-3-8b", "nodes": 4, "batch_tokens": 1 << 21, "accelerator": "h200", "space": "dp-tp"},
    {"model": "llama-3.2-3b", "nodes": 2, "batch_tokens": 1 << 20, "accelerator": "a100-80gb"},
    {"model": "llama-2-13b", "nodes": 4, "batch_tokens": 1 << 21, "inter_node_gb_per_s": 12.5, "space": "dp-tp"},
    {"model": "seed-70b", "nodes": 16, "batch_tokens": 1 << 22, "accelerator": "b200", "space": "dp-tp"},
    {"model": "llama-3-70b", "nodes": 8, "batch_tokens": 1 << 22, "accelerator": "mi300x", "space": "dp-tp"},
    {"model": "llama-2-7b", "nodes": 1, "batch_tokens": 1 << 20, "seq_len": 8192},
]
LADDER = (0.25, 0.5, 1, 2, 4, 8)
"""The global batch of each base scenario times these: the what-if steps a client takes."""

MALFORMED = [  # (body, content type): each must be answered 4xx with an error message
    (b"{not json", "application/json"),
    (json.dumps({"scenario": {"nodes": 0}}).encode(), "application/json"),
    (json.dumps({"scenario": {"model": "/etc/passwd"}}).encode(), "application/json"),
    (b"scenario=1", "application/x-www-form-urlencoded"),
]


def scenarios(bases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**base, "batch_tokens": int(base["batch_tokens"] * k)} for base in bases for k in LADDER]


def digest(answer: dict[str, Any]) -> tuple[Any, ...]:
    """What a plan answer is checked on."""
    rec = answer["recommended"]
    return (rec["estimate"]["plan"]["string"] if rec else None, rec["estimate"]["step_time_s"] if rec else None,
            answer["search"]["n_plans"], answer["search"]["n_feasible"], len(answer["plans"]))


def expected_answers(items: list[dict[str, Any]], workers: int | None) -> list[tuple[Any, ...]]:
    from meshplan.parallel import parallel_map
    from meshplan.web.compute import plan
    from meshplan.web.scenario import normalise

    return parallel_map(lambda s: digest(plan(normalise(s))), items, workers)


@dataclass
class Tally:
    latencies_s: dict[str, list[float]] = field(default_factory=dict)
    cache: Counter = field(default_factory=Counter)
    wrong: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, seconds: float) -> None:
        with self.lock:
            self.latencies_s.setdefault(kind, []).append(seconds)

    def fail(self, text: str) -> None:
        with self.lock:
            self.wrong.append(text)


def client(i: int, url: str, items: list[dict[str, Any]], want: list[tuple[Any, ...]], deadline: float,
           max_requests: int, tally: Tally) -> None:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    n_bases = len(items) // len(LADDER)
    base, start, n = i % n_bases, i // n_bases, 0  # clients on one base start on different rungs
    while time.monotonic() < deadline and n < max_requests:
        n += 1
        k = base * len(LADDER) + (start + n) % len(LADDER)
        try:
            t0 = time.perf_counter()
            status, headers, body = request(conn, "POST", "/api/plan", json.dumps({"scenario": items[k]}).encode())
            tally.add("plan", time.perf_counter() - t0)
            if status != 200:
                tally.fail(f"plan {items[k]}: HTTP {status} {body[:200]!r}")
            elif digest(json.loads(body)) != want[k]:
                tally.fail(f"plan {items[k]}: {digest(json.loads(body))} != {want[k]}")
            with tally.lock:
                tally.cache[headers.get("x-meshplan-cache", "?")] += 1
            if n % 5 == 0:
                for path, least in (("/", 5000), ("/static/app.js", 10000), ("/api/catalog", 1000)):
                    t0 = time.perf_counter()
                    status, _, body = request(conn, "GET", path)
                    tally.add("page", time.perf_counter() - t0)
                    if status != 200 or len(body) < least:
                        tally.fail(f"GET {path}: HTTP {status}, {len(body)} bytes")
            if n % 10 == 0:
                body_bad, ctype = MALFORMED[(n // 10) % len(MALFORMED)]
                t0 = time.perf_counter()
                status, _, body = request(conn, "POST", "/api/plan", body_bad, ctype)
                tally.add("malformed", time.perf_counter() - t0)
                if not 400 <= status < 500 or "message" not in json.loads(body).get("error", {}):
                    tally.fail(f"malformed {body_bad[:40]!r}: HTTP {status} {body[:200]!r}")
        except (OSError, http.client.HTTPException, json.JSONDecodeError) as exc:
            tally.fail(f"client {i}: {exc!r}")
            conn.close()
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    conn.close()


def request(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None,
            ctype: str = "application/json") -> tuple[int, dict[str, str], bytes]:
    headers = {"content-type": ctype} if body is not None else {}
    conn.request(method, path, body=body, headers=headers)
    r = conn.getresponse()
    data = r.read()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, data


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run(url: str, *, clients: int, duration_s: float, max_requests: int, bases: list[dict[str, Any]] | None = None,
        expected_workers: int | None = None, log=print) -> dict[str, Any]:
    host = urllib.parse.urlsplit(url).hostname
    if host not in ("127.0.0.1", "localhost", "::1") and not (host or "").startswith("127."):
        raise SystemExit(f"load_web: loopback addresses only, not {host!r}")
    items = scenarios(bases or BASES)
    t0 = time.perf_counter()
    want = expected_answers(items, expected_workers)
    log(f"expected answers for {len(items)} scenarios computed in-process in {time.perf_counter() - t0:.1f} s")
    tally = Tally()
    deadline = time.monotonic() + duration_s
    threads = [threading.Thread(target=client, args=(i, url, items, want, deadline, max_requests, tally), daemon=True)
               for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    summary: dict[str, Any] = {"clients": clients, "duration_s": duration_s, "wall_s": wall,
                               "scenarios": len(items), "wrong": len(tally.wrong), "first_wrong": tally.wrong[:5],
                               "plan_answers": dict(tally.cache)}
    for kind, lat in sorted(tally.latencies_s.items()):
        summary[kind] = {"requests": len(lat), "p50_s": statistics.median(lat), "p95_s": percentile(lat, 0.95),
                         "p99_s": percentile(lat, 0.99), "max_s": max(lat), "per_s": len(lat) / wall}
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running server (loopback); default: start one")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    ap.add_argument("--max-requests", type=int, default=100_000, help="per client, at most")
    ap.add_argument("--workers", type=int, default=None, help="the started server's search workers")
    ap.add_argument("--cache", type=int, default=None, help="the started server's cached answers (0: none)")
    ap.add_argument("--json", type=Path, help="write the summary here")
    args = ap.parse_args()
    if args.url:
        summary = run(args.url, clients=args.clients, duration_s=args.duration, max_requests=args.max_requests)
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.web.conftest import live_server

        extra = [*(["--cache", str(args.cache)] if args.cache is not None else [])]
        workers = args.workers or max(1, min(4, len(os.sched_getaffinity(0))))
        with live_server(*extra, workers=workers) as url:
            print(f"server {url}: {workers} search workers, cache {args.cache if args.cache is not None else 64}")
            summary = run(url, clients=args.clients, duration_s=args.duration, max_requests=args.max_requests)
    print(json.dumps(summary, indent=2))
    if args.json:
        from meshplan.fileio import write_json

        write_json(args.json, summary)
    return 1 if summary["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
