"""Billing through real NATS and Redis, in-process with an injected clock.

Ownership comes from a real local HTTP server serving inventory's /v1/assets
JSON shape (the test is about billing alone); test_billing_with_inventory.py
runs the real inventory process.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx
import nats
import pytest
from fastapi import FastAPI

from whaleflux.billing.app import BillingSettings, build
from whaleflux.billing.service import Billing
from whaleflux.servers import QuietHandler, serve_http
from whaleflux.shared import subjects
from whaleflux.shared.events import (
    AlertRaised,
    AlertResolved,
    GpuSample,
    GpuTelemetry,
    JobFinished,
    JobPlaced,
    JobStarted,
    decode,
)

from .processes import ADMIN_TOKEN, Clock, connect_bus, until

UTC = UTC
T0 = datetime(2026, 3, 10, 8, tzinfo=UTC)


def _asset(uuid, model, ownership, pool, node, **kw):
    base = {"uuid": uuid, "index": 0, "model": model, "node": node, "status": "active", "last_seen": T0.isoformat(),
            "ownership": ownership, "declared": True, "site": "east", "cluster": "c1", "rack": None, "pool": pool,
            "monthly_cost_usd": None, "lease": None, "contracts": [], "purchase": None,
            "hourly_price_per_gpu_usd": None, "since": None}
    return {**base, **kw}


ASSETS = [
    _asset("GPU-L0", "H200", "leased", "cloud", "h200-01", lease={
        "contract_id": "CW-1", "provider": "coreweave", "start": "2026-01-01", "end": "2026-12-31",
        "monthly_price_per_gpu_usd": "2150.00", "minimum_term_months": 1, "auto_renew": False, "notice_days": 30}),
    _asset("GPU-L1", "H200", "leased", "cloud", "h200-01", lease={
        "contract_id": "CW-1", "provider": "coreweave", "start": "2026-01-01", "end": "2026-12-31",
        "monthly_price_per_gpu_usd": "2150.00", "minimum_term_months": 1, "auto_renew": False, "notice_days": 30}),
    _asset("GPU-O0", "H100", "owned", "onprem", "h100-01",
           purchase={"price_per_gpu_usd": "30000", "date": "2025-03-01", "depreciation_months": 48}),
    _asset("GPU-C0", "H200", "cloud", "burst", "h200-c1", hourly_price_per_gpu_usd="4.00", since="2026-03-05"),
]

PRICEBOOK = """\
prices:
  - {model: H100, ownership: owned, effective_from: 2026-01-01, usd_per_kwh: "0.20", overhead_per_gpu_month: "100"}
"""


class AssetsServer:
    """A real HTTP server answering GET /v1/assets with inventory's JSON shape."""

    def __init__(self, assets: list[dict]):
        self.assets = assets
        outer = self

        class Handler(QuietHandler):
            def do_GET(self):
                body = json.dumps(outer.assets).encode()
                self.send_response(200 if self.path == "/v1/assets" else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

        self.httpd = serve_http(Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def env(env, monkeypatch):
    monkeypatch.setenv("WHALEFLUX_ADMIN_TOKEN", ADMIN_TOKEN)
    monkeypatch.setenv("WHALEFLUX_INVENTORY_REFRESH_S", "3600")  # tests refresh explicitly
    monkeypatch.setenv("WHALEFLUX_BUDGET_CHECK_INTERVAL_S", "3600")
    return env


@pytest.fixture
def assets_server():
    server = AssetsServer(ASSETS)
    yield server
    server.close()


async def _run_job(bus, job_id, gpus, model, team, start, hours, node="n1", project="p"):
    placed = JobPlaced(job_id=job_id, attempt=1, cluster="c1", node=node, gpu_model=model, gpu_uuids=gpus,
                       gpu_indices=list(range(len(gpus))), command=["x"], team=team, project=project)
    await bus.publish(subjects.job_placed("c1", node), placed, event_id=f"placed-{job_id}-1", time=start)
    await bus.publish(subjects.job_started("c1", node), JobStarted(job_id=job_id, attempt=1, cluster="c1", node=node,
                      gpu_uuids=gpus, pid=1, started_at=start), event_id=f"started-{job_id}-1")
    if hours is not None:
        await bus.publish(subjects.job_finished("c1", node), JobFinished(
            job_id=job_id, attempt=1, cluster="c1", node=node, exit_code=0, started_at=start,
            finished_at=start + timedelta(hours=hours)), event_id=f"finished-{job_id}-1")


async def _started(clock) -> tuple[FastAPI, Billing]:
    app, svc = build(BillingSettings(), clock=clock)
    await svc.runtime.start()
    await until(lambda: asyncio.sleep(0, svc.runtime.state_ready.is_set()), what="state ready")
    return app, svc


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://billing")


async def _fetched(svc: Billing) -> bool:
    return (await svc.store.assets()).fetched_at is not None


async def _usage_count(svc: Billing, n: int) -> bool:
    return sum(r.ended_at is not None for r in await svc.store.all_usage_records()) >= n


async def _reports(app: FastAPI) -> dict[str, dict]:
    async with _client(app) as http:
        out = {}
        for by in ("job", "team", "project"):
            resp = await http.get("/v1/costs", params={"by": by, "from": "2026-03-01T00:00:00Z",
                                                       "to": "2026-03-20T00:00:00Z"})
            assert resp.status_code == 200, resp.text
            out[by] = resp.json()
        return out


async def test_costs_by_ownership_reconcile_with_idle_and_a_replay_gives_identical_totals(env, assets_server,
                                                                                          monkeypatch):
    monkeypatch.setenv("WHALEFLUX_INVENTORY_URL", assets_server.url)
    clock = Clock(datetime(2026, 3, 20, tzinfo=UTC))
    bus = await connect_bus(env)
    await _run_job(bus, "lease-job", ["GPU-L0"], "H200", "nlp", T0, 10)
    await _run_job(bus, "own-job", ["GPU-O0"], "H100", "cv", T0 + timedelta(hours=1), 5, node="h100-01")
    await _run_job(bus, "stray-job", ["GPU-X9"], "A100", "nlp", T0, 2, node="a100-09")  # not in inventory
    # Ten GPU-hours on the cloud H200 before billing ever saw it: priced from its declared start.
    await _run_job(bus, "cloud-job", ["GPU-C0"], "H200", "cv", T0, 10, node="h200-c1", project="q")
    app, svc = await _started(clock)
    try:
        assert await svc.refresh_assets()
        await until(lambda: _usage_count(svc, 4), what="four jobs metered")
        reports = await _reports(app)
        report = reports["job"]
        rows = {r["key"]: r for r in report["rows"]}
        march_ms = Decimal(31 * 24 * 3600 * 1000)
        # 10 h of one leased H200 at $2,150/GPU-month, March having 31 days.
        assert rows["lease-job"]["cost_usd"] == str((Decimal(2150) * 36_000_000 / march_ms).quantize(Decimal("0.01")))
        # 5 h of an owned H100: $30,000 over 48 months; no owned H100 price book entry, so no overhead, and said so.
        own = Decimal(30000) / 48 * 18_000_000 / march_ms
        assert rows["own-job"]["cost_usd"] == str(own.quantize(Decimal("0.01")))
        assert any("no owned H100 price book entry" in n for n in report["pricing"]["notes"])
        assert rows["cloud-job"]["cost_usd"] == "40.00"  # 10 GPU-h at the declared $4/GPU-h
        # The stray GPU is priced at the reference A100 rate and said so.
        assert rows["stray-job"]["cost_usd"] == str((Decimal("3.4309") * 2).quantize(Decimal("0.01")))
        assert any("GPU-X9" in n and "not in inventory" in n for n in report["pricing"]["notes"])
        assert report["pricing"]["inventory"]["basis"] == "inventory ownership terms"
        # Every amount is a decimal string; rows plus idle add up to the fleet total.
        totals = report["totals"]
        fleet = Decimal(totals["fleet_usd"])
        assert sum(Decimal(r["cost_usd"]) for r in report["rows"]) + Decimal(totals["idle_usd"]) + Decimal(
            totals["rounding_usd"]) == fleet
        assert fleet == sum(Decimal(i["fleet_usd"]) for i in report["idle"])
        window = Decimal(19 * 24 * 3600 * 1000) / march_ms
        cloud_fleet = Decimal(4) * 15 * 24  # declared since 5 March: 15 days of the window
        expected_fleet = (2 * Decimal(2150) + Decimal(30000) / 48) * window + Decimal("3.4309") * 2 + cloud_fleet
        # Each pool's fleet line is its own rounding: the sum within half a cent per line of the exact fleet.
        assert abs(fleet - expected_fleet) <= Decimal("0.005") * len(report["idle"])
        idle = {(i["pool"], i["model"]): i for i in report["idle"]}
        assert idle[("cloud", "H200")]["ownership"] == "leased" and idle[("cloud", "H200")]["gpus"] == 2
        assert Decimal(idle[("burst", "H200")]["idle_usd"]) == cloud_fleet - 40

        # Redis lost, days later: the service replays the job stream and reports the same totals to the cent
        # for every job, team, project and idle line (prices come from the declaration, not from when billing
        # saw a GPU).
        await svc.runtime.stop()
        r = await _flush_billing(env)
        assert r > 0
        clock.now += timedelta(days=3)
        app, svc = await _started(clock)
        assert await svc.refresh_assets()
        await until(lambda: _usage_count(svc, 4), what="replayed")
        again = await _reports(app)
        for by in ("job", "team", "project"):
            for field in ("rows", "totals", "idle", "total_usd"):
                assert again[by][field] == reports[by][field], (by, field)
    finally:
        await svc.runtime.stop()
        await bus.close()


async def _flush_billing(servers) -> int:
    from redis.asyncio import Redis

    redis = Redis.from_url(servers.redis_url, password=servers.redis_password, decode_responses=True)
    keys = [k async for k in redis.scan_iter("wf:billing:*")]
    if keys:
        await redis.delete(*keys)
    await redis.aclose()
    return len(keys)


async def test_unreachable_inventory_falls_back_to_price_book_defaults_and_says_so(env, monkeypatch):
    monkeypatch.setenv("WHALEFLUX_INVENTORY_URL", "http://127.0.0.1:9")  # nothing listens
    clock = Clock(datetime(2026, 3, 20, tzinfo=UTC))
    bus = await connect_bus(env)
    await _run_job(bus, "j1", ["GPU-L0"], "H200", "nlp", T0, 1)
    app, svc = await _started(clock)
    try:
        assert not await svc.refresh_assets()
        await until(lambda: _usage_count(svc, 1), what="metered")
        async with _client(app) as http:
            report = (await http.get("/v1/costs", params={"by": "job"})).json()
            [rec] = (await http.get("/v1/costs/jobs/j1")).json()
        assert "inventory unreachable" in report["pricing"]["inventory"]["basis"]
        assert report["pricing"]["inventory"]["error"].startswith("ConnectError")
        assert report["rows"][0]["cost_usd"] == "7.91"  # one hour at the reference H200 rate, $7.912
        assert report["totals"]["idle_usd"] == "0.00"
        assert rec["gpu_seconds"] == "3600.000" and rec["usd_per_gpu_hour"] == "7.9120" and rec["state"] == "finished"
    finally:
        await svc.runtime.stop()
        await bus.close()


async def test_bad_price_book_upload_is_rejected_with_line_and_the_previous_one_stays(env, monkeypatch, tmp_path):
    book = tmp_path / "prices.yaml"
    book.write_text(PRICEBOOK)
    monkeypatch.setenv("WHALEFLUX_PRICEBOOK_FILE", str(book))
    monkeypatch.setenv("WHALEFLUX_INVENTORY_URL", "http://127.0.0.1:9")
    app, svc = await _started(Clock(T0))
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    try:
        async with _client(app) as http:
            view = (await http.get("/v1/pricebook")).json()
            assert view["source"] == str(book) and view["entries"][0]["usd_per_kwh"] == "0.20"
            bad = PRICEBOOK + '  - {model: H100, ownership: owned, effective_from: 2026-02-01,\n' \
                              '     usd_per_kwh: "-0.1", overhead_per_gpu_month: "1"}\n'
            resp = await http.put("/admin/pricebook", content=bad, headers=auth)
            assert resp.status_code == 422
            errors = resp.json()["detail"]["errors"]
            assert "upload:4: prices[1].usd_per_kwh: Input should be greater than or equal to 0" in errors
            overlap = PRICEBOOK + ('  - {model: H100, ownership: owned, effective_from: 2026-02-01, '
                                   'usd_per_kwh: "0.3", overhead_per_gpu_month: "1"}\n')
            resp = await http.put("/admin/pricebook", content=overlap, headers=auth)
            assert resp.json()["detail"]["errors"] == [
                "upload:3: prices[1].effective_from: H100 owned 2026-02-01..open end overlaps prices[0]"]
            assert (await http.put("/admin/pricebook", content=PRICEBOOK)).status_code == 401
            view = (await http.get("/v1/pricebook")).json()
            assert view["source"] == str(book) and view["last_error"]["source"] == "upload"
            # TCO uses the book in force, with reference cloud prices where it has none.
            tco = (await http.get("/v1/tco", params={"model": "H100", "purchase_price": "30000", "months": 24})).json()
            assert tco["break_even_vs_cloud"] is not None and "reference" in tco["sources"]["cloud"]
            resp = await http.get("/v1/tco", params={"model": "A100"})
            assert resp.status_code == 400 and "purchase_price" in resp.json()["detail"]
    finally:
        await svc.runtime.stop()


async def test_energy_efficiency_and_a_budget_alert_published_once_and_resolved(env, assets_server, monkeypatch,
                                                                                  tmp_path):
    book = tmp_path / "prices.yaml"
    book.write_text(PRICEBOOK)
    monkeypatch.setenv("WHALEFLUX_PRICEBOOK_FILE", str(book))
    monkeypatch.setenv("WHALEFLUX_INVENTORY_URL", assets_server.url)
    clock = Clock(T0 + timedelta(hours=3))
    nc = await nats.connect(env.nats_url, user=env.nats_user, password=env.nats_password)
    alerts = []

    async def on_alert(msg):
        alerts.append(decode(msg.data))

    await nc.subscribe(subjects.ALERT_RAISED, cb=on_alert)
    await nc.subscribe(subjects.ALERT_RESOLVED, cb=on_alert)
    bus = await connect_bus(env)
    app, svc = await _started(clock)
    try:
        await svc.refresh_assets()
        await until(lambda: asyncio.sleep(0, "billing-telemetry" in svc.runtime.bus.bound), what="telemetry consumer")
        await _run_job(bus, "hot", ["GPU-O0"], "H100", "cv", T0, None, node="h100-01")
        await until(lambda: _held(svc, "GPU-O0"), what="job running")

        def sample(minutes, joules, util):
            g = GpuSample(uuid="GPU-O0", index=0, model="H100", utilization_gpu_pct=util, memory_used_mib=1,
                          memory_total_mib=81559, temperature_c=50, energy_j=joules)
            return GpuTelemetry(cluster="c1", node="h100-01", seq=minutes, sample_time=T0 + timedelta(minutes=minutes),
                                gpus=[g])

        # 36 MJ = 10 kWh between the first and last samples; the middle one is sent twice.
        for minutes, joules, util in ((10, 1e6, 80), (20, 19e6, 60), (20, 19e6, 60), (30, 37e6, 100)):
            await bus.publish(subjects.gpu_telemetry("c1", "h100-01"), sample(minutes, joules, util))
        await until(lambda: _cum_j(svc, "GPU-O0", 36e6), what="energy counted")
        await bus.publish(subjects.JOB_FINISHED, JobFinished(
            job_id="hot", attempt=1, cluster="c1", node="h100-01", exit_code=0, started_at=T0,
            finished_at=T0 + timedelta(hours=2)), event_id="finished-hot-1")
        await until(lambda: _usage_count(svc, 1), what="finished")
        async with _client(app) as http:
            [rec] = (await http.get("/v1/costs/jobs/hot")).json()
            assert rec["power_usd"] == "2.000000"  # 10 kWh x $0.20
            assert rec["efficiency_pct"] == 80.0  # (80 + 60 + 100) / 3, the duplicate not counted
            report = (await http.get("/v1/costs", params={"by": "team"})).json()
            assert report["efficiency_pct"] == {"cv": 80.0}

            # A $25 monthly budget for team cv: ~$3.95 by March 10, 11:00 projects to ~$15.5 (burn rate ~$12.9,
            # trend ~$15.5): past 50%, not 100%.
            budgets = [{"scope": "team", "name": "cv", "amount_usd": "25", "thresholds_pct": [50, 100]}]
            auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            resp = await http.put("/admin/budgets", json=budgets, headers=auth)
            assert resp.status_code == 200, resp.text
            fired = resp.json()["alerts_published"]
            assert fired == ["raised-cost-budget-team-cv-202603-50"]
            assert await svc.check_budgets() == []  # the same crossing again: nothing new
            status = (await http.get("/v1/budgets")).json()
            assert status[0]["spend_to_date"].startswith("3.9") and 50 < status[0]["projected_pct"] < 100
            bad = await http.put("/admin/budgets", json=[{"scope": "team", "amount_usd": "-1"}], headers=auth)
            assert bad.status_code == 422 and "amount_usd" in json.dumps(bad.json())

            await until(lambda: asyncio.sleep(0, len(alerts) >= 1), what="alert on the bus")
            # The budget raised to $100: the projection is back under 50%, the alert resolves, once.
            clock.now += timedelta(minutes=5)
            budgets[0]["amount_usd"] = "100"
            resp = await http.put("/admin/budgets", json=budgets, headers=auth)
            assert resp.json()["alerts_published"] == ["resolved-cost-budget-team-cv-202603-50-1"]
            assert await svc.check_budgets() == []
            # Back to $25: due again, raised again (its second firing), then resolved when March is over.
            budgets[0]["amount_usd"] = "25"
            resp = await http.put("/admin/budgets", json=budgets, headers=auth)
            assert resp.json()["alerts_published"] == ["raised-cost-budget-team-cv-202603-50-2"]
            clock.now = datetime(2026, 4, 1, 1, tzinfo=UTC)
            assert await svc.check_budgets() == ["resolved-cost-budget-team-cv-202603-50-2"]
            assert await svc.check_budgets() == []

        await until(lambda: asyncio.sleep(0, len(alerts) >= 4), what="alerts on the bus")
        await asyncio.sleep(0.3)
        assert [e.id for e, _ in alerts] == ["raised-cost-budget-team-cv-202603-50",
                                             "resolved-cost-budget-team-cv-202603-50-1",
                                             "raised-cost-budget-team-cv-202603-50-2",
                                             "resolved-cost-budget-team-cv-202603-50-2"]
        (envelope, data), (_, resolved) = alerts[:2]
        assert isinstance(data, AlertRaised) and isinstance(resolved, AlertResolved)
        assert data.category == "cost" and data.labels["name"] == "cv" and "Team cv projected" in data.summary
        assert data.ends_at == datetime(2026, 4, 1, tzinfo=UTC)  # alerting resolves it with March at the latest
        assert resolved.fingerprint == data.fingerprint and resolved.starts_at == data.starts_at
        assert resolved.labels == data.labels and resolved.ends_at > resolved.starts_at
    finally:
        await svc.runtime.stop()
        await bus.close()
        await nc.close()


async def _held(svc: Billing, gpu: str) -> bool:
    [holder] = await svc.store.holders([gpu])
    return holder is not None and holder.started_at is not None


async def _cum_j(svc: Billing, gpu: str, expected: float) -> bool:
    [last] = await svc.store.last_readings([gpu])
    return last is not None and abs(last.cum_j - expected) < 1e-6


async def test_a_requeued_attempt_stops_accruing_and_a_late_end_report_replaces_it_once(env, monkeypatch):
    from whaleflux.shared.events import JobRequeued

    monkeypatch.setenv("WHALEFLUX_INVENTORY_URL", "http://127.0.0.1:9")
    clock = Clock(datetime(2026, 3, 20, tzinfo=UTC))
    bus = await connect_bus(env)
    # Attempt 1 starts on a node that is then lost: no end report, only the scheduler's requeue.
    await _run_job(bus, "lost", ["GPU-L0"], "H200", "nlp", T0, None)
    requeued_at = T0 + timedelta(hours=2)
    await bus.publish(subjects.JOB_REQUEUED, JobRequeued(job_id="lost", attempt=1, cluster="c1", node="n1",
                      reason="node n1 lost", cause="node_lost"), event_id="requeued-lost-1", time=requeued_at)
    app, svc = await _started(clock)
    try:
        await until(lambda: _usage_count(svc, 1), what="attempt ended by the requeue")
        async with _client(app) as http:
            [rec] = (await http.get("/v1/costs/jobs/lost")).json()
        assert rec["state"] == "requeued" and rec["gpu_seconds"] == "7200.000"

        # The node comes back and its agent reports the stop late: that end replaces the requeue's.
        await bus.publish(subjects.JOB_FINISHED, JobFinished(job_id="lost", attempt=1, cluster="c1", node="n1",
                          exit_code=-15, started_at=T0, finished_at=T0 + timedelta(hours=3)),
                          event_id="finished-lost-1")

        async def finished():
            async with _client(app) as http:
                recs = (await http.get("/v1/costs/jobs/lost")).json()
            return recs if recs[0]["state"] == "finished" else None
        [rec] = await until(finished, what="late end report")
        assert rec["gpu_seconds"] == "10800.000"
    finally:
        await svc.runtime.stop()
        await bus.close()


async def test_a_renamed_field_in_inventorys_answer_is_a_failed_fetch_and_the_last_good_copy_stays(env, monkeypatch):
    server = AssetsServer(ASSETS)
    monkeypatch.setenv("WHALEFLUX_INVENTORY_URL", server.url)
    app, svc = await _started(Clock(datetime(2026, 3, 20, tzinfo=UTC)))
    try:
        # The service loop's first fetch done (its next is an hour away): it cannot land after the failed one.
        await until(lambda: _fetched(svc), what="the inventory loop's first fetch")
        assert await svc.refresh_assets()
        # Inventory renames `ownership`: typed at the boundary, so no GPU is silently priced as unknown.
        server.assets = [{("owner" if k == "ownership" else k): v for k, v in a.items()} for a in ASSETS]
        assert not await svc.refresh_assets()
        async with _client(app) as http:
            report = (await http.get("/v1/costs", params={"by": "job"})).json()
        inventory = report["pricing"]["inventory"]
        assert inventory["error"].startswith("ValidationError") and "ownership" in inventory["error"]
        assert inventory["basis"] == "inventory ownership terms (cached; inventory unreachable now)"
        idle = {(i["pool"], i["model"]): i["ownership"] for i in report["idle"]}
        assert idle == {("cloud", "H200"): "leased", ("onprem", "H100"): "owned", ("burst", "H200"): "cloud"}
    finally:
        await svc.runtime.stop()
        server.close()


async def test_the_store_returns_the_samples_around_any_instants_sparse_or_dense(env):
    from whaleflux.billing.energy import Reading, Series, next_reading

    app, svc = await _started(Clock(T0))
    try:
        t0 = int(T0.timestamp() * 1000)
        last: Reading | None = None
        full: list[Reading] = []
        for i in range(200):  # a sample every 10 s, 1 kJ each
            r = next_reading(last, t0 + i * 10_000, 1e3 * i, 50.0)
            assert r is not None
            await svc.store.add_readings({"G": r}, {"G": last})
            full.append(r)
            last = r
        [kept] = await svc.store.last_readings(["G"])
        assert kept == last
        every = Series({"G": full})
        for points in ({t0 + 15_000, t0 + 1_005_000}, set(range(t0 - 5_000, t0 + 2_100_000, 7_000))):
            got = await svc.store.series({"G": points})
            ts = sorted(points)
            for a, b in zip(ts, ts[1:], strict=False):
                assert got.joules("G", a, b) == every.joules("G", a, b)
    finally:
        await svc.runtime.stop()


async def test_usage_is_read_by_time_window_through_its_index_and_an_old_ledger_is_indexed_at_start(env):
    from whaleflux.billing.ledger import LedgerView
    from whaleflux.billing.metering import UsageRecord

    def rec(job, start, hours):
        return UsageRecord(job_id=job, attempt=1, team="t", project="p", gpu_model="H100", gpus=1, node="n",
                           gpu_uuids=["G"], started_at=start,
                           ended_at=None if hours is None else start + timedelta(hours=hours),
                           state="running" if hours is None else "finished")

    records = [rec(f"d{i}", T0 - timedelta(days=i), 2) for i in range(365)]
    records += [rec("long", T0 - timedelta(days=40), 24 * 30), rec("live", T0 - timedelta(days=200), None)]
    app, svc = await _started(Clock(T0))
    try:
        view = LedgerView(usage={r.ledger_key: r for r in records}, dirty_usage={r.ledger_key for r in records})
        await svc.store.commit_view(view)
        day = T0 - timedelta(days=20)
        got = await svc.store.usage_columns(day, day + timedelta(days=1))
        assert sorted(got.job_id) == ["d20", "live", "long"], await _index_state(env)

        # A ledger written before the index: indexed once (what on_ready does at start-up), then read alike.
        from redis.asyncio import Redis

        redis = Redis.from_url(env.redis_url, password=env.redis_password, decode_responses=True)
        await redis.delete("wf:billing:usage:starts", "wf:billing:usage:running", "wf:billing:usage:longest",
                           "wf:billing:usage:rows")
        await redis.aclose()
        assert len(await svc.store.usage_columns(day, day + timedelta(days=1))) == 0  # nothing indexed
        assert await svc.store.ensure_usage_index() == len(records)
        assert await svc.store.ensure_usage_index() == 0  # once
        again = await svc.store.usage_columns(day, day + timedelta(days=1))
        assert sorted(again.job_id) == sorted(got.job_id) and sorted(again.keys) == sorted(got.keys)
        assert [r.job_id for r in await svc.store.job_usage("d7")] == ["d7"]
    finally:
        await svc.runtime.stop()


async def test_a_batch_reads_back_what_the_last_wrote_and_clears_only_holders_the_store_kept(env):
    from whaleflux.billing import ledger

    def events(job, gpu, *kinds):
        placed = JobPlaced(job_id=job, attempt=1, cluster="c1", node="n1", gpu_model="H100", gpu_uuids=[gpu],
                           gpu_indices=[0], command=["x"], team="t", project="p")
        made = {"placed": placed,
                "started": JobStarted(job_id=job, attempt=1, cluster="c1", node="n1", gpu_uuids=[gpu], pid=1,
                                      started_at=T0),
                "finished": JobFinished(job_id=job, attempt=1, cluster="c1", node="n1", exit_code=0,
                                        started_at=T0, finished_at=T0 + timedelta(hours=1))}
        return [(made[k], T0) for k in kinds]

    async def batch(svc, timed):
        view = await svc.store.ledger_view(*ledger.reads_for(timed))
        assert ledger.job_events(timed, view) == [None] * len(timed)
        await svc.store.commit_view(view)
        return view

    app, svc = await _started(Clock(T0))
    try:
        empty = await svc.store.ledger_view([], [], [])  # nothing asked: nothing read
        assert (empty.holds, empty.holders, empty.usage, empty.placements) == ({}, {}, {}, {})
        first = events("a", "G1", "placed", "started")
        await batch(svc, first)
        [held] = await svc.store.holders(["G1"])
        assert held is not None and held.job_id == "a"
        # The next batch sees what the first wrote: a's holds, holder, running record and placement; b is
        # placed and finished within it (G2 held and released in memory, never stored).
        view = await batch(svc, events("a", "G1", "finished") + events("b", "G2", "placed", "finished"))
        assert view.unheld == {"G2"} and view.holds["a"].gpus() == {"G1"}
        assert view.placements["a:1"] == first[0][0] and view.placements["b:1"] is not None
        assert view.usage["a:1"] is not None and view.usage["a:1"].state == "finished"
        assert await svc.store.holders(["G1", "G2"]) == [None, None]  # a's stored holder cleared, b's never set
        again = await svc.store.ledger_view(*ledger.reads_for(events("a", "G1", "finished")))
        assert again.usage["a:1"] == view.usage["a:1"] and again.holders == {"G1": None}
    finally:
        await svc.runtime.stop()


async def _index_state(servers):
    from redis.asyncio import Redis

    redis = Redis.from_url(servers.redis_url, password=servers.redis_password, decode_responses=True)
    out = (await redis.zscore("wf:billing:usage:longest", "ms"), await redis.zcard("wf:billing:usage:starts"))
    await redis.aclose()
    return out
