"""Fetching from a durable JetStream pull consumer, with one wait per fetch instead of one per message.

nats-py's `PullSubscription.fetch` waits for each message of a batch on its own (`next_msg`: a task, a
timer and a uuid per message), about 25 us of CPU per message on the 2-core machine, three times what
the rest of fetching and acking costs (bench/RESULTS.md, issue 17). `Puller` sends the same pull request
(`$JS.API.CONSUMER.MSG.NEXT.<stream>.<durable>`) from an inbox of its own whose callback collects the
messages, and wakes the fetch once: when the batch is complete or the server ends the request.

A request is `{"batch": n, "expires": timeout, "no_wait": true}`: the server holds it until a first
message is there (at most `timeout`), then delivers what it has, up to `n`, and ends it with a status
(404 no messages, 408 expired, 409 for a leadership change or a deleted consumer) unless all `n` came.
A message arriving after the fetch gave up waiting is kept for the next fetch, never dropped.
"""

from __future__ import annotations

import asyncio
import json

import nats
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.errors import APIError, ServiceUnavailableError

API_PREFIX = "$JS.API"
_STATUS = "Status"
_NO_RESPONDERS = "503"  # nobody serves the consumer's subject: it is gone (or JetStream is)
_HEARTBEAT = "100"
_GRACE_S = 0.5  # the fetch waits this much past the request's expiry for the server's 408


class Puller:
    """One durable pull consumer's fetches; `bind` first, `unsubscribe` at the end."""

    def __init__(self, nc: nats.NATS, stream: str, durable: str, api_prefix: str = API_PREFIX):
        self.nc = nc
        self.next_subject = f"{api_prefix}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._inbox = ""
        self._sub: Subscription | None = None
        self._got: list[Msg] = []
        self._want = 0
        self._done: asyncio.Future[str | None] | None = None  # the request in hand ended: its status

    async def bind(self) -> None:
        self._inbox = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(self._inbox, cb=self._received)

    async def unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            await sub.unsubscribe()

    async def _received(self, msg: Msg) -> None:
        headers = msg.headers
        status = headers.get(_STATUS) if headers and not msg.data else None
        if status == _HEARTBEAT:
            return
        if status is None:
            self._got.append(msg)
            if len(self._got) < self._want:
                return
        done = self._done
        if done is not None and not done.done():
            done.set_result(status)

    async def fetch(self, batch: int, timeout: float) -> list[Msg]:
        """Up to `batch` messages: those already received, else the next request's, once its first came (at
        most `timeout` s; [] when none did). ServiceUnavailableError: the consumer is not there."""
        if self._sub is None:
            raise nats.errors.BadSubscriptionError
        if not self._got:
            await self._request(batch, timeout)
        out, self._got = self._got[:batch], self._got[batch:]
        return out

    async def _request(self, batch: int, timeout: float) -> None:
        self._want = batch
        done = self._done = asyncio.get_running_loop().create_future()
        request = {"batch": batch, "expires": int(timeout * 1e9), "no_wait": True}
        await self.nc.publish(self.next_subject, json.dumps(request).encode(), reply=self._inbox)
        try:
            async with asyncio.timeout(timeout + _GRACE_S):  # not wait_for: it can swallow a stop (3.11)
                status = await done
        except TimeoutError:  # no answer at all (connection trouble): what came meanwhile is kept
            return
        finally:
            self._done = None
        if self._got or status is None or status.startswith("4"):
            return  # what came (none when the request expired or was ended by the server)
        if status == _NO_RESPONDERS:
            raise ServiceUnavailableError(code=503, description=f"no consumer at {self.next_subject}")
        raise APIError(code=int(status) if status.isdigit() else None, description=f"pull request ended {status}")
