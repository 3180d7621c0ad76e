"""Alertmanager both ways, against the real thing (Debian's `prometheus-alertmanager`: Alertmanager 0.25 and
amtool), with real NATS, Redis and an alerting process:

- WhaleFlux as the fast source of a real Alertmanager (the `alertmanager` receiver type posting to its
  /api/v2/alerts): Alertmanager accepts the alerts, routes them to its own webhook receiver, and hears the
  resolution;
- amtool against alerting's Alertmanager v2 API: alerts queried, silences added, listed and expired, alerts
  added (routed by WhaleFlux like its own), the configuration shown.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from .processes import ADMIN_TOKEN, make_cluster, wait_until
from .test_alerting_service import Receiver, _knows_node, _publish, gpu, registered, telemetry

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
AMTOOL = shutil.which("amtool")
pytestmark = pytest.mark.skipif(
    ALERTMANAGER is None or AMTOOL is None,
    reason="needs Alertmanager and amtool: install Debian's prometheus-alertmanager (.ci/run does)")

RULES = """
rules:
  - name: GPUTemperatureHigh
    kind: threshold
    metric: temperature_c
    threshold: {value: 85}
    hysteresis: 3
    severity: critical
    category: thermal
    summary: "GPU {gpu} on {node} at {value:.0f} C"
route:
  receiver: am
  group_by: [incident]
  group_wait: 0s
  group_interval: 1s
receivers:
  - {name: am, type: alertmanager, url: "%(am)s"}
incidents:
  window: 1m
"""

AM_CONFIG = """
route:
  receiver: sink
  group_by: [alertname, Hostname]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: sink
    webhook_configs: [{url: "%(sink)s", send_resolved: true}]
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def stack(clean_servers, tmp_path: Path):
    sink = Receiver()
    port = _free_port()
    (tmp_path / "am.yml").write_text(AM_CONFIG % {"sink": sink.url})
    am = subprocess.Popen(
        [str(ALERTMANAGER), f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'am-data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "am.log").open("w"))
    am_url = f"http://127.0.0.1:{port}"
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES % {"am": am_url})
    cluster = make_cluster(clean_servers, tmp_path)
    try:
        wait_until(lambda: _ready(am_url), timeout=60, what="Alertmanager ready")
        proc = cluster.service("alerting", WHALEFLUX_ALERTING_RULES_FILE=str(rules))
        proc.wait_ready()
        yield proc, am_url, sink, clean_servers, tmp_path
    finally:
        cluster.stop()
        am.terminate()
        am.wait(timeout=30)
        sink.close()


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _amtool(tmp_path: Path, url: str, *args: str) -> str:
    http_config = tmp_path / "amtool-http.yml"
    http_config.write_text(f"authorization:\n  credentials: {ADMIN_TOKEN}\n")
    done = subprocess.run([str(AMTOOL), f"--alertmanager.url={url}", f"--http.config.file={http_config}", *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"amtool {' '.join(args)}: {done.stderr}"
    return done.stdout


def _hot(servers) -> None:
    asyncio.run(_publish(servers, registered("h100-01", "rack-a")))
    wait_until(lambda: asyncio.run(_knows_node(servers, "onprem", "h100-01")), what="the registration stored")
    asyncio.run(_publish(servers, telemetry(1, gpu(95))))


def test_a_real_alertmanager_takes_whalefluxs_alerts_routes_them_and_hears_the_resolution(stack):
    proc, am_url, sink, servers, _ = stack
    _hot(servers)
    wait_until(lambda: any(p["status"] == "firing" for p in sink.received), timeout=60,
               what="Alertmanager's webhook hears the alert WhaleFlux sent it")
    [firing] = [p for p in sink.received if p["status"] == "firing"]
    [alert] = firing["alerts"]
    labels = alert["labels"]
    assert labels["alertname"] == "GPUTemperatureHigh" and labels["severity"] == "critical"
    assert labels["Hostname"] == "h100-01" and labels["modelName"] == "NVIDIA H100 80GB HBM3"
    assert labels["incident"].startswith("inc-") and alert["annotations"]["summary"] == "GPU 0 on h100-01 at 95 C"
    assert firing["groupLabels"] == {"alertname": "GPUTemperatureHigh", "Hostname": "h100-01"}  # its own route
    [held] = httpx.get(am_url + "/api/v2/alerts").json()
    assert held["status"]["state"] == "active" and held["labels"]["UUID"] == "GPU-h1-0"
    [log] = httpx.get(proc.url + "/v1/notifications", params={"receiver": "am"}).json()
    assert (log["status"], log["http_status"]) == ("delivered", 200)

    asyncio.run(_publish(servers, telemetry(2, gpu(60))))
    wait_until(lambda: any(p["status"] == "resolved" for p in sink.received), timeout=60,
               what="Alertmanager hears the resolution and tells its webhook")
    assert httpx.get(am_url + "/api/v2/alerts").json() == []  # resolved: Alertmanager no longer lists it


def test_amtool_queries_alerts_and_adds_lists_and_expires_silences_on_whaleflux(stack):
    proc, _, _, servers, tmp_path = stack
    _hot(servers)
    wait_until(lambda: httpx.get(proc.url + "/api/v2/alerts").json(), timeout=60, what="the alert in /api/v2")
    [alert] = json.loads(_amtool(tmp_path, proc.url, "alert", "query", "-o", "json"))
    assert alert["labels"]["alertname"] == "GPUTemperatureHigh" and alert["status"]["state"] == "active"
    assert alert["receivers"] == [{"name": "am"}]
    assert json.loads(_amtool(tmp_path, proc.url, "alert", "query", "-o", "json", "alertname=Nothing")) == []

    silence_id = _amtool(tmp_path, proc.url, "silence", "add", "Hostname=h100-01", "--comment=maintenance",
                         "--author=tester", "--duration=1h").strip()
    [listed] = json.loads(_amtool(tmp_path, proc.url, "silence", "query", "-o", "json"))
    assert listed["id"] == silence_id and listed["status"]["state"] == "active"
    assert listed["matchers"] == [{"name": "Hostname", "value": "h100-01", "isRegex": False, "isEqual": True}]
    [muted] = json.loads(_amtool(tmp_path, proc.url, "alert", "query", "-o", "json", "-s"))
    assert muted["status"]["state"] == "suppressed" and muted["status"]["silencedBy"] == [silence_id]
    _amtool(tmp_path, proc.url, "silence", "expire", silence_id)
    assert json.loads(_amtool(tmp_path, proc.url, "silence", "query", "-o", "json")) == []  # expired: not listed
    [expired] = json.loads(_amtool(tmp_path, proc.url, "silence", "query", "-o", "json", "--expired"))
    assert expired["status"]["state"] == "expired"

    # Alerts added through the v2 API are WhaleFlux's to group and route like its own.
    _amtool(tmp_path, proc.url, "alert", "add", "alertname=ExternalDiskFull", "severity=critical",
            "Hostname=storage-01", "--annotation=summary=disk full")
    wait_until(lambda: any(a["labels"]["alertname"] == "ExternalDiskFull"
                           for a in httpx.get(proc.url + "/api/v2/alerts").json()), timeout=60,
               what="an alert added with amtool grouped by WhaleFlux")
    groups = httpx.get(proc.url + "/api/v2/alerts/groups").json()
    assert {a["labels"]["alertname"] for g in groups for a in g["alerts"]} == {"GPUTemperatureHigh", "ExternalDiskFull"}
    assert all(g["receiver"] == {"name": "am"} and "incident" in g["labels"] for g in groups)
    assert "GPUTemperatureHigh" in _amtool(tmp_path, proc.url, "config", "show")


def test_v2_writes_need_the_admin_token_and_bad_input_is_a_4xx_naming_the_field(stack):
    proc, *_ = stack
    silence = {"matchers": [{"name": "a", "value": "b", "isRegex": False}], "startsAt": "2026-01-01T00:00:00Z",
               "endsAt": "2099-01-01T00:00:00Z", "createdBy": "x", "comment": "y"}
    assert httpx.post(proc.url + "/api/v2/silences", json=silence).status_code == 401
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    past = {**silence, "endsAt": "2026-01-01T00:00:01Z"}
    bad = httpx.post(proc.url + "/api/v2/silences", json=past, headers=auth)
    assert bad.status_code == 400 and "endsAt" in bad.text
    no_comment = httpx.post(proc.url + "/api/v2/silences", json={**silence, "comment": " "}, headers=auth)
    assert no_comment.status_code == 400 and "comment" in no_comment.text
    assert httpx.post(proc.url + "/api/v2/alerts", json=[{"labels": {}}], headers=auth).status_code == 422
    bad_filter = httpx.get(proc.url + "/api/v2/alerts", params={"filter": "not a matcher"})
    assert bad_filter.status_code == 400 and "filter" in bad_filter.text
    assert httpx.delete(proc.url + "/api/v2/silence/nope", headers=auth).status_code == 404
    status = httpx.get(proc.url + "/api/v2/status").json()
    assert set(status) >= {"cluster", "versionInfo", "config", "uptime"} and status["cluster"]["status"] == "disabled"


def test_an_alert_added_with_an_end_resolves_at_it_and_the_real_alertmanager_hears_so(stack):
    proc, am_url, sink, _, tmp_path = stack
    # Far enough ahead to see it listed first on a busy machine (amtool sends milliseconds).
    end = (datetime.now(UTC) + timedelta(seconds=20)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    _amtool(tmp_path, proc.url, "alert", "add", "alertname=BackupLate", "severity=warning", "Hostname=backup-01",
            "--annotation=summary=backup late", f"--end={end}")
    [listed] = wait_until(lambda: json.loads(_amtool(tmp_path, proc.url, "alert", "query", "-o", "json")),
                          timeout=60, what="the alert added with an end listed")
    assert listed["labels"]["alertname"] == "BackupLate"
    assert datetime.fromisoformat(listed["endsAt"]) == datetime.fromisoformat(end)  # its end, as added
    wait_until(lambda: any(p["status"] == "firing" and p["alerts"][0]["labels"]["alertname"] == "BackupLate"
                           for p in sink.received), timeout=60, what="Alertmanager hears it firing")
    # Not posted again: at its end WhaleFlux resolves it, lists it no more, and tells Alertmanager.
    wait_until(lambda: json.loads(_amtool(tmp_path, proc.url, "alert", "query", "-o", "json")) == [], timeout=60,
               what="resolved at its endsAt")
    wait_until(lambda: any(p["status"] == "resolved" and p["alerts"][0]["labels"]["alertname"] == "BackupLate"
                           for p in sink.received), timeout=60, what="Alertmanager hears it resolved")
    assert [a for a in httpx.get(proc.url + "/v1/alerts").json() if a["rule"] == "BackupLate"] == []
