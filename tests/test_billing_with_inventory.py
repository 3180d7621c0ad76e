"""The real inventory and billing processes: ownership travels over HTTP, the CLI shows and exports costs."""

from __future__ import annotations

import asyncio
import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx

from whaleflux.shared import subjects
from whaleflux.shared.bus import Bus
from whaleflux.shared.events import GpuIdentity, JobFinished, JobPlaced, JobStarted, NodeRegistered

from .processes import make_cluster, wait_until

ASSETS = """\
contracts:
  - {id: CW-H200, provider: coreweave, start: 2026-01-01, end: 2027-12-31, monthly_price_per_gpu: "2150.00"}
assets:
  - {node: h200-01, model: H200, gpus: 2, ownership: leased, pool: cloud, leases: [CW-H200]}
"""


async def _publish(servers, start: datetime) -> None:
    bus = await Bus.connect(servers.nats_url, source="test", user=servers.nats_user, password=servers.nats_password)
    try:
        await bus.ensure_streams()
        gpus = [GpuIdentity(uuid=f"GPU-h200-{i}", index=i, model="H200", name="NVIDIA H200", memory_total_mib=143771)
                for i in range(2)]
        await bus.publish(subjects.node_registered("c1", "h200-01"),
                          NodeRegistered(cluster="c1", node="h200-01", pool="cloud", agent_version="t", gpus=gpus))
        uuids = ["GPU-h200-0"]
        await bus.publish(subjects.job_placed("c1", "h200-01"), JobPlaced(
            job_id="tune", attempt=1, cluster="c1", node="h200-01", gpu_model="H200", gpu_uuids=uuids,
            gpu_indices=[0], command=["x"], team="retail", project="bot"), event_id="placed-tune-1", time=start)
        await bus.publish(subjects.JOB_STARTED, JobStarted(job_id="tune", attempt=1, cluster="c1", node="h200-01",
                          gpu_uuids=uuids, pid=1, started_at=start), event_id="started-tune-1")
        await bus.publish(subjects.JOB_FINISHED, JobFinished(
            job_id="tune", attempt=1, cluster="c1", node="h200-01", exit_code=0, started_at=start,
            finished_at=start + timedelta(minutes=30)), event_id="finished-tune-1")
    finally:
        await bus.close()


def test_billing_prices_a_job_with_the_lease_inventory_declares_and_the_cli_exports_focus(clean_servers, tmp_path):
    assets = tmp_path / "assets.yaml"
    assets.write_text(ASSETS)
    cluster = make_cluster(clean_servers, tmp_path)
    inventory = cluster.service("inventory", WHALEFLUX_ASSETS_FILE=str(assets))
    inventory.wait_ready()
    billing = cluster.service("billing", WHALEFLUX_INVENTORY_URL=inventory.url, WHALEFLUX_INVENTORY_REFRESH_S="0.3")
    try:
        billing.wait_ready()
        now = datetime.now(UTC)
        start = now - timedelta(hours=1)
        asyncio.run(_publish(clean_servers, start))
        frm = (start - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")

        def leased():
            r = httpx.get(billing.url + "/v1/costs", params={"by": "team", "from": frm}).json()
            return r["rows"] and r["idle"] and r["idle"][0]["ownership"] == "leased" and r
        report = wait_until(leased, timeout=60, what="job priced with inventory's lease")
        assert report["pricing"]["inventory"]["basis"] == "inventory ownership terms"
        [row] = report["rows"]
        assert row["key"] == "retail" and row["gpu_hours"] == "0.5000"
        [line] = report["idle"]
        assert (line["pool"], line["model"], line["gpus"]) == ("cloud", "H200", 2)
        totals = report["totals"]
        assert Decimal(row["cost_usd"]) + Decimal(totals["idle_usd"]) + Decimal(totals["rounding_usd"]) == Decimal(
            totals["fleet_usd"])

        shown = cluster.cli("costs", "--by", "team", "--from", frm)
        assert shown.returncode == 0, shown.stderr
        assert "retail" in shown.stdout and "leased" in shown.stdout and "fleet $" in shown.stdout
        to = now.strftime("%Y-%m-%dT%H:%M:%SZ")  # one fixed window for every export below
        exported = cluster.cli("costs", "--export", "focus", "--from", frm, "--to", to)
        assert exported.returncode == 0, exported.stderr
        rows = list(csv.DictReader(io.StringIO(exported.stdout)))
        usage = [r for r in rows if r["x_JobId"] == "tune"]
        assert [(r["ResourceId"], r["x_Team"], Decimal(r["ConsumedQuantity"])) for r in usage] == [
            ("GPU-h200-0", "retail", Decimal("0.5"))]
        assert {r["ChargeCategory"] for r in rows} == {"Usage", "Purchase"}
        assert all(r["AllocatedMethodId"] == "" for r in rows)
        # Idle shared back: the leased pool's idle rows become split cost allocation rows for the team that used it.
        shared = cluster.cli("costs", "--export", "focus", "--share-idle", "--by", "team", "--from", frm, "--to", to)
        assert shared.returncode == 0, shared.stderr
        split = list(csv.DictReader(io.StringIO(shared.stdout)))
        allocated = [r for r in split if r["AllocatedMethodId"]]
        assert allocated and {(r["AllocatedResourceId"], r["x_Idle"]) for r in allocated} == {("team/retail", "true")}
        assert not [r for r in split if r["x_Idle"] == "true" and r["ChargeCategory"] == "Usage"
                    and not r["AllocatedMethodId"]]
        effective = lambda rs: sum((Decimal(r["EffectiveCost"]) for r in rs), Decimal(0))  # noqa: E731
        assert effective(split) == effective(rows)  # split exactly: the same total to the last digit
        refused = cluster.cli("costs", "--export", "focus", "--share-idle", "--by", "job", "--from", frm)
        assert refused.returncode == 1 and "--by team or --by project" in refused.stdout + refused.stderr
        tco = cluster.cli("costs", "tco", "--model", "H200", "--purchase-price", "35000", "--usd-per-kwh", "0.12",
                          "--overhead", "150")
        assert tco.returncode == 0, tco.stderr
        assert "breaks even with cloud in month" in tco.stdout and "2190" in tco.stdout  # reference H200 lease
    finally:
        cluster.stop()
