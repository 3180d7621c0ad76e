"""Live views: NATS says something changed, each open view is rebuilt at most once a tick, for all its browsers.

A view is keyed by what it shows ("fleet", "alerts", "job:<id>"). However many browsers watch
it, one render per tick calls the services' APIs once and the same bytes go to every browser:
fifty open fleet pages cost the control plane what one does. A view nobody watches is not built.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field

import nats
import nats.errors
import structlog

from whaleflux.shared.bus import nats_servers

log = structlog.get_logger("whaleflux.console.live")

# SSE event name -> data; one render of a view yields several (e.g. the fleet's table and its heat map).
Frames = list[tuple[str, str]]
Render = Callable[[], Awaitable[Frames]]

# Event subject prefixes -> what changed.
TOPICS = {"gpu.telemetry.": "gpu", "node.": "node", "job.": "job", "alert.": "alert", "lease.": "lease"}
# Without any event (an alert acked through the CLI publishes none; the bus may be down), a watched view
# is rebuilt this often anyway.
FALLBACK_S = 10.0
KEEPALIVE_S = 15.0
QUEUE_FRAMES = 4
SLICE_S = 0.002  # the bus's messages are folded at most this long before the event loop gets a turn


@dataclass
class View:
    key: str
    topics: frozenset[str]
    render: Render
    queues: set[asyncio.Queue] = field(default_factory=set)
    dirty: bool = True
    built_at: float = 0.0
    # Each frame's data as last sent: a frame is sent again only when it changed, and a browser that joins gets
    # them all at once (so it never waits for a frame that does not change, such as the heat map's layout).
    last: dict[str, str] = field(default_factory=dict)


class LiveHub:
    def __init__(self, interval_s: float = 1.0):
        self.interval_s = interval_s
        self.views: dict[str, View] = {}
        self.renders = 0  # how many view builds ran: what the control plane paid (bench, tests)
        self.nc: nats.NATS | None = None
        # Subject prefix -> what else hears its messages' bytes (the fleet state folds gpu.telemetry).
        self.taps: dict[str, Callable[[bytes, str], None]] = {}  # (the message, its subject)
        self._slice_at = 0.0  # when the bus's callback last let the event loop run

    # ----------------------------------------------------------------- events in

    def mark(self, topic: str) -> None:
        """Something of `topic` changed: every view showing it is rebuilt at its next tick."""
        for view in self.views.values():
            if topic in view.topics:
                view.dirty = True

    async def connect(self, url: str, user: str | None, password: str | None) -> None:
        """Listen to the bus (plain subscriptions: the console only needs to hear that something happened)."""

        async def on_msg(msg) -> None:
            for prefix, tap in self.taps.items():
                if msg.subject.startswith(prefix):
                    tap(msg.data, msg.subject)
            for prefix, topic in TOPICS.items():
                if msg.subject.startswith(prefix):
                    self.mark(topic)
                    break
            # nats-py awaits this callback for each queued message in turn, and a callback that never suspends
            # lets the whole backlog be folded in one step of the event loop: at 1,000 nodes a page request
            # waited behind hundreds of folds (on a busy machine, most of its time to first byte).
            now = time.monotonic()
            if now - self._slice_at >= SLICE_S:
                await asyncio.sleep(0)  # let the loop run what waits (a request, a view's build), then go on
                self._slice_at = time.monotonic()

        delay = 0.5
        while True:
            try:
                self.nc = await nats.connect(nats_servers(url), user=user, password=password, connect_timeout=3,
                                             max_reconnect_attempts=-1, name="whaleflux-console")
                break
            except (TimeoutError, nats.errors.Error, OSError) as exc:
                log.warning("bus.waiting", error=repr(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        for subject in ("gpu.telemetry.>", "node.>", "job.>", "alert.>", "lease.>"):
            await self.nc.subscribe(subject, cb=on_msg)
        log.info("bus.listening")

    @property
    def connected(self) -> bool:
        return bool(self.nc and self.nc.is_connected)

    async def close(self) -> None:
        if self.nc is not None:
            with contextlib.suppress(nats.errors.Error):
                await self.nc.close()

    # ----------------------------------------------------------------- views out

    async def stream(self, key: str, topics: set[str], render: Render) -> AsyncGenerator[str, None]:
        """Server-sent events of one view for one browser, until it goes away."""
        view = self.views.get(key)
        if view is None:
            view = self.views[key] = View(key, frozenset(topics), render)
        queue: asyncio.Queue = asyncio.Queue(QUEUE_FRAMES)
        view.queues.add(queue)
        if view.last:  # what the others have: frames that did not change since are not sent again
            queue.put_nowait("".join(encode(name, data) for name, data in view.last.items()))
        try:
            yield ": connected\n\n"
            while True:
                try:
                    async with asyncio.timeout(KEEPALIVE_S):  # not wait_for: it can swallow a stop (3.11)
                        frames = await queue.get()
                except TimeoutError:
                    yield ": keep-alive\n\n"
                    continue
                yield frames
        finally:
            view.queues.discard(queue)
            if not view.queues:
                self.views.pop(key, None)

    async def run(self) -> None:
        """Every tick, rebuild each watched view that changed, once, and hand the result to all its browsers."""
        while True:
            started = time.monotonic()
            for view in list(self.views.values()):
                stale = started - view.built_at >= (FALLBACK_S if self.connected else 2 * self.interval_s)
                if view.queues and (view.dirty or stale):
                    await self._build(view)
            await asyncio.sleep(max(0.05, self.interval_s - (time.monotonic() - started)))

    async def _build(self, view: View) -> None:
        view.dirty = False
        view.built_at = time.monotonic()
        self.renders += 1
        try:
            frames = await view.render()
        except Exception as exc:  # noqa: BLE001 - a view that fails to build must not stop the others; logged
            log.error("view.failed", view=view.key, error=repr(exc))
            return
        changed = [(name, data) for name, data in frames if view.last.get(name) != data]
        if not changed:
            return
        view.last.update(changed)
        chunk = "".join(encode(name, data) for name, data in changed)
        for queue in list(view.queues):
            if queue.full():  # a slow browser gets the newest state, not a backlog
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
            queue.put_nowait(chunk)


def encode(event: str, data: str) -> str:
    """One server-sent event; every line of `data` gets its own `data:` field."""
    lines = data.splitlines() or [""]
    return f"event: {event}\n" + "".join(f"data: {line}\n" for line in lines) + "\n"
