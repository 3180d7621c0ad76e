"""Who may publish and subscribe what on NATS: one identity per component, derived from the bus contract.

Pure: no I/O. The nats-server config that `whaleflux up` writes (`nats_authorization`) and the tables in
docs/security.md both come from here. What each service consumes is read from `streams.CONSUMERS` (a
consumer `<service>-…` belongs to that service), so a new consumer is permitted the day it is declared;
what each service publishes is declared in `PUBLISHES` below, next to the subjects in `subjects.py`.

JetStream is reached through request subjects (`$JS.API.…`, docs.nats.io "JetStream API"): each
identity gets only the API subjects of its own durable consumers (info, create, delete, next message),
the acks of its own consumers (`$JS.ACK.<stream>.<durable>.>`) and its own replies on `_INBOX.<user>.>`.
A node's agent gets less (`node_consumer_api`): it may create its consumer only on the API subject that names
its one filter (`CONSUMER.CREATE.<stream>.<durable>.<filter>`; nats-server refuses a request whose config's
filter differs from the subject's), and may not delete it, so it can never widen what it reads.
Submissions carry their team (`job.submitted.<team>`): a submitter may publish only its teams' subjects.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from . import subjects as s
from .localconfig import SERVICES
from .partitions import PARTITIONS
from .streams import CONSUMERS, STREAMS, ConsumerSpec, agent_consumer

API = "$JS.API"
OPERATOR = "operator"

# The scheduler keeps its folded job history in a JetStream object store (services/scheduler/rebuild.py).
SCHEDULER_BUCKET = "WHALEFLUX_SCHEDULER_SNAPSHOTS"

# The team a submitter of `up` (and of the compose deployment) submits for: a job's default team.
DEFAULT_TEAM = "default"

# What each service publishes (grep `publish` in services/<name>): its events, and nothing else.
PUBLISHES: dict[str, tuple[str, ...]] = {
    "telemetry": (),
    # job.submitted (for any team: its API checks the caller's teams) and job.cancelled from its API; placements,
    # stop orders, rejections and requeues; drains and undrains; GPU cordons (an operator's, or its quarantine of
    # a faulty GPU) and their ends.
    "scheduler": (f"{s.JOB_SUBMITTED}.>", f"{s.JOB_PLACED}.>", f"{s.JOB_PREEMPTED}.>", s.JOB_REJECTED, s.JOB_REQUEUED,
                  s.JOB_CANCELLED, f"{s.NODE_DRAIN_REQUESTED}.>", f"{s.NODE_UNDRAINED}.>", f"{s.GPU_CORDONED}.>",
                  f"{s.GPU_UNCORDONED}.>"),
    # Alerts, and the drains its auto-drain rules ask for.
    "alerting": (s.ALERT_RAISED, s.ALERT_RESOLVED, f"{s.NODE_DRAIN_REQUESTED}.>"),
    "billing": (s.ALERT_RAISED, s.ALERT_RESOLVED),  # budget alerts and their resolutions
    "inventory": (s.LEASE_EXPIRING, s.LEASE_EXPIRED),
}


@dataclass(frozen=True)
class Identity:
    """One NATS user: what it may publish and subscribe to (everything else is refused by the server)."""

    user: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    role: str

    def may_publish(self, subject: str) -> bool:
        return any(matches(pattern, subject) for pattern in self.publish)

    def may_subscribe(self, subject: str) -> bool:
        return any(matches(pattern, subject) for pattern in self.subscribe)


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` is one token, a final `>` one or more."""
    want, got = pattern.split("."), subject.split(".")
    for i, tok in enumerate(want):
        if tok == ">":
            return len(got) > i
        if i >= len(got) or (tok != "*" and tok != got[i]):
            return False
    return len(want) == len(got)


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def consumer_api(stream: str, durable: str) -> list[str]:
    """Run one durable pull consumer: look it up, create or replace it, fetch from it, ack its messages."""
    return [
        f"{API}.CONSUMER.INFO.{stream}.{durable}",
        f"{API}.CONSUMER.CREATE.{stream}.{durable}",
        f"{API}.CONSUMER.CREATE.{stream}.{durable}.>",  # nats-py puts a single filter subject in the API subject
        f"{API}.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
        f"{API}.CONSUMER.DELETE.{stream}.{durable}",
        f"{API}.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def node_consumer_api(spec: ConsumerSpec) -> list[str]:
    """Run a node's own consumer and nothing more: look it up, create or update it with its one filter only,
    fetch from it, ack its messages. No delete, no legacy `DURABLE.CREATE`, no create without the filter."""
    [only] = spec.filter_subjects  # one filter, so that nats-py names it in the create subject
    return [
        f"{API}.CONSUMER.INFO.{spec.stream}.{spec.durable}",
        f"{API}.CONSUMER.CREATE.{spec.stream}.{spec.durable}.{only}",
        f"{API}.CONSUMER.MSG.NEXT.{spec.stream}.{spec.durable}",
        f"$JS.ACK.{spec.stream}.{spec.durable}.>",
    ]


def _consuming(specs: Iterable[ConsumerSpec]) -> list[str]:
    """The API subjects of these consumers, and the dead-letter subjects of what they consume."""
    out: list[str] = []
    for declared in specs:
        for spec in declared.partitions():  # scaled out, a partitioned consumer is one durable per partition
            out += consumer_api(spec.stream, spec.durable)
            out += [s.deadletter(subject) for subject in spec.filter_subjects]
    return out


def stream_api(*, update: bool) -> list[str]:
    """Declare the streams (`Bus.ensure_streams`): create with the declared config; `update` also changes one."""
    verbs = ("INFO", "CREATE", "UPDATE") if update else ("INFO", "CREATE")
    return [f"{API}.STREAM.{verb}.{name}" for name in STREAMS for verb in verbs]


def service_consumers(service: str) -> list[ConsumerSpec]:
    return [spec for name, spec in CONSUMERS.items() if name.startswith(f"{service}-")]


def _scheduler_extra() -> list[str]:
    """Rebuild: short-lived consumers of any name on the jobs, nodes and validations (GPU cordons) streams, and its
    snapshot object store."""
    obj = f"OBJ_{SCHEDULER_BUCKET}"
    out = []
    for stream in ("WHALEFLUX_JOBS", "WHALEFLUX_NODES", "WHALEFLUX_VALIDATIONS"):
        out += [f"{API}.CONSUMER.{verb}.{stream}.*" for verb in ("INFO", "CREATE", "DELETE")]
        out += [f"{API}.CONSUMER.CREATE.{stream}.*.>", f"{API}.CONSUMER.MSG.NEXT.{stream}.*"]
    out += [f"{API}.*.*.{obj}", f"{API}.*.*.{obj}.>", f"{API}.*.*.*.{obj}", f"{API}.*.*.*.{obj}.>",
            f"$O.{SCHEDULER_BUCKET}.>", f"$JS.FC.{obj}.>", f"$JS.ACK.{obj}.>", f"{API}.STREAM.NAMES"]
    return out


def inbox(user: str) -> str:
    """The one part of `_INBOX` that `user` may subscribe to: its own replies."""
    return f"{s.inbox_prefix(user)}.>"


def service_identity(service: str) -> Identity:
    if service not in PUBLISHES:
        raise ValueError(f"unknown service {service!r}; one of {', '.join(PUBLISHES)}")
    publish = [*PUBLISHES[service], *stream_api(update=True), *_consuming(service_consumers(service))]
    if service == "scheduler":
        publish += _scheduler_extra()
    return Identity(service, _unique(publish), (inbox(service),), f"the {service} service")


def agent_user(cluster: str, node: str) -> str:
    return f"agent-{s.token(cluster)}-{s.token(node)}"


def agent_identity(nodes: Sequence[tuple[str, str]], user: str | None = None) -> Identity:
    """An agent of these (cluster, node)s: publishes their telemetry, heartbeats, registrations, burn-in reports
    and their jobs' starts and ends, consumes their own placements and stop orders, and nothing of any other node.

    `user`: the name for an agent of several nodes (a simulated fleet); one node's agent is `agent-<cluster>-<node>`.
    """
    if not nodes:
        raise ValueError("an agent identity needs at least one node")
    if user is None:
        if len(nodes) != 1:
            raise ValueError("an agent of several nodes needs a user name")
        user = agent_user(*nodes[0])
    publish = stream_api(update=False)
    for cluster, node in nodes:
        publish += [s.gpu_telemetry(cluster, node), s.node_heartbeat(cluster, node), s.node_registered(cluster, node),
                    s.gpu_validated(cluster, node),  # its burn-in's report cards
                    s.job_started(cluster, node), s.job_finished(cluster, node), s.job_failed(cluster, node)]
        orders = agent_consumer(cluster, node)
        publish += [*node_consumer_api(orders), *(s.deadletter(f) for f in orders.filter_subjects)]
    return Identity(user, _unique(publish), (inbox(user),), f"the agent of {', '.join(f'{c}/{n}' for c, n in nodes)}")


def submitter_identity(teams: Sequence[str] = (DEFAULT_TEAM,), user: str = "submitter") -> Identity:
    """Another system that submits jobs for `teams`: `job.submitted.<team>` of each and its publish
    acknowledgements, nothing else (as over HTTP, where a submitter's token submits only for its teams)."""
    if not teams:
        raise ValueError("a submitter needs at least one team")
    return Identity(user, _unique(s.job_submitted(team) for team in teams), (inbox(user),),
                    f"an external system that submits jobs (teams: {', '.join(teams)})")


def console_identity() -> Identity:
    """The web console hears that something happened (plain subscriptions) and publishes nothing."""
    heard = (f"{s.GPU_TELEMETRY}.>", "node.>", "job.>", "alert.>", "lease.>")
    return Identity("console", (), heard, "the web console (reads only)")


def operator_identity(user: str = OPERATOR) -> Identity:
    """A person's CLI: submits jobs and reads the streams' and consumers' state; changes nothing else."""
    inspect = [f"{API}.INFO", f"{API}.STREAM.NAMES", f"{API}.STREAM.LIST", f"{API}.STREAM.INFO.*",
               f"{API}.CONSUMER.NAMES.*", f"{API}.CONSUMER.LIST.*", f"{API}.CONSUMER.INFO.*.*"]
    return Identity(user, (f"{s.JOB_SUBMITTED}.>", *inspect), (inbox(user),),
                    "a person's CLI (whaleflux submit for any team, inspection)")


def stack_identities(agent_nodes: Sequence[tuple[str, str]], agent_user_name: str = "agent") -> list[Identity]:
    """Every identity of a whole system: the five services, the console, the operator, the agent of
    `agent_nodes` (one user for a simulated fleet) and a submitter for the default team."""
    return [*(service_identity(name) for name in SERVICES), console_identity(), operator_identity(),
            agent_identity(agent_nodes, agent_user_name), submitter_identity()]


def _user_block(identity: Identity, password: str) -> str:
    perms = {}
    for kind, allowed in (("publish", identity.publish), ("subscribe", identity.subscribe)):
        # An empty allow list would not restrict: deny everything explicitly instead.
        perms[kind] = {"allow": list(allowed)} if allowed else {"deny": [">"]}
    # JSON is valid nats-server config syntax; quoted strings keep `$JS` from reading as a variable.
    return json.dumps({"user": identity.user, "password": password, "permissions": perms})


def nats_authorization(users: Sequence[tuple[Identity, str]]) -> str:
    """The `authorization { users = [...] }` block of a nats-server config for these (identity, password)s."""
    names = [identity.user for identity, _ in users]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate NATS user in {names}")
    body = ",\n".join(f"    {_user_block(identity, password)}" for identity, password in users)
    return f"authorization {{\n  users = [\n{body}\n  ]\n}}\n"


def markdown_table(identities: Sequence[Identity]) -> str:
    """The identities as docs/security.md shows them: events published, durable consumers run, subscriptions.
    (Besides these, each may declare the streams, dead-letter what it consumes and get its replies.)"""
    rows = ["| NATS user | who | publishes | consumes (durable consumer) | subscribes |", "|---|---|---|---|---|"]
    next_prefix = f"{API}.CONSUMER.MSG.NEXT."
    for identity in identities:
        events = [p for p in identity.publish if not p.startswith(("$", s.DEADLETTER_PREFIX))]
        consumers = [p.removeprefix(next_prefix).replace(".", " / ", 1) for p in identity.publish
                     if p.startswith(next_prefix)]
        # A partitioned consumer's durables per partition, shown once: `telemetry-gpu[-p0…p7]`.
        last = f"-p{PARTITIONS - 1}"
        partitioned = {c.removesuffix(last) for c in consumers if c.endswith(last)}
        consumers = [f"{c}[-p0…p{PARTITIONS - 1}]" if c in partitioned else c for c in consumers
                     if not any(c.startswith(f"{base}-p") for base in partitioned)]
        subscribed = [p for p in identity.subscribe if p != inbox(identity.user)]
        cells = [", ".join(f"`{x}`" for x in items) or "—" for items in (events, consumers, subscribed)]
        rows.append(f"| `{identity.user}` | {identity.role} | {' | '.join(cells)} |")
    return "\n".join(rows) + "\n"


def documented_identities() -> list[Identity]:
    """The identities of a system as the docs show them: the agent of one node CLUSTER/NODE."""
    return stack_identities([("CLUSTER", "NODE")], agent_user("CLUSTER", "NODE"))
