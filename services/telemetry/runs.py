"""Job runs: the `telemetry-jobs` handler, each run's GPU usage, and its settlement once the run ended.

The fold of a run's events is jobs.py's, the usage arithmetic usage.py's; this
module reads and writes them through the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime

from whaleflux.shared.contracts import fold_holders, gpus_involved
from whaleflux.shared.contracts.holders import JOB_EVENTS as HOLDER_EVENTS
from whaleflux.shared.events import Envelope, EventData, JobFailed, JobFinished

from .history import resolution_for
from .jobs import JOB_EVENTS, JobRun, apply
from .settings import TelemetrySettings
from .store import TelemetryStore
from .usage import JobUsage, from_points, from_rollups
from .views import JobRef


class NoRun(LookupError):
    """Telemetry knows no run of this job (not started yet, or never placed)."""


class Runs:
    def __init__(self, store: TelemetryStore, settings: TelemetrySettings, clock: Callable[[], datetime]) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock

    async def on_job(self, env: Envelope, data: EventData) -> None:
        if not isinstance(data, JOB_EVENTS):
            return  # the consumer's subjects carry only these
        job_id = data.job_id
        before = await self.store.run(job_id) or JobRun()
        after = apply(before, data)
        holds = None
        if isinstance(data, HOLDER_EVENTS):
            job = await self.store.job_holds(job_id)
            current = await self.store.holders_of(gpus_involved(job, data))
            holds = fold_holders(job, data, env.time, current)
        ended = isinstance(data, (JobFinished, JobFailed))
        await self.store.save_run(job_id, before, after, holds, settle=ended)

    async def usage(self, job_id: str) -> JobUsage:
        """Usage of the job's GPUs over its run (so far); stored once the job has ended and settled."""
        run = await self.store.run(job_id)
        if run is None or run.started_at is None:
            raise NoRun(f"job_id: no run of job {job_id!r} is known to telemetry (not started yet?)")
        if run.usage is not None:
            return run.usage
        now = self.clock().timestamp()
        since = run.started_at.timestamp()
        until = run.finished_at.timestamp() if run.finished_at else now
        uuids = list(run.gpu_uuids)
        # Samples of the last moments of a run may still be in flight.
        complete = run.finished_at is not None and until < now - 2 * self.settings.rollup_grace_s
        if resolution_for(since, now, self.settings.raw_retention_s) == "raw":
            usage = from_points(job_id, await self.store.points(uuids, since, until), complete)
        else:
            usage = from_rollups(job_id, await self.store.rollups(uuids, since // 60 * 60, until), complete)
        if complete:
            await self.store.settle(job_id, usage)
        return usage

    async def settle_loop(self) -> None:
        """Store the usage of ended jobs, so it outlives the raw history."""
        while True:
            for job_id in await self.store.unsettled():
                try:
                    await self.usage(job_id)
                except NoRun:
                    await self.store.forget_unsettled(job_id)
            await asyncio.sleep(self.settings.rollup_grace_s or 1.0)

    async def jobs_by_gpu(self) -> dict[str, JobRef]:
        """GPU uuid -> the job holding it now."""
        holders = await self.store.holders()
        refs = await self.store.job_refs(sorted({h.job_id for h in holders.values()}))
        return {u: refs[h.job_id] for u, h in holders.items()}

    async def job_of(self, uuid: str) -> JobRef | None:
        holder = (await self.store.holders_of([uuid])).get(uuid)
        return (await self.store.job_refs([holder.job_id]))[holder.job_id] if holder else None
