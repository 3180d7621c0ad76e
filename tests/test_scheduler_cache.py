"""The leader's store cache fills from a read unless that part was written meanwhile (real Redis).

Under load writes land all the time; a read that refused to fill whenever *any* write landed during it
never filled, so every pass and heartbeat read and parsed every registration and queued job again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from redis.asyncio import Redis

from whaleflux.scheduler.leadership import Leadership
from whaleflux.scheduler.records import JobRecord
from whaleflux.scheduler.store import SchedulerStore
from whaleflux.shared.events import GpuIdentity, JobSubmitted, NodeRegistered
from whaleflux.shared.outbox import Outbox

PREFIX = "wf:scheduler"
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _reg(node: str) -> NodeRegistered:
    gpu = GpuIdentity(uuid=f"{node}-0", index=0, model="H100", name="H100", memory_total_mib=81559)
    return NodeRegistered(cluster="c1", node=node, agent_version="t", gpus=[gpu])


def _job(job_id: str) -> JobRecord:
    return JobRecord(job_id=job_id, spec=JobSubmitted(job_id=job_id, name=job_id, command=["true"]), submitted_at=T0)


class DuringReads:
    """Counts the store's reads of one Redis command and runs `meanwhile` inside each (after Redis answered,
    before the store sees the answer): a write landing while the read is in flight."""

    def __init__(self, redis: Redis, command: str):
        self.calls = 0
        self.meanwhile: Callable[[], Awaitable[None]] | None = None
        real = getattr(redis, command)

        async def read(*args, **kwargs):
            self.calls += 1
            answer = await real(*args, **kwargs)
            if self.meanwhile is not None:
                job, self.meanwhile = self.meanwhile, None
                await job()
            return answer

        setattr(redis, command, read)


async def _leading_store(servers) -> tuple[Redis, SchedulerStore]:
    redis = Redis.from_url(servers.redis_url, password=servers.redis_password, decode_responses=True)
    leader = Leadership(redis, PREFIX, "one", 30)
    store = SchedulerStore(redis, PREFIX, Outbox(redis, PREFIX), "test", leader, lambda: "epoch-1")
    await redis.set(store.epoch_key, "epoch-1")
    await leader.acquire(poll_s=0.1)
    return redis, store


async def test_registrations_fill_the_cache_despite_other_writes_but_not_their_own(clean_servers):
    redis, store = await _leading_store(clean_servers)
    try:
        await store.register(_reg("n1"))
        reads = DuringReads(redis, "hgetall")
        reads.meanwhile = lambda: store.save(_job("elsewhere"))  # a job written while the nodes are read
        assert set(await store.registrations()) == {"c1/n1"}
        assert set(await store.registrations()) == {"c1/n1"} and await store.registered("c1/n1")
        assert reads.calls == 1, "filled by the first read: a job's write does not touch registrations"

        store.drop_cache()
        reads.meanwhile = lambda: store.register(_reg("n2"))  # a registration written while they are read
        assert set(await store.registrations()) == {"c1/n1"}, "the read's answer predates the write"
        assert set(await store.registrations()) == {"c1/n1", "c1/n2"}, "not filled from it: read again"
        assert reads.calls == 3
    finally:
        await redis.aclose()


async def test_job_records_fill_the_cache_except_those_written_during_the_read(clean_servers):
    redis, store = await _leading_store(clean_servers)
    try:
        await store.submit([_job("a"), _job("b")])  # SET NX: known only once read back
        reads = DuringReads(redis, "mget")
        changed = _job("b").model_copy(update={"reason": "written meanwhile"})
        reads.meanwhile = lambda: store.save(changed)
        first = await store.jobs_shared(["a", "b"])
        assert first["b"].reason is None, "the read's answer predates the write"
        again = await store.jobs_shared(["a", "b"])
        assert again["a"] is first["a"], "a was filled (and parsed once) though b was written meanwhile"
        assert again["b"].reason == "written meanwhile", "b comes from its own write, never the older read"
        assert reads.calls == 1, "both from the cache: a filled by the read, b by its own write"
    finally:
        await redis.aclose()
