"""One node's agent: registers its GPUs, publishes telemetry and heartbeats, runs placed jobs."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from pathlib import Path

import structlog
from tenacity import AsyncRetrying, wait_exponential

from whaleflux import __version__
from whaleflux.shared import subjects
from whaleflux.shared.bus import Bus
from whaleflux.shared.catalog import FleetNode
from whaleflux.shared.events import (
    Envelope,
    EventData,
    GpuTelemetry,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobPreempted,
    JobStarted,
    NodeHeartbeat,
    NodeRegistered,
    make_envelope,
)
from whaleflux.shared.service import Clock, system_clock
from whaleflux.shared.streams import agent_consumer

from . import runner
from .backend import GpuBackend

log = structlog.get_logger("whaleflux.agent")


def _event_id(kind: str, placed: JobPlaced) -> str:
    """Fixed per (job, attempt, part), so a redelivered report is one event; rank 0 keeps the plain id."""
    return f"{kind}-{placed.job_id}-{placed.attempt}" + (f"-r{placed.part}" if placed.part else "")


class NodeAgent:
    def __init__(
        self,
        bus: Bus,
        node: FleetNode,
        backend: GpuBackend,
        *,
        interval_s: float = 1.0,
        log_dir: Path,
        clock: Clock = system_clock,
    ):
        self.bus = bus
        self.node = node
        self.backend = backend
        self.interval_s = interval_s
        self.log_dir = log_dir
        self.clock = clock
        self.jobs: dict[tuple[str, int], runner.RunningJob] = {}
        self._tasks: list[asyncio.Task] = []
        self._waiters: list[asyncio.Task] = []  # one per running job: reports how it ended
        self._stops: dict[tuple[str, int], asyncio.Task] = {}  # jobs being stopped (preempted), by (job, attempt)
        self._seq = 0
        # Fault injection "node goes silent": no telemetry or heartbeat until then (None: not silent).
        self.silent_until: datetime | None = None

    @property
    def source(self) -> str:
        return f"whaleflux/agent/{self.node.cluster}/{self.node.name}"

    async def start(self) -> None:
        # The placement consumer exists before the node announces itself, so no
        # placement made right after registration can be missed.
        placements = agent_consumer(self.node.cluster, self.node.name)
        await self.bus.ensure_consumer(placements)
        await self._publish(
            subjects.node_registered(self.node.cluster, self.node.name),
            NodeRegistered(
                cluster=self.node.cluster,
                node=self.node.name,
                rack=self.node.rack,
                pool=self.node.pool,
                interconnect=self.node.interconnect,
                agent_version=__version__,
                gpus=self.backend.identities(),
            ),
        )
        self.bus.start_consumer(placements, self.on_order, None, "")
        self._tasks.append(asyncio.create_task(self._telemetry_loop(), name=f"telemetry-{self.node.name}"))
        log.info("agent.node_started", node=self.node.name, gpus=len(self.backend.identities()))

    async def _publish(self, subject: str, data: EventData, event_id: str | None = None, correlation: str | None = None) -> Envelope:
        """Publish, retrying until the bus takes it: a job's end must never be lost."""
        env = make_envelope(data, source=self.source, event_id=event_id, correlation_id=correlation)
        async for attempt in AsyncRetrying(wait=wait_exponential(multiplier=0.2, max=5), reraise=True):
            with attempt:
                await self.bus.publish_envelope(subject, env)
        return env

    async def _telemetry_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            now = self.clock()
            try:
                await self._sample(now)
            except Exception as exc:  # a failed sample must not stop the next one
                log.warning("agent.sample_failed", node=self.node.name, error=repr(exc))
            next_at += self.interval_s
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    def go_silent(self, duration_s: float | None) -> None:
        """Stop publishing telemetry and heartbeats for `duration_s` (None: until the agent restarts)."""
        self.silent_until = datetime.max.replace(tzinfo=timezone.utc) if duration_s is None else self.clock() + timedelta(seconds=duration_s)

    async def _sample(self, now: datetime) -> None:
        if self.silent_until is not None:
            if now < self.silent_until:
                return
            self.silent_until = None
        self._seq += 1
        cluster, name = self.node.cluster, self.node.name
        batch = GpuTelemetry(cluster=cluster, node=name, seq=self._seq, sample_time=now, gpus=self.backend.sample(now))
        env = make_envelope(batch, source=self.source, time=now)
        await self.bus.publish_envelope(subjects.gpu_telemetry(cluster, name), env)
        heartbeat = NodeHeartbeat(cluster=cluster, node=name, seq=self._seq, running_jobs=sorted({k[0] for k in self.jobs}))
        await self.bus.publish_envelope(subjects.node_heartbeat(cluster, name), make_envelope(heartbeat, source=self.source, time=now))

    async def on_order(self, env: Envelope, data: EventData) -> None:
        """Placements and stop orders for this node, in the order the scheduler sent them."""
        if isinstance(data, JobPlaced):
            await self.on_placed(env, data)
        elif isinstance(data, JobPreempted):
            await self.on_preempted(env, data)

    async def on_preempted(self, env: Envelope, order: JobPreempted) -> None:
        """Stop the job (SIGTERM to its process group, SIGKILL after the grace period).

        Any attempt up to the ordered one is stopped: a node declared lost that
        comes back may still run an older attempt the scheduler has moved away.
        The stop runs in the background; its waiter reports job.finished with the
        signal's exit code, and a later placement on the same GPUs waits for it.
        """
        for key, job in list(self.jobs.items()):
            if key[0] == order.job_id and key[1] <= order.attempt:
                self._stop_in_background(key, job, order.grace_s)
                log.info("job.preempting", job_id=order.job_id, attempt=key[1], reason=order.reason, grace_s=order.grace_s)

    def _stop_in_background(self, key: tuple[str, int], job: runner.RunningJob, grace_s: float) -> asyncio.Task:
        task = self._stops.get(key)
        if task is None:
            task = self._stops[key] = asyncio.create_task(runner.stop(job, grace_s=grace_s))
            task.add_done_callback(lambda _t: self._stops.pop(key, None))
        return task

    async def on_placed(self, env: Envelope, placed: JobPlaced) -> None:
        key = (placed.job_id, placed.attempt)
        if key in self.jobs:
            return  # redelivered placement: the job already runs here
        # The scheduler gave these GPUs to a new job, so whatever holds them here was
        # preempted or moved away: it stops before the new job starts, never shares them.
        wanted = set(placed.gpu_uuids)
        holders = [(k, j) for k, j in self.jobs.items() if k != key and wanted & set(j.placed.gpu_uuids)]
        if holders:
            await asyncio.gather(*(self._stop_in_background(k, j, 5.0) for k, j in holders), return_exceptions=True)
            # Let their waiters hand the GPUs back to the backend before the new job takes them.
            for _ in range(200):
                if not any(k in self.jobs for k, _ in holders):
                    break
                await asyncio.sleep(0.01)
        base = dict(cluster=placed.cluster, node=placed.node, job_id=placed.job_id, attempt=placed.attempt, rank=placed.rank)
        try:
            job = await runner.launch(placed, self.log_dir)
        except OSError as exc:
            failed = JobFailed(**base, reason=f"cannot start command: {exc.strerror or exc}", failed_at=self.clock())
            await self._publish(subjects.JOB_FAILED, failed, _event_id("failed", placed), placed.job_id)
            return
        self.jobs[key] = job
        started_at = self.clock()
        self.backend.job_started(placed.gpu_uuids, placed.job_id, job.process.pid)
        await self._publish(
            subjects.JOB_STARTED,
            JobStarted(**base, gpu_uuids=placed.gpu_uuids, pid=job.process.pid, started_at=started_at),
            _event_id("started", placed),
            placed.job_id,
        )
        log.info("job.started", job_id=placed.job_id, pid=job.process.pid, gpus=placed.gpu_indices, rank=placed.rank)
        self._waiters.append(asyncio.create_task(self._wait(job, started_at, base)))

    async def _wait(self, job: runner.RunningJob, started_at: datetime, base: dict) -> None:
        code = await job.process.wait()
        placed = job.placed
        self.backend.job_stopped(placed.gpu_uuids)
        finished = JobFinished(**base, exit_code=code, started_at=started_at, finished_at=self.clock())
        await self._publish(subjects.JOB_FINISHED, finished, _event_id("finished", placed), placed.job_id)
        self.jobs.pop((placed.job_id, placed.attempt), None)
        log.info("job.finished", job_id=placed.job_id, exit_code=code)

    async def stop(self) -> None:
        """Stop every job this agent started, report how each ended, then stop telemetry."""
        await asyncio.gather(*(runner.stop(j, grace_s=5) for j in list(self.jobs.values())), return_exceptions=True)
        # The waiters publish job.finished for the stopped jobs, so the scheduler frees their GPUs.
        pending = [t for t in self._waiters if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=5)
        for task in [*self._tasks, *self._waiters]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._waiters, return_exceptions=True)
