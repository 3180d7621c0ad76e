"""Helpers for tests of services scaled out (WHALEFLUX_SCALE_OUT): who holds which unit, and which replica is whom."""

from __future__ import annotations

import asyncio

import httpx

from whaleflux.shared.partition_store import PartitionStore
from whaleflux.shared.partitions import units

from .processes import wait_until

# Two replicas of a service sharing the partitions, leases short enough that a handover takes seconds.
SCALED = {"WHALEFLUX_SCALE_OUT": "true", "WHALEFLUX_PARTITION_LEASE_S": "3"}


def instance(proc) -> str:
    """The replica's instance name, as it holds its leases under."""
    checks = httpx.get(proc.url + "/admin/status", timeout=5,
                       headers={"Authorization": f"Bearer {proc.env['WHALEFLUX_ADMIN_TOKEN']}"}).json()
    return str(checks["settings"]["instance"])


async def holders(servers, service: str) -> dict[str, str | None]:
    """unit -> the instance holding its lease (None: nobody)."""
    from redis.asyncio import Redis

    redis = Redis.from_url(servers.redis_url, password=servers.redis_password, decode_responses=True)
    try:
        return await PartitionStore(redis, f"wf:{service}").holders(units())
    finally:
        await redis.aclose()


def both_holding(servers, service: str) -> dict[str, str | None]:
    """Until two replicas hold units; the holders then."""
    def shared() -> dict[str, str | None] | None:
        held = asyncio.run(holders(servers, service))
        return held if len(set(held.values()) - {None}) == 2 and None not in held.values() else None
    return wait_until(shared, timeout=60, what=f"both {service} replicas holding units")


def wait_survivor_holds_all(servers, service: str, survivor) -> None:
    name = instance(survivor)
    wait_until(lambda: set(asyncio.run(holders(servers, service)).values()) == {name}, timeout=60,
               what=f"the surviving {service} replica holding every unit")
