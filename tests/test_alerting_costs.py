"""Cost guardians: inventory's findings become FinOps alerts; billing's cost alerts route to FinOps.

The service test runs the alerting process on real NATS and Redis against a
real local HTTP server that serves `GET /v1/findings` in inventory's own JSON
shape (built with inventory's `views.finding_json`), and real local webhook
receivers for on-call and FinOps.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx
import pytest
import structlog

from whaleflux.alerting.config import DEFAULT_RULES_FILE, ConfigError, FindingRule, load_config, parse_config
from whaleflux.alerting.dispatch.route import build_route
from whaleflux.alerting.guardians import FindingsSource
from whaleflux.alerting.rules.engine import RuleEngine, Transition
from whaleflux.inventory.findings import Finding
from whaleflux.inventory.views import finding_json
from whaleflux.servers import QuietHandler, serve_http
from whaleflux.shared import subjects
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.contracts import FINDINGS
from whaleflux.shared.contracts import Finding as FindingJson
from whaleflux.shared.events import AlertRaised

from .processes import make_cluster, wait_until
from .test_alerting_service import Receiver, _publish

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def reserved_idle(model="A100", ownership="leased", pool="cloud", hours=80, gpus=8, usd="15120.00") -> dict:
    """A reserved-idle finding exactly as inventory's GET /v1/findings serves it."""
    return finding_json(Finding(
        "reserved-idle", "warning", f"{gpus}x {model} ({ownership}, pool {pool}) idle {hours} h — ${usd}/month",
        Decimal(usd) if usd is not None else None, tuple(f"GPU-{model}-{i}" for i in range(gpus)),
        {"idle_hours": str(hours), "model": model, "pool": pool, "ownership": ownership},
    ))


def other_findings() -> list[dict]:
    return [
        finding_json(Finding("idle-allocated", "warning", "a100-01: 2x A100 allocated but idle", Decimal("3000"),
                             ("GPU-x",), {"node": "a100-01", "jobs": "j1"})),
        finding_json(Finding("capacity", "info", "free now: 8x A100", None, (), {})),
    ]


def observe(e: RuleEngine, findings: list[dict], now: datetime) -> list[Transition]:
    """The engine fed findings as alerting reads them: JSON parsed with the shared contract."""
    return e.observe_findings(FINDINGS.validate_python(findings), now)


GUARD = """rules:
  - {name: ReservedIdle, kind: finding, finding: reserved-idle, min_monthly_usd: 100, severity: warning, category: cost,
     summary: "{summary} [{model}/{pool}, {gpus} GPUs, {monthly_usd:.0f} USD]"}
route: {receiver: r}
receivers: [{name: r, type: webhook, url: 'http://x'}]
"""


def test_reserved_idle_findings_fire_once_per_model_ownership_pool_and_resolve_when_gone():
    e = RuleEngine(parse_config(GUARD), gpu_models())
    first = observe(e, [reserved_idle(hours=80), reserved_idle(model="H100", pool="onprem", ownership="owned"),
                                *other_findings()], T0)
    assert [(t.firing, t.labels["model"], t.labels["pool"]) for t in first] == [(True, "A100", "cloud"),
                                                                              (True, "H100", "onprem")]
    a100 = first[0]
    assert a100.labels == {"finding": "reserved-idle", "model": "A100", "ownership": "leased", "pool": "cloud"}
    assert a100.summary == "8x A100 (leased, pool cloud) idle 80 h — $15120.00/month [A100/cloud, 8 GPUs, 15120 USD]"
    assert a100.value == 15120.0
    # Idle for longer, more GPUs, a new summary: the same alert (same fingerprint), nothing new.
    assert observe(e, [reserved_idle(hours=81, gpus=9), reserved_idle(model="H100", pool="onprem",
                                                                           ownership="owned")], T0) == []
    # The H100s got work: only their alert resolves.
    [gone] = observe(e, [reserved_idle(hours=82)], T0 + timedelta(hours=1))
    assert not gone.firing and gone.labels["model"] == "H100" and "no longer reported" in gone.summary
    # Under the money floor: not raised; unknown cost: raised (the floor only filters known costs).
    assert observe(e, [reserved_idle(), reserved_idle(model="RTX4090", pool="dev", usd="40.00")], T0) == []
    [unknown] = observe(e, [reserved_idle(), reserved_idle(model="L4", pool="dev", usd=None)], T0)
    assert unknown.firing and unknown.value is None and "nan USD" in unknown.summary


def test_a_finding_without_key_fields_is_identified_by_its_gpus():
    e = RuleEngine(parse_config(GUARD), gpu_models())
    legacy = {**reserved_idle(), "detail": {"idle_hours": "80"}}  # an inventory that names no model/pool
    [t] = observe(e, [legacy], T0)
    assert set(t.labels) == {"finding", "gpus"}
    assert observe(e, [{**legacy, "summary": "changed"}], T0) == []


def test_finding_rules_are_validated_and_cannot_drain():
    bad = GUARD.replace("finding: reserved-idle,", "finding: reserved-idel, actions: [drain],")
    with pytest.raises(ConfigError) as exc:
        parse_config(bad, "g.yaml")
    assert any(e.startswith("g.yaml:2: rules[0].finding: Input should be") for e in exc.value.errors), exc.value.errors
    drain = GUARD.replace("finding: reserved-idle,", "finding: reserved-idle, actions: [drain],")
    with pytest.raises(ConfigError) as exc:
        parse_config(drain, "g.yaml")
    assert exc.value.errors == ["g.yaml:2: rules[0].actions: drain needs a node: not available on finding rules"]


def test_default_routes_send_every_cost_alert_to_finops_and_nothing_else_there():
    config = load_config(DEFAULT_RULES_FILE)
    route = build_route(config.route)
    guardian = config.rule("GPUReservedIdle")
    assert isinstance(guardian, FindingRule) and guardian.finding == "reserved-idle"
    cost_alerts = [
        # ours, from inventory's findings
        {"alertname": "GPUReservedIdle", "severity": "warning", "category": "cost", "finding": "reserved-idle",
         "model": "A100", "ownership": "leased", "pool": "cloud"},
        # billing's, as billing publishes them (budgets.py)
        {"alertname": "BudgetProjection", "severity": "critical", "category": "cost", "scope": "team", "name": "nlp",
         "period": "2026-12", "threshold_pct": "100"},
        {"alertname": "SpendAboveForecast", "severity": "warning", "category": "cost", "scope": "project",
         "name": "llm", "period": "2026-12", "week": "2026-11-23"},
        {"alertname": "LeaseExpiring", "severity": "info", "category": "cost", "contract_id": "c1"},
    ]
    for labels in cost_alerts:
        assert [r.receiver for r in route.match(labels)] == ["finops"], labels
    hot = {"alertname": "GPUTemperatureHigh", "severity": "critical", "category": "thermal", "Hostname": "h1"}
    assert [r.receiver for r in route.match(hot)] == ["default"]


# --------------------------------------------------------------------------- through the service


class Findings:
    """A real local HTTP server answering GET /v1/findings like inventory does (or 503 while `down`)."""

    def __init__(self, findings: list[dict]) -> None:
        self.findings = findings
        self.down = False
        self.gets = 0
        me = self

        class Handler(QuietHandler):
            def do_GET(self):  # noqa: N802
                me.gets += 1
                if self.path != "/v1/findings" or me.down:
                    self.send_response(404 if not me.down else 503)
                    self.end_headers()
                    return
                body = json.dumps(me.findings).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = serve_http(Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def polled(self, n: int, timeout: float = 30) -> None:
        want = self.gets + n
        wait_until(lambda: self.gets >= want, timeout=timeout, interval=0.05, what=f"{n} more polls")

    def close(self) -> None:
        self.server.shutdown()


def _alerts(receiver: Receiver) -> list[tuple[str, str, str]]:
    return [(p["status"], a["labels"]["alertname"], a["status"]) for p in receiver.received for a in p["alerts"]]


def test_guardian_polls_inventory_pages_finops_once_and_billing_cost_alerts_go_there_too(clean_servers, tmp_path):
    inventory = Findings([reserved_idle(hours=80), *other_findings()])
    oncall, finops = Receiver(), Receiver()
    # The shipped rules and routes, with the FinOps route's 30 s group_wait shortened for the test.
    text = DEFAULT_RULES_FILE.read_text()
    assert text.count("group_wait: 30s") == 1 and text.count("group_interval: 5m") == 1
    rules = tmp_path / "rules.yaml"
    rules.write_text(text.replace("group_wait: 30s", "group_wait: 0s")
                     .replace("group_interval: 5m", "group_interval: 1s"))
    env = {"WHALEFLUX_ALERTING_RULES_FILE": str(rules), "WHALEFLUX_INVENTORY_URL": inventory.url,
           "WHALEFLUX_ALERTING_FINDINGS_POLL_S": "0.2", "WHALEFLUX_ALERTING_WEBHOOK_URLS": oncall.url,
           "WHALEFLUX_ALERTING_FINOPS_URLS": finops.url}
    cluster = make_cluster(clean_servers, tmp_path)
    proc = cluster.service("alerting", **env)
    try:
        proc.wait_ready()
        wait_until(lambda: finops.received, timeout=30, what="FinOps page")
        [page] = finops.received
        [alert] = page["alerts"]
        assert page["status"] == "firing" and page["receiver"] == "finops"
        assert alert["labels"] | {"incident": "-"} == {
            "alertname": "GPUReservedIdle", "severity": "warning", "category": "cost", "finding": "reserved-idle",
            "model": "A100", "ownership": "leased", "pool": "cloud", "incident": "-"}
        assert alert["annotations"]["summary"].startswith("8x A100 (leased, pool cloud) idle 80 h")
        [firing] = httpx.get(proc.url + "/v1/alerts").json()
        assert firing["category"] == "cost" and firing["value"] == 15120.0
        guardians = httpx.get(proc.url + "/v1/rules").json()["guardians"]
        assert guardians["rules"] == ["GPUReservedIdle"] and guardians["inventory"]["error"] is None

        # Still idle, longer, on more GPUs; then a restart (kill -9): the same alert, never paged again.
        inventory.findings = [reserved_idle(hours=81, gpus=9), *other_findings()]
        inventory.polled(3)
        proc.kill9()
        proc = cluster.service("alerting", **env)
        proc.wait_ready()
        inventory.polled(3)
        assert [a["fingerprint"] for a in httpx.get(proc.url + "/v1/alerts").json()] == [firing["fingerprint"]]

        # Billing's budget alert (published by billing on alert.raised, category cost) goes to FinOps too.
        budget = AlertRaised(fingerprint="cost-budget-team-nlp-202612-100", rule="BudgetProjection",
                             severity="critical", category="cost",
                             summary="team nlp projected to spend $12,000 in December 2026",
                             labels={"alertname": "BudgetProjection", "scope": "team", "name": "nlp",
                                     "period": "2026-12", "threshold_pct": "100"}, value=120.0,
                             starts_at=datetime.now(UTC))
        asyncio.run(_publish(clean_servers, (subjects.ALERT_RAISED, budget)))
        wait_until(lambda: ("firing", "BudgetProjection", "firing") in _alerts(finops), timeout=30,
                   what="budget alert at FinOps")
        # Titled with what it says (not "BudgetProjection on "), and listed like every other alert.
        [paged] = [a for p in finops.received for a in p["alerts"] if a["labels"]["alertname"] == "BudgetProjection"]
        assert paged["annotations"]["incident_title"] == budget.summary
        listed = {a["fingerprint"]: a for a in httpx.get(proc.url + "/v1/alerts").json()}
        assert set(listed) == {firing["fingerprint"], budget.fingerprint}
        mine = listed[budget.fingerprint]
        assert (mine["rule"], mine["severity"], mine["category"], mine["value"]) == (
            "BudgetProjection", "critical", "cost", 120.0)
        assert mine["summary"] == budget.summary and mine["labels"]["threshold_pct"] == "100"
        assert mine["incident"] is not None
        shown = cluster.cli("alerts", timeout=60)
        assert shown.returncode == 0 and "BudgetProjection" in shown.stdout and "GPUReservedIdle" in shown.stdout
        v2 = httpx.get(proc.url + "/api/v2/alerts", params={"filter": 'alertname="BudgetProjection"'}).json()
        assert [a["fingerprint"] for a in v2] == [budget.fingerprint]
        [incident] = [i for i in httpx.get(proc.url + "/v1/incidents").json() if i["correlation"] == "budget"]
        assert incident["title"] == budget.summary

        # Inventory unreachable for a while: nothing resolves, the error shows.
        inventory.down = True
        inventory.polled(3)
        status = httpx.get(proc.url + "/v1/rules").json()["guardians"]["inventory"]
        assert status["error"] == "inventory answered 503"
        assert {a["fingerprint"] for a in httpx.get(proc.url + "/v1/alerts").json()} == {firing["fingerprint"],
                                                                                        budget.fingerprint}

        # Back, and the GPUs found work: the finding is gone, FinOps hears it resolved.
        inventory.findings, inventory.down = other_findings(), False
        wait_until(lambda: ("resolved", "GPUReservedIdle", "resolved") in _alerts(finops), timeout=30,
                   what="resolved at FinOps")
        # Six more polls of the same findings (longer than the 1 s group_interval), then nothing queued or
        # retrying: nothing more is on its way.
        inventory.polled(6)
        wait_until(lambda: httpx.get(proc.url + "/v1/notifications", params={"status": "pending"}).json() == [],
                   what="no delivery pending")
        assert _alerts(finops) == [("firing", "GPUReservedIdle", "firing"), ("firing", "BudgetProjection", "firing"),
                                       ("resolved", "GPUReservedIdle", "resolved")]
        assert oncall.received == []  # cost never pages on-call
        log = httpx.get(proc.url + "/v1/notifications", params={"receiver": "finops"}).json()
        assert [e["status"] for e in log] == ["delivered"] * 3
    finally:
        cluster.stop()
        inventory.close()
        oncall.close()
        finops.close()


async def _poll(url: str) -> tuple[list[FindingJson] | None, dict[str, Any]]:
    async with httpx.AsyncClient() as http:
        source = FindingsSource(url, http, structlog.get_logger("test"))
        return await source.fetch(T0), source.status


def test_findings_are_parsed_with_the_contract_and_a_wrong_shape_is_refused_naming_the_field():
    inventory = Findings([reserved_idle(), *other_findings()])
    try:
        findings, status = asyncio.run(_poll(inventory.url))
        assert findings is not None and [f.kind for f in findings] == ["reserved-idle", "idle-allocated", "capacity"]
        assert findings[0].monthly_usd == Decimal("15120.00") and status["error"] is None and status["findings"] == 3
        inventory.findings = [{**reserved_idle(), "monthly_usd": "lots of money"}]
        findings, status = asyncio.run(_poll(inventory.url))
    finally:
        inventory.close()
    assert findings is None
    assert status["error"].startswith("unexpected findings from inventory: 1 problem(s), first at 0.monthly_usd:")
    assert "lots of money" not in status["error"]  # where and what, never the values
