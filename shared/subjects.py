"""Every NATS subject WhaleFlux uses, in one place.

Tokens that come from names (cluster, node) are validated so a name can never
inject a wildcard or an extra token into a subject.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")

GPU_TELEMETRY = "gpu.telemetry"
GPU_VALIDATED = "gpu.validated"
GPU_CORDONED = "gpu.cordoned"
GPU_UNCORDONED = "gpu.uncordoned"
NODE_REGISTERED = "node.registered"
NODE_HEARTBEAT = "node.heartbeat"
NODE_DRAIN_REQUESTED = "node.drain_requested"
NODE_UNDRAINED = "node.undrained"
JOB_SUBMITTED = "job.submitted"
JOB_PLACED = "job.placed"
JOB_STARTED = "job.started"
JOB_FINISHED = "job.finished"
JOB_FAILED = "job.failed"
JOB_REJECTED = "job.rejected"
JOB_PREEMPTED = "job.preempted"
JOB_REQUEUED = "job.requeued"
JOB_CANCELLED = "job.cancelled"
LEASE_EXPIRING = "lease.expiring"
LEASE_EXPIRED = "lease.expired"
ALERT_RAISED = "alert.raised"
ALERT_RESOLVED = "alert.resolved"
DEADLETTER_PREFIX = "deadletter"


def inbox_prefix(user: str) -> str:
    """Where replies to `user`'s connections arrive (`_INBOX.<user>.…`): shared/bus.py connects with it, and
    the user may subscribe to nothing else of `_INBOX`, so no identity reads another's replies."""
    return f"_INBOX.{user}"


def token(value: str) -> str:
    """Return `value` if it is safe as one subject token, else raise ValueError."""
    if not _TOKEN.match(value):
        raise ValueError(f"{value!r} is not a valid subject token (letters, digits, '-' and '_' only)")
    return value


def gpu_telemetry(cluster: str, node: str) -> str:
    return f"{GPU_TELEMETRY}.{token(cluster)}.{token(node)}"


def gpu_validated(cluster: str, node: str) -> str:
    return f"{GPU_VALIDATED}.{token(cluster)}.{token(node)}"


def gpu_cordoned(cluster: str, node: str) -> str:
    return f"{GPU_CORDONED}.{token(cluster)}.{token(node)}"


def gpu_uncordoned(cluster: str, node: str) -> str:
    return f"{GPU_UNCORDONED}.{token(cluster)}.{token(node)}"


def node_registered(cluster: str, node: str) -> str:
    return f"{NODE_REGISTERED}.{token(cluster)}.{token(node)}"


def node_heartbeat(cluster: str, node: str) -> str:
    return f"{NODE_HEARTBEAT}.{token(cluster)}.{token(node)}"


def job_placed(cluster: str, node: str) -> str:
    """Placements carry the node so each agent consumes only its own."""
    return f"{JOB_PLACED}.{token(cluster)}.{token(node)}"


def job_preempted(cluster: str, node: str) -> str:
    """Stop orders carry the node, like placements, so the node's agent consumes them in order with its placements."""
    return f"{JOB_PREEMPTED}.{token(cluster)}.{token(node)}"


def node_drain_requested(cluster: str, node: str) -> str:
    return f"{NODE_DRAIN_REQUESTED}.{token(cluster)}.{token(node)}"


def node_undrained(cluster: str, node: str) -> str:
    return f"{NODE_UNDRAINED}.{token(cluster)}.{token(node)}"


def deadletter(subject: str) -> str:
    return f"{DEADLETTER_PREFIX}.{subject}"
