"""The console in a real browser (Debian's Chromium through Playwright) against real services, NATS and Redis."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from .processes import ADMIN_TOKEN, Proc, make_cluster, wait_until

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
SERVICES = ("telemetry", "scheduler", "alerting", "billing", "inventory")
DEMO_GPUS = 28  # small-demo.yaml: 4x RTX 4090, 8x A100, 8x H100, 8x H200

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="needs Debian's chromium (/usr/bin/chromium): apt-get install chromium")


@pytest.fixture
def stack(clean_servers, tmp_path):
    """The five services, a simulated demo fleet with fault injection, and the console."""
    cluster = make_cluster(clean_servers, tmp_path)
    procs = {name: cluster.service(name) for name in SERVICES}
    agent = cluster.agent(interval_s=0.5, http=True)
    # `whaleflux service console`, as `up` starts it.
    console = cluster.service("console", WHALEFLUX_LIVE_INTERVAL_S="0.5",
                              **{f"WHALEFLUX_{name.upper()}_URL": proc.url for name, proc in procs.items()})
    try:
        for proc in (*procs.values(), console):
            proc.wait_ready(60)
        wait_until(lambda: len(httpx.get(procs["telemetry"].url + "/v1/gpus").json()) == DEMO_GPUS, timeout=60,
                   what="every demo GPU in telemetry")
        yield cluster, procs, agent, console
    finally:
        cluster.stop()


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        yield b
        b.close()


def air_gapped(context) -> list[str]:
    """Refuse every request that leaves this machine, and list them: the console must need none."""
    outside: list[str] = []

    def handle(route):
        host = urlparse(route.request.url).hostname
        if host in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", handle)
    return outside


def logged_in(browser, console: Proc):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    outside = air_gapped(context)
    page = context.new_page()
    page.goto(console.url + "/fleet")
    page.fill("#token", ADMIN_TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url("**/fleet")
    return context, page, outside


def test_login_is_required_and_the_session_is_an_httponly_cookie(stack, browser):
    _, _, _, console = stack
    from playwright.sync_api import expect

    context = browser.new_context()
    page = context.new_page()
    page.goto(console.url + "/jobs?state=running")
    assert urlparse(page.url).path == "/login"  # every page sends a stranger to the login
    page.fill("#token", "not-the-token")
    page.click("button[type=submit]")
    expect(page.locator(".error")).to_contain_text("Wrong token")
    page.fill("#token", ADMIN_TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url("**/jobs?state=running")  # back where it was going
    (cookie,) = [c for c in context.cookies() if c["name"] == "wf_session"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax" and ADMIN_TOKEN not in cookie["value"]
    assert ADMIN_TOKEN not in page.url

    # Live streams and writes need the session; a write also needs this session's CSRF token.
    assert httpx.get(console.url + "/live/fleet").status_code == 401
    jar = {"wf_session": cookie["value"]}
    forged = httpx.post(console.url + "/jobs", data={"command": "true"}, cookies=jar)
    assert forged.status_code == 403
    assert httpx.post(console.url + "/alerts/x/ack", data={"csrf": "guess"}, cookies=jar).status_code == 403
    assert httpx.post(console.url + "/jobs/x/cancel", cookies=jar).status_code == 403
    context.close()


def test_fleet_shows_every_demo_gpu_and_an_injected_fault_is_flagged_alerted_and_acked(stack, browser):
    _, procs, agent, console = stack
    from playwright.sync_api import expect

    context, page, outside = logged_in(browser, console)
    expect(page.locator("[data-testid=gpu-count]")).to_have_text(str(DEMO_GPUS))
    expect(page.locator("tr[data-gpu]")).to_have_count(DEMO_GPUS)
    heat = page.evaluate("JSON.parse(document.getElementById('heat-data').textContent).gpus")
    assert heat == DEMO_GPUS

    resp = httpx.post(agent.url + "/admin/faults", json={"kind": "ecc-dbe", "node": "a100-01", "gpu": 2},
                      headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert resp.status_code == 200, resp.text
    gpus = httpx.get(procs["telemetry"].url + "/v1/gpus", params={"node": "a100-01"}).json()
    uuid = next(g["gpu"]["uuid"] for g in gpus if g["gpu"]["index"] == 2)
    # The open page updates itself (server-sent events), no reload.
    expect(page.locator(f"tr[data-gpu='{uuid}'] .badge.flag")).to_contain_text("ecc", timeout=30_000)

    page.click("nav >> text=Alerts")
    row = page.locator("tr[data-alert]", has_text="GPUUncorrectableECC")
    expect(row).to_have_count(1, timeout=30_000)
    fingerprint = row.get_attribute("data-alert")
    page.fill("#who", "alice")
    row.get_by_role("button", name="Ack").click()
    expect(page.locator(f"tr[data-alert='{fingerprint}']")).to_contain_text("acked by alice", timeout=15_000)
    alerts = httpx.get(procs["alerting"].url + "/v1/alerts").json()
    (acked,) = [a for a in alerts if a["fingerprint"] == fingerprint]
    assert acked["acknowledged"]["by"] == "alice"
    assert outside == []
    context.close()


def test_a_job_submitted_from_the_form_runs_shows_its_log_and_a_focus_export_downloads_and_one_is_cancelled(
        stack, browser):
    _, procs, _, console = stack
    from playwright.sync_api import expect

    context, page, outside = logged_in(browser, console)
    page.goto(console.url + "/jobs/new")
    page.fill("#command", "python -c \"print('hello from the console')\"")
    page.fill("input[name=team]", "web")
    page.select_option("select[name=size_model]", "llama-3-8b")  # the estimate beside the form
    expect(page.locator("#estimate")).to_contain_text("fits", timeout=15_000)
    page.click("#submit-form button[type=submit]")
    page.wait_for_url("**/jobs/*")
    job_id = urlparse(page.url).path.rsplit("/", 1)[1]
    expect(page.locator("[data-testid=job-state]")).to_have_text("succeeded", timeout=60_000)
    expect(page.locator("[data-testid=job-log]")).to_contain_text("hello from the console", timeout=15_000)
    record = httpx.get(procs["scheduler"].url + f"/v1/jobs/{job_id}").json()
    assert record["spec"]["team"] == "web" and record["exit_code"] == 0

    page.goto(console.url + "/jobs?team=web")
    expect(page.locator(f"tr[data-job='{job_id}']")).to_have_count(1)

    wait_until(lambda: httpx.get(procs["billing"].url + f"/v1/costs/jobs/{job_id}").status_code == 200,
               what="the job charged")
    page.goto(console.url + "/costs")
    with page.expect_download() as info:
        page.click("text=FOCUS 1.2 CSV")
    download = info.value
    assert download.suggested_filename.endswith("focus.csv")
    rows = list(csv.DictReader(io.StringIO(Path(download.path()).read_text())))
    assert rows and {"BilledCost", "EffectiveCost", "ChargePeriodStart", "x_JobId"} <= set(rows[0])
    assert any(r["x_JobId"] == job_id for r in rows)

    # A long job is cancelled from its page: stopped on its node, cancelled (not failed), the button gone.
    page.goto(console.url + "/jobs/new")
    page.fill("#command", "sleep 600")
    page.click("#submit-form button[type=submit]")
    page.wait_for_url("**/jobs/*")
    long_id = urlparse(page.url).path.rsplit("/", 1)[1]
    expect(page.locator("[data-testid=job-state]")).to_have_text("running", timeout=60_000)
    # The fleet page shows it on the GPU it holds (the console folds job events from the bus).
    page.goto(console.url + "/fleet")
    holding = page.locator(f"tr[data-gpu] a[href='/jobs/{long_id}']")
    expect(holding).to_have_count(1, timeout=15_000)
    page.goto(console.url + f"/jobs/{long_id}")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("[data-testid=cancel-job]")
    expect(page.locator("[data-testid=job-state]")).to_have_text("cancelled", timeout=15_000)
    expect(page.locator("[data-testid=cancel-job]")).to_have_count(0)
    page.goto(console.url + "/fleet")
    expect(holding).to_have_count(0, timeout=15_000)  # its GPU is free again
    record = httpx.get(procs["scheduler"].url + f"/v1/jobs/{long_id}").json()
    assert record["state"] == "cancelled" and record["reason"] == "cancelled: cancelled from the console", record
    assert outside == []
    context.close()


def test_every_page_renders_and_api_docs_work_without_internet(stack, browser):
    _, procs, _, console = stack
    from playwright.sync_api import expect

    context, page, outside = logged_in(browser, console)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    for path, text in (("/inventory", "Leases"), ("/costs", "Budgets"), ("/sizing?model=llama-3-8b&task=lora", "fits"),
                       ("/costs/tco?model=H100&gpus=8&utilization=0.7&months=36&purchase_price=30000&usd_per_kwh=0.12&overhead=150",
                        "Break-even"), ("/fleet/nodes/h100-01", "Scheduler")):
        page.goto(console.url + path)
        expect(page.locator("main")).to_contain_text(text)
    # The keyboard alone: the first Tab is the skip link, which moves focus to the content; the sections are
    # links reached by Tab and followed with Enter.
    page.goto(console.url + "/fleet")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"
    page.focus("nav >> text=Fleet")
    for _ in range(2):
        page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Alerts"
    page.keyboard.press("Enter")
    page.wait_for_url("**/alerts")
    # A phone's width: the page fits it (wide tables scroll inside their card, not the page sideways).
    page.set_viewport_size({"width": 390, "height": 844})
    for path in ("/fleet", "/jobs", "/costs"):
        page.goto(console.url + path)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390, path
    page.set_viewport_size({"width": 1280, "height": 900})
    # Swagger UI and ReDoc of a service, from its own vendored files.
    page.goto(procs["telemetry"].url + "/docs")
    expect(page.locator(".swagger-ui .title")).to_contain_text("WhaleFlux telemetry", timeout=15_000)
    page.goto(procs["billing"].url + "/redoc")
    expect(page.locator("h1")).to_contain_text("WhaleFlux billing", timeout=15_000)
    # Its sidebar, where ReDoc puts Redocly's logo from a CDN: the page's policy keeps the browser from asking.
    expect(page.get_by_text("API docs by Redocly")).to_have_count(1)
    assert outside == [] and errors == []
    context.close()
