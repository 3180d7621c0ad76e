"""A configuration document a service keeps in Redis: the last good one stays in force.

Inventory's declared assets and billing's price book work the same way: a YAML
text arrives from a file (re-read when its content changes) or an admin upload;
it is parsed and checked; a good one is stored and used, a bad one is recorded
with its `FILE:LINE: key: problem` errors while the previous one stays.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import structlog
from redis.asyncio import Redis

from .clock import Clock
from .yamlconfig import ConfigFileError

T = TypeVar("T")


class StoredConfig(Generic[T]):
    """One configuration document under `key` (a hash: text, source, applied_at, file_hash)."""

    def __init__(self, redis: Redis, key: str, parse: Callable[[str, str], T], clock: Clock,
                 log: structlog.typing.FilteringBoundLogger, name: str):
        self.redis = redis
        self.key = key  # hash: text, source, applied_at, file_hash
        self.error_key = f"{key}:error"  # JSON: source, at, errors, hash
        self.parse = parse
        self.clock = clock
        self.log = log
        self.name = name
        self._parsed: tuple[str, T] | None = None

    async def current(self) -> T | None:
        """The document in force, or None before a good one arrived."""
        text, source = (_text(v) for v in await self.redis.hmget(self.key, "text", "source"))
        if text is None:
            return None
        if self._parsed is None or self._parsed[0] != text:
            # Accepted once already; parse again only when another replica changed it.
            self._parsed = (text, self.parse(text, source or "stored"))
        return self._parsed[1]

    async def apply(self, text: str, source: str, file_hash: str | None = None) -> T:
        """Check and store a new document; on ConfigFileError the previous one stays in force."""
        try:
            parsed = self.parse(text, source)
        except ConfigFileError as exc:
            await self.redis.set(self.error_key, json.dumps(
                {"source": source, "at": self.clock().isoformat(), "errors": exc.errors, "hash": file_hash}))
            self.log.warning(f"{self.name}.rejected", source=source, errors=exc.errors)
            raise
        applied_at = self.clock().isoformat()
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.key, mapping={"text": text, "source": source, "applied_at": applied_at,
                                         "file_hash": file_hash or ""})
            pipe.delete(self.error_key)
            await pipe.execute()
        self._parsed = (text, parsed)
        self.log.info(f"{self.name}.applied", source=source)
        return parsed

    async def reload_file(self, path: str | None) -> bool:
        """Apply the file if its content changed since last applied or rejected; True if applied."""
        if not path:
            return False
        try:
            text = await asyncio.to_thread(Path(path).read_text, encoding="utf-8")
        except OSError as exc:
            self.log.warning(f"{self.name}.unreadable", path=path, error=exc.strerror or repr(exc))
            return False
        digest = hashlib.sha256(text.encode()).hexdigest()
        if await self.redis.hget(self.key, "file_hash") == digest:
            return False
        last = await self.redis.get(self.error_key)
        if last and json.loads(last).get("hash") == digest:
            return False  # the same bad file again: already reported
        try:
            await self.apply(text, path, digest)
        except ConfigFileError:
            return False
        return True

    async def rejection(self) -> dict[str, Any] | None:
        """The last rejected document's source, time and errors, if the latest attempt failed."""
        raw = await self.redis.get(self.error_key)
        return dict(json.loads(raw)) if raw else None


def _text(value: object) -> str | None:
    """A Redis reply as text (clients here decode replies; this also reads raw bytes)."""
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)
