"""Escalation through the service (real NATS, Redis, an alerting process, real local receivers): a second GPU of
a node overheating inside the incident the first opened pages as an escalation (PagerDuty: an incident of its
own), asks for its own drain, and the resolution reaches every PagerDuty incident of the group."""

from __future__ import annotations

import asyncio

from .processes import wait_until
from .test_alerting_service import (  # noqa: F401 (alerting: the fixture)
    _drain_events,
    _knows_node,
    _nothing_pending,
    _publish,
    alerting,
    gpu,
    registered,
    telemetry,
)


def test_a_second_hot_gpu_inside_an_open_incident_pages_as_an_escalation_and_drains_again(alerting):  # noqa: F811
    cluster, proc, recv, servers, _, _ = alerting
    asyncio.run(_publish(servers, registered("h100-01", "rack-a")))
    wait_until(lambda: asyncio.run(_knows_node(servers, "onprem", "h100-01")), what="registration handled")
    asyncio.run(_publish(servers, telemetry(1, gpu(95), gpu(50, 1))))
    wait_until(lambda: recv["pd"].received, timeout=60, what="the first page")
    asyncio.run(_publish(servers, telemetry(2, gpu(95), gpu(96, 1))))
    wait_until(lambda: len(recv["pd"].received) >= 2, timeout=60, what="the escalation")
    asyncio.run(_publish(servers, telemetry(3, gpu(60), gpu(60, 1))))
    wait_until(lambda: len(recv["pd"].received) >= 4, timeout=60, what="both PagerDuty incidents resolved")
    wait_until(lambda: _nothing_pending(proc), what="no delivery pending")

    pd = recv["pd"].received
    assert [e["event_action"] for e in pd[:2]] == ["trigger", "trigger"]
    base = pd[0]["dedup_key"]
    assert pd[1]["dedup_key"] == base + "-e1"  # a new PagerDuty incident: it pages
    assert sorted((e["event_action"], e["dedup_key"]) for e in pd[2:]) == [("resolve", base), ("resolve", base + "-e1")]
    firing = [p for p in recv["hook"].received if p["status"] == "firing"]
    assert len(firing) == 2 and len({a["labels"]["incident"] for p in firing for a in p["alerts"]}) == 1
    assert firing[1]["commonAnnotations"]["incident_title"].startswith("Escalation: rack rack-a:")
    drains = asyncio.run(_drain_events(servers))
    assert [d.node for d in drains] == ["h100-01", "h100-01"]  # one per cause: the node may be back in service
    assert len({d.fingerprint for d in drains}) == 2
