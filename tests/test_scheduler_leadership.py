"""Active/standby schedulers: the Redis lease, fencing of a paused ex-leader, and kill -9 of the leader."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections import Counter

import httpx
import pytest
from redis.asyncio import Redis

from whaleflux.scheduler.leadership import Leadership, NotLeader
from whaleflux.scheduler.store import SchedulerStore
from whaleflux.servers import free_port
from whaleflux.shared.events import JobPlaced, JobStarted
from whaleflux.shared.outbox import Outbox
from whaleflux.shared.redis_client import StateConnection
from whaleflux.shared.runtime import StateUnavailable
from whaleflux.shared.settings import CommonSettings

from .processes import Proc, make_cluster, wait_until
from .test_crash_recovery import _job_history, _submit

PREFIX = "wf:scheduler"


def _redis(servers) -> Redis:
    return Redis.from_url(servers.redis_url, password=servers.redis_password, decode_responses=True)


async def test_one_holder_at_a_time_and_each_takeover_gets_a_higher_token(clean_servers):
    redis = _redis(clean_servers)
    a, b = Leadership(redis, PREFIX, "a", 0.5), Leadership(redis, PREFIX, "b", 0.5)
    try:
        assert await a.try_acquire() and a.token == 1
        assert not await b.try_acquire() and not b.is_leader
        assert await a.renew()
        assert (await b.current()) == (a.holder, 1)
        await asyncio.sleep(0.7)  # a neither renews nor releases: its lease lapses
        assert await b.try_acquire() and b.token == 2
        assert not await a.renew(), "the old holder cannot extend a lease that is no longer its own"
        await b.release()
        assert await a.try_acquire() and a.token == 3, "a released lease is free at once, with a fresh token"
    finally:
        await redis.aclose()


async def test_the_lease_is_kept_while_the_event_loop_is_busy_and_lost_to_a_takeover(clean_servers):
    """Renewal runs on a thread of its own: a pass that holds the event loop for several leases does not let a
    standby take over; a takeover is still noticed (`on_lost`, once)."""
    settings = CommonSettings(redis_url=clean_servers.redis_url, redis_password=clean_servers.redis_password)
    redis = _redis(clean_servers)
    a = Leadership(redis, PREFIX, "a", 0.3)
    lost = asyncio.Event()

    async def on_lost() -> None:
        assert not lost.is_set()
        lost.set()

    standby_took: list[int] = []

    def standby(until: float) -> None:  # another replica, trying to take the lease all the while
        async def poll() -> None:
            other = _redis(clean_servers)
            b = Leadership(other, PREFIX, "b", 0.3)
            try:
                while time.monotonic() < until and not standby_took:
                    if await b.try_acquire():
                        standby_took.append(b.token or 0)
                    await asyncio.sleep(0.02)
            finally:
                await other.aclose()
        asyncio.run(poll())

    try:
        assert await a.try_acquire()
        keeper = asyncio.create_task(a.keep(on_lost, lambda: StateConnection(settings, PREFIX)))
        await asyncio.sleep(0)  # the keeper starts its thread
        until = time.monotonic() + 2.0  # about 7 leases
        rival = threading.Thread(target=standby, args=(until,))
        rival.start()
        while time.monotonic() < until:  # a long pass: CPU work on the event loop, no await
            sum(range(10_000))
        rival.join()
        assert standby_took == [], "the lease lapsed while the event loop was busy"
        assert (await a.current()) == (a.holder, 1)

        await redis.delete(a.lease_key)  # another replica takes over
        b = Leadership(redis, PREFIX, "b", 30)
        assert await b.try_acquire() and b.token == 2
        await asyncio.wait_for(lost.wait(), 10)
        await asyncio.wait_for(keeper, 10)
        assert not a.is_leader
    finally:
        await redis.aclose()


async def test_a_lease_that_lapsed_while_nobody_took_it_is_taken_back_with_its_token(clean_servers):
    redis = _redis(clean_servers)
    a, b = Leadership(redis, PREFIX, "a", 0.3), Leadership(redis, PREFIX, "b", 0.3)
    store = SchedulerStore(redis, PREFIX, Outbox(redis, PREFIX), "test", a, lambda: "epoch-1")
    await redis.set(store.epoch_key, "epoch-1")
    try:
        assert await a.try_acquire() and a.token == 1
        await asyncio.sleep(0.4)  # a stalled past its lease; nobody took it
        assert not await a.renew()
        assert await a.try_acquire() and a.token == 1, "no one else held a token: the same one, the cache kept"
        async with store.transaction() as pipe:
            pipe.hset(store.alloc_key, "GPU-1", "job-a")
            await pipe.execute()
        await asyncio.sleep(0.4)
        assert await b.try_acquire() and b.token == 2
        await b.release()
        assert await a.try_acquire() and a.token == 3, "another held one meanwhile: a new token"
    finally:
        await redis.aclose()


async def test_a_paused_ex_leader_cannot_commit_after_a_takeover(clean_servers):
    redis = _redis(clean_servers)
    old, new = Leadership(redis, PREFIX, "old", 5), Leadership(redis, PREFIX, "new", 5)
    store = SchedulerStore(redis, PREFIX, Outbox(redis, PREFIX), "test", old, lambda: "epoch-1")
    await redis.set(store.epoch_key, "epoch-1")
    try:
        with pytest.raises(NotLeader):
            async with store.transaction():
                pass  # a standby never writes
        await old.acquire(poll_s=0.1)
        async with store.transaction() as pipe:
            pipe.hset(store.alloc_key, "GPU-1", "job-a")
            await pipe.execute()

        # The leader stalls between reading state and EXEC; meanwhile its lease is taken over.
        with pytest.raises(NotLeader):
            async with store.transaction() as pipe:
                pipe.hset(store.alloc_key, "GPU-1", "job-b")
                await redis.delete(old.lease_key)
                assert await new.try_acquire()
                await pipe.execute()
        # And any later attempt is refused before it starts.
        with pytest.raises(NotLeader):
            async with store.transaction():
                pass
        assert await redis.hgetall(store.alloc_key) == {"GPU-1": "job-a"}
    finally:
        await redis.aclose()


async def test_no_write_lands_on_a_store_that_was_wiped_or_replaced(clean_servers):
    redis = _redis(clean_servers)
    leader = Leadership(redis, PREFIX, "one", 5)
    store = SchedulerStore(redis, PREFIX, Outbox(redis, PREFIX), "test", leader, lambda: "epoch-1")
    try:
        await redis.set(store.epoch_key, "epoch-1")
        await leader.acquire(poll_s=0.1)
        await redis.flushdb()
        await leader.try_acquire()  # the lease is taken again on the empty store: leadership alone would not notice
        with pytest.raises(StateUnavailable):
            async with store.transaction() as pipe:
                pipe.hset(store.alloc_key, "GPU-1", "job-a")
                await pipe.execute()
        await redis.set(store.epoch_key, "epoch-2")  # rebuilt by someone else: still not the state we decided on
        with pytest.raises(StateUnavailable):
            async with store.transaction():
                pass
        assert await redis.hgetall(store.alloc_key) == {}
    finally:
        await redis.aclose()


def _role(proc: Proc) -> str | None:
    try:
        return httpx.get(proc.url + "/v1/leader", timeout=1).json()["role"]
    except httpx.HTTPError:
        return None


def test_kill_9_of_the_leader_hands_over_to_the_standby_and_no_job_is_placed_twice(clean_servers, tmp_path):
    cluster = make_cluster(clean_servers, tmp_path)
    env = {**cluster.base_env, "WHALEFLUX_LEADER_LEASE_S": "2"}
    replicas = []
    ids = [f"ha-{i:03d}" for i in range(40)]
    try:
        for name in ("scheduler-a", "scheduler-b"):
            port = free_port()
            argv = [sys.executable, "-m", "whaleflux", "service", "scheduler"]
            proc = Proc(name, argv, {**env, "WHALEFLUX_HTTP_PORT": str(port)}, cluster.log_dir / f"{name}.log", port)
            cluster.procs[name] = proc.start()
            replicas.append(proc)
            proc.wait_ready()  # a starts (and leads) first; b is ready as a standby
        first, second = replicas
        cluster.agent("a100-01", "h100-01")
        assert wait_until(lambda: _role(first) == "leader" and _role(second) == "standby", what="roles")
        wait_until(lambda: len(httpx.get(second.url + "/v1/nodes").json()) == 2, what="nodes (read on the standby)")
        readyz = httpx.get(second.url + "/readyz").json()
        assert readyz["ready"] and not any(k.startswith("consumer:") for k in readyz["checks"])

        # The leader is killed after the 10th submission; the others arrive while the standby takes over.
        tenth, killed = threading.Event(), threading.Event()
        submitter = threading.Thread(target=lambda: asyncio.run(
            _submit(clean_servers, ids, milestones={10: tenth}, resume={10: killed})))
        submitter.start()
        assert tenth.wait(60)
        first.kill9()
        killed.set()
        wait_until(lambda: _role(second) == "leader", timeout=60, interval=0.1, what="standby takes over")
        submitter.join()
        assert "leader.elected" in second.log_path.read_text()

        def all_done():
            jobs = httpx.get(second.url + "/v1/jobs", params={"limit": 1000}).json()
            return len(jobs) == len(ids) and all(j["state"] == "succeeded" for j in jobs) and jobs
        wait_until(all_done, timeout=120, what="all jobs succeeded")

        history = asyncio.run(_job_history(clean_servers))
        placed = Counter(e.job_id for e in history if isinstance(e, JobPlaced))
        started = Counter(e.job_id for e in history if isinstance(e, JobStarted))
        assert placed == Counter({i: 1 for i in ids}), "each job placed exactly once"
        assert started == Counter({i: 1 for i in ids}), "each job ran exactly once"
    finally:
        cluster.stop()
