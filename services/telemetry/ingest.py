"""Registrations and telemetry batches in, the store's one-call writes out; the sweep of silent nodes.

The decisions are admission.py's (store, retry or refuse a batch) and
history.py's (which minutes to roll); this module keeps the per-process caches
in front of the store (a node's registered GPUs, its last stored batch, the
GPUs gone from their node's batches) and the ingest metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram

from whaleflux.shared.bus import Reject, Retry, batch_handler
from whaleflux.shared.events import Envelope, EventData, GpuTelemetry, NodeRegistered

from .admission import Last, Refused, Verdict, admit, gone_and_back
from .history import minutes_to_roll, roll_offset
from .settings import TelemetrySettings
from .store import TelemetryStore
from .store_script import BatchWrite

SILENT_S = 10.0  # a node with no batch stored for this long has its minutes rolled by the sweep
TRIM_EVERY_S = 600.0  # how often the sweep trims a silent node's history (ingest trims the others)
SWEEP_CHUNK = 200  # GPUs per store script call in the sweep


class IngestMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.stored = Counter("whaleflux_telemetry_gpu_samples_stored", "GPU samples stored", registry=registry)
        self.flagged = Counter(
            "whaleflux_telemetry_batches_flagged",
            "Telemetry batches flagged: duplicate_seq and out_of_order are dead-lettered, seq_reset is stored",
            ["reason"],
            registry=registry,
        )
        self.lag = Histogram(
            "whaleflux_telemetry_store_lag_seconds",
            "From a batch's sample time to its samples stored in Redis",
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
        )


class Ingest:
    """The `telemetry-nodes` and `telemetry-gpu` handlers and the history sweep."""

    def __init__(self, store: TelemetryStore, settings: TelemetrySettings, clock: Callable[[], datetime],
                 metrics: IngestMetrics, log: structlog.typing.FilteringBoundLogger) -> None:
        self.store = store
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self.log = log
        self._known: dict[str, set[str]] = {}  # "cluster/node" -> registered GPU uuids (cache of the store)
        self._last: dict[str, Last] = {}  # "cluster/node" -> last stored batch (cache of the store)
        self._offsets: dict[str, float] = {}  # "cluster/node" -> its roll offset (history.roll_offset)
        self._swept: dict[str, tuple[float, float]] = {}  # silent "cluster/node" -> (last minute rolled, last trim)
        self._gone: set[str] = set()  # GPUs missing from their node's batches (cache of the store)

    async def load(self) -> None:
        """Read what the caches start from (on start-up and after a rebuild)."""
        self._known.clear()
        self._last.clear()
        self._gone = await self.store.gone_gpus()

    # ------------------------------------------------------------------ registrations

    async def on_registered(self, env: Envelope, data: EventData) -> None:
        if not isinstance(data, NodeRegistered):
            return  # the consumer's subjects carry only registrations
        await self.store.register(data)
        self._known[f"{data.cluster}/{data.node}"] = {g.uuid for g in data.gpus}

    async def _registered(self, node_key: str) -> set[str]:
        cached = self._known.get(node_key)
        if cached is None:
            cluster, node = node_key.split("/", 1)
            cached = await self.store.registered_gpus(cluster, node)
            if cached:
                self._known[node_key] = cached
        return cached

    # ------------------------------------------------------------------ batches

    @batch_handler
    async def on_telemetry_batch(self, events: list[tuple[Envelope, EventData]]) -> list[Exception | None]:
        """Judge each node batch in order, then store all admitted ones in one store call."""
        outcomes: list[Exception | None] = [None] * len(events)
        accepted: dict[str, Last] = {}  # node -> last batch admitted so far in this call
        previous: dict[str, GpuTelemetry] = {}  # node -> its batch admitted last in this call
        write = self._write()
        now = self.clock()
        times = []
        for i, (env, data) in enumerate(events):
            if not isinstance(data, GpuTelemetry):  # the consumer's subjects carry only these
                outcomes[i] = Reject(f"{env.type}: not a telemetry batch")
                continue
            node_key = f"{data.cluster}/{data.node}"
            t = data.sample_time.timestamp()
            last = accepted.get(node_key) or self._last.get(node_key) or await self.store.last_batch(node_key)
            known = await self._registered(node_key)
            verdict = admit(data, known, last, now, self.settings.max_clock_skew_s)
            if isinstance(verdict, Refused):
                outcomes[i] = self._refusal(verdict)
                continue
            if verdict is Verdict.RESTART:
                self.metrics.flagged.labels(verdict.value).inc()
                self.log.info("telemetry.seq_reset", node=node_key, seq=data.seq, last_seq=last.seq if last else None)
            accepted[node_key] = Last(data.seq, t)
            write.add(data, node_key, t, env.wire())
            if len(data.gpus) != len(known) or self._gone:
                await self._track_gone(write, data, node_key, known, previous.get(node_key))
            previous[node_key] = data
            minutes = minutes_to_roll(last.t if last else None, t, self._offset(node_key))
            if minutes:  # every registered GPU of the node, also one that stopped reporting
                write.roll(sorted(known), minutes)
            times.append(t)
        if not accepted:
            return outcomes
        await self.store.write(write)
        self._last.update(accepted)
        self.metrics.stored.inc(write.samples)
        stored_at = self.clock().timestamp()
        for t in times:
            self.metrics.lag.observe(max(stored_at - t, 0.0))
        return outcomes

    def _refusal(self, refused: Refused) -> Exception:
        if refused.flagged is not None:
            self.metrics.flagged.labels(refused.flagged.value).inc()
        if refused.retry_s is not None:
            return Retry(refused.reason, delay_s=refused.retry_s)
        return Reject(refused.reason)

    async def _track_gone(self, write: BatchWrite, data: GpuTelemetry, node_key: str, known: set[str],
                          previous: GpuTelemetry | None) -> None:
        """Keep the last sample of GPUs that vanished from the node's batches; forget it when they return."""
        went, back = gone_and_back({g.uuid for g in data.gpus}, known, self._gone)
        if went:
            previous = previous or await self.store.stored_batch(node_key)
            if previous is not None:
                write.went(previous, went)
            self._gone |= went
        if back:
            write.returned(back)
            self._gone -= back

    # ------------------------------------------------------------------ history upkeep

    def _offset(self, node_key: str) -> float:
        offset = self._offsets.get(node_key)
        if offset is None:
            offset = self._offsets[node_key] = roll_offset(node_key, self.settings.rollup_grace_s)
        return offset

    def _write(self) -> BatchWrite:
        s = self.settings
        return self.store.batch_write(self.clock().timestamp(), s.raw_retention_s, s.rollup_retention_s)

    async def roll_and_trim(self) -> None:
        """The minutes a silent node's last batches left unrolled, and its history trimmed every TRIM_EVERY_S."""
        now = self.clock().timestamp()
        write, gpus = self._write(), 0
        for node_key, last in sorted((await self.store.last_batches()).items()):
            if now - last.t < SILENT_S:
                continue
            rolled, trimmed = self._swept.get(node_key, (float("-inf"), float("-inf")))
            minutes = [m for m in minutes_to_roll(last.t, now, self._offset(node_key)) if m > rolled]
            if not minutes and now - trimmed < TRIM_EVERY_S:
                continue
            uuids = sorted(await self._registered(node_key))
            if minutes:
                write.roll(uuids, minutes)
            else:
                write.trim(uuids)
            self._swept[node_key] = (minutes[-1] if minutes else rolled, now)
            gpus += len(uuids)
            if gpus >= SWEEP_CHUNK:
                await self.store.write(write)
                write, gpus = self._write(), 0
        if gpus:
            await self.store.write(write)
