"""`meshplan serve` in a real headless browser (the system's Chromium, driven by Playwright): the page plans
the default scenario, re-plans as the global batch and the accelerator change, keeps the previous answer
beside the new one, and its recommendation, table and charts agree with `meshplan plan --json` for the
same scenario; a link reproduces the view; bad input gets a message in the page. Screenshots are saved
in $MESHPLAN_ARTIFACTS (else a temporary folder, printed)."""

import time

import pytest
from tests.web.conftest import CHROMIUM_ARGS, cli_json, live_server, need, need_chromium

pytestmark = pytest.mark.slow
READY_S = 180_000  # ms: a search, the simulator and the explanation on a busy two-core machine


@pytest.fixture(scope="module")
def browser():
    need("playwright", "starlette", "uvicorn", what="pip install 'meshplan[web-test]'")
    executable = need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def server():
    need("starlette", "uvicorn", what="pip install 'meshplan[web]'")
    with live_server(workers=2) as url:
        yield url


def wait_rendered(page, n: int) -> None:
    page.wait_for_selector(f"body[data-state=ready][data-renders='{n}']", timeout=READY_S)


def chart_option(page, element_id: str) -> dict:
    return page.evaluate(f"() => JSON.parse(JSON.stringify(echarts.getInstanceByDom("
                         f"document.getElementById('{element_id}')).getOption(), (k, v) => "
                         f"typeof v === 'function' ? undefined : v))")


def check_against_cli(page, want: dict) -> None:
    """The page's recommendation, table and charts show `meshplan plan --json`'s figures."""
    rec = want["recommended"]
    assert page.get_attribute("#rec-plan", "data-plan") == rec["plan"]["string"]
    assert page.inner_text("#rec-plan") == rec["plan"]["label"]
    assert float(page.get_attribute("#rec-step", "data-step")) == pytest.approx(rec["step_time_s"], rel=1e-12)
    assert page.inner_text("#rec-mfu") == f"{rec['mfu'] * 100:.1f}%"
    feasible = [p for p in want["plans"] if p["feasible"]]
    rows = page.eval_on_selector_all("#plans tbody tr", "rs => rs.map(r => [r.dataset.plan, +r.dataset.rank])")
    assert [r[0] for r in rows] == [p["plan"]["string"] for p in feasible[:len(rows)]] and len(rows) == min(50, len(
        feasible))
    assert f"of {len(feasible):,} plans that fit" in page.inner_text("#table-note")
    infeasible = [p for p in want["plans"] if not p["feasible"]]
    assert page.inner_text("#infeasible-title").startswith(f"{len(infeasible):,} plan")
    if infeasible:
        first = page.inner_text("#infeasible tbody tr:first-child td.reason")
        assert first.split("\n")[0] == infeasible[0]["infeasible_reasons"][0]
    memory = chart_option(page, "chart-memory")
    top = [(i, p) for i, p in enumerate(want["plans"], 1) if p["feasible"]][:6]
    labels = memory["yAxis"][0]["data"]
    assert labels[:len(top)] == [f"#{i} {p['plan']['label']}" for i, p in top]
    hbm = next(s for s in memory["series"] if s["name"] == "HBM capacity")
    assert hbm["markLine"]["data"][0]["xAxis"] == pytest.approx(rec["memory"]["capacity_bytes"] / 2**30)
    first_terms = {s["name"]: s["data"][0]["value"] for s in memory["series"] if s["type"] == "bar"}
    assert {k: v for k, v in first_terms.items() if v} == pytest.approx(
        {k: v / 2**30 for k, v in want["plans"][top[0][0] - 1]["memory"]["terms"].items() if v > 0})
    time_chart = chart_option(page, "chart-time")
    step = sum(s["data"][0]["value"] for s in time_chart["series"] if s["type"] == "bar")
    assert step == pytest.approx(top[0][1]["step_time_s"], rel=1e-9)
    pareto = chart_option(page, "chart-pareto")
    front = next(s for s in pareto["series"] if s["name"] == "Pareto front")
    assert [d["plan"] for d in front["data"]] == [p["plan"] for p in want["pareto"]]
    timeline = chart_option(page, "chart-timeline")
    assert sum(len(s["data"]) for s in timeline["series"]) > 0


def change(page, selector: str, value: str) -> None:
    if page.eval_on_selector(selector, "e => e.tagName") == "SELECT":
        page.select_option(selector, value)
    else:
        page.fill(selector, value)
        page.locator(selector).blur()  # the browser's own change event, as a person leaving the field


def test_what_if_planning_in_a_browser(browser, server, artifacts_dir):
    t0 = time.perf_counter()
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("console", lambda m: problems.append(f"console: {m.text}") if m.type == "error"
            and "status of 422" not in m.text else None)
    external = []
    page.on("request", lambda r: external.append(r.url) if not r.url.startswith(server) else None)

    # 1. the default scenario
    page.goto(server + "/")
    wait_rendered(page, 1)
    check_against_cli(page, cli_json("plan", "--json", "--no-conditions"))
    assert page.is_hidden("#prev-card")
    page.screenshot(path=str(artifacts_dir / "1-default.png"))
    first = page.get_attribute("#rec-plan", "data-plan")

    # 2. what if the global batch doubles
    change(page, "#batch", "8M")
    wait_rendered(page, 2)
    check_against_cli(page, cli_json("plan", "--json", "--no-conditions", "--batch-tokens", "8M"))
    assert page.is_visible("#prev-card") and page.get_attribute("#prev-plan", "data-plan") == first
    assert "global batch 4M → 8M" in page.inner_text("#prev-diff")
    ghosts = [x for x in chart_option(page, "chart-memory")["yAxis"][0]["data"] if x.startswith("previous: ")]
    assert len(ghosts) == 1 and "batch=8388608" in page.url
    page.screenshot(path=str(artifacts_dir / "2-batch-8M.png"))
    second = page.get_attribute("#rec-plan", "data-plan")

    # 3. what if the cluster were H200s
    change(page, "#accelerator", "h200")
    wait_rendered(page, 3)
    want = cli_json("plan", "--json", "--no-conditions", "--batch-tokens", "8M", "--cluster", "h200")
    check_against_cli(page, want)
    assert page.get_attribute("#prev-plan", "data-plan") == second
    assert "accelerator h100-sxm → h200" in page.inner_text("#prev-diff")
    assert "accel=h200" in page.url
    page.screenshot(path=str(artifacts_dir / "3-h200.png"), full_page=False)

    # 4. the conditions of change arrive and agree with the plan command
    page.wait_for_selector("#conditions li, #conditions-status:has-text('No condition')", timeout=READY_S)
    page.locator("#conditions").scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts_dir / "4-conditions.png"))

    # 5. a plan picked in the table is shown in detail, as `meshplan evaluate` gives it
    row = page.locator("#plans tbody tr").nth(2)
    picked = row.get_attribute("data-plan")
    row.click()
    page.wait_for_selector(f"#selected-title[data-plan='{picked}']", timeout=READY_S)
    assert page.inner_text("#selected-title").startswith("Selected plan: ")
    stack = want["assumed_stack"]["stack"]  # no stack named: the page times a plan on the stack plan assumed
    detail = cli_json("evaluate", "--json", "--batch-tokens", "8M", "--cluster", "h200", "--stack", stack,
                      "--plan", picked)
    assert detail["plan"]["string"] in page.inner_text("#selected-summary")
    assert f"step {detail['step_time_s']:.2f} s" in page.inner_text("#selected-summary")
    page.locator("#selected-title").scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts_dir / "5-selected-plan.png"))

    # 5b. where meshplan.frameworks is installed, the plan exports to each framework (or says what it lacks)
    frameworks = page.evaluate("() => window.meshplanPage.catalog.panels.exports")
    if frameworks:
        page.click(f"#export-buttons button[data-framework='{frameworks[0]}']")
        page.wait_for_selector("#export-text:not([hidden])", timeout=60_000)
        from meshplan.errors import SpecError
        from meshplan.web.compute import export_plan
        from meshplan.web.scenario import normalise

        try:  # what the library gives for the same scenario and plan: the settings, or the refusal
            want_text = export_plan(normalise({"accelerator": "h200", "batch_tokens": 8 << 20}), picked,
                                    frameworks[0])["text"]
        except SpecError as exc:
            want_text = f"Not exported: {exc.message}"
        assert page.text_content("#export-text") == want_text
        page.locator("#exports").scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts_dir / "5b-export.png"))
    else:
        assert page.is_hidden("#exports")

    # 6. the table sorts and filters
    page.click("#plans th[data-key=step_time_s]")
    steps = page.eval_on_selector_all("#plans tbody tr", "rs => rs.map(r => +r.dataset.step)")
    assert steps == sorted(steps)
    change(page, "#filter-stack", "PyTorch")
    stacks = page.eval_on_selector_all("#plans tbody tr", "rs => rs.map(r => r.dataset.stack)")
    assert stacks and set(stacks) == {"PyTorch"}
    change(page, "#filter-family", "fsdp")
    families = page.eval_on_selector_all("#plans tbody tr", "rs => rs.map(r => r.dataset.family)")
    assert families and set(families) == {"fsdp"}

    # 7. the link reproduces the view
    link = page.url
    other = browser.new_page(viewport={"width": 1440, "height": 1000})
    other.goto(link)
    wait_rendered(other, 1)
    assert other.get_attribute("#rec-plan", "data-plan") == want["recommended"]["plan"]["string"]
    assert other.input_value("#accelerator") == "h200" and other.input_value("#batch") == "8M"
    other.close()

    # 8. bad input: a message in the page, the previous answer kept
    change(page, "#batch", "lots")
    page.wait_for_selector("#error:not([hidden])")
    assert "batch_tokens" in page.inner_text("#error")
    change(page, "#batch", "8M")
    statuses = []
    page.on("response", lambda r: statuses.append(r.status) if "/api/spec" in r.url else None)
    page.set_input_files("#model-file", files=[{"name": "broken.toml", "mimeType": "text/plain",
                                                "buffer": b"name = 'x'\nn_layers = ["}])
    page.wait_for_selector("#error:has-text('malformed TOML')", timeout=30_000)
    assert statuses == [422] and "model_spec" in page.inner_text("#error")
    assert page.get_attribute("#rec-plan", "data-plan") == want["recommended"]["plan"]["string"]
    page.evaluate("() => window.scrollTo(0, 0)")
    page.screenshot(path=str(artifacts_dir / "6-error.png"))

    # 9. where meshplan.economics is installed, a token budget gives the time to train and its cost
    if page.evaluate("() => window.meshplanPage.catalog.panels.economics"):
        renders = int(page.get_attribute("body", "data-renders"))
        change(page, "#train-tokens", "15.6T")
        wait_rendered(page, renders + 1)
        page.wait_for_selector("#economics:not([hidden])")
        assert page.inner_text("#economics-body").startswith("Time to train 15,600,000,000,000 tokens")
        assert "tokens=15600000000000" in page.url
        page.locator("#economics").scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts_dir / "7-economics.png"))
    else:
        assert page.is_hidden("#economics") and page.is_hidden("#train-tokens-row")

    assert not problems, problems
    assert external == []  # every asset from the server itself
    print(f"browser test: {time.perf_counter() - t0:.1f} s; screenshots in {artifacts_dir}")
