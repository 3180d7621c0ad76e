"""The leader lease's keys in Redis, and the scripts that take, renew and give it up (see `leadership.py`)."""

from __future__ import annotations

from redis.asyncio import Redis

# Take the lease if free: bump the token and store "holder token" with a TTL. A holder whose lease lapsed
# while nobody took it (the counter still at its token, ARGV[3]) takes it back with that token: nobody else
# can have written since, and its cache and transactions in flight stay good.
_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) == ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. ARGV[3], 'PX', ARGV[2])
  return tonumber(ARGV[3])
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. token, 'PX', ARGV[2])
return token
"""

# Extend the lease only while it is still ours (same holder and token).
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class LeaseStore:
    """The lease key (`holder token`, with a TTL) and the fencing-token counter, which never goes back."""

    def __init__(self, redis: Redis, prefix: str):
        self.redis = redis
        self.prefix = prefix
        self.lease_key = f"{prefix}:leader"
        self.token_key = f"{prefix}:leader-token"

    async def take(self, holder: str, lease_ms: int, held: int | None = None) -> int:
        """The next fencing token if the lease was free and is now `holder`'s, else 0; `held`, the token the
        holder had, if no one has taken one since."""
        return int(await self.redis.eval(_ACQUIRE, 2, self.lease_key, self.token_key, holder, lease_ms,
                                         "" if held is None else str(held)))

    async def extend(self, value: str, lease_ms: int) -> bool:
        """Extend the lease while it still holds `value` (same holder and token)."""
        return bool(await self.redis.eval(_RENEW, 1, self.lease_key, value, lease_ms))

    async def holder(self) -> tuple[str | None, int | None]:
        """(holder, token) of whoever holds the lease now, or (None, None)."""
        raw = await self.redis.get(self.lease_key)
        if not raw:
            return None, None
        text = raw.decode() if isinstance(raw, bytes) else raw
        holder, _, token = text.rpartition(" ")
        return holder, int(token)

    async def give_up(self, value: str) -> None:
        """Delete the lease if it still holds `value`."""
        await self.redis.eval(_RELEASE, 1, self.lease_key, value)
