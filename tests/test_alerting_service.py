"""Alerting through real NATS, Redis, a service process and real local HTTP receivers of every type."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import httpx
import nats
import pytest
from redis.asyncio import Redis

from whaleflux.servers import QuietHandler, serve_http
from whaleflux.shared import subjects
from whaleflux.shared.bus import Bus
from whaleflux.shared.events import EventData, GpuIdentity, GpuSample, GpuTelemetry, NodeRegistered, decode

from .processes import ADMIN_TOKEN, make_cluster, wait_until


class Receiver:
    """A real local HTTP server; answers 503 to the first `fail_first` POSTs, then `ok_status`."""

    def __init__(self, fail_first: int = 0, ok_status: int = 200) -> None:
        self.received: list[dict] = []
        self.failures = 0
        me = self

        class Handler(QuietHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if me.failures < fail_first:
                    me.failures += 1
                    self.send_response(503)
                else:
                    me.received.append(body)
                    self.send_response(ok_status)
                self.end_headers()

        self.server = serve_http(Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"

    def close(self) -> None:
        self.server.shutdown()


RULES = """
rules:
  - name: GPUTemperatureHigh
    kind: threshold
    metric: temperature_c
    threshold: {device: slowdown_temperature_c, model: temp_slowdown_c}
    hysteresis: 3
    severity: critical
    category: thermal
    summary: "GPU {gpu} on {node} at {value:.0f} C (slowdown {threshold:.0f} C)"
    actions: [drain]
route:
  receiver: hook
  group_by: [incident]
  group_wait: 0s
  group_interval: 1s
  routes:
    - {matchers: [severity="critical"], receiver: pd, continue: true}
    - {matchers: [severity="critical"], receiver: slack, continue: true}
    - {matchers: [severity="critical"], receiver: teams, continue: true}
    - {matchers: [severity="critical"], receiver: hook}
receivers:
  - {name: pd, type: pagerduty, url: "%(pd)s", routing_key_env: TEST_PD_KEY}
  - {name: slack, type: slack, url_env: TEST_SLACK_URL}
  - {name: teams, type: teams, url: "%(teams)s"}
  - {name: hook, type: webhook, url: "%(hook)s"}
incidents:
  window: 1m
  correlate:
    - {name: rack, matchers: [category="thermal"], by: [rack], title: "rack {rack}: {alertnames} on {count} GPU(s)"}
"""

PD_KEY = "R0UT1NGKEY0123456789abcdef012345"


@pytest.fixture
def alerting(clean_servers, tmp_path):
    recv = {"pd": Receiver(ok_status=202), "slack": Receiver(), "teams": Receiver(ok_status=202),
            "hook": Receiver(fail_first=2)}
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES % {k: r.url for k, r in recv.items() if k != "slack"})
    cluster = make_cluster(clean_servers, tmp_path)
    env = {"WHALEFLUX_ALERTING_RULES_FILE": str(rules), "TEST_PD_KEY": PD_KEY, "TEST_SLACK_URL": recv["slack"].url}
    proc = cluster.service("alerting", **env)
    try:
        proc.wait_ready()
        yield cluster, proc, recv, clean_servers, rules, env
    finally:
        cluster.stop()
        for r in recv.values():
            r.close()


def gpu(temp: float, index=0) -> GpuSample:
    return GpuSample(uuid=f"GPU-h1-{index}", index=index, model="H100", utilization_gpu_pct=50, memory_used_mib=1000,
                     memory_total_mib=81559, temperature_c=temp)


async def _publish(servers, *items) -> None:
    bus = await Bus.connect(servers.nats_url, source="test", user=servers.nats_user, password=servers.nats_password)
    try:
        await bus.ensure_streams()
        for subject, data in items:
            await bus.publish(subject, data)
    finally:
        await bus.close()


def telemetry(seq: int, *gpus: GpuSample, node="h100-01") -> tuple[str, GpuTelemetry]:
    data = GpuTelemetry(cluster="onprem", node=node, seq=seq, sample_time=datetime.now(UTC), gpus=list(gpus))
    return subjects.gpu_telemetry("onprem", node), data


def registered(node: str, rack: str) -> tuple[str, NodeRegistered]:
    ident = GpuIdentity(uuid="GPU-h1-0", index=0, model="H100", name="NVIDIA H100 80GB HBM3", memory_total_mib=81559)
    return subjects.node_registered("onprem", node), NodeRegistered(cluster="onprem", node=node, rack=rack, pool="h100",
                                                                    agent_version="t", gpus=[ident])


async def _knows_node(servers, cluster: str, node: str) -> bool:
    """Whether alerting has stored a node's registration (rack and pool) in its topology."""
    redis = Redis.from_url(servers.redis_url, password=servers.redis_password, decode_responses=True)
    try:
        return await redis.hexists("wf:alerting:topology", f"{cluster}/{node}")
    finally:
        await redis.aclose()


def _nothing_pending(proc) -> bool:
    """No notification queued or being retried: nothing more will be sent unless a new alert comes."""
    return httpx.get(proc.url + "/v1/notifications", params={"status": "pending"}).json() == []


async def _drain_events(servers) -> list:
    nc = await nats.connect(servers.nats_url, user=servers.nats_user, password=servers.nats_password)
    try:
        js = nc.jetstream()
        sub = await js.subscribe(subjects.NODE_DRAIN_REQUESTED + ".>", ordered_consumer=True,
                                 deliver_policy=nats.js.api.DeliverPolicy.ALL)
        out: list[EventData] = []
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except nats.errors.TimeoutError:  # no more stored
                return out
            out.append(decode(msg.data)[1])
    finally:
        await nc.close()


def test_hot_gpu_pages_every_receiver_type_once_and_a_503_receiver_gets_exactly_one_of_each(alerting):
    cluster, proc, recv, servers, _, _ = alerting
    asyncio.run(_publish(servers, registered("h100-01", "rack-a")))
    # Registration and telemetry are separate consumers; a real agent registers long before its first sample.
    wait_until(lambda: asyncio.run(_knows_node(servers, "onprem", "h100-01")), what="registration handled")
    asyncio.run(_publish(servers, telemetry(1, gpu(95), gpu(50, 1))))
    wait_until(lambda: all(len(r.received) >= 1 for r in recv.values()), timeout=60, what="firing everywhere")
    asyncio.run(_publish(servers, telemetry(2, gpu(60), gpu(50, 1))))
    wait_until(lambda: all(len(r.received) >= 2 for r in recv.values()), timeout=60, what="resolved everywhere")
    # Every delivery done, none queued or retrying: a duplicate could only come from a retry still pending.
    wait_until(lambda: _nothing_pending(proc), what="no delivery pending")

    hook = recv["hook"]
    assert hook.failures == 2
    assert [p["status"] for p in hook.received] == ["firing", "resolved"]
    assert hook.received[0]["version"] == "4" and hook.received[0]["alerts"][0]["labels"]["rack"] == "rack-a"
    assert hook.received[0]["commonAnnotations"]["incident_title"] == "rack rack-a: GPUTemperatureHigh on 1 GPU(s)"

    pd = recv["pd"].received
    assert [e["event_action"] for e in pd] == ["trigger", "resolve"]
    assert pd[0]["dedup_key"] == pd[1]["dedup_key"] and pd[0]["routing_key"] == PD_KEY
    assert pd[0]["payload"]["severity"] == "critical" and pd[0]["payload"]["source"] == "h100-01"
    assert [m["blocks"][0]["type"] for m in recv["slack"].received] == ["header", "header"]
    assert recv["slack"].received[1]["text"].startswith("[RESOLVED]")
    assert all(m["attachments"][0]["content"]["type"] == "AdaptiveCard" for m in recv["teams"].received)
    assert len(recv["teams"].received) == 2

    log = httpx.get(proc.url + "/v1/notifications", params={"receiver": "hook"}).json()
    assert [(e["status"], e["notification_status"]) for e in log] == [("delivered", "resolved"),
                                                                       ("delivered", "firing")]
    assert log[1]["attempts"] == 3
    assert PD_KEY not in httpx.get(proc.url + "/v1/notifications").text  # the log never holds secrets
    assert recv["slack"].url not in (cluster.log_dir / "alerting.log").read_text()  # URLs may hold tokens: never logged

    [drain] = asyncio.run(_drain_events(servers))
    assert drain.node == "h100-01" and drain.cluster == "onprem" and "GPUTemperatureHigh" in drain.reason


def test_silences_and_firing_alerts_survive_a_restart_and_silenced_alerts_are_not_sent(alerting):
    cluster, proc, recv, servers, rules, env = alerting
    out = cluster.cli("alerts", "silence", "add", 'Hostname="h100-02"', "--duration", "1h", "--comment", "maintenance",
                      "--author", "ops")
    assert out.returncode == 0, out.stdout + out.stderr
    asyncio.run(_publish(servers, telemetry(1, gpu(95)), telemetry(1, gpu(96), node="h100-02")))
    wait_until(lambda: len(httpx.get(proc.url + "/v1/alerts").json()) == 2, what="two alerts firing")
    wait_until(lambda: recv["pd"].received, what="page for h100-01")
    # A kill between the POST and recording it would send again (at least once; same dedup_key): wait for the record.
    wait_until(lambda: httpx.get(proc.url + "/v1/notifications", params={"receiver": "pd"}).json(), what="pd logged")

    proc.kill9()
    proc = cluster.service("alerting", **env)
    proc.wait_ready()
    alerts = {a["labels"]["Hostname"]: a for a in httpx.get(proc.url + "/v1/alerts").json()}
    assert set(alerts) == {"h100-01", "h100-02"}
    assert alerts["h100-02"]["silenced_by"] and not alerts["h100-01"]["silenced_by"]
    listing = cluster.cli("alerts", "silence")
    assert "maintenance" in listing.stdout and "active" in listing.stdout

    # Acknowledging after the restart reaches PagerDuty as `acknowledge` on the same dedup key.
    ack = cluster.cli("alerts", "ack", alerts["h100-01"]["fingerprint"], "--by", "oncall")
    assert ack.returncode == 0, ack.stdout + ack.stderr
    wait_until(lambda: len(recv["pd"].received) >= 2, what="acknowledge")
    assert [e["event_action"] for e in recv["pd"].received] == ["trigger", "acknowledge"]
    assert len({e["dedup_key"] for e in recv["pd"].received}) == 1
    # The silenced node never reached any receiver.
    assert all("h100-02" not in json.dumps(m) for r in recv.values() for m in r.received)


def test_a_bad_rules_file_is_refused_with_its_line_and_the_old_rules_stay(alerting):
    cluster, proc, recv, servers, rules, env = alerting
    rules.write_text(rules.read_text().replace("kind: threshold", "kind: thresold"))
    r = httpx.post(proc.url + "/admin/rules/reload", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 422
    assert any(":4: rules[0].kind" in e for e in r.json()["detail"]), r.json()
    assert [x["name"] for x in httpx.get(proc.url + "/v1/rules").json()["rules"]] == ["GPUTemperatureHigh"]
    asyncio.run(_publish(servers, telemetry(1, gpu(95))))
    wait_until(lambda: recv["pd"].received, what="old rules still page")
