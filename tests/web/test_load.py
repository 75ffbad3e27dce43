"""`meshplan serve` under load on loopback (the short version of benchmarks/load_web.py): 20 concurrent
clients planning different scenarios, every answer checked against the library's; and one user's long
search does not hold up another's page or small search."""

import importlib.util
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from tests.web.conftest import live_server, need

pytestmark = pytest.mark.slow


def _load_web():
    spec = importlib.util.spec_from_file_location(
        "load_web", Path(__file__).resolve().parents[2] / "benchmarks" / "load_web.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_twenty_clients_get_correct_answers():
    need("starlette", "uvicorn", what="pip install 'meshplan[web]'")
    load = _load_web()
    with live_server(workers=2) as url:
        summary = load.run(url, clients=20, duration_s=12, max_requests=1000, bases=load.BASES[:4],
                           log=lambda *a: None)
    print(json.dumps(summary, indent=1))
    assert summary["wrong"] == 0, summary["first_wrong"]
    assert summary["plan"]["requests"] >= 20 and summary["plan_answers"].get("miss", 0) >= 4
    assert summary["page"]["requests"] >= 1


def _post(url: str, body: dict, timeout: float = 300) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_long_search_does_not_block_another_users_page():
    need("starlette", "uvicorn", what="pip install 'meshplan[web]'")
    with live_server("--time-limit", "40", workers=2) as url:
        long_done = threading.Event()
        result = {}

        def long_search():
            result["long"] = _post(url + "/api/plan", {"scenario": {"model": "llama-3.1-405b", "nodes": 2048,
                                                                    "batch_tokens": 16777216, "seq_len": 8192}})
            long_done.set()

        threading.Thread(target=long_search, daemon=True).start()
        time.sleep(2.0)  # the long search holds a worker by now
        t0 = time.perf_counter()
        with urllib.request.urlopen(url + "/", timeout=30) as r:
            assert r.status == 200
        page_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        status, answer = _post(url + "/api/plan", {"scenario": {"model": "llama-3.2-3b", "nodes": 1,
                                                                "space": "dp-tp", "batch_tokens": 1 << 20}})
        small_s = time.perf_counter() - t0
        assert status == 200 and answer["recommended"]
        assert not long_done.is_set(), "the long search ended before the small one: nothing was shown"
        assert page_s < 5 and small_s < 30, (page_s, small_s)
        long_done.wait(120)
        status, answer = result["long"]
        assert status in (200, 422)
        if status == 422:  # stopped at the server's limit, with a message
            assert "longer than this server's limit" in answer["error"]["message"]
