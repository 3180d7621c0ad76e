"""Inventory service: every GPU agents registered, what was declared about it, leases, rollups and findings.

Consumes node.registered / node.heartbeat (discovery), job.submitted / placed /
rejected / finished / failed (queue and allocations), gpu.telemetry
(utilization), gpu.validated (burn-ins) and gpu.cordoned / gpu.uncordoned (the
scheduler's GPU quarantine); produces lease.expiring and lease.expired through the outbox.
This module only wires the parts on the shared `Runtime`: store.py (every
Redis key), service.py (handlers, lease checks, queries) around the pure
discovery, allocations, assets, reconcile, leases, rollups and findings
modules, and api.py (the HTTP routes).
"""

from __future__ import annotations

from fastapi import FastAPI

from whaleflux.shared.runtime import Clock, Runtime, ServiceParts, serve, system_clock

from .api import ROUTERS
from .service import Inventory
from .settings import InventorySettings

__all__ = ["InventorySettings", "build", "main"]


def build(settings: InventorySettings | None = None, clock: Clock = system_clock) -> tuple[FastAPI, Inventory]:
    """The inventory app and its service object (tests start it with `inventory.runtime.start()`)."""
    settings = settings or InventorySettings()
    runtime = Runtime(name="inventory", settings=settings, clock=clock)
    inventory = Inventory(runtime, settings)
    app = runtime.app(ServiceParts(
        consumers={"inventory-nodes": inventory.on_node_event, "inventory-jobs": inventory.on_job_event,
                   "inventory-telemetry": inventory.on_telemetry, "inventory-validations": inventory.on_validated,
                   "inventory-cordons": inventory.on_cordon, "inventory-drains": inventory.on_drain},
        routers=ROUTERS,
        on_ready=inventory.on_ready,
        background=[inventory.check_loop],
        state={"inventory": inventory},
    ))
    return app, inventory


def main() -> None:
    app, inventory = build()
    serve(app, inventory.runtime)
