"""Inventory through real NATS and Redis, run in-process with an injected clock.

- lease notices: each horizon fires once, a restart publishes no duplicate, a renewal stops them;
- rollups: a simulated day on the small demo fleet, with the real scheduler placing the jobs,
  matches the allocations the scheduler recorded to the microsecond.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
import nats
import pytest

from whaleflux.inventory.app import InventorySettings, build
from whaleflux.inventory.service import Inventory
from whaleflux.scheduler.app import SchedulerSettings
from whaleflux.scheduler.app import build as build_scheduler
from whaleflux.scheduler.service import Scheduler
from whaleflux.shared import subjects
from whaleflux.shared.bus import Bus
from whaleflux.shared.catalog import gpu_models, load_fleet
from whaleflux.shared.events import (
    GpuIdentity,
    GpuSample,
    GpuTelemetry,
    JobFinished,
    JobSubmitted,
    NodeRegistered,
    decode,
)

from .processes import Clock, connect_bus, until

ASSETS = """\
contracts:
  - id: CW-A100
    provider: coreweave
    start: 2026-01-01
    end: {end}
    monthly_price_per_gpu: "1890.00"
    notice_days: 30
assets:
  - node: a100-01
    model: A100
    gpus: 8
    ownership: leased
    pool: onprem
    leases: [CW-A100]
"""
END = datetime(2026, 4, 1, tzinfo=UTC)  # the day after `end: 2026-03-31`


def _fleet_registrations() -> list[NodeRegistered]:
    """The small demo fleet as its agents would register it."""
    models = gpu_models()
    out = []
    for n in load_fleet().nodes():
        m = models[n.gpu_model]
        gpus = [GpuIdentity(uuid=f"GPU-{n.name}-{i}", index=i, model=n.gpu_model, name=m.names[0],
                            memory_total_mib=m.memory_mib) for i in range(n.gpus)]
        out.append(NodeRegistered(cluster=n.cluster, node=n.name, rack=n.rack, pool=n.pool, interconnect=n.interconnect,
                                  agent_version="test", gpus=gpus))
    return out


async def test_lease_horizons_fire_once_survive_a_restart_and_stop_when_renewed(env, tmp_path, monkeypatch):
    assets = tmp_path / "assets.yaml"
    assets.write_text(ASSETS.format(end="2026-03-31"))
    monkeypatch.setenv("WHALEFLUX_ASSETS_FILE", str(assets))
    monkeypatch.setenv("WHALEFLUX_CHECK_INTERVAL_S", "3600")  # the test drives the checks
    clock = Clock(END - timedelta(days=70))

    nc = await nats.connect(env.nats_url, user=env.nats_user, password=env.nats_password)
    received = []

    async def on_msg(msg):
        received.append(decode(msg.data)[0].id)

    await nc.subscribe("lease.>", cb=on_msg)
    bus = await connect_bus(env)
    [a100] = [r for r in _fleet_registrations() if r.node == "a100-01"]
    await bus.publish(subjects.node_registered(a100.cluster, a100.node), a100)

    _, svc = build(InventorySettings(), clock=clock)
    await svc.runtime.start()
    try:
        await until(lambda: svc.store.node("onprem", "a100-01"), what="registration")
        published: list[str] = []

        async def check_at(now: datetime) -> None:
            clock.now = now
            published.extend(n.event_id for n in await svc.check_leases())

        await check_at(END - timedelta(days=70))  # nothing due yet
        await check_at(END - timedelta(days=59))  # 29 days before the notice deadline (Mar 2)
        await check_at(END - timedelta(days=31))  # 1 day before it: the 7-day horizon was slept through
        await check_at(END - timedelta(days=29))
        await check_at(END - timedelta(days=29))  # same time again: nothing new

        # Restart: a new service object on the same Redis and streams sees what already fired.
        await svc.runtime.stop()
        _, svc = build(InventorySettings(), clock=clock)
        await svc.runtime.start()
        await check_at(END - timedelta(days=29))
        await check_at(END - timedelta(days=6))

        # Renewal: a new end date in the assets file. The remaining horizons (1 day) never fire,
        # nor does lease.expired at the old end.
        assets.write_text(ASSETS.format(end="2026-09-30"))
        assert await svc.reload_file()
        await check_at(END - timedelta(hours=12))
        await check_at(END + timedelta(minutes=5))

        expected = [
            "lease-expiring-CW-A100-30d-notice-20260302",
            "lease-expiring-CW-A100-1d-notice-20260302",
            "lease-expiring-CW-A100-30d-end-20260401",
            "lease-expiring-CW-A100-7d-end-20260401",
        ]
        # The service's own start-up check may publish a due notice before the test's
        # call does (it runs when the loop first gets to it): what counts is what went out.
        assert set(published) <= set(expected) and len(published) >= 3
        await until(lambda: asyncio.sleep(0, len(received) >= 4), what="events on the bus")
        await asyncio.sleep(0.2)  # a duplicate would arrive right behind
        assert received == expected
        info = await bus.js.stream_info("WHALEFLUX_LEASES")
        assert info.state.messages == 4

        # The new term still gets its own notices later.
        await check_at(datetime(2026, 9, 2, tzinfo=UTC))
        assert published[-1] == "lease-expiring-CW-A100-30d-end-20261001"
    finally:
        await svc.runtime.stop()
        await bus.close()
        await nc.close()


async def test_rollup_over_a_simulated_day_matches_the_scheduler_allocations(env, monkeypatch):
    monkeypatch.setenv("WHALEFLUX_CHECK_INTERVAL_S", "3600")
    day = datetime(2026, 3, 10, tzinfo=UTC)
    clock = Clock(day)
    bus = await connect_bus(env)
    regs = _fleet_registrations()
    for r in regs:
        await bus.publish(subjects.node_registered(r.cluster, r.node), r)
    _, sched = build_scheduler(SchedulerSettings(), clock=clock)
    app, inv = build(InventorySettings(), clock=clock)
    await sched.runtime.start()
    await inv.runtime.start()
    try:
        await until(lambda: _count(_len(sched.store.node_keys()), 1), what="scheduler nodes")
        await until(lambda: _count(inv.store.node_count(), len(regs)), what="inventory nodes")
        await until(lambda: asyncio.sleep(0, "inventory-telemetry" in inv.runtime.bus.bound), what="telemetry consumer")

        # (start offset, duration, gpus, model): overlapping jobs, some crossing hour boundaries.
        plan = [
            (timedelta(hours=0, minutes=5), timedelta(hours=3, minutes=7, seconds=11), 4, "A100"),
            (timedelta(hours=1, minutes=59, seconds=30), timedelta(minutes=1), 1, "H100"),
            (timedelta(hours=2, minutes=0, seconds=45), timedelta(hours=10, seconds=1), 8, "H100"),
            (timedelta(hours=5, minutes=30), timedelta(hours=2, minutes=30), 2, "RTX4090"),
            (timedelta(hours=9, seconds=17), timedelta(hours=14, minutes=59), 8, "H200"),
            (timedelta(hours=13, minutes=45, milliseconds=250), timedelta(hours=8), 3, "A100"),
            (timedelta(hours=22, minutes=10), timedelta(hours=5), 2, "RTX4090"),  # still running at day end
        ]
        events = []
        for i, (start, length, gpus, model) in enumerate(plan):
            events.append((day + start, "submit", f"day-{i}", gpus, model))
            events.append((day + start + length, "finish", f"day-{i}", gpus, model))
        sampled = False
        for at, kind, job_id, gpus, model in sorted(events):
            if at >= day + timedelta(days=1):
                continue
            clock.now = at
            if kind == "submit":
                await bus.publish(subjects.JOB_SUBMITTED, JobSubmitted(
                    job_id=job_id, name=job_id, command=["true"], gpus=gpus, gpu_models=[model]))
                job = await until(lambda j=job_id: _state(sched, j, "placed"), what=f"{job_id} placed")
                await until(lambda j=job_id: inv.store.has_allocation(f"{j}:1"), what="inventory saw placement")
                if job_id == "day-2" and not sampled:
                    # Ten minutes of telemetry on the H100 node while the job holds all of it.
                    sampled = True
                    await _telemetry(bus, inv, regs, "h100-01", at)
            else:
                job = await sched.get_job(job_id)
                assert job is not None and job.cluster and job.node and job.placed_at
                await bus.publish(subjects.job_finished(job.cluster, job.node), JobFinished(
                    job_id=job_id, attempt=1, cluster=job.cluster, node=job.node, exit_code=0,
                    started_at=job.placed_at, finished_at=at))
                await until(lambda j=job_id: _state(sched, j, "succeeded"), what=f"{job_id} finished")
                await until(lambda j=job_id: inv.store.has_allocation(f"{j}:1", ended=True), what="inventory saw end")

        clock.now = day + timedelta(days=1)
        # What the scheduler recorded, per GPU and hour.
        expected: dict[tuple[str, str], float] = {}
        for i in range(len(plan)):
            job = await sched.get_job(f"day-{i}")
            assert job is not None and job.placed_at is not None
            placed, ended = job.placed_at, job.finished_at or clock.now
            for h in range(24):
                lo, hi = day + timedelta(hours=h), day + timedelta(hours=h + 1)
                overlap = (min(ended, hi) - max(placed, lo)).total_seconds()
                if overlap > 0:
                    for gpu in job.gpu_uuids:
                        expected[(gpu, lo.isoformat())] = expected.get((gpu, lo.isoformat()), 0) + overlap

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://inventory") as http:
            params = {"by": "gpu", "start": day.isoformat(), "end": clock.now.isoformat()}
            rows = (await http.get("/v1/rollups", params=params)).json()
            pools = (await http.get("/v1/rollups", params={**params, "by": "pool"})).json()
            by_model = {r["key"]: r for r in (await http.get("/v1/inventory", params={"by": "model"})).json()}
        got = {(r["key"], r["hour"]): r["allocated_s"] for r in rows if r["allocated_s"]}
        assert set(got) == set(expected)
        for key, seconds in expected.items():
            assert got[key] == pytest.approx(seconds, abs=1e-6), key
        assert len(rows) == 24 * sum(len(r.gpus) for r in regs)
        total = sum(expected.values())
        assert sum(r["allocated_s"] for r in pools) == pytest.approx(total, abs=1e-5)
        hour3 = (day + timedelta(hours=3)).isoformat()
        onprem_h3 = next(r for r in pools if r["key"] == "onprem" and r["hour"] == hour3)
        onprem_s = sum(v for (g, h), v in expected.items() if h == hour3 and ("a100" in g or "h100" in g))
        assert onprem_h3["allocated_fraction"] == pytest.approx(onprem_s / (16 * 3600))

        # Mean utilization while allocated only counts the allocated GPUs' samples.
        day2_job = await sched.get_job("day-2")
        assert day2_job is not None
        day2 = set(day2_job.gpu_uuids)
        h100_hour = [r for r in rows if r["hour"] == (day + timedelta(hours=2)).isoformat() and r["key"] in day2]
        assert len(h100_hour) == 8 and all(r["mean_util_allocated"] == 80.0 for r in h100_hour)
        other = [r for r in rows if r["hour"] == (day + timedelta(hours=2)).isoformat() and r["key"] not in day2]
        assert all(r["mean_util_allocated"] is None for r in other)
        assert by_model["RTX4090"]["allocated"] == 2 and by_model["H100"]["allocated"] == 0
    finally:
        await inv.runtime.stop()
        await sched.runtime.stop()
        await bus.close()


async def _count(awaitable, n: int) -> bool:
    return await awaitable >= n


async def _len(awaitable) -> int:
    return len(await awaitable)


async def _state(sched: Scheduler, job_id: str, state: str):
    job = await sched.get_job(job_id)
    return job if job is not None and job.state == state else None


async def _telemetry(bus: Bus, inv: Inventory, regs: list[NodeRegistered], node: str, at: datetime) -> None:
    [reg] = [r for r in regs if r.node == node]
    for s in range(10):
        gpus = [GpuSample(uuid=g.uuid, index=g.index, model=g.model, utilization_gpu_pct=80.0, memory_used_mib=0,
                          memory_total_mib=g.memory_total_mib, temperature_c=40)
                for g in reg.gpus]
        data = GpuTelemetry(cluster=reg.cluster, node=node, seq=s, sample_time=at + timedelta(minutes=s), gpus=gpus)
        await bus.publish(subjects.gpu_telemetry(reg.cluster, node), data)
    hour = at.replace(minute=0, second=0, microsecond=0)
    await until(lambda: _samples(inv, reg.gpus[-1].uuid, hour, 10), what="telemetry consumed")


async def _samples(inv: Inventory, uuid: str, hour: datetime, n: int) -> bool:
    sums = (await inv.store.utilization(hour, hour + timedelta(hours=1))).get((uuid, hour))
    return sums is not None and sums.total_n >= n


def test_inventory_process_declares_assets_rejects_bad_uploads_and_serves_the_cli(clean_servers, tmp_path):
    from .processes import ADMIN_TOKEN, make_cluster, wait_until

    today = datetime.now(UTC).date()
    assets = tmp_path / "assets.yaml"
    assets.write_text(
        ASSETS.format(end=(today + timedelta(days=19)).isoformat())
        .replace("node: a100-01", "node: h200-01").replace("model: A100", "model: H200")
        .replace("pool: onprem", "pool: cloud")
        + "  - node: r4090-01\n    ownership: owned\n    pool: dev\n"
          "    purchase: {price_per_gpu: \"1800\", date: 2026-01-01, depreciation_months: 24}\n"
    )
    cluster = make_cluster(clean_servers, tmp_path)
    inv = cluster.service("inventory", WHALEFLUX_ASSETS_FILE=str(assets), WHALEFLUX_CHECK_INTERVAL_S="0.2")
    cluster.agent("r4090-01", "h200-01", "a100-01")
    try:
        inv.wait_ready()
        rows = wait_until(lambda: _all_assets(inv.url, 20), what="assets")
        by_node: dict[str, dict] = {}
        for r in rows:
            by_node.setdefault(r["node"], r)
        assert by_node["h200-01"]["ownership"] == "leased" and by_node["h200-01"]["lease"]["contract_id"] == "CW-A100"
        assert by_node["h200-01"]["lease"]["monthly_price_per_gpu_usd"] == "1890.00"
        assert by_node["r4090-01"]["monthly_cost_usd"] == "75.00" and by_node["r4090-01"]["pool"] == "dev"
        assert by_node["a100-01"]["ownership"] == "owned-unknown" and not by_node["a100-01"]["declared"]

        # A bad upload is rejected with line and key; the declarations in force do not change.
        bad = assets.read_text().replace("model: H200", "model: H900")
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        assert httpx.put(inv.url + "/admin/assets", content=bad).status_code == 401
        resp = httpx.put(inv.url + "/admin/assets", content=bad, headers=auth)
        assert resp.status_code == 422
        assert resp.json()["detail"]["errors"] == [
            "upload:10: assets[0].model: unknown model 'H900' (known: A100, H100, H200, RTX4090)"]
        declared = httpx.get(inv.url + "/v1/declarations").json()
        assert declared["source"] == str(assets) and declared["last_error"]["source"] == "upload"
        assert declared["declarations"]["assets"][0]["model"] == "H200"

        # The 30-day horizon of the end date was reached: one lease.expiring for the 8 H200 GPUs.
        leases_out = cluster.cli("leases")
        assert leases_out.returncode == 0, leases_out.stderr
        assert "CW-A100" in leases_out.stdout and "$15120.00" in leases_out.stdout and "(passed)" in leases_out.stdout
        history = wait_until(lambda: asyncio.run(_lease_events(clean_servers)), what="lease.expiring")
        [event] = history
        assert event.contract_id == "CW-A100" and event.horizon_days == 30 and event.gpu_count == 8
        assert event.summary.startswith("1 leased H200 node (8 GPUs) of contract CW-A100 (coreweave) expire in ")
        assert "notice deadline passed — renew or release?" in event.summary

        inventory_out = cluster.cli("inventory", "--by", "ownership")
        assert inventory_out.returncode == 0, inventory_out.stderr
        assert "owned-unknown" in inventory_out.stdout and "leased" in inventory_out.stdout
        findings_out = cluster.cli("findings")
        assert "8 GPUs registered but not declared" in findings_out.stdout and "capacity now" in findings_out.stdout
    finally:
        cluster.stop()


def _all_assets(url: str, n: int) -> list | None:
    rows = httpx.get(url + "/v1/assets").json()
    return rows if len(rows) == n else None


async def _lease_events(servers) -> list:
    bus = await connect_bus(servers)
    try:
        sub = await bus.js.pull_subscribe("lease.>", stream="WHALEFLUX_LEASES")
        try:
            msgs = await sub.fetch(10, timeout=0.5)
        except TimeoutError:  # none stored yet (nats.errors.TimeoutError is one)
            return []
        return [decode(m.data)[1] for m in msgs]
    finally:
        await bus.close()


async def test_capacity_snapshot_names_queued_work_and_forgets_rejected_jobs(env, monkeypatch):
    monkeypatch.setenv("WHALEFLUX_CHECK_INTERVAL_S", "3600")
    clock = Clock(datetime(2026, 3, 10, tzinfo=UTC))
    bus = await connect_bus(env)
    regs = _fleet_registrations()
    for r in regs:
        await bus.publish(subjects.node_registered(r.cluster, r.node), r)
    _, sched = build_scheduler(SchedulerSettings(), clock=clock)
    _, inv = build(InventorySettings(), clock=clock)
    await sched.runtime.start()
    await inv.runtime.start()
    try:
        await until(lambda: _count(_len(sched.store.node_keys()), len(regs)), what="scheduler nodes")
        jobs = [
            JobSubmitted(job_id="fills-h100", name="a", command=["true"], gpus=8, gpu_models=["H100"]),
            JobSubmitted(job_id="waits-48h", name="b", command=["true"], gpus=8, gpu_models=["H100"],
                         expected_runtime_s=48 * 3600),
            # 16 GPUs on one NVLink node: the fleet's nodes have 8 (without nvlink it would run as a gang).
            JobSubmitted(job_id="never-fits", name="c", command=["true"], gpus=16, nvlink=True),
        ]
        for job in jobs:
            await bus.publish(subjects.JOB_SUBMITTED, job)
        await until(lambda: _state(sched, "fills-h100", "placed"), what="first job placed")
        await until(lambda: _state(sched, "never-fits", "rejected"), what="infeasible job rejected")

        async def snapshot():
            found = [f for f in await inv.all_findings(clock()) if f.kind == "capacity"]
            text = found[0].summary if found else ""
            return "1 job queued" in text and text
        text = await until(snapshot, what="capacity snapshot with the queue")
        assert "a 48 h job needing 8x H100 is queued (waits-48h)" in text
        assert "never-fits" not in text
        assert "H100 node" not in text  # the only H100 node is taken
    finally:
        await sched.runtime.stop()
        await inv.runtime.stop()
        await bus.close()
