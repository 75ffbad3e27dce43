"""`meshplan serve`'s JSON API through the ASGI test client: its answers agree with `meshplan plan --json`
and `meshplan evaluate --json`, and malformed or oversized requests get a 4xx with one clear message,
never a 500 or a trace."""

import json

import pytest
from tests.web.conftest import cli_json, need

SMALL = {"model": "llama-2-7b", "nodes": 2, "batch_tokens": 524288}
SMALL_ARGS = ["--model", "llama-2-7b", "--nodes", "2", "--batch-tokens", "512K"]


@pytest.fixture(scope="module")
def client():
    need("starlette", "uvicorn", "httpx", what="pip install 'meshplan[web-test]'")
    from starlette.testclient import TestClient

    from meshplan.web.app import Config, create_app

    with TestClient(create_app(Config(workers=1, time_limit_s=120)), base_url="http://localhost") as c:
        yield c


def post(client, path, body, **kw):
    return client.post(path, content=json.dumps(body), headers={"content-type": "application/json"}, **kw)


def test_plan_agrees_with_the_plan_command(client):
    r = post(client, "/api/plan", {"scenario": SMALL})
    assert r.status_code == 200
    got = r.json()
    want = cli_json("plan", "--json", "--no-conditions", *SMALL_ARGS)
    rec = got["recommended"]["estimate"]
    assert rec["plan"]["string"] == want["recommended"]["plan"]["string"]
    assert rec["step_time_s"] == pytest.approx(want["recommended"]["step_time_s"], rel=1e-12)
    assert rec["memory"] == want["recommended"]["memory"]
    assert rec["uncertainty"] == want["recommended"]["uncertainty"]
    assert [p["plan"] for p in got["plans"]] == [p["plan"]["string"] for p in want["plans"]]
    assert [p["feasible"] for p in got["plans"]] == [p["feasible"] for p in want["plans"]]
    assert got["search"]["n_plans"] == want["n_plans"] and got["search"]["n_pruned"] == want["n_pruned"]
    assert [q["lines"] for q in got["questions"]] == [q["answer"] for q in want["questions"]]
    assert [p[3] for p in got["charts"]["pareto"]["front"]] == [p["plan"] for p in want["pareto"]]
    infeasible = [p for p in got["plans"] if not p["feasible"]]
    assert infeasible and all(p["reasons"] and p["step_time_s"] is None for p in infeasible)
    # the charts draw the best feasible plans, named by their rank in the table
    feasible = [(i, p) for i, p in enumerate(want["plans"], 1) if p["feasible"]][:6]
    assert [row["label"] for row in got["charts"]["memory"]["rows"]] == [
        f"#{i} {p['plan']['label']}" for i, p in feasible]
    assert got["charts"]["memory"]["capacity_gib"] == pytest.approx(want["recommended"]["memory"]["capacity_bytes"]
                                                                    / 2**30)
    for row, (_, p) in zip(got["charts"]["time"]["rows"], feasible, strict=True):
        assert sum(row["terms"].values()) == pytest.approx(p["step_time_s"], rel=1e-9)
    timeline = got["recommended"]["timeline"]
    assert timeline["ops"] and all(0 <= op[0] < len(timeline["lanes"]) and op[2] >= 0 for op in timeline["ops"])


def test_identical_requests_share_one_answer(client):
    before = client.get("/api/health").json()["cache_hits"]
    a = post(client, "/api/plan", {"scenario": SMALL})
    b = post(client, "/api/plan", {"scenario": {**SMALL, "space": "full", "optimizer": "adamw"}})
    assert a.status_code == b.status_code == 200 and a.content == b.content
    assert client.get("/api/health").json()["cache_hits"] == before + 2


def test_evaluate_agrees_with_the_evaluate_command(client):
    plan = "tp=2,dp_shard=8"
    r = post(client, "/api/evaluate", {"scenario": SMALL, "plan": plan})
    assert r.status_code == 200
    got = r.json()["estimate"]
    want = cli_json("evaluate", "--json", "--plan", plan, *SMALL_ARGS)
    for key in ("plan", "memory", "step_time_s", "time_breakdown", "comm", "uncertainty", "feasible"):
        assert got[key] == want[key], key


def test_conditions_agree_with_the_plan_command(client):
    scenario = {"model": "llama-3.2-3b", "nodes": 1, "batch_tokens": 262144, "space": "dp-tp"}
    r = post(client, "/api/conditions", {"scenario": scenario})
    assert r.status_code == 200
    want = cli_json("plan", "--json", "--model", "llama-3.2-3b", "--nodes", "1", "--batch-tokens", "256K",
                    "--space", "dp-tp")
    got = r.json()
    assert [c["text"] for c in got["conditions"]] == [c["text"] for c in want["conditions"]]
    assert got["recommended_plan"] == want["recommended"]["plan"]["string"]


def test_catalog_lists_what_the_page_offers(client):
    from meshplan.catalog import list_accelerators, list_models
    from meshplan.web.scenario import DEFAULTS

    d = client.get("/api/catalog").json()
    assert [m["name"] for m in d["models"]] == list_models()
    assert [a["name"] for a in d["accelerators"]] == list_accelerators()
    assert d["defaults"] == DEFAULTS
    assert "exports" in d["panels"] and "economics" in d["panels"]


def test_every_asset_is_served_from_the_package_and_the_page_names_no_other_host(client):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    for src in ("/static/echarts.min.js", "/static/charts.js", "/static/app.js", "/static/app.css",
                "/static/favicon.svg", "/static/ECHARTS-LICENSE.txt"):
        assert src in page.text or src.endswith(".txt")
        r = client.get(src)
        assert r.status_code == 200 and len(r.content) > 100, src
    for text in (page.text, client.get("/static/app.js").text, client.get("/static/charts.js").text):
        assert "http://" not in text.replace("http://www.w3.org", "") and "https://" not in text
    etag = client.get("/static/app.js").headers["etag"]
    assert client.get("/static/app.js", headers={"if-none-match": etag}).status_code == 304


BAD = [
    # (what, request kwargs, status, words of the message)
    ("not JSON", {"content": b"{nope", "headers": {"content-type": "application/json"}}, 400, "not valid JSON"),
    ("a JSON list", {"content": b"[1, 2]", "headers": {"content-type": "application/json"}}, 400, "JSON object"),
    ("NaN", {"content": b'{"scenario": {"nodes": NaN}}', "headers": {"content-type": "application/json"}}, 400,
     "NaN is not a JSON number"),
    ("deep nesting", {"content": b'{"a":' + b"[" * 60000 + b"]" * 60000 + b"}",
                      "headers": {"content-type": "application/json"}}, 400, "not valid JSON"),
    ("too large", {"content": b'{"a":"' + b"x" * 300000 + b'"}', "headers": {"content-type": "application/json"}},
     413, "larger than"),
    ("a form post", {"content": b"scenario=x", "headers": {"content-type": "application/x-www-form-urlencoded"}},
     415, "application/json"),
    ("not UTF-8", {"content": b'{"scenario": "\xff"}', "headers": {"content-type": "application/json"}}, 400,
     "not valid JSON"),
]

BAD_SCENARIOS = [
    ({"nodes": 0}, "nodes", "whole number from 1"),
    ({"nodes": "8"}, "nodes", "whole number"),
    ({"nodes": True}, "nodes", "whole number"),
    ({"nodes": 1e300}, "nodes", "whole number"),
    ({"model": "/etc/passwd"}, "model", "must be one of"),
    ({"model": "../catalog/models/seed-70b"}, "model", "must be one of"),
    ({"accelerator": "h100-sxm.toml"}, "accelerator", "must be one of"),
    ({"colour": "blue"}, "scenario", "unknown keys 'colour'"),
    ({"batch_tokens": 4096 * 3 + 1}, "job.global_batch_tokens", "multiple of seq_len"),
    ({"inter_node_gb_per_s": -1}, "inter_node_gb_per_s", "GB/s"),
    ({"precision": "fp4"}, "precision", "bf16, fp8"),
    ({"space": ["full"]}, "space", "must be one of"),
    ({"model_spec": {"text": "name = 'x'\nn_layers = [", "format": "toml"}}, "model_spec", "malformed TOML"),
    ({"model_spec": {"text": "{\"name\": \"x\"}", "format": "toml"}}, "model_spec", "choose the json format"),
    ({"model_spec": {"text": "{\"name\": \"x\"}", "format": "json"}}, "model.n_layers", "is missing"),
    ({"model_spec": {"text": "name='x'\nn_layers=2\nhidden=64\nn_heads=4\nn_kv_heads=4\nffn_hidden=128\n"
                             "vocab=100\ncolour=1", "format": "toml"}}, "model", "unknown key colour"),
    ({"model_spec": {"text": "name='x'\nn_layers='two'\nhidden=64\nn_heads=4\nn_kv_heads=4\nffn_hidden=128\n"
                             "vocab=100", "format": "toml"}}, "model.n_layers", "whole number"),
    ({"model_spec": {"text": "x" * 70000, "format": "toml"}}, "model_spec.text", "at most 65,536"),
    ({"model_spec": "/etc/passwd"}, "model_spec", "must be an object"),
    ({"model_spec": {"path": "/etc/passwd", "text": ""}}, "model_spec", "must be an object"),
    ({"job_spec": {"text": "optimizer = 'lion'", "format": "toml"}}, "job.optimizer", "must be one of"),
    ({"job_spec": {"text": "[runtime]\ncolour = 1", "format": "toml"}}, "job.runtime", "unknown key colour"),
]


@pytest.mark.parametrize("what,kwargs,status,words", BAD, ids=[b[0] for b in BAD])
def test_malformed_requests_get_a_4xx_with_one_message(client, what, kwargs, status, words):
    r = client.post("/api/plan", **kwargs)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert words in err["message"] and "Traceback" not in r.text


@pytest.mark.parametrize("scenario,field,words", BAD_SCENARIOS, ids=[str(b[0])[:40] for b in BAD_SCENARIOS])
def test_bad_scenarios_name_the_field(client, scenario, field, words):
    r = post(client, "/api/plan", {"scenario": scenario})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["field"] == field and words in err["message"], err
    assert "Traceback" not in r.text and "/etc/passwd" not in err["message"].replace(repr("/etc/passwd"), "")


def test_oversized_bodies_are_refused_before_they_are_read(client):
    big = json.dumps({"scenario": {"model_spec": {"text": "#" * 400_000}}})
    r = client.post("/api/plan", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "KiB" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: the limit holds on the bytes as they arrive
        for _ in range(100):
            yield b" " * 8192

    r = client.post("/api/plan", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_bad_plans_and_paths(client):
    r = post(client, "/api/evaluate", {"scenario": SMALL, "plan": "tp=3,dp_shard=5"})
    assert r.status_code == 422 and r.json()["error"]["field"].startswith("plan")
    r = post(client, "/api/evaluate", {"scenario": SMALL, "plan": 7})
    assert r.status_code == 422 and r.json()["error"]["field"] == "plan"
    r = client.get("/api/nope")
    assert r.status_code == 404 and r.json()["error"]["field"] == "path"
    r = client.get("/api/plan")
    assert r.status_code == 405 and "method not allowed" in r.json()["error"]["message"]
    assert client.get("/static/../pyproject.toml").status_code == 404
    r = post(client, "/api/export", {"scenario": SMALL, "plan": "dp_shard=16", "framework": "nope"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "framework"


def test_a_foreign_host_name_is_refused(client):
    """With the server on loopback, a page of another domain resolved to 127.0.0.1 gets nothing."""
    r = client.get("/api/catalog", headers={"host": "evil.example:8765"})
    assert r.status_code == 400 and "only requests to" in r.text
    assert client.get("/api/catalog", headers={"host": "127.0.0.1:8765"}).status_code == 200
    assert client.get("/api/catalog", headers={"host": "[::1]:8765"}).status_code == 200


def test_an_uploaded_spec_is_checked_and_described(client):
    from meshplan.catalog import _catalog_dir

    text = _catalog_dir("models").joinpath("llama-3-8b.toml").read_text()
    r = post(client, "/api/spec", {"kind": "model", "doc": {"format": "toml", "text": text, "name": "m.toml"}})
    assert r.status_code == 200 and r.json()["name"] == "llama-3-8b" and r.json()["n_layers"] == 32
    job = "global_batch_tokens = '2M'\nseq_len = 8192\nsoftware = 'torchtitan'\ncompiled = true\n"
    r = post(client, "/api/spec", {"kind": "job", "doc": {"format": "toml", "text": job}})
    d = r.json()
    assert r.status_code == 200 and d["batch_tokens"] == 2 * 2**20 and d["software"] == "torchtitan"
    assert d["fields"]["compiled"] is True
    r = post(client, "/api/spec", {"kind": "cluster", "doc": {"text": ""}})
    assert r.status_code == 422 and r.json()["error"]["field"] == "kind"
    # an uploaded model plans like the catalog's
    a = post(client, "/api/plan", {"scenario": {**SMALL, "model": None,
                                                "model_spec": {"format": "toml", "text": text}}}).json()
    b = post(client, "/api/plan", {"scenario": {**SMALL, "model": "llama-3-8b"}}).json()
    assert a["recommended"]["estimate"]["plan"] == b["recommended"]["estimate"]["plan"]
    assert a["scenario"]["uploaded_model"] == "uploaded.toml"


def test_a_search_past_the_time_limit_is_stopped_and_the_server_goes_on():
    need("starlette", "uvicorn", "httpx", what="pip install 'meshplan[web-test]'")
    from starlette.testclient import TestClient

    from meshplan.web.app import Config, create_app

    with TestClient(create_app(Config(workers=1, time_limit_s=0.3)), base_url="http://localhost") as c:
        big = {"model": "llama-3.1-405b", "nodes": 2048, "batch_tokens": 16777216}
        r = post(c, "/api/plan", {"scenario": big})
        assert r.status_code == 422 and "longer than this server's limit" in r.json()["error"]["message"]
        r = post(c, "/api/spec", {"kind": "job", "doc": {"text": "seq_len = 2048"}})
        assert r.status_code == 200
        r = post(c, "/api/evaluate", {"scenario": SMALL, "plan": "dp_shard=16"})  # a fresh worker answers
        assert r.status_code in (200, 422)
        if r.status_code == 422:  # a slow machine: the fresh worker's imports ate the 0.3 s
            assert "limit" in r.json()["error"]["message"]


def test_serve_without_the_extra_says_how_to_install_it():
    import subprocess
    import sys

    code = ("import sys; sys.modules['starlette'] = None; sys.modules['uvicorn'] = None\n"
            "import importlib.util\n"
            "real = importlib.util.find_spec\n"
            "importlib.util.find_spec = lambda n, *a: None if n in ('starlette', 'uvicorn') else real(n, *a)\n"
            "from meshplan.cli import main\n"
            "sys.exit(main(['serve']))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == ("meshplan: error: serve: needs starlette, which is not installed: "
                                "pip install 'meshplan[web]'")


def test_the_core_imports_no_web_package():
    import subprocess
    import sys

    code = ("import sys\n"
            "for m in ('starlette', 'uvicorn', 'httpx', 'playwright'): sys.modules[m] = None\n"
            "import meshplan, meshplan.cli, meshplan.web, meshplan.report.html, meshplan.report.chartdata\n"
            "from meshplan.cli import build_parser\n"
            "assert 'serve' in build_parser().format_help()\n"
            "import meshplan.web.compute, meshplan.web.scenario, meshplan.web.pool\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
