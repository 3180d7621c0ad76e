"""Production by default where it matters (issue 36, part 8), each through the real service: a silent fleet is
`unknown`, never `healthy`; a threshold outside its physical range is refused with its file, line and key."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import httpx

from whaleflux.agent.simulated import SimulatedNode
from whaleflux.shared import subjects
from whaleflux.shared.bus import Bus
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.events import GpuTelemetry, NodeRegistered
from whaleflux.telemetry.app import TelemetrySettings, build

from .processes import ADMIN_TOKEN, Clock, make_cluster, until, wait_until
from .rootjobs import ROOT_JOBS

SERVICES = ("telemetry", "scheduler", "alerting", "billing", "inventory")

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


async def test_a_fleet_whose_telemetry_went_silent_is_unknown_not_healthy(env):
    clock = Clock(T0)
    settings = TelemetrySettings(maintenance_interval_s=3600, stale_after_s=15)
    app, svc = build(settings, clock=clock)
    await svc.start()
    bus = await Bus.connect(env.nats_url, source="test", user=env.nats_user, password=env.nats_password)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://telemetry")
    try:
        await until(lambda: asyncio.sleep(0, "telemetry-gpu" in svc.runtime.bus.bound), what="consumers")
        assert (await http.get("/v1/fleet")).json()["health"] == "unknown"  # nothing heard yet
        node = SimulatedNode("h100-01", gpu_models()["H100"], 2, interconnect="nvlink")
        await bus.publish(subjects.node_registered("onprem", "h100-01"),
                          NodeRegistered(cluster="onprem", node="h100-01", agent_version="t", gpus=node.identities()))
        await bus.publish(subjects.gpu_telemetry("onprem", "h100-01"),
                          GpuTelemetry(cluster="onprem", node="h100-01", seq=1, sample_time=T0, gpus=node.sample(T0)))

        async def fleet() -> dict:
            return (await http.get("/v1/fleet")).json()

        async def heard() -> bool:
            return (await fleet())["gpus"] == 2

        await until(heard, what="the batch stored")
        assert (await fleet())["health"] == "healthy"
        assert [n["health"] for n in (await http.get("/v1/nodes")).json()] == ["healthy"]

        # No sample within the freshness window: silence, which is not health.
        clock.now = T0 + timedelta(seconds=settings.stale_after_s + 1)
        assert (await fleet())["health"] == "unknown"
        assert [n["health"] for n in (await http.get("/v1/nodes")).json()] == ["unknown"]
        assert (await http.get("/v1/nodes/h100-01")).json()["summary"]["health"] == "unknown"
    finally:
        await http.aclose()
        await bus.close()
        await svc.stop()


RULES = """\
rules:
  - name: Overheating
    kind: threshold
    metric: temperature_c
    threshold: {value: %s}
    actions: [drain]
    summary: "GPU {gpu} on {node} at {value:.0f} C"
route: {receiver: hook}
receivers:
  - {name: hook, type: webhook, url: "http://127.0.0.1:9/hook"}
"""


def test_a_threshold_outside_its_physical_range_is_refused_naming_file_line_and_key(clean_servers, tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES % 90)
    cluster = make_cluster(clean_servers, tmp_path)
    proc = cluster.service("alerting", WHALEFLUX_ALERTING_RULES_FILE=str(rules))
    try:
        proc.wait_ready()
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        # 0 °C would fire on every GPU and drain every node: refused, the 90 °C rule stays in force.
        rules.write_text(RULES % 0)
        refused = httpx.post(proc.url + "/admin/rules/reload", headers=admin)
        assert refused.status_code == 422, refused.text
        [problem] = refused.json()["detail"]
        assert problem.startswith(f"{rules}:5: rules[0].threshold.value:"), problem
        assert "outside the physical range of temperature_c (30–120 °C)" in problem
        assert [r["name"] for r in httpx.get(proc.url + "/v1/rules").json()["rules"]] == ["Overheating"]
        rules.write_text(RULES % 95)
        assert httpx.post(proc.url + "/admin/rules/reload", headers=admin).status_code == 200

        # At start-up too: a service given such a file stops, naming the line, instead of draining the fleet.
        rules.write_text(RULES % 500)
        bad = cluster.service("alerting", "bad", WHALEFLUX_ALERTING_RULES_FILE=str(rules))
        wait_until(lambda: bad.process.poll() is not None, timeout=120, what="alerting refusing the file")
        assert bad.process.returncode != 0
        assert f"{rules}:5: rules[0].threshold.value" in bad.log_path.read_text()
    finally:
        cluster.stop()


def _login_cookie(url: str, **headers: str) -> str:
    answer = httpx.get(url + "/login", headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.headers["set-cookie"]


def test_the_consoles_cookies_are_secure_behind_tls_and_a_forwarded_header_counts_only_when_trusted(
        clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    plain = cluster.service("console", "plain")
    proxied = cluster.service("console", "proxied", WHALEFLUX_TRUST_FORWARDED_PROTO="true")
    try:
        plain.wait_ready()
        proxied.wait_ready()
        assert "secure" not in _login_cookie(plain.url).lower()
        # A header anyone could send is not TLS: without a trusted proxy it changes nothing.
        assert "secure" not in _login_cookie(plain.url, **{"X-Forwarded-Proto": "https"}).lower()
        # Behind the proxy it trusts, HTTPS at the proxy makes the cookies HTTPS-only...
        assert "; secure" in _login_cookie(proxied.url, **{"X-Forwarded-Proto": "https"}).lower()
        # ...and the proxy's plain HTTP does not.
        assert "secure" not in _login_cookie(proxied.url, **{"X-Forwarded-Proto": "http"}).lower()
    finally:
        cluster.stop()


def test_up_production_starts_every_service_with_authenticated_reads(tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WHALEFLUX_", "NATS_", "REDIS_"))} | ROOT_JOBS
    env["WHALEFLUX_HOME"] = str(home)
    with open(tmp_path / "up.out", "wb") as out_file:
        up = subprocess.Popen([sys.executable, "-m", "whaleflux", "up", "--production"], env=env, stdout=out_file,
                              stderr=subprocess.STDOUT)
    try:
        config = home / "config.json"

        def all_ready() -> bool:
            if up.poll() is not None:
                raise AssertionError((tmp_path / "up.out").read_text()[-3000:])
            services = json.loads(config.read_text())["services"] if config.exists() else {}
            return set(SERVICES) <= set(services) and all(
                httpx.get(services[s] + "/readyz", timeout=1).status_code == 200 for s in SERVICES)

        wait_until(all_ready, timeout=180, what="all five services ready in production mode")
        cfg = json.loads(config.read_text())
        token = {"Authorization": f"Bearer {cfg['admin_token']}"}
        reads = {"telemetry": "/v1/fleet", "scheduler": "/v1/jobs", "alerting": "/v1/alerts",
                 "billing": "/v1/costs", "inventory": "/v1/assets"}
        for name, path in reads.items():
            assert httpx.get(cfg["services"][name] + path, timeout=10).status_code == 401, name
        assert httpx.get(cfg["services"]["scheduler"] + "/v1/jobs", headers=token, timeout=10).status_code == 200
        # The CLI carries the token from the config file: it works as before.
        done = subprocess.run([sys.executable, "-m", "whaleflux", "submit", "--wait", "--", "true"], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "succeeded" in done.stdout, done.stdout + done.stderr
        assert "production" in (tmp_path / "up.out").read_text()
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
