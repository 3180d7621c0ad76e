"""The one place a WhaleFlux process opens its Redis: one server (`REDIS_URL`), or the master that Redis
Sentinel names (`WHALEFLUX_REDIS_SENTINELS`, `WHALEFLUX_REDIS_MASTER`).

Behind Sentinel the client asks the sentinels for the master and asks again whenever the connection fails
or the server answers as a replica (redis-py's `SentinelConnectionPool`), so a service follows a failover
on its own; with `WHALEFLUX_REDIS_MIN_REPLICAS` > 0 it also gets a `ReplicaBarrier` (see replication_store).
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel

from .replication_store import ReplicaBarrier
from .settings import CommonSettings

HEALTH_CHECK_S = 10
# A sentinel or a master that does not answer in this long is treated as gone (the next one is asked).
SOCKET_TIMEOUT_S = 5.0


class StateConnection:
    """A process's Redis client, and what it takes to close it."""

    def __init__(self, settings: CommonSettings, prefix: str) -> None:
        password = settings.secret("redis_password")
        self.sentinel: Sentinel | None = None
        self.barrier: ReplicaBarrier | None = None
        if not settings.redis_sentinels:
            self.redis: Redis = Redis.from_url(settings.redis_url, password=password, decode_responses=True,
                                               health_check_interval=HEALTH_CHECK_S)
            return
        # The database number (and user) still come from REDIS_URL; its host is Sentinel's to say.
        url = urlsplit(settings.redis_url)
        # redis-py leaves Sentinel.__init__ unannotated.
        self.sentinel = Sentinel(  # type: ignore[no-untyped-call]
            settings.sentinel_addresses(),
            # Sentinels take the same password as the servers (deploy/: one `redis_password` secret).
            sentinel_kwargs={"password": password, "socket_timeout": SOCKET_TIMEOUT_S},
            socket_timeout=SOCKET_TIMEOUT_S,
        )
        username = unquote(url.username) if url.username else None
        self.redis = self.sentinel.master_for(
            settings.redis_master, redis_class=Redis, password=password, username=username,
            db=int(url.path.strip("/") or 0), decode_responses=True, health_check_interval=HEALTH_CHECK_S)
        if settings.redis_min_replicas > 0:
            self.barrier = ReplicaBarrier(self.redis, prefix, settings.redis_min_replicas)

    async def aclose(self) -> None:
        await self.redis.aclose()
        if self.sentinel is not None:
            await self.sentinel.aclose()
