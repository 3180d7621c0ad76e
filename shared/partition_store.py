"""The replicas of a scaled-out service and the leases on its units, in Redis (see `partitions.py`).

Times are Redis' own (`TIME`), so replicas on different hosts, or tests on a clock that stands still, agree on
what expired. Keys, under the service's prefix:
- `<prefix>:members`: sorted set, replica instance -> when its membership expires (ms);
- `<prefix>:unit:<unit>`: the instance that holds the unit, with a TTL (the lease).
"""

from __future__ import annotations

from redis.asyncio import Redis

# Renew this member, forget the expired ones, return the live ones.
_HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 10)
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""

# Take the unit if free, or renew it if it is ours; return who holds it now.
_CLAIM = """
local holder = redis.call('GET', KEYS[1])
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return ARGV[1]
end
if holder == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return holder
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_LEAVE = """
redis.call('ZREM', KEYS[1], ARGV[1])
for i = 2, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('DEL', KEYS[i]) end
end
return 1
"""


class PartitionStore:
    """Membership and unit leases of one service's replicas."""

    def __init__(self, redis: Redis, prefix: str) -> None:
        self.redis = redis
        self.members_key = f"{prefix}:members"
        self.prefix = prefix

    def unit_key(self, unit: str) -> str:
        return f"{self.prefix}:unit:{unit}"

    async def heartbeat(self, instance: str, ttl_ms: int) -> list[str]:
        """Say `instance` is alive for `ttl_ms`; the members alive now (itself included)."""
        got = await self.redis.eval(_HEARTBEAT, 1, self.members_key, instance, ttl_ms)
        return [m.decode() if isinstance(m, bytes) else str(m) for m in got]

    async def claim(self, unit: str, instance: str, ttl_ms: int) -> str:
        """Take or renew the lease on `unit` for `instance`; whoever holds it afterwards."""
        got = await self.redis.eval(_CLAIM, 1, self.unit_key(unit), instance, ttl_ms)
        return got.decode() if isinstance(got, bytes) else str(got)

    async def release(self, unit: str, instance: str) -> None:
        await self.redis.eval(_RELEASE, 1, self.unit_key(unit), instance)

    async def holders(self, units: list[str]) -> dict[str, str | None]:
        """unit -> its holder now (None: free)."""
        values = await self.redis.mget([self.unit_key(unit) for unit in units])
        return {unit: (v.decode() if isinstance(v, bytes) else v) for unit, v in zip(units, values, strict=True)}

    async def leave(self, instance: str, units: list[str]) -> None:
        """A replica stopping: out of the members, and every lease it holds given up at once."""
        await self.redis.eval(_LEAVE, 1 + len(units), self.members_key, *[self.unit_key(u) for u in units], instance)
