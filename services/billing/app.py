"""Billing wired on the service runtime: consumers, routers, start-up and loops (docs/services/billing.md)."""

from __future__ import annotations

from fastapi import FastAPI

from whaleflux.shared.runtime import Clock, Runtime, ServiceParts, serve, system_clock

from .api import ROUTERS
from .service import Billing
from .settings import BillingSettings

__all__ = ["BillingSettings", "build", "main"]


def build(settings: BillingSettings | None = None, clock: Clock = system_clock) -> tuple[FastAPI, Billing]:
    """The billing app and its service object (tests start it with `billing.runtime.start()`)."""
    settings = settings or BillingSettings()
    runtime = Runtime(name="billing", settings=settings, clock=clock)
    billing = Billing(runtime, settings)
    app = runtime.app(ServiceParts(
        consumers={"billing-jobs": billing.on_job_events, "billing-telemetry": billing.on_telemetry},
        routers=ROUTERS,
        on_ready=billing.on_ready,
        on_stop=billing.on_stop,
        background=[billing.inventory_loop, billing.budget_loop],
        state={"billing": billing},
    ))
    return app, billing


def main() -> None:
    app, billing = build()
    serve(app, billing.runtime)
