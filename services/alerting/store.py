"""Every Redis key and encoding of alerting, behind typed methods. Nothing else in alerting talks to Redis.

Keys (prefix `wf:alerting`): `firing` (fingerprint -> alert.raised JSON),
`topology` (`cluster/node` -> rack, pool and GPU names), `job-classes` (job id ->
workload class), `job-owners` (job id -> `team/project`, for job failure alerts),
`groups`, `incidents`, `silences`, `acks` (JSON models by id),
`deliveries` (sorted set: delivery id by due time, epoch seconds), `delivery`
(id -> Delivery JSON) and `notifications` (the log, newest first, LOG_KEEP rows).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, cast

from redis.asyncio import Redis

from whaleflux.shared.events import AlertRaised
from whaleflux.shared.outbox import Outbox

from .delivery.model import Delivery, LogEntry
from .dispatch.groups import Group
from .dispatch.incidents import Incident
from .dispatch.intake import Ack, Changes
from .dispatch.silences import Silence
from .firing import AlertChange
from .rules.engine import NodeInfo

LOG_KEEP = 10_000
# The due deliveries and their records: [id, record or "" when it has none, ...].
_DUE = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], 0, ARGV[1], 'LIMIT', 0, ARGV[2])
local out = {}
if #ids == 0 then return out end
local raws = redis.call('HMGET', KEYS[2], unpack(ids))
for i, id in ipairs(ids) do
  out[#out + 1] = id
  out[#out + 1] = raws[i] or ''
end
return out
"""


class StateHost(Protocol):
    """Where the connections are (the service runtime): Redis and the outbox, once connected."""

    @property
    def redis(self) -> Redis: ...

    @property
    def outbox(self) -> Outbox: ...


@dataclass
class Snapshot:
    """Everything alerting keeps, as loaded at start-up."""

    firing: dict[str, AlertRaised] = field(default_factory=dict)
    topology: dict[tuple[str, str], NodeInfo] = field(default_factory=dict)
    job_classes: dict[str, str] = field(default_factory=dict)
    job_owners: dict[str, tuple[str, str]] = field(default_factory=dict)
    groups: dict[str, Group] = field(default_factory=dict)
    incidents: dict[str, Incident] = field(default_factory=dict)
    silences: dict[str, Silence] = field(default_factory=dict)
    acks: dict[str, Ack] = field(default_factory=dict)


class AlertStore:
    def __init__(self, host: StateHost, prefix: str) -> None:
        self.host = host
        p = prefix
        self.firing, self.topology, self.job_classes = f"{p}:firing", f"{p}:topology", f"{p}:job-classes"
        self.job_owners = f"{p}:job-owners"
        self.groups, self.incidents = f"{p}:groups", f"{p}:incidents"
        self.silences, self.acks = f"{p}:silences", f"{p}:acks"
        self.queue, self.delivery, self.log = f"{p}:deliveries", f"{p}:delivery", f"{p}:notifications"

    @property
    def redis(self) -> Redis:
        return self.host.redis

    async def _hash(self, key: str) -> dict[str, str]:
        # The connection decodes responses (decode_responses=True): what redis-py types as `bytes | str` is str.
        return cast(dict[str, str], await self.redis.hgetall(key))

    async def load(self) -> Snapshot:
        topology = {}
        for key, v in (await self._hash(self.topology)).items():
            cluster, node = key.split("/", 1)
            topology[(cluster, node)] = NodeInfo.from_json(json.loads(v))
        return Snapshot(
            firing={fp: AlertRaised.model_validate_json(v) for fp, v in (await self._hash(self.firing)).items()},
            topology=topology,
            job_classes=await self._hash(self.job_classes),
            job_owners={k: _owner(v) for k, v in (await self._hash(self.job_owners)).items()},
            groups={k: Group.model_validate_json(v) for k, v in (await self._hash(self.groups)).items()},
            incidents={k: Incident.model_validate_json(v) for k, v in (await self._hash(self.incidents)).items()},
            silences={k: Silence.model_validate_json(v) for k, v in (await self._hash(self.silences)).items()},
            acks={k: Ack.model_validate_json(v) for k, v in (await self._hash(self.acks)).items()},
        )

    # ------------------------------------------------------------ inputs

    async def save_node(self, cluster: str, node: str, info: NodeInfo) -> None:
        await self.redis.hset(self.topology, f"{cluster}/{node}", json.dumps(info.to_json()))

    async def save_job_class(self, job_id: str, workload_class: str, owner: tuple[str, str] | None = None) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.job_classes, job_id, workload_class)
            if owner is not None:
                pipe.hset(self.job_owners, job_id, "/".join(owner))
            await pipe.execute()

    async def forget_job_class(self, job_id: str) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self.job_classes, job_id)
            pipe.hdel(self.job_owners, job_id)
            await pipe.execute()

    async def save_alert(self, change: AlertChange) -> None:
        """The firing set and the alert.raised / alert.resolved event: one MULTI."""
        async with self.redis.pipeline(transaction=True) as pipe:
            if isinstance(change.alert, AlertRaised):
                pipe.hset(self.firing, change.fingerprint, change.alert.model_dump_json())
            else:
                pipe.hdel(self.firing, change.fingerprint)
            self.host.outbox.stage(pipe, change.subject, change.envelope)
            await pipe.execute()

    # ------------------------------------------------------------ dispatch

    async def save_changes(self, changes: Changes, deliveries: list[Delivery]) -> None:
        """Groups, incidents, queued deliveries and drain events: one MULTI, so a crash loses or doubles nothing."""
        async with self.redis.pipeline(transaction=True) as pipe:
            for key, g in changes.groups.items():
                pipe.hset(self.groups, key, g.model_dump_json())
            for key in changes.removed:
                pipe.hdel(self.groups, key)
            for inc in changes.incidents:
                pipe.hset(self.incidents, inc.id, inc.model_dump_json())
            for d in deliveries:
                pipe.hset(self.delivery, d.id, d.model_dump_json())
                pipe.zadd(self.queue, {d.id: d.created_at.timestamp()})
            for out in changes.drains:
                self.host.outbox.stage(pipe, out.subject, out.envelope)
            await pipe.execute()

    async def forget_incidents(self, ids: list[str]) -> None:
        if ids:
            await self.redis.hdel(self.incidents, *ids)

    async def save_ack(self, fingerprint: str, ack: Ack) -> None:
        await self.redis.hset(self.acks, fingerprint, ack.model_dump_json())

    async def save_silence(self, silence: Silence) -> None:
        await self.redis.hset(self.silences, silence.id, silence.model_dump_json())

    # ------------------------------------------------------------ the delivery queue

    async def due(self, now: datetime, limit: int = 200) -> list[Delivery]:
        """Deliveries due at `now`, oldest due first, in one round trip (it is on the path of every page); an id
        without its record is dropped from the queue."""
        rows = cast(list[str], await self.redis.eval(_DUE, 2, self.queue, self.delivery, now.timestamp(), limit))
        out = []
        for did, raw in zip(rows[0::2], rows[1::2], strict=True):
            if raw == "":
                await self.redis.zrem(self.queue, did)
            else:
                out.append(Delivery.model_validate_json(raw))
        return out

    async def next_due(self, after: datetime) -> float | None:
        """Epoch seconds when the next delivery after `after` is due; None when none is."""
        first = await self.redis.zrangebyscore(self.queue, f"({after.timestamp()}", "+inf", start=0, num=1,
                                               withscores=True)
        return float(first[0][1]) if first else None

    async def postpone(self, delivery_id: str, at: datetime) -> None:
        """Try again at `at`, unchanged (it was not tried: rate limit)."""
        await self.redis.zadd(self.queue, {delivery_id: at.timestamp()})

    async def retry(self, d: Delivery, at: datetime) -> None:
        """Tried and failed: keep its attempts and error, try again at `at`."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.delivery, d.id, d.model_dump_json())
            pipe.zadd(self.queue, {d.id: at.timestamp()})
            await pipe.execute()

    async def finish(self, entry: LogEntry) -> None:
        """Done with a delivery: out of the queue, its outcome in the log."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zrem(self.queue, entry.delivery_id)
            pipe.hdel(self.delivery, entry.delivery_id)
            pipe.lpush(self.log, entry.model_dump_json())
            pipe.ltrim(self.log, 0, LOG_KEEP - 1)
            await pipe.execute()

    async def pending(self) -> list[Delivery]:
        return [Delivery.model_validate_json(r) for r in cast(list[str], await self.redis.hvals(self.delivery))]

    async def log_entries(self) -> list[LogEntry]:
        """The notification log, newest first."""
        rows = cast(list[str], await self.redis.lrange(self.log, 0, LOG_KEEP - 1))
        return [LogEntry.model_validate_json(r) for r in rows]


def _owner(value: str) -> tuple[str, str]:
    team, _, project = value.partition("/")
    return team, project
