"""Redis behind Sentinel (issue 20, Deliver 3): the services follow a failover, and confirm their writes on a
replica before the bus hears of them, so a master killed under jobs loses none and runs none twice."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from whaleflux.shared.redis_client import StateConnection
from whaleflux.shared.replication_store import NotReplicated
from whaleflux.shared.settings import CommonSettings

from .lifecycle import assert_billed_what_ran, assert_ran_once_each
from .sentinel import SentinelRedis, failover_under_jobs


@pytest.fixture
def sentinel(tmp_path):
    redis = SentinelRedis(tmp_path / "sentinel", secrets.token_urlsafe(16)).start()
    yield redis
    redis.stop()


def _settings(redis: SentinelRedis) -> CommonSettings:
    env = redis.env()
    return CommonSettings(redis_url=env["REDIS_URL"], redis_sentinels=env["WHALEFLUX_REDIS_SENTINELS"],
                          redis_master=env["WHALEFLUX_REDIS_MASTER"], redis_password=env["WHALEFLUX_REDIS_PASSWORD"])


def test_the_client_follows_the_promoted_replica_and_finds_what_was_confirmed(sentinel):
    settings = _settings(sentinel)

    async def write() -> None:
        state = StateConnection(settings, "wf:test")
        assert state.barrier is not None
        await state.redis.set("wf:test:job", "placed")
        await state.barrier()
        await state.aclose()

    asyncio.run(write())
    old = sentinel.kill9_master()
    new = sentinel.wait_promoted(old)
    assert new != old

    async def read() -> tuple[object, int]:
        state = StateConnection(settings, "wf:test")
        try:
            got = await state.redis.get("wf:test:job")
            port = int((await state.redis.info("server"))["tcp_port"])
            return got, port
        finally:
            await state.aclose()

    assert asyncio.run(read()) == ("placed", new)


def test_the_barrier_refuses_when_no_replica_confirms(sentinel):
    settings = _settings(sentinel)
    master = sentinel.master()
    for port in [p for p in sentinel.servers if p != master]:
        sentinel.procs.pop(port).kill()

    async def write() -> None:
        state = StateConnection(settings, "wf:test")
        assert state.barrier is not None
        state.barrier.timeout_ms = 200
        try:
            await state.redis.set("wf:test:job", "placed")
            with pytest.raises(NotReplicated, match="0 replica"):
                await state.barrier()
        finally:
            await state.aclose()

    asyncio.run(write())


def test_a_master_killed_under_jobs_loses_none_and_runs_none_twice(tmp_path):
    result = failover_under_jobs(tmp_path, billed=assert_billed_what_ran)
    assert result.new != result.old
    assert len(result.ids) == 18
    assert_ran_once_each(result.marks, result.ids, result.records)


def test_without_sentinels_the_client_is_the_one_server_and_has_no_barrier():
    state = StateConnection(CommonSettings(redis_url="redis://127.0.0.1:6399/3"), "wf:test")
    assert state.sentinel is None and state.barrier is None
    assert state.redis.connection_pool.connection_kwargs["db"] == 3
    asyncio.run(state.aclose())

