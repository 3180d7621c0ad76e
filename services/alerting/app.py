"""Alerting service: evaluates rules on live telemetry and events, groups alerts into incidents, notifies receivers.

Wiring only: the runtime (connections, consumers, loops), the store, the
service shell (`service.py`) and the API routers (`api.py`, Alertmanager's v2 API in `api_v2.py`).
"""

from __future__ import annotations

from fastapi import FastAPI

from whaleflux.shared.runtime import Clock, Runtime, ServiceParts, serve, system_clock

from .api import ROUTERS
from .api_v2 import v2
from .service import Alerting
from .settings import AlertingSettings
from .store import AlertStore


def build(settings: AlertingSettings | None = None, clock: Clock = system_clock) -> tuple[FastAPI, Alerting]:
    settings = settings or AlertingSettings()
    runtime = Runtime(name="alerting", settings=settings, clock=clock)
    store = AlertStore(runtime, runtime.prefix)
    svc = Alerting(runtime, settings, store)
    app = runtime.app(ServiceParts(
        consumers={
            "alerting-telemetry": svc.on_telemetry,
            "alerting-notify": svc.on_alert,
            "alerting-nodes": svc.on_node,
            "alerting-undrains": svc.on_undrained,
            "alerting-jobs": svc.on_event,
            "alerting-leases": svc.on_event,
        },
        routers=[*ROUTERS, v2],
        on_ready=svc.on_ready,
        on_stop=svc.on_stop,
        background=[svc.tick_loop, svc.delivery_loop, svc.reload_loop, svc.findings_loop],
        state={"store": store, "service": svc},
    ))
    return app, svc


def main() -> None:
    app, svc = build()
    serve(app, svc.rt)
