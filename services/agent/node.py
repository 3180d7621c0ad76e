"""One node's agent: registers its GPUs, publishes telemetry and heartbeats, runs placed jobs."""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import structlog
from tenacity import AsyncRetrying, stop_after_delay, wait_exponential

from whaleflux.shared import subjects
from whaleflux.shared.bus import Bus, Retry
from whaleflux.shared.catalog import FleetNode
from whaleflux.shared.clock import Clock, system_clock
from whaleflux.shared.events import (
    AttemptReport,
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
from whaleflux.shared.streams import agent_consumer
from whaleflux.shared.version import __version__

from . import attempts, disk, fencing, jobuser, recovery, runner, virtual
from .backend import GpuBackend
from .burnin.gate import NodeGate

log = structlog.get_logger("whaleflux.agent")

PLANNED_STOP = "agent stopped: planned shutdown"
# An ended attempt stays listed in heartbeats this long after its end was published, so a
# scheduler that missed or has not yet handled that job.finished can end the attempt from it.
LISTED_AFTER_END_S = 60.0
# How long a telemetry sample or heartbeat is retried before it is dropped (the next one is due anyway).
LIVE_RETRY_S = 10.0


def _base(placed: JobPlaced) -> dict:
    """The fields every job event of this attempt (and part) carries."""
    return dict(cluster=placed.cluster, node=placed.node, job_id=placed.job_id, attempt=placed.attempt,
                rank=placed.rank)


@dataclass(frozen=True)
class EndedAttempt:
    """An attempt whose end was published, or that was refused: listed in heartbeats until LISTED_AFTER_END_S after
    `reported_at`."""

    dir: Path | None  # None: a virtual or refused attempt (no folder)
    report: AttemptReport
    reported_at: datetime


class NodeAgent:
    def __init__(
        self,
        bus: Bus,
        node: FleetNode,
        backend: GpuBackend,
        *,
        interval_s: float = 1.0,
        log_dir: Path,
        attempts_dir: Path,
        stop_grace_s: float = 5.0,
        fence_after_s: float = 60.0,
        clock: Clock = system_clock,
        virtual_jobs: bool = False,
        gate: NodeGate | None = None,
        job_users: jobuser.JobUsers | None = None,
        places: runner.JobPlaces | None = None,
        min_free_bytes: int = disk.MIN_FREE_BYTES,
    ):
        self.bus = bus
        self.node = node
        self.backend = backend
        self.interval_s = interval_s
        self.log_dir = log_dir
        # Absolute: the paths handed to supervisors must not depend on the agent's working folder.
        self.node_dir = (attempts_dir / node.cluster / node.name).absolute()
        self.stop_grace_s = stop_grace_s
        self.fence_after_s = fence_after_s
        self.clock = clock
        # Bench/test mode (virtual.py): placed jobs start no process, they "run" for their stated duration.
        self.virtual_jobs = virtual_jobs
        # The validation gate (burnin/gate.py): a burn-in before the node registers, when its policy asks.
        self.gate = gate
        # Who its jobs run as (jobuser.py): by team/project, else the default; None: the agent's own user.
        self.job_users = job_users or jobuser.JobUsers()
        # Where its jobs' own folders are (runner.JobPlaces, jobarea.py).
        self.places = places or runner.JobPlaces(areas=(log_dir.parent / "areas").absolute())
        # Where it writes (disk.py): an attempt starts only with min_free_bytes free in each.
        self.stores = [disk.Store(runner.ATTEMPT_STORE, self.node_dir), disk.Store(runner.LOG_STORE, log_dir)]
        self.min_free_bytes = min_free_bytes
        # Why the node takes no new work (a disk fault), said in every heartbeat; None: healthy.
        self.fault: str | None = None
        self.jobs: dict[tuple[str, int], runner.RunningJob | virtual.VirtualJob] = {}
        self.ended: dict[tuple[str, int], EndedAttempt] = {}
        # Placements past their start-by check and not yet in `jobs`: listed as running, so a heartbeat sent
        # after their start_by never leaves out an attempt that is about to start.
        self.starting: dict[tuple[str, int], JobPlaced] = {}
        self._stopping = False
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
        await self.bus.ensure_consumer_patiently(placements)  # NATS busy or briefly away: wait
        # Attempts an earlier agent left are taken up before any placement is handled,
        # so a redelivered placement of one of them is not run a second time.
        self.node_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        left = recovery.scan(self.node_dir)
        for attempt in left:
            running, ended = attempt.running, attempt.ended
            if attempt.reported_at is not None and running is not None and ended is not None:
                self._list_ended(attempt.dir, attempt.placed, running, ended, attempt.reported_at)
            elif ended is None and running is not None:  # scan() keeps an unended attempt only while it runs
                self._adopt(attempt.dir, attempt.placed, running)
        gpus = self.backend.identities()
        if self.gate is not None:
            # Held back (unregistered, so nothing is placed here) while a burn-in runs; failing GPUs stay out.
            gpus, validated = await self.gate.admit(self.backend, running_attempts=len(self.jobs))
            if validated is not None:
                # Before the registration, so that whoever reads both knows why GPUs are missing from it.
                # A random id, fixed across its retries: two burn-ins are two events, however close.
                await self._publish(subjects.gpu_validated(self.node.cluster, self.node.name), validated)
        await self._publish(
            subjects.node_registered(self.node.cluster, self.node.name),
            NodeRegistered(cluster=self.node.cluster, node=self.node.name, rack=self.node.rack, pool=self.node.pool,
                           interconnect=self.node.interconnect, agent_version=__version__, gpus=gpus,
                           fence_after_s=self.fence_after_s, stop_grace_s=self.stop_grace_s),
        )
        for attempt in left:
            if attempt.reported_at is None:
                await self._take_up(attempt)
        self.bus.start_consumer(placements, self.on_order, None, "")
        self._tasks.append(asyncio.create_task(self._telemetry_loop(), name=f"telemetry-{self.node.name}"))
        log.info("agent.node_started", node=self.node.name, gpus=len(self.backend.identities()),
                 adopted=sorted(k[0] for k in self.jobs))

    def _adopt(self, attempt_dir: Path, placed: JobPlaced, running: attempts.Running) -> None:
        """Hold an attempt whose supervisor outlived the earlier agent as if this agent had launched it."""
        job = runner.adopt(placed, attempt_dir, running)
        self.jobs[(placed.job_id, placed.attempt)] = job
        self.backend.job_started(placed.gpu_uuids, placed.job_id, job.running.job_pid)
        log.info("job.adopted", job_id=placed.job_id, attempt=placed.attempt, pid=job.running.job_pid, rank=placed.rank)

    async def _take_up(self, attempt: recovery.LeftAttempt) -> None:
        """Report an attempt the earlier agent left unreported: its start, then its end, or watch it while it runs."""
        placed = attempt.placed
        if attempt.running is not None:
            # The earlier agent may have died between starting it and saying so; the id makes a repeat one event.
            await self._publish_started(placed, attempt.running)
        if attempt.ended is not None:
            await self._report_end(attempt.dir, placed, attempt.running, attempt.ended)
        else:
            self._watch(self.jobs[(placed.job_id, placed.attempt)])

    def _watch(self, job: runner.RunningJob | virtual.VirtualJob) -> None:
        task = asyncio.create_task(self._wait(job))
        self._waiters.append(task)
        # Thousands of (virtual) jobs come and go: forget each waiter once it is done.
        task.add_done_callback(lambda t: self._waiters.remove(t) if t in self._waiters else None)

    async def _publish(self, subject: str, data: EventData, event_id: str | None = None,
                       correlation: str | None = None) -> Envelope:
        """Publish, retrying until the bus takes it: a job's end must never be lost."""
        env = make_envelope(data, source=self.source, event_id=event_id, correlation_id=correlation, time=self.clock())
        async for attempt in AsyncRetrying(wait=wait_exponential(multiplier=0.2, max=5), reraise=True):
            with attempt:
                await self.bus.publish_envelope(subject, env)
        return env

    async def _report(self, subject: str, data: JobStarted | JobFinished | JobFailed, placed: JobPlaced) -> None:
        """An attempt's report on its node's subject, its id fixed per (job, attempt, part; rank 0 plain): one event."""
        event_id = f"{data.event_name.removeprefix('job.')}-{placed.job_id}-{placed.attempt}"
        await self._publish(subject, data, event_id + (f"-r{placed.part}" if placed.part else ""), placed.job_id)

    async def _publish_live(self, subject: str, env: Envelope) -> None:
        """Publish a sample or heartbeat, retrying for up to LIVE_RETRY_S: a NATS server lost from a cluster
        (reconnect, stream leader elected again) takes a few seconds, and the sample must not be lost to it.
        The envelope keeps its id, so a retry of a publish that was stored after all is stored once."""
        async for attempt in AsyncRetrying(wait=wait_exponential(multiplier=0.1, max=1), reraise=True,
                                           stop=stop_after_delay(LIVE_RETRY_S)):
            with attempt:
                await self.bus.publish_envelope(subject, env)

    async def _telemetry_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            now = self.clock()
            try:
                await self._sample(now)
            except Exception as exc:  # noqa: BLE001  (a failed sample must not stop the next one)
                log.warning("agent.sample_failed", node=self.node.name, error=repr(exc))
            next_at += self.interval_s
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    def go_silent(self, duration_s: float | None) -> None:
        """Stop publishing telemetry and heartbeats for `duration_s` (None: until the agent restarts)."""
        forever = datetime.max.replace(tzinfo=UTC)
        self.silent_until = forever if duration_s is None else self.clock() + timedelta(seconds=duration_s)

    def speak_again(self) -> bool:
        """End a node-silent fault now; False if the node was not silent."""
        was, self.silent_until = self.silent_until is not None, None
        return was

    async def _sample(self, now: datetime) -> None:
        self._forget_ended(now)
        if self.silent_until is not None:
            if now < self.silent_until:
                return
            self.silent_until = None
        self._seq += 1
        cluster, name = self.node.cluster, self.node.name
        batch = GpuTelemetry(cluster=cluster, node=name, seq=self._seq, sample_time=now, gpus=self.backend.sample(now))
        if self.gate is not None:
            self.gate.watch(batch.gpus, now)
        env = make_envelope(batch, source=self.source, time=now)
        await self._publish_live(subjects.gpu_telemetry(cluster, name), env)
        if not self.virtual_jobs:  # a virtual attempt writes nothing
            await self._check_disks()
        heartbeat = NodeHeartbeat(cluster=cluster, node=name, seq=self._seq, fault=self.fault,
                                  running_jobs=sorted({k[0] for k in self.jobs}), attempts=self.attempt_reports())
        beat = make_envelope(heartbeat, source=self.source, time=now)
        await self._publish_live(subjects.node_heartbeat(cluster, name), beat)
        # Only a heartbeat the bus took counts as a sign of life: a node the scheduler no longer
        # hears is declared lost, and its supervisors stop their jobs (supervise.py).
        try:
            (self.node_dir / attempts.ALIVE).touch()
        except OSError as exc:
            why = disk.fault_of_write(self.stores[0], exc)
            if why is None:
                raise
            self._disk_fault(why)

    async def _check_disks(self) -> None:
        """Look at the stores again: a fault found takes the node out of work; once a faulty node's stores have
        space and take a write again, it takes work again."""
        why = await asyncio.to_thread(disk.check, self.stores, self.min_free_bytes, write=self.fault is not None)
        if why is not None:
            self._disk_fault(why)
        elif self.fault is not None:
            log.warning("node.disk_recovered", node=self.node.name, was=self.fault)
            self.fault = None

    def _disk_fault(self, why: str) -> None:
        """The node takes no new work until a later check finds its stores usable (said in its heartbeats)."""
        if why != self.fault:
            log.error("node.disk_fault", node=self.node.name, reason=why, note="no new work until it clears")
        self.fault = why

    def attempt_reports(self) -> list[AttemptReport]:
        """Every attempt running (or starting) here, and those that ended or were refused within LISTED_AFTER_END_S
        of their report."""
        running = [AttemptReport(job_id=j.placed.job_id, attempt=j.placed.attempt, rank=j.placed.rank, state="running",
                                 started_at=j.running.started_at) for j in self.jobs.values()]
        starting = [AttemptReport(job_id=p.job_id, attempt=p.attempt, rank=p.rank, state="running")
                    for k, p in self.starting.items() if k not in self.jobs]
        listed = [*running, *starting, *(e.report for e in self.ended.values())]
        return sorted(listed, key=lambda r: (r.job_id, r.attempt))

    def _list_ended(self, attempt_dir: Path | None, placed: JobPlaced, running: attempts.Running, ended: attempts.Exit,
                    reported_at: datetime) -> None:
        report = AttemptReport(job_id=placed.job_id, attempt=placed.attempt, rank=placed.rank, state="exited",
                               started_at=running.started_at, exit_code=ended.exit_code,
                               finished_at=ended.finished_at, interrupted=ended.interrupted)
        self.ended[(placed.job_id, placed.attempt)] = EndedAttempt(attempt_dir, report, reported_at)

    def _forget_ended(self, now: datetime) -> None:
        for key, ended in list(self.ended.items()):
            if (now - ended.reported_at).total_seconds() >= LISTED_AFTER_END_S:
                if ended.dir is not None:
                    shutil.rmtree(ended.dir, ignore_errors=True)
                del self.ended[key]

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
                # Recorded as the attempt's `interrupted`: a stop we were told to make is never the job's own failure.
                self._stop_in_background(key, job, order.grace_s, f"stopped by the scheduler: {order.reason}")
                log.info("job.preempting", job_id=order.job_id, attempt=key[1], reason=order.reason,
                         grace_s=order.grace_s)

    def _stop_in_background(self, key: tuple[str, int], job: runner.RunningJob | virtual.VirtualJob, grace_s: float,
                            reason: str | None = None) -> asyncio.Task:
        task = self._stops.get(key)
        if task is None:
            if isinstance(job, virtual.VirtualJob):
                stopping = virtual.stop(job, reason)
            else:
                stopping = runner.stop(job, grace_s, reason)
            task = self._stops[key] = asyncio.create_task(stopping)
            task.add_done_callback(lambda _t: self._stops.pop(key, None))
        return task

    async def on_placed(self, env: Envelope, placed: JobPlaced) -> None:
        key = (placed.job_id, placed.attempt)
        if key in self.jobs or key in self.ended or key in self.starting:
            return  # redelivered placement: the attempt runs, ran or was refused here
        if self._stopping:
            # Not acked: the next agent of this node takes it.
            raise Retry("the agent is stopping", delay_s=5.0)
        # The scheduler gave these GPUs to a new job, so whatever holds them here was
        # preempted or moved away: it stops before the new job starts, never shares them.
        wanted = set(placed.gpu_uuids)
        holders = [(k, j) for k, j in self.jobs.items() if k != key and wanted & set(j.placed.gpu_uuids)]
        if holders:
            stops = (self._stop_in_background(k, j, 5.0, "its GPUs were given to another job") for k, j in holders)
            await asyncio.gather(*stops, return_exceptions=True)
            # Let their waiters hand the GPUs back to the backend before the new job takes them.
            for _ in range(200):
                if not any(k in self.jobs for k, _ in holders):
                    break
                await asyncio.sleep(0.01)
        attempt_dir = self.node_dir / attempts.dir_name(placed.job_id, placed.attempt, placed.part)
        if self.fault is None and not self.virtual_jobs:  # free space first: its records must have room
            why = await asyncio.to_thread(disk.check, self.stores, self.min_free_bytes)
            if why is not None:
                self._disk_fault(why)
        if self.fault is not None:
            self._refuse(placed, f"node fault: {self.fault}")  # never started: the scheduler requeues it at once
            return
        # The fencing check, then the attempt listed as starting with no await between: a heartbeat is either
        # sent before the check (and the check then sees a clock no later than the heartbeat's) or lists it.
        refused = fencing.refusal(placed, self.clock())
        if refused is not None:
            self._refuse(placed, refused)
            return
        if self.virtual_jobs:
            await self._start_virtual(placed)
            return
        self.starting[key] = placed
        try:
            job = await runner.launch(placed, self.log_dir, self.node_dir, self.places, grace_s=self.stop_grace_s,
                                      fence_after_s=self.fence_after_s, run_as=self._job_user(placed))
        except disk.DiskFault as exc:
            self._disk_fault(str(exc))
            await self._hand_back(attempt_dir, placed, str(exc))
            return
        except runner.CannotStart as exc:
            # A supervisor that died before it could say so may have met the disk: then it is the node's fault.
            why = await asyncio.to_thread(disk.check, self.stores, self.min_free_bytes, write=True)
            if why is not None:
                self._disk_fault(why)
                await self._hand_back(attempt_dir, placed, why)
            else:
                await self._report_failed(attempt_dir, placed, str(exc), self.clock())
            return
        finally:
            self.starting.pop(key, None)
        self.jobs[key] = job
        self.backend.job_started(placed.gpu_uuids, placed.job_id, job.running.job_pid)
        await self._publish_started(placed, job.running)
        log.info("job.started", job_id=placed.job_id, pid=job.running.job_pid, gpus=placed.gpu_indices,
                 rank=placed.rank)
        self._watch(job)

    def _job_user(self, placed: JobPlaced) -> str | None:
        """Who the job runs as (jobuser.py); CannotStart when its team's uid cannot be had."""
        try:
            return self.job_users.for_job(placed.team, placed.project)
        except (OSError, RuntimeError, ValueError) as exc:
            raise runner.CannotStart(f"no user for team {placed.team!r}: {exc}") from exc

    def _refuse(self, placed: JobPlaced, reason: str) -> None:
        """A stale placement: never started, listed as refused in heartbeats for LISTED_AFTER_END_S (the scheduler
        requeues the attempt on that, or on the first heartbeat sent after its start_by that lists nothing)."""
        now = self.clock()
        report = AttemptReport(job_id=placed.job_id, attempt=placed.attempt, rank=placed.rank, state="refused",
                               finished_at=now, interrupted=reason)
        self.ended[(placed.job_id, placed.attempt)] = EndedAttempt(None, report, now)
        log.warning("job.refused", job_id=placed.job_id, attempt=placed.attempt, rank=placed.rank, reason=reason)

    async def _hand_back(self, attempt_dir: Path, placed: JobPlaced, why: str) -> None:
        """A placement the node's disk kept from starting: its folder removed, refused as a node fault (the scheduler
        requeues it at once, blaming no job); the node takes no new work until its disks pass again."""
        self.starting.pop((placed.job_id, placed.attempt), None)  # listed as refused from now on, not as starting
        await asyncio.to_thread(shutil.rmtree, attempt_dir, True)
        self._refuse(placed, f"node fault: {why}")

    async def _start_virtual(self, placed: JobPlaced) -> None:
        """A virtual attempt (bench/test mode): no process, no folder; reported and listed like a real one."""
        job = virtual.launch(placed, self.clock)
        self.jobs[(placed.job_id, placed.attempt)] = job
        self.backend.job_started(placed.gpu_uuids, placed.job_id, None)
        await self._publish_started(placed, job.running)
        log.info("job.started", job_id=placed.job_id, virtual=True, gpus=placed.gpu_indices, rank=placed.rank)
        self._watch(job)

    async def _publish_started(self, placed: JobPlaced, running: attempts.Running) -> None:
        started = JobStarted(**_base(placed), gpu_uuids=placed.gpu_uuids, pid=running.job_pid,
                             started_at=running.started_at)
        await self._report(subjects.job_started(placed.cluster, placed.node), started, placed)

    async def _wait(self, job: runner.RunningJob | virtual.VirtualJob) -> None:
        ended = await job.ended
        placed = job.placed
        key = (placed.job_id, placed.attempt)
        self.backend.job_stopped(placed.gpu_uuids)
        if ended is None and not self.virtual_jobs:
            ended = await self._end_seen_on_a_faulty_disk(job)
        if ended is None:
            # Its supervisor died without recording the end: report and list nothing, so the
            # scheduler, no longer seeing the attempt in heartbeats, ends it as lost.
            if job.dir is not None:
                shutil.rmtree(job.dir, ignore_errors=True)
            self.jobs.pop(key, None)
            log.warning("job.lost", job_id=placed.job_id, attempt=placed.attempt, reason="supervisor died unrecorded")
            return
        await self._report_end(job.dir, placed, job.running, ended)
        self.jobs.pop(key, None)

    async def _end_seen_on_a_faulty_disk(self, job: runner.RunningJob | virtual.VirtualJob) -> attempts.Exit | None:
        """The end of an attempt whose supervisor recorded none, where the node's disk failed it: the attempt ran
        (and is billed) from its recorded start to now, stopped by the node's fault; None where the disk is fine
        (then the supervisor died for another reason, and the attempt is lost as before)."""
        why = await asyncio.to_thread(disk.check, self.stores, self.min_free_bytes, write=True)
        if why is None:
            return None
        self._disk_fault(why)
        # Its job was killed with it (runner._recorded_exit): SIGKILL is how it ended.
        return attempts.Exit(finished_at=self.clock(), exit_code=-9, interrupted=f"node fault: {why}")

    async def _report_end(self, attempt_dir: Path | None, placed: JobPlaced, running: attempts.Running | None,
                          ended: attempts.Exit) -> None:
        """Publish how the attempt ended, as its supervisor recorded it, and list it in heartbeats for a while."""
        if ended.error is not None or running is None:
            reason = ended.error or "the command never started"
            await self._report_failed(attempt_dir, placed, reason, ended.finished_at)
            return
        if ended.failed and attempt_dir is not None:
            # A job that failed while its log could not be written (a full log disk) failed for the node's fault:
            # it is requeued, not failed, and billed for what it ran.
            logs = [s for s in self.stores if s.name == runner.LOG_STORE]
            why = await asyncio.to_thread(disk.check, logs, self.min_free_bytes, write=True)
            if why is not None:
                self._disk_fault(why)
                ended = attempts.Exit(finished_at=ended.finished_at, exit_code=ended.exit_code,
                                      interrupted=f"node fault: {why}")
        tail = None if not ended.failed else (  # the job's own failure: its last log lines
            virtual.log_tail(placed) if attempt_dir is None else await runner.log_tail(placed, self.log_dir))
        finished = JobFinished(**_base(placed), exit_code=ended.exit_code, started_at=running.started_at,
                               finished_at=ended.finished_at, interrupted=ended.interrupted, log_tail=tail)
        await self._report(subjects.job_finished(placed.cluster, placed.node), finished, placed)
        reported_at = self.clock()
        if attempt_dir is not None:  # a virtual attempt has no folder; fsynced, so off the loop (and awaited first)
            try:
                await asyncio.to_thread(attempts.mark_reported, attempt_dir, reported_at)
            except OSError as exc:
                # Published all the same (a later agent reports it again under the same event id, one event).
                why = disk.fault_of_write(self.stores[0], exc)
                if why is None:
                    raise
                self._disk_fault(why)
        self._list_ended(attempt_dir, placed, running, ended, reported_at)
        log.info("job.finished", job_id=placed.job_id, attempt=placed.attempt, exit_code=ended.exit_code,
                 interrupted=ended.interrupted)

    async def _report_failed(self, attempt_dir: Path | None, placed: JobPlaced, reason: str,
                             failed_at: datetime) -> None:
        """The command never ran: job.failed, and nothing to list (the scheduler never saw it start)."""
        failed = JobFailed(**_base(placed), reason=reason, failed_at=failed_at)
        await self._report(subjects.job_failed(placed.cluster, placed.node), failed, placed)
        if attempt_dir is not None:
            shutil.rmtree(attempt_dir, ignore_errors=True)
        log.warning("job.failed_to_start", job_id=placed.job_id, attempt=placed.attempt, reason=reason)

    async def stop(self) -> None:
        """A planned stop: no more orders taken, every attempt here stopped and reported interrupted, telemetry."""
        self._stopping = True
        # Its placement consumer first (a placement in hand is refused, for the next agent): no job starts after.
        durable = agent_consumer(self.node.cluster, self.node.name).durable
        if durable in self.bus.running_consumers():
            await self.bus.stop_consumer(durable)
        stops = [self._stop_in_background(k, j, self.stop_grace_s, PLANNED_STOP) for k, j in list(self.jobs.items())]
        await asyncio.gather(*stops, return_exceptions=True)
        # The waiters publish job.finished for the stopped jobs, so the scheduler requeues them.
        pending = [t for t in self._waiters if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=5)
        left = {*self._tasks, *self._waiters}
        while left:
            # Again until they end: nats-py can swallow a cancel that lands inside a publish.
            for task in left:
                task.cancel()
            _, left = await asyncio.wait(left, timeout=1.0)
