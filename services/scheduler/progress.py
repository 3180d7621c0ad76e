"""What the nodes report about attempts (job.started / finished / failed), and new submissions.

The decisions are pure (`history.after_end`, `history.late_end`, `gang.on_part_report`);
this applies them to the store, under the scheduler's lock.
"""

from __future__ import annotations

from whaleflux.shared import job_paths
from whaleflux.shared.bus import batch_handler
from whaleflux.shared.events import Envelope, EventData, JobFailed, JobFinished, JobStarted, JobSubmitted

from .gang import on_part_report
from .history import after_end, from_attempt_node, late_end, record_end
from .records import ACTIVE, JobRecord
from .service import Scheduler
from .store import SchedulerStore

Report = JobStarted | JobFinished | JobFailed


class Writes:
    """Starts and ends of a run of reports, written in one MULTI (`SchedulerStore.record_progress`)."""

    def __init__(self) -> None:
        self.saved: list[JobRecord] = []
        self.ended: list[JobRecord] = []
        self.jobs: set[str] = set()

    async def save(self, job: JobRecord) -> None:
        self.saved.append(job)
        self.jobs.add(job.job_id)

    async def end(self, job: JobRecord) -> None:
        self.ended.append(job)
        self.jobs.add(job.job_id)

    async def flush(self, store: SchedulerStore) -> None:
        saved, ended = self.saved, self.ended
        self.saved, self.ended, self.jobs = [], [], set()
        await store.record_progress(saved, ended)


class Progress:
    """Job events into the store: submissions queued, attempts started and ended."""

    def __init__(self, scheduler: Scheduler):
        self.s = scheduler

    @batch_handler
    async def on_job_events(self, events: list[tuple[Envelope, EventData]]) -> None:
        """A fetch of job events, in stream order: each run of submissions recorded in one MULTI, each run
        of progress reports under one hold of the lock, their starts and ends written in one MULTI. Every
        handler is idempotent by nature (SET NX, attempt and state guards), so a batch handled again after
        a failure changes nothing twice."""
        submitted: list[JobRecord] = []
        reports: list[Report] = []
        rejected = False
        for _env, data in events:
            if isinstance(data, JobSubmitted):
                await self._on_reports(reports)
                reports = []
                submitted.append(JobRecord(job_id=data.job_id, spec=data, submitted_at=_env.time))
            elif isinstance(data, (JobStarted, JobFinished, JobFailed)):
                rejected |= await self._submit(submitted)
                submitted = []
                reports.append(data)
        rejected |= await self._submit(submitted)
        progressed = bool(reports) or rejected
        await self._on_reports(reports)
        self.s.dirty.set()
        if progressed:
            await self.s.publish_staged()

    async def _submit(self, submitted: list[JobRecord]) -> bool:
        """Record the submissions; one that names a folder not its own (any system may publish job.submitted,
        not only the API, which refuses it) is rejected with the reason instead, never queued. True if any was."""
        store, rejected = self.s.store, False
        accepted = []
        for job in submitted:
            refused = job_paths.refusals(job.spec.model_dump(), job.spec.team, self.s.settings.team_roots)
            if not refused:
                accepted.append(job)
            elif await store.job(job.job_id) is None:  # a redelivery of one rejected already changes nothing
                reason = "; ".join(f"{field}: {why}" for field, why in refused.items())
                await store.reject(job, reason, self.s.clock())
                rejected = True
        await store.submit(accepted)
        return rejected

    async def _on_reports(self, reports: list[Report]) -> None:
        """Reports in order under one hold of the lock; the plain starts and ends among them are written
        together (a job's next report waits until its last one is written)."""
        if not reports:
            return
        writes = Writes()
        async with self.s.lock:
            for data in reports:
                if data.job_id in writes.jobs:
                    await writes.flush(self.s.store)
                await self.on_report(data, writes)
            await writes.flush(self.s.store)

    async def on_report(self, data: Report, writes: Writes | None = None) -> None:
        """One report about an attempt (from the bus, or read off a node's heartbeat); the caller holds the lock.
        With `writes`, a plain start or end is left there for the caller to write (with others)."""
        job = await self.s.store.job(data.job_id)
        if job is not None and not from_attempt_node(job, data):
            self.s.log.warning("job.report_from_other_node", job_id=data.job_id, attempt=data.attempt,
                               node=f"{data.cluster}/{data.node}", placed_on=job.nodes, event=data.event_name,
                               reason="the attempt was not placed on the reporting node: ignored")
            return
        if job is not None and isinstance(data, (JobFinished, JobFailed)) and late_end(job, data):
            await self._on_late_end(job, data)
            return
        if (job is not None and job.state == "pending" and job.held_until is not None and data.attempt == job.attempt
                and isinstance(data, (JobFinished, JobFailed))):
            # The stopped attempt of a preempted, moved or drained job ended (its checkpoint is written):
            # place it again.
            job.held_until = None
            await self.s.store.save(job)
            self.s.log.info("job.stopped", job_id=job.job_id, attempt=data.attempt)
            self.s.dirty.set()
            return
        # Only the current attempt while it holds GPUs: reports of a preempted or
        # lost attempt (the job is pending again, or placed anew) change nothing.
        if job is None or data.attempt != job.attempt or job.state not in ACTIVE:
            self.s.log.info("job.progress_ignored", job_id=data.job_id, attempt=data.attempt)
            return
        if job.parts:
            await self._on_gang_progress(job, data)
            return
        if isinstance(data, JobStarted):
            if job.state == "placed":
                job.state, job.started_at = "running", data.started_at
                await (writes.save(job) if writes is not None else self.s.store.save(job))
            return
        await self._end_attempt(job, data, writes)

    async def _on_late_end(self, job: JobRecord, data: JobFinished | JobFailed) -> None:
        """The attempt we gave up on (its node went silent) ended on its own after all, before another was placed:
        its end is the job's end (or, per the job's policy, it runs again at once), never a second full run."""
        decision = after_end(job, data, self.s.settings.max_restarts)
        job.held_until = job.lost_attempt = None
        if decision.requeue:
            await self.s.store.save(job)
        else:
            record_end(job, data)
            await self.s.store.finish(job, unqueue=True)
        self.s.log.warning("job.lost_attempt_ended", job_id=job.job_id, attempt=data.attempt, state=job.state,
                           exit_code=getattr(data, "exit_code", None))
        self.s.dirty.set()

    async def _end_attempt(self, job: JobRecord, data: JobFinished | JobFailed, writes: Writes | None) -> None:
        """The current attempt of a job on one node ended."""
        decision = after_end(job, data, self.s.settings.max_restarts)
        if decision.requeue:
            await self.s.store.requeue(job, decision.cause, decision.reason, self.s.clock(), None)
            self.s.log.info("job.requeued", job_id=job.job_id, attempt=data.attempt, cause=decision.cause)
            self.s.dirty.set()
            return
        record_end(job, data)
        await (writes.end(job) if writes is not None else self.s.store.finish(job))
        self.s.dirty.set()

    async def _on_gang_progress(self, job: JobRecord, data: Report) -> None:
        """A part of a gang spanning nodes reported: all or nothing (see gang.py)."""
        settings, store = self.s.settings, self.s.store
        if isinstance(data, JobFinished) and data.interrupted:
            # A planned stop of one part: the whole gang goes back to the queue to resume, the other parts stop.
            now = self.s.clock()
            await store.requeue(job, "interrupted", data.interrupted, now, settings.preemption_grace_s,
                                frozenset({data.rank or 0}), hold_until=settings.stop_hold(now))
            self.s.dirty.set()
            return
        step = on_part_report(job, data)
        if step.action == "ignore":
            self.s.log.info("job.progress_ignored", job_id=job.job_id, attempt=data.attempt, rank=data.rank,
                            node=data.node)
            return
        if step.action == "save":
            await store.save(job)
            return
        now, grace = self.s.clock(), settings.preemption_grace_s
        if step.action == "failed" and job.spec.restart_on_failure and len(job.requeues) < settings.max_restarts:
            stopping = {p.rank for p in step.stop}
            spare = frozenset(p.rank for p in job.parts if p.rank not in stopping)
            await store.requeue(job, "restart_on_failure", f"failed ({step.reason}), restarting", now, grace, spare)
        else:
            if step.action == "failed":
                failed = next(p for p in job.parts if p.rank == (data.rank or 0))
                job.state, job.reason = "failed", step.reason
                job.exit_code, job.finished_at = failed.exit_code, failed.finished_at
            await store.end(job, list(step.stop), f"gang failed: {step.reason}", grace, now)
        self.s.log.info("job.gang_" + step.action, job_id=job.job_id, attempt=job.attempt, reason=step.reason,
                        stopping=[p.node for p in step.stop])
        self.s.dirty.set()
