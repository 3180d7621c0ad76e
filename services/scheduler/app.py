"""The scheduler wired on the service runtime: consumers, routers, start-up, rebuild and loops.

Consumes job.submitted / started / finished / failed, node.registered,
node.drain_requested, node.heartbeat, gpu.telemetry and alert.raised / resolved (a GPU with a critical
alert takes no work until it resolves); produces job.placed,
job.preempted, job.requeued, job.rejected, node.undrained, gpu.cordoned and
gpu.uncordoned through the outbox, so a crash never loses or doubles one
(docs/services/scheduler.md). The collaborators: `Progress` (job events),
`Failover` (nodes), `Feeds` (telemetry, leases), `GpuHealth` (GPU quarantine),
`PlacementPass` (the queue policy), `Replica` (the lease and rebuilds), all
around one `Scheduler`.
"""

from __future__ import annotations

from fastapi import FastAPI

from whaleflux.shared.runtime import Clock, Runtime, ServiceParts, serve, system_clock

from .api import EXCEPTION_HANDLERS, ROUTERS
from .failover import Failover
from .feeds import Feeds
from .gpu_health import GpuHealth
from .passes import PlacementPass
from .progress import Progress
from .replica import Replica
from .service import Scheduler
from .settings import SchedulerSettings

__all__ = ["SchedulerSettings", "build", "main"]


def build(settings: SchedulerSettings | None = None, clock: Clock = system_clock) -> tuple[FastAPI, Scheduler]:
    """The scheduler app and its shared state (tests start it with `scheduler.runtime.start()`)."""
    settings = settings or SchedulerSettings()
    runtime = Runtime(name="scheduler", settings=settings, clock=clock)
    scheduler = Scheduler(runtime, settings)
    progress = Progress(scheduler)
    failover = Failover(scheduler, progress)
    health = GpuHealth(scheduler, failover)
    feeds = Feeds(settings, clock, runtime.log, health)
    placement = PlacementPass(scheduler, feeds, failover)
    replica = Replica(scheduler, failover, placement)
    app = runtime.app(ServiceParts(
        consumers={
            "scheduler-jobs": progress.on_job_events,
            "scheduler-nodes": failover.on_node_event,
            "scheduler-heartbeats": failover.on_heartbeat,
            "scheduler-telemetry": feeds.on_telemetry,
            "scheduler-alerts": health.on_alert,
        },
        routers=ROUTERS,
        on_ready=replica.on_ready,
        rebuild=replica.rebuild,
        background=[placement.loop, failover.liveness_loop, replica.snapshot_loop, feeds.lease_loop, health.loop],
        on_stop=replica.on_stop,
        publish=scheduler.publish_staged,
        readiness=replica.readiness,
        exception_handlers=EXCEPTION_HANDLERS,
        state={"scheduler": scheduler, "failover": failover, "feeds": feeds, "health": health},
    ))
    return app, scheduler


def main() -> None:
    app, scheduler = build()
    serve(app, scheduler.runtime)
