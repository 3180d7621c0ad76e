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


def job_started(cluster: str, node: str) -> str:
    """A node's reports about its attempts carry the node, so its agent's NATS identity may report only its own
    (older history holds them bare, `job.started`: consumers of the history take both)."""
    return f"{JOB_STARTED}.{token(cluster)}.{token(node)}"


def job_finished(cluster: str, node: str) -> str:
    return f"{JOB_FINISHED}.{token(cluster)}.{token(node)}"


def job_failed(cluster: str, node: str) -> str:
    return f"{JOB_FAILED}.{token(cluster)}.{token(node)}"


def job_submitted(team: str) -> str:
    """Submissions carry their team (`job.submitted.<team>`), so a submitter's NATS identity may submit only for its
    teams (older history holds them bare, `job.submitted`: consumers take both). A dotted team is several tokens."""
    return f"{JOB_SUBMITTED}.{'.'.join(token(part) for part in team.split('.'))}"


def node_jobs(cluster: str, node: str) -> str:
    """Every job subject of one node, its orders (placed, preempted) and its own reports: the agent's consumer
    takes them with this one filter, the only one its NATS identity may create that consumer with."""
    return f"job.*.{token(cluster)}.{token(node)}"


def job_preempted(cluster: str, node: str) -> str:
    """Stop orders carry the node, like placements, so the node's agent consumes them in order with its placements."""
    return f"{JOB_PREEMPTED}.{token(cluster)}.{token(node)}"


def node_drain_requested(cluster: str, node: str) -> str:
    return f"{NODE_DRAIN_REQUESTED}.{token(cluster)}.{token(node)}"


def node_undrained(cluster: str, node: str) -> str:
    return f"{NODE_UNDRAINED}.{token(cluster)}.{token(node)}"


# Subjects `<base>.<cluster>.<node>` (the telemetry stream stores a partition token after them): the event's own
# `cluster` and `node` must be the ones its subject names, since NATS permissions are granted by subject.
NODE_SCOPED = (GPU_TELEMETRY, GPU_VALIDATED, GPU_CORDONED, GPU_UNCORDONED, NODE_REGISTERED, NODE_HEARTBEAT,
               NODE_DRAIN_REQUESTED, NODE_UNDRAINED, JOB_PLACED, JOB_PREEMPTED, JOB_STARTED, JOB_FINISHED, JOB_FAILED)


def subject_node(subject: str) -> tuple[str, str] | None:
    """The (cluster, node) a node-scoped subject names; None for any other subject (a bare `job.finished` of older
    history included)."""
    parts = subject.split(".")
    if len(parts) < 4 or f"{parts[0]}.{parts[1]}" not in NODE_SCOPED:
        return None
    return parts[2], parts[3]


def node_mismatch(subject: str, cluster: object, node: object) -> str | None:
    """Why an event about `cluster`/`node` may not travel on `subject` (its subject names another node), or None.
    A node's identity may publish only its own nodes' subjects: the data must not name another node."""
    named = subject_node(subject)
    if named is None or named == (cluster, node):
        return None
    return f"subject names node {named[0]}/{named[1]} but data names {cluster}/{node}"


def subject_team(subject: str) -> str | None:
    """The team a submission's subject names (`job.submitted.<team>`); None for any other subject (a bare
    `job.submitted` of older history included)."""
    prefix = f"{JOB_SUBMITTED}."
    return subject.removeprefix(prefix) if subject.startswith(prefix) else None


def team_mismatch(subject: str, team: object) -> str | None:
    """Why a submission for `team` may not travel on `subject` (its subject names another team), or None.
    A submitter's identity may publish only its own teams' subjects: the data must not name another team."""
    named = subject_team(subject)
    if named is None or named == team:
        return None
    return f"subject names team {named} but data names {team}"


def deadletter(subject: str) -> str:
    return f"{DEADLETTER_PREFIX}.{subject}"
