"""The GPU quarantine on the store: telemetry's samples and silences judged (`quarantine.py`), operators' cordons.

Only the leader judges (it alone consumes telemetry and writes); each change is one fenced MULTI with its
gpu.cordoned or gpu.uncordoned staged in the outbox, so others (inventory) hear of it exactly once and a
rebuild after a lost store folds it back (rebuild.py). The quarantine is kept in memory once read, and read
again after a rebuild or a new lease.
"""

from __future__ import annotations

import asyncio

from whaleflux.shared.events import (
    AlertRaised,
    AlertResolved,
    Envelope,
    EventData,
    GpuCordoned,
    GpuTelemetry,
    GpuUncordoned,
)
from whaleflux.shared.gpu_flags import ecc_errors

from .failover import Failover
from .quarantine import (
    Gpu,
    QuarantinePolicy,
    Step,
    alert_ended,
    alert_fired,
    cordon,
    judge,
    missing_problem,
    sample_problem,
    uncordon,
)
from .records import GpuQuarantine
from .service import TROUBLE, Scheduler

# How often GPUs are checked for going missing.
CHECK_EVERY_S = 1.0


class GpuHealth:
    """Which GPUs are quarantined, and the judgements that put them there or let them go."""

    def __init__(self, scheduler: Scheduler, failover: Failover):
        self.s = scheduler
        self.failover = failover
        settings = scheduler.settings
        self.policy = QuarantinePolicy(settings.gpu_quarantine_hold_s, settings.gpu_missing_s)
        self._records: dict[str, GpuQuarantine] | None = None
        self._key: tuple[str | None, int | None] = (None, None)
        self._accepted: dict[str, int] = {}
        self._sampled: dict[str, float] = {}  # GPU uuid -> when its last sample arrived (our clock)
        self._node_sampled: dict[str, float] = {}  # cluster/node -> when its last telemetry batch arrived
        self._ecc: dict[str, int] = {}  # GPU uuid -> its ECC errors in its last sample
        self.watching_since = scheduler.clock().timestamp()
        self._lock = asyncio.Lock()

    async def quarantined(self) -> dict[str, GpuQuarantine]:
        """GPU uuid -> its quarantine: while leading, the store's as read once per (state epoch, fencing token), so
        a rebuilt store or a new lease is read afresh (and silences judged afresh); a standby reads the store."""
        store = self.s.store
        if not self.s.is_leader:
            return await store.quarantines()
        key = (self.s.runtime.epoch, self.s.leadership.token)
        if self._records is None or key != self._key:
            self._key = key
            self._accepted = await store.accepted_ecc()
            self._records = await store.quarantines()
            self.watching_since = self.s.clock().timestamp()
        return dict(self._records)

    async def _commit(self, gpu: Gpu, step: Step, accepted: int | None = None) -> None:
        now = self.s.clock()
        await self.s.store.set_quarantine(gpu.uuid, gpu.node, step.record, step.event, now, accepted)
        records = self._records if self._records is not None else {}
        if step.record is None:
            records.pop(gpu.uuid, None)
        else:
            records[gpu.uuid] = step.record
        if accepted is not None:
            self._accepted[gpu.uuid] = accepted
        if step.event is not None:
            data = step.event.data
            what = "gpu.quarantined" if isinstance(data, GpuCordoned) else "gpu.released"
            reason = data.reason if isinstance(data, (GpuCordoned, GpuUncordoned)) else None
            self.s.log.warning(what, node=gpu.node, gpu=gpu.index, uuid=gpu.uuid, reason=reason)
            await self.s.publish_staged()
            self.s.dirty.set()

    async def observe(self, batch: GpuTelemetry) -> None:
        """One node's samples: a fault quarantines its GPU, healthy samples count toward the hold."""
        at = self.s.clock()
        now = at.timestamp()
        self._node_sampled[f"{batch.cluster}/{batch.node}"] = now
        for g in batch.gpus:
            self._sampled[g.uuid] = now
            self._ecc[g.uuid] = ecc_errors(g)
        if not self.s.deciding or not self.s.is_leader:
            return  # judged again from the next samples once the store is whole
        async with self._lock:
            records = await self.quarantined()
            for g in batch.gpus:
                problem = sample_problem(g, self._accepted.get(g.uuid, 0))
                current = records.get(g.uuid)
                if problem is None and current is None:
                    continue
                gpu = Gpu(batch.cluster, batch.node, g.uuid, g.index)
                step = judge(current, gpu, problem, problem is None, at, self.policy)
                if step is not None:
                    await self._commit(gpu, step)

    async def check_missing(self) -> None:
        """Quarantine each GPU gone from telemetry while its node heartbeats."""
        at = self.s.clock()
        now = at.timestamp()
        async with self._lock:
            records = await self.quarantined()
            for key, reg in (await self.s.store.registrations()).items():
                heard, sampled = self.failover.heard_at(key), self._node_sampled.get(key)
                for g in reg.gpus:
                    if g.uuid in records:
                        continue  # already out; coming back is judged by its samples
                    problem = missing_problem(self._sampled.get(g.uuid), sampled, heard, self.watching_since, now,
                                              self.policy)
                    if problem is not None:
                        gpu = Gpu(reg.cluster, reg.node, g.uuid, g.index)
                        step = judge(None, gpu, problem, False, at, self.policy)
                        if step is not None:
                            await self._commit(gpu, step)

    async def on_alert(self, env: Envelope, data: EventData) -> None:
        """A critical alert on a GPU (its labels name its UUID) takes the GPU out until it resolves."""
        if not isinstance(data, (AlertRaised, AlertResolved)):
            return
        if isinstance(data, AlertRaised) and data.severity != "critical":
            return
        uuid = data.labels.get("UUID")
        if not uuid:
            return  # a node's or a job's alert: a drain, if its rule asks for one, does the rest
        gpu = await self._registered(uuid)
        if gpu is None:
            return
        async with self._lock:
            current = (await self.quarantined()).get(uuid)
            if isinstance(data, AlertRaised):
                step = alert_fired(current, gpu, data.fingerprint, data.rule, self.s.clock())
            else:
                step = alert_ended(current, data.fingerprint, data.rule)
            if step is not None:
                await self._commit(gpu, step)

    async def _registered(self, uuid: str) -> Gpu | None:
        for reg in (await self.s.store.registrations()).values():
            for g in reg.gpus:
                if g.uuid == uuid:
                    return Gpu(reg.cluster, reg.node, g.uuid, g.index)
        return None

    async def cordon(self, gpu: Gpu, reason: str) -> GpuQuarantine:
        """An operator's cordon (kept until the operator lifts it)."""
        async with self._lock:
            current = (await self.quarantined()).get(gpu.uuid)
            step = cordon(current, gpu, reason, self.s.clock())
            if step is not None:
                await self._commit(gpu, step)
            return (await self.quarantined())[gpu.uuid]

    async def uncordon(self, gpu: Gpu) -> GpuQuarantine | None:
        """An operator lifts a cordon or a fault's quarantine; returns what was lifted (None: nothing was)."""
        async with self._lock:
            current = (await self.quarantined()).get(gpu.uuid)
            accepted = max(self._ecc.get(gpu.uuid, 0), self._accepted.get(gpu.uuid, 0))
            step = uncordon(current, accepted)
            if step is not None:
                await self._commit(gpu, step, accepted)
        return current

    async def loop(self) -> None:
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            if not self.s.deciding or not self.s.is_leader:
                self.watching_since = self.s.clock().timestamp()
                continue
            try:
                await self.check_missing()
            except TROUBLE as exc:
                self.s.log.error("gpu_health.check_failed", error=repr(exc))
