"""JetStream streams and durable consumers, declared in one place.

Services ask for their consumers by name; nobody creates streams or consumers
ad hoc. `Bus.ensure_streams()` applies these declarations idempotently.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    SubjectTransform,
)

from . import subjects as s
from .partitions import PARTITIONS

DAY = 86400.0


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: list[str]
    max_age_s: float
    max_bytes: int = -1
    # nats-server 2.15 caps a stream at 1,000 consumers unless it sets its own limit (-1 no longer means none).
    max_consumers: int = 1000
    # Partitioned by node: what is published on this subject (`*` the node's tokens) is stored with its
    # partition appended as one more token (`partitions.py`), for one durable consumer per partition.
    partition_by: str | None = None

    def transform(self) -> SubjectTransform | None:
        if self.partition_by is None:
            return None
        tokens = self.partition_by.split(".")
        wild = [i for i, tok in enumerate(tokens) if tok == "*"]
        dest = [f"{{{{wildcard({wild.index(i) + 1})}}}}" if i in wild else tok for i, tok in enumerate(tokens)]
        indexes = ",".join(str(n + 1) for n in range(len(wild)))
        return SubjectTransform(src=self.partition_by,
                                dest=".".join([*dest, f"{{{{partition({PARTITIONS},{indexes})}}}}"]))

    def partition_filter(self, k: int) -> str:
        """The stored subjects of partition `k`."""
        if self.partition_by is None:
            raise ValueError(f"stream {self.name} is not partitioned")
        return f"{self.partition_by}.{k}"

    def published(self, stored: str) -> str:
        """The subject an event was published on, from the one it is stored under (the partition dropped)."""
        if self.partition_by is not None and len(stored.split(".")) == len(self.partition_by.split(".")) + 1:
            return stored.rpartition(".")[0]
        return stored

    def config(self, replicas: int = 1) -> StreamConfig:
        """The stream's config with `replicas` copies (R1 on one server, R3 in a three-server cluster)."""
        return StreamConfig(
            name=self.name,
            num_replicas=replicas,
            subjects=self.subjects,
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=self.max_age_s,
            max_bytes=self.max_bytes,
            max_consumers=self.max_consumers,
            # Publishers set Nats-Msg-Id to the event id: a re-publish within the
            # window (an outbox flush after a crash) is stored once.
            duplicate_window=120.0,
            subject_transform=self.transform(),
        )


STREAMS: dict[str, StreamSpec] = {
    spec.name: spec
    for spec in (
        # Stored as gpu.telemetry.<cluster>.<node>.<partition>: scaled-out services split it by partition.
        StreamSpec("WHALEFLUX_TELEMETRY", [f"{s.GPU_TELEMETRY}.>"], max_age_s=3600, max_bytes=2 * 1024**3,
                   partition_by=f"{s.GPU_TELEMETRY}.*.*"),
        StreamSpec("WHALEFLUX_NODES", ["node.>"], max_age_s=7 * DAY),
        # Burn-in reports (gpu.validated) and cordons (gpu.cordoned / gpu.uncordoned: the scheduler's GPU
        # quarantine, which its rebuild folds): how each GPU was last judged, kept like the jobs.
        StreamSpec("WHALEFLUX_VALIDATIONS", [f"{s.GPU_VALIDATED}.>", f"{s.GPU_CORDONED}.>", f"{s.GPU_UNCORDONED}.>"],
                   max_age_s=400 * DAY),
        # Jobs, leases and alerts are the history services rebuild from: keep them long.
        # Every node agent has its own durable consumer of its placements here, besides the services'.
        StreamSpec("WHALEFLUX_JOBS", ["job.>"], max_age_s=400 * DAY, max_consumers=100_000),
        StreamSpec("WHALEFLUX_LEASES", ["lease.>"], max_age_s=400 * DAY),
        StreamSpec("WHALEFLUX_ALERTS", ["alert.>"], max_age_s=90 * DAY),
        StreamSpec("WHALEFLUX_DEADLETTER", [f"{s.DEADLETTER_PREFIX}.>"], max_age_s=30 * DAY),
    )
}

# A partition's events fetched by a replica that died are delivered again after this long (a handover waits it).
PARTITION_ACK_WAIT_S = 5.0
# Redeliveries wait longer each time; after len(backoff) + 1 tries an event is dead-lettered.
BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class ConsumerSpec:
    durable: str
    stream: str
    filter_subjects: list[str]
    # Live-only feeds (telemetry) start at new messages; histories start at the beginning.
    deliver_new: bool = False
    max_ack_pending: int = 1000
    batch: int = 64
    backoff_s: tuple[float, ...] = BACKOFF_S
    # Redelivery after a consumer died mid-event. Not the server-side `backoff`
    # list: with one set, JetStream uses its first value as the ack wait.
    ack_wait_s: float = 10.0
    # Batch mode: after a fetch that came back less than a quarter full, wait this long
    # before the next, so that a steady feed is handled in fewer, larger batches (each
    # costs a pull request, a Redis call and socket writes) at this much added latency.
    linger_s: float = 0.0
    # Skip the per-event dedup lookup where the handler is idempotent by nature
    # (storing the latest telemetry sample twice changes nothing).
    dedup: bool = True
    # A service run as several replicas (WHALEFLUX_SCALE_OUT) runs this consumer as one durable per partition
    # of its (partitioned) stream, `<durable>-p<k>`, each run by the replica that holds partition k's lease.
    partitioned: bool = False
    # A partition's consumer taken over from a replica that died holding events unacked: wait for their
    # redelivery (ack_wait) before fetching, so they are handled before the newer ones, in order.
    takeover: bool = False
    # False for a node's consumer: its NATS identity may create it, and update it in place with its own filter,
    # but never delete it (shared/permissions.py), so a change the server will not make in place is an operator's.
    replaceable: bool = True

    def partition(self, k: int) -> ConsumerSpec:
        """Partition `k`'s durable consumer. It fetches an eighth of the whole feed's batch: a replica holding
        every partition then has as many events fetched and not yet acked as one consumer of the whole feed
        (two fetches each), so under a backlog none waits in the process past the shorter ack_wait and comes
        again (bench/telemetry_replicas.py saw half of all batches redelivered with whole batches)."""
        if not self.partitioned:
            raise ValueError(f"consumer {self.durable} is not partitioned")
        return replace(self, durable=f"{self.durable}-p{k}", filter_subjects=[STREAMS[self.stream].partition_filter(k)],
                       partitioned=False, takeover=True, ack_wait_s=PARTITION_ACK_WAIT_S,
                       batch=max(1, self.batch // PARTITIONS))

    def partitions(self) -> list[ConsumerSpec]:
        """Every durable consumer this declaration stands for: itself, and one per partition if partitioned."""
        return [self, *(self.partition(k) for k in range(PARTITIONS))] if self.partitioned else [self]

    @property
    def max_deliver(self) -> int:
        return len(self.backoff_s) + 1

    def delay_before(self, delivery: int) -> float:
        """How long to wait before redelivering after failed delivery number `delivery` (1-based)."""
        return self.backoff_s[min(delivery - 1, len(self.backoff_s) - 1)]

    def config(self) -> ConsumerConfig:
        filters = self.filter_subjects
        return ConsumerConfig(
            # Named, nats-py creates it on `CONSUMER.CREATE.<stream>.<name>[.<filter>]`, not the legacy
            # `CONSUMER.DURABLE.CREATE`; a single filter goes into that subject, which permissions can pin.
            name=self.durable,
            durable_name=self.durable,
            deliver_policy=DeliverPolicy.NEW if self.deliver_new else DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait_s,
            max_deliver=self.max_deliver,
            max_ack_pending=self.max_ack_pending,
            filter_subject=filters[0] if len(filters) == 1 else None,
            filter_subjects=filters if len(filters) > 1 else None,
        )


# The nodes' reports about attempts (job.started / finished / failed): on `<subject>.<cluster>.<node>`, so each
# agent's identity may send only its own nodes' (shared/permissions.py); and bare, as history from before they
# carried the node holds them, so a consumer that reads the history folds those too. No identity may publish a
# bare one now.
def reports(*bases: str) -> tuple[str, ...]:
    """Filters for these reports (default all three) as sent now and as older history holds them."""
    return tuple(x for base in bases or (s.JOB_STARTED, s.JOB_FINISHED, s.JOB_FAILED) for x in (f"{base}.>", base))


def submissions() -> tuple[str, ...]:
    """Filters for submissions as sent now (`job.submitted.<team>`, so a submitter's identity may submit only for
    its teams) and as older history holds them (bare `job.submitted`, which no identity may publish now)."""
    return (f"{s.JOB_SUBMITTED}.>", s.JOB_SUBMITTED)


def _c(durable: str, stream: str, *filters: str, **kw: Any) -> ConsumerSpec:
    return ConsumerSpec(durable=durable, stream=stream, filter_subjects=list(filters), **kw)


CONSUMERS: dict[str, ConsumerSpec] = {
    spec.durable: spec
    for spec in (
        _c("telemetry-gpu", "WHALEFLUX_TELEMETRY", f"{s.GPU_TELEMETRY}.>", deliver_new=True, batch=256, dedup=False,
           linger_s=0.005, partitioned=True),
        _c("telemetry-nodes", "WHALEFLUX_NODES", f"{s.NODE_REGISTERED}.>"),
        # Job names, teams and GPUs, so samples and /metrics carry job labels and per-job usage.
        _c("telemetry-jobs", "WHALEFLUX_JOBS", *submissions(), f"{s.JOB_PLACED}.>", *reports()),
        # In batches (a burst of submissions is recorded in one MULTI) and without the per-event id dedup
        # marker: every scheduler job handler is idempotent by nature (SET NX, attempt and state guards).
        _c("scheduler-jobs", "WHALEFLUX_JOBS", *submissions(), *reports(), batch=256, dedup=False),
        _c("scheduler-nodes", "WHALEFLUX_NODES", f"{s.NODE_REGISTERED}.>", f"{s.NODE_DRAIN_REQUESTED}.>"),
        # Measured free memory per GPU, for placement: only the latest sample matters (no id dedup).
        _c("scheduler-telemetry", "WHALEFLUX_TELEMETRY", f"{s.GPU_TELEMETRY}.>", deliver_new=True, batch=256,
           dedup=False,
           linger_s=0.05),
        # Critical alerts on a GPU take it out of placement until they resolve (gpu_health.py). Live only: a GPU's
        # alerts from before the scheduler first ran are not replayed into quarantines.
        _c("scheduler-alerts", "WHALEFLUX_ALERTS", s.ALERT_RAISED, s.ALERT_RESOLVED, deliver_new=True),
        # Liveness only matters now: start at new heartbeats, and skip the per-event dedup
        # marker (one per node per second); recording the latest time twice changes nothing.
        _c("scheduler-heartbeats", "WHALEFLUX_NODES", f"{s.NODE_HEARTBEAT}.>", deliver_new=True, batch=256,
           dedup=False),
        # Partitioned when scaled out: a GPU's series and rule state live in the replica that holds its partition.
        _c("alerting-telemetry", "WHALEFLUX_TELEMETRY", f"{s.GPU_TELEMETRY}.>", deliver_new=True, batch=256,
           dedup=False, partitioned=True),
        _c("alerting-notify", "WHALEFLUX_ALERTS", f"{s.ALERT_RAISED}", f"{s.ALERT_RESOLVED}"),
        # Topology (rack, pool) from registrations, liveness from heartbeats: idempotent, no id dedup.
        _c("alerting-nodes", "WHALEFLUX_NODES", f"{s.NODE_REGISTERED}.>", f"{s.NODE_HEARTBEAT}.>", dedup=False),
        # Undrains (the scheduler's node.undrained): incidents forget their drains there. Live only: a replay must
        # not undo drains asked for since.
        _c("alerting-undrains", "WHALEFLUX_NODES", f"{s.NODE_UNDRAINED}.>", deliver_new=True),
        # Event rules: live only, so a replay never re-raises last month's failures. Submissions and ends:
        # each running job's workload class, for baselines per GPU model and workload class.
        # (Live only: the nodes' reports on their node subjects; bare ones are history from before those.)
        _c("alerting-jobs", "WHALEFLUX_JOBS", f"{s.JOB_FAILED}.>", s.JOB_REJECTED, *submissions(),
           f"{s.JOB_FINISHED}.>", deliver_new=True),
        _c("alerting-leases", "WHALEFLUX_LEASES", s.LEASE_EXPIRING, s.LEASE_EXPIRED, deliver_new=True),
        # In batches (read once, decided in stream order, one MULTI, acked after it), without the per-event
        # id dedup: every write is keyed by (job, attempt, part) and a redelivery rewrites the same values.
        _c("billing-jobs", "WHALEFLUX_JOBS", *reports(), s.JOB_REQUEUED, f"{s.JOB_PLACED}.>", batch=256,
           dedup=False),
        # Measured energy for power cost; counters are cumulative, so a redelivered sample adds nothing.
        _c("billing-telemetry", "WHALEFLUX_TELEMETRY", f"{s.GPU_TELEMETRY}.>", deliver_new=True, batch=256,
           dedup=False, partitioned=True),
        _c("inventory-nodes", "WHALEFLUX_NODES", f"{s.NODE_REGISTERED}.>", f"{s.NODE_HEARTBEAT}.>", dedup=False),
        _c("inventory-jobs", "WHALEFLUX_JOBS", *submissions(), s.JOB_REJECTED, f"{s.JOB_PLACED}.>",
           *reports(s.JOB_FINISHED, s.JOB_FAILED)),
        _c("inventory-validations", "WHALEFLUX_VALIDATIONS", f"{s.GPU_VALIDATED}.>"),
        # The scheduler's GPU cordons and quarantines: such a GPU is counted unhealthy, not active.
        _c("inventory-cordons", "WHALEFLUX_VALIDATIONS", f"{s.GPU_CORDONED}.>", f"{s.GPU_UNCORDONED}.>"),
        # Nodes drained and undrained: their GPUs are counted draining, not free (as the scheduler counts them).
        _c("inventory-drains", "WHALEFLUX_NODES", f"{s.NODE_DRAIN_REQUESTED}.>", f"{s.NODE_UNDRAINED}.>"),
        _c("inventory-telemetry", "WHALEFLUX_TELEMETRY", f"{s.GPU_TELEMETRY}.>", deliver_new=True, batch=256,
           dedup=False, partitioned=True),
    )
}


def agent_consumer(cluster: str, node: str) -> ConsumerSpec:
    """Each node agent has its own durable consumer of the placements for its node.

    It starts at new placements: a node first seen today must not run the
    placements of an earlier node of the same name. Afterwards the durable
    consumer resumes where the agent left off.
    """
    # Placements and stop orders on one consumer: the agent handles them in the order
    # the scheduler published them (a preempted job stops before its GPUs are reused).
    # One filter, `job.*.<cluster>.<node>`: the node's identity may create this consumer only on the API
    # subject that names it, so the server refuses any other filter (`job.>`) or name. It also brings the
    # node's own reports (started, finished, failed), which the agent acks and ignores.
    return _c(
        f"agent-{s.token(cluster)}-{s.token(node)}",
        "WHALEFLUX_JOBS",
        s.node_jobs(cluster, node),
        deliver_new=True,
        replaceable=False,
    )
