"""The scheduler uses what telemetry and inventory know, through the real services: memory a foreign process
holds on an idle GPU, and a lease that ends before the job would."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import httpx

from whaleflux.scheduler.feeds import DRIVER_RESERVE_MIB, free_memory, lease_ends
from whaleflux.shared.contracts import LEASES
from whaleflux.shared.events import GpuSample, GpuTelemetry

from .processes import ADMIN_TOKEN, make_cluster, wait_until

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def test_free_memory_is_what_the_sample_leaves_less_the_driver_reserve():
    gpu = GpuSample(uuid="g", index=0, model="A100", utilization_gpu_pct=0, memory_used_mib=60000,
                    memory_total_mib=81920, temperature_c=40)
    batch = GpuTelemetry(cluster="c", node="n", seq=1, sample_time=datetime.now(UTC), gpus=[gpu])
    assert free_memory(batch) == {"g": 81920 - 60000 - DRIVER_RESERVE_MIB}


def _lease(ends_at: str, nodes: list[str], auto_renew: bool) -> dict[str, object]:
    """One row of inventory's /v1/leases as it answers it."""
    return {"contract_id": f"c-{nodes[0]}-{ends_at}", "provider": "p", "state": "active", "start": "2026-01-01",
            "ends_at": ends_at, "days_left": 10.0, "notice_deadline": None, "notice_days_left": None,
            "auto_renew": auto_renew, "minimum_term_months": 1, "renewed_by": None, "gpu_count": 8 * len(nodes),
            "nodes": nodes, "gpu_models": ["H200"], "monthly_price_per_gpu_usd": "1500.00",
            "monthly_cost_usd": "12000.00"}


def test_lease_ends_per_node_skip_auto_renewing_leases_and_take_the_first_end():
    ends = lease_ends(LEASES.validate_python([
        _lease("2026-12-02T00:00:00+00:00", ["h200-01", "h200-02"], auto_renew=False),
        _lease("2026-12-01T12:00:00+00:00", ["h200-02"], auto_renew=False),
        _lease("2026-12-01T01:00:00+00:00", ["rented-01"], auto_renew=True),
    ]))
    assert ends == {"h200-01": datetime(2026, 12, 2, tzinfo=UTC).timestamp(),
                    "h200-02": datetime(2026, 12, 1, 12, tzinfo=UTC).timestamp()}


def _submit(scheduler, **body) -> str:
    r = httpx.post(scheduler.url + "/v1/jobs", json={"name": "j", "command": ["sleep", "30"], **body}, headers=AUTH)
    assert r.status_code == 202, r.text
    return r.json()["job_id"]


def _job(scheduler, job_id: str) -> dict:
    return httpx.get(f"{scheduler.url}/v1/jobs/{job_id}").json()


def _why(scheduler, job_id: str) -> str:
    return httpx.get(f"{scheduler.url}/v1/jobs/{job_id}/why").json()["why"]


def test_memory_a_foreign_process_holds_on_an_idle_gpu_keeps_a_job_away_and_why_says_so(clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    scheduler = cluster.service("scheduler")
    agent = cluster.agent("r4090-01", http=True)
    try:
        scheduler.wait_ready()
        wait_until(lambda: httpx.get(scheduler.url + "/v1/nodes").json(), what="node registered")
        for gpu in (0, 1, 2):  # three of the four idle 24 GB GPUs get 20 GB taken by something we did not start
            fault = {"kind": "foreign-memory", "node": "r4090-01", "gpu": gpu, "memory_mib": 20000}
            assert httpx.post(agent.url + "/admin/faults", json=fault, headers=AUTH).status_code == 200
        spec = {"gpu_models": ["RTX4090"], "min_memory_mib": 12000}
        # The scheduler hears of the held memory from the next samples.
        wait_until(lambda: all(f is not None and f < 12000 for f in httpx.get(scheduler.url + "/v1/nodes").json()[0]
                               ["memory_free_mib"][:3]), what="the scheduler sees the held memory")
        first = _submit(scheduler, **spec)
        placed = wait_until(lambda: (j := _job(scheduler, first))["state"] in ("placed", "running") and j,
                            what="placed")
        assert placed["gpu_uuids"] == [g["uuid"] for g in httpx.get(agent.url + "/v1/nodes").json()[0]["gpus"]
                                       if g["index"] == 3], placed
        second = _submit(scheduler, **spec)
        why = wait_until(lambda: "memory" in (w := _why(scheduler, second)) and w, what="why mentions memory")
        assert _job(scheduler, second)["state"] == "pending", why
    finally:
        cluster.stop()


def test_a_job_is_kept_off_a_node_whose_lease_ends_before_it_would_and_why_says_so(clean_servers, tmp_path):
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).date()
    assets = tmp_path / "assets.yaml"
    assets.write_text(
        "contracts:\n"
        f"  - {{id: SHORT, provider: p, start: 2026-01-01, end: {tomorrow}, monthly_price_per_gpu: '2000',"
        " minimum_term_months: 1, auto_renew: false, notice_days: 1}\n"
        "assets:\n"
        "  - {node: h200-01, model: H200, gpus: 8, ownership: leased, cluster: cloud-a, pool: cloud, leases: [SHORT]}\n"
    )
    cluster = make_cluster(clean_servers, tmp_path)
    inventory = cluster.service("inventory", WHALEFLUX_ASSETS_FILE=str(assets))
    scheduler = cluster.service("scheduler", WHALEFLUX_INVENTORY_URL=inventory.url, WHALEFLUX_LEASE_REFRESH_S="0.5")
    cluster.agent("h200-01")
    try:
        scheduler.wait_ready()
        inventory.wait_ready()
        wait_until(lambda: httpx.get(scheduler.url + "/v1/nodes").json(), what="node registered")
        wait_until(lambda: httpx.get(scheduler.url + "/v1/nodes").json()[0]["lease_ends_at"],
                   what="lease known to the scheduler")
        long = _submit(scheduler, gpu_models=["H200"], expected_runtime_s=100 * 3600)
        why = wait_until(lambda: "lease ends" in (w := _why(scheduler, long)) and w, what="why mentions the lease")
        # The lease's end in local time with its date (not today), how far off, and the job's need, in words.
        assert "{at:" not in why and "(in " in why and re.search(r"job needs \d+ d", why), why
        assert _job(scheduler, long)["state"] == "pending", why
        short = _submit(scheduler, gpu_models=["H200"], expected_runtime_s=600)
        wait_until(lambda: _job(scheduler, short)["state"] in ("placed", "running"),
                   what="a short job still runs there")
    finally:
        cluster.stop()
