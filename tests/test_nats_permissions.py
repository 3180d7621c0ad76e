"""NATS identities: the permission table (pure), and a real nats-server that enforces it.

The server here is started from the pip wheel with the config `whaleflux up` writes (shared/permissions.py);
the forbidden publishes are refused by the server itself, and each service and the agent, connected with their
own identity, do all they do (every consumer bound: ready).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import stat
from dataclasses import dataclass

import nats
import pytest
from nats.js.errors import NotFoundError

from whaleflux.servers import LocalServers, write_private
from whaleflux.shared import subjects as s
from whaleflux.shared.bus import Bus
from whaleflux.shared.localconfig import SERVICES
from whaleflux.shared.permissions import (
    PUBLISHES,
    SCHEDULER_BUCKET,
    agent_identity,
    console_identity,
    matches,
    nats_authorization,
    operator_identity,
    service_consumers,
    service_identity,
    stack_identities,
    submitter_identity,
)
from whaleflux.shared.settings import CommonSettings
from whaleflux.shared.streams import CONSUMERS

from .conftest import Servers
from .processes import make_cluster

NODE = ("onprem", "a100-01")  # the agent's own node (nodes of the default fleet)
OTHER = ("onprem", "h100-01")
AGENT, OTHER_AGENT = "agent-onprem-a100-01", "agent-onprem-h100-01"


# ---------------------------------------------------------------------- the table


def test_subject_matching_follows_nats_wildcards():
    assert matches("job.placed.>", "job.placed.c1.n1") and not matches("job.placed.>", "job.placed")
    assert matches("a.*.c", "a.b.c") and not matches("a.*.c", "a.b.c.d") and not matches("a.b", "a.b.c")


def test_every_declared_consumer_belongs_to_a_service_identity():
    owned = {spec.durable for name in SERVICES for spec in service_consumers(name)}
    assert owned == set(CONSUMERS)
    for name in SERVICES:
        identity = service_identity(name)
        for spec in service_consumers(name):
            assert identity.may_publish(f"$JS.API.CONSUMER.MSG.NEXT.{spec.stream}.{spec.durable}")
            assert identity.may_publish(f"$JS.ACK.{spec.stream}.{spec.durable}.1.2.3.4.5")
            assert all(identity.may_publish(s.deadletter(f)) for f in spec.filter_subjects)


def test_no_service_may_run_another_services_consumer():
    telemetry = service_identity("telemetry")
    assert not telemetry.may_publish("$JS.API.CONSUMER.MSG.NEXT.WHALEFLUX_JOBS.scheduler-jobs")
    assert not telemetry.may_publish("$JS.API.CONSUMER.DELETE.WHALEFLUX_JOBS.billing-jobs")
    assert not telemetry.may_publish(s.job_placed(*NODE)) and not telemetry.may_publish(s.JOB_SUBMITTED)


def test_an_agent_publishes_only_its_own_nodes_subjects_and_consumes_only_its_own_orders():
    agent = agent_identity([NODE])
    assert agent.user == AGENT
    for subject in (s.gpu_telemetry(*NODE), s.node_heartbeat(*NODE), s.node_registered(*NODE), s.job_started(*NODE),
                    s.job_finished(*NODE), s.job_failed(*NODE)):
        assert agent.may_publish(subject), subject
    for subject in (s.gpu_telemetry(*OTHER), s.node_heartbeat(*OTHER), s.node_registered(*OTHER),
                    s.job_started(*OTHER), s.job_finished(*OTHER), s.job_failed(*OTHER), s.JOB_STARTED,
                    s.JOB_FINISHED, s.JOB_FAILED,
                    s.job_placed(*NODE), s.job_placed(*OTHER), s.job_preempted(*NODE), s.node_drain_requested(*NODE),
                    s.JOB_SUBMITTED, s.ALERT_RAISED, "$JS.API.STREAM.UPDATE.WHALEFLUX_JOBS",
                    "$JS.API.STREAM.DELETE.WHALEFLUX_JOBS", f"$JS.API.CONSUMER.MSG.NEXT.WHALEFLUX_JOBS.{OTHER_AGENT}"):
        assert not agent.may_publish(subject), subject
    assert agent.may_publish("$JS.API.CONSUMER.MSG.NEXT.WHALEFLUX_JOBS.agent-onprem-a100-01")
    assert not agent.may_subscribe("job.>") and agent.subscribe == (f"_INBOX.{AGENT}.>",)
    assert not agent.may_subscribe("_INBOX.scheduler.x") and not agent.may_subscribe("_INBOX.>")


def test_every_consumer_of_the_nodes_reports_takes_them_on_their_node_subjects():
    """What agents send now (`job.finished.<cluster>.<node>`) reaches every consumer of reports; the consumers that
    read history from its start (all but the live-only alerting-jobs) take the bare ones older history holds."""
    for report in (s.JOB_STARTED, s.JOB_FINISHED, s.JOB_FAILED):
        readers = {name for name, spec in CONSUMERS.items()
                   if any(matches(f, report) or matches(f, f"{report}.c.n") for f in spec.filter_subjects)}
        assert readers, report
        for name in readers:
            spec = CONSUMERS[name]
            assert any(matches(f, f"{report}.{NODE[0]}.{NODE[1]}") for f in spec.filter_subjects), (name, report)
            assert spec.deliver_new or report in spec.filter_subjects, (name, report)
    assert {n for n, c in CONSUMERS.items() if any(matches(f, s.job_finished(*NODE)) for f in c.filter_subjects)} == {
        "telemetry-jobs", "scheduler-jobs", "alerting-jobs", "billing-jobs", "inventory-jobs"}


def test_submitter_console_and_operator_are_narrow():
    assert submitter_identity().publish == ("job.submitted.default",)
    vision = submitter_identity(["vision", "ml.nlp"], user="ci")
    assert vision.publish == ("job.submitted.vision", "job.submitted.ml.nlp") and vision.user == "ci"
    for other in (s.JOB_SUBMITTED, "job.submitted.default", "job.submitted.ml", "job.submitted.ml.nlp.x"):
        assert not vision.may_publish(other), other
    with pytest.raises(ValueError, match="at least one team"):
        submitter_identity([])
    console = console_identity()
    assert console.publish == () and console.may_subscribe(s.job_placed(*NODE))
    operator = operator_identity()
    assert operator.may_publish(s.job_submitted("any-team")) and not operator.may_publish(s.JOB_SUBMITTED)
    assert operator.may_publish("$JS.API.STREAM.INFO.WHALEFLUX_JOBS")
    assert not operator.may_publish(s.node_drain_requested(*NODE))
    assert not operator.may_publish("$JS.API.STREAM.DELETE.WHALEFLUX_JOBS")


def test_every_event_subject_has_a_publisher():
    """A subject added to subjects.py without a publisher in the table would be refused to whoever sends it."""
    declared = {v for k, v in vars(s).items() if re.fullmatch(r"[A-Z_]+", k) and isinstance(v, str)}
    declared -= {s.DEADLETTER_PREFIX}
    published = [p for name in PUBLISHES for p in service_identity(name).publish]
    published += agent_identity([NODE]).publish
    # A subject with tokens (gpu.telemetry.<cluster>.<node>) is published under its prefix.
    missing = {subject for subject in declared if not any(matches(p, subject) or p.startswith(f"{subject}.")
                                                           for p in published)}
    assert missing == set()


def test_authorization_block_is_one_user_per_identity_and_refuses_duplicates():
    users = [(identity, secrets.token_urlsafe(8)) for identity in stack_identities([NODE, OTHER])]
    text = nats_authorization(users)
    assert text.count('"user":') == len(users) == 9
    assert '"$JS.API.CONSUMER.MSG.NEXT.WHALEFLUX_JOBS.agent-onprem-h100-01"' in text
    assert '{"deny": [">"]}' in text  # the console publishes nothing
    with pytest.raises(ValueError, match="duplicate"):
        nats_authorization(users + users[:1])
    with pytest.raises(ValueError, match="unknown service"):
        service_identity("nope")


def test_a_secret_comes_from_a_file_named_by_its_FILE_variable(tmp_path, monkeypatch):
    path = tmp_path / "nats.pw"
    path.write_text("s3cret-from-a-file-0123\n")
    monkeypatch.setenv("WHALEFLUX_NATS_PASSWORD_FILE", str(path))
    assert CommonSettings().secret("nats_password") == "s3cret-from-a-file-0123"
    monkeypatch.setenv("WHALEFLUX_NATS_PASSWORD", "set-directly-wins-000")
    assert CommonSettings().secret("nats_password") == "set-directly-wins-000"
    monkeypatch.delenv("WHALEFLUX_NATS_PASSWORD")
    monkeypatch.setenv("WHALEFLUX_NATS_PASSWORD_FILE", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="WHALEFLUX_NATS_PASSWORD_FILE: cannot read"):
        CommonSettings()


# ---------------------------------------------------------------------- a real server


@dataclass
class Guarded:
    servers: LocalServers
    passwords: dict[str, str]

    async def connect(self, user: str, refused: Refusals | None = None) -> nats.NATS:
        return await nats.connect(self.servers.nats_url, user=user, password=self.passwords[user],
                                  error_cb=refused.record if refused else None, allow_reconnect=False,
                                  inbox_prefix=s.inbox_prefix(user))  # as shared/bus.py connects


class Refusals:
    """The server's errors on a connection, as they arrive."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.arrived = asyncio.Event()

    async def record(self, exc: Exception) -> None:
        self.errors.append(str(exc).lower())
        self.arrived.set()

    async def first(self) -> list[str]:
        await asyncio.wait_for(self.arrived.wait(), 10)
        return self.errors


@pytest.fixture
def guarded(tmp_path):
    """nats-server and redis-server from the wheels, NATS with every identity of a stack, an agent per node."""
    identities = [(identity, secrets.token_urlsafe(16)) for identity in stack_identities([NODE], AGENT)]
    identities.append((agent_identity([OTHER]), secrets.token_urlsafe(16)))
    local = LocalServers(tmp_path / "servers", "unused", "unused", secrets.token_urlsafe(16),
                         identities=identities).start()
    try:
        yield Guarded(local, {identity.user: password for identity, password in identities})
    finally:
        local.stop()


async def _refused(guarded: Guarded, user: str, subject: str) -> list[str]:
    """Publish `subject` as `user`: the server's errors."""
    refused = Refusals()
    nc = await guarded.connect(user, refused)
    try:
        await nc.publish(subject, b"{}")
        return await refused.first()
    finally:
        await nc.close()


async def _jobs_messages(guarded: Guarded) -> int:
    nc = await guarded.connect("scheduler")
    try:
        return (await nc.jetstream().stream_info("WHALEFLUX_JOBS")).state.messages
    finally:
        await nc.close()


def test_the_server_refuses_what_an_identity_may_not_publish(guarded):
    async def scenario() -> None:
        nc = await guarded.connect("scheduler")
        await Bus(nc, "test").ensure_streams()
        await nc.close()
        for user, subject in ((AGENT, s.job_placed(*OTHER)), (AGENT, s.job_placed(*NODE)),
                              (AGENT, s.gpu_telemetry(*OTHER)), (AGENT, s.job_finished(*OTHER)),
                              (AGENT, s.job_started(*OTHER)), (AGENT, s.JOB_FINISHED),
                              ("submitter", s.node_drain_requested(*NODE)),
                              ("submitter", s.job_placed(*NODE)), ("console", s.job_submitted("default")),
                              ("submitter", s.JOB_SUBMITTED), ("submitter", s.job_submitted("vision")),
                              (AGENT, "$JS.API.STREAM.DELETE.WHALEFLUX_JOBS")):
            errors = await _refused(guarded, user, subject)
            expected = f'permissions violation for publish to "{subject.lower()}"'
            assert any(expected in e for e in errors), (user, subject, errors)
        # Nothing of it reached the stream; what the submitter may publish does.
        assert await _jobs_messages(guarded) == 0
        nc = await guarded.connect("submitter")
        ack = await nc.jetstream().publish(s.job_submitted("default"), b"{}")
        await nc.close()
        assert ack.stream == "WHALEFLUX_JOBS" and await _jobs_messages(guarded) == 1
        # The agent's report about a job on its own node is taken.
        nc = await guarded.connect(AGENT)
        ack = await nc.jetstream().publish(s.job_finished(*NODE), b"{}")
        await nc.close()
        assert ack.stream == "WHALEFLUX_JOBS" and await _jobs_messages(guarded) == 2
        # An agent cannot read another node's orders by subscribing to them.
        refused = Refusals()
        nc = await guarded.connect(AGENT, refused)
        await nc.subscribe(s.job_placed(*OTHER))
        errors = await refused.first()
        await nc.close()
        assert any("permissions violation for subscription" in e for e in errors), errors

    asyncio.run(scenario())


def test_no_identity_may_read_another_identitys_replies(guarded):
    """Replies arrive under `_INBOX.<user>`: the agent's own JetStream requests are answered there, and the
    server refuses it a subscription to the scheduler's inbox or to all of `_INBOX`."""
    async def scenario() -> None:
        nc = await guarded.connect("scheduler")
        await Bus(nc, "test").ensure_streams()
        assert nc.new_inbox().startswith("_INBOX.scheduler.")
        await nc.close()
        for other in (f"{s.inbox_prefix('scheduler')}.>", "_INBOX.>", f"{s.inbox_prefix('submitter')}.abc"):
            refused = Refusals()
            nc = await guarded.connect(AGENT, refused)
            await nc.subscribe(other)
            errors = await refused.first()
            await nc.close()
            assert any(f'permissions violation for subscription to "{other.lower()}"' in e for e in errors), errors
        nc = await guarded.connect(AGENT)  # its own replies still come: a JetStream request answered
        try:
            info = await nc.jetstream().consumer_info("WHALEFLUX_JOBS", AGENT)
        except NotFoundError:
            info = None  # not bound yet: the answer (a 404) came back on the agent's own inbox all the same
        finally:
            await nc.close()
        assert info is None or info.name == AGENT

    asyncio.run(scenario())


def test_services_and_the_agent_do_all_they_do_with_their_own_identities(guarded, tmp_path):
    """Each connects as itself (password from a 0600 file) and gets ready: streams declared, every consumer bound,
    the console listening; a job the operator submits is placed on the agent's node, started and finished there."""
    secrets_dir = tmp_path / "secrets"
    local = guarded.servers
    cluster = make_cluster(Servers(local.nats_url, local.redis_url, redis_password=local.redis_password), tmp_path)

    def as_user(user: str) -> dict[str, str]:
        path = secrets_dir / f"{user}.nats"
        write_private(path, guarded.passwords[user])
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        return {"WHALEFLUX_NATS_USER": user, "WHALEFLUX_NATS_PASSWORD_FILE": str(path)}

    try:
        procs = [cluster.service(name, **as_user(name)) for name in SERVICES]
        agent = as_user(AGENT)
        cluster.agent(NODE[1], interval_s=0.5, WHALEFLUX_NATS_USER=agent["WHALEFLUX_NATS_USER"],
                      WHALEFLUX_NATS_PASSWORD_FILE=agent["WHALEFLUX_NATS_PASSWORD_FILE"])
        urls = {f"WHALEFLUX_{name.upper()}_URL": proc.url for name, proc in zip(SERVICES, procs, strict=True)}
        procs.append(cluster.service("console", **as_user("console"), **urls))  # it only subscribes
        for proc in procs:
            proc.wait_ready()
        cluster.base_env.update(WHALEFLUX_NATS_USER="operator", WHALEFLUX_NATS_PASSWORD=guarded.passwords["operator"])
        done = cluster.cli("submit", "--wait", "--", "python", "-c", "print('hi')", timeout=120)
        assert done.returncode == 0 and "succeeded" in done.stdout, done.stdout + done.stderr
        logs = "".join(p.log_path.read_text() for p in cluster.procs.values())
        # A refused publish or subscription reaches the bus's error callback (or nats-py's default logger).
        assert "nats.error" not in logs and "permissions violation" not in logs.lower()
    finally:
        cluster.stop()


def test_no_password_on_any_command_line_of_the_servers(guarded):
    local = guarded.servers
    for proc in local.procs:
        cmdline = " ".join(map(str, proc.args))
        assert not any(password in cmdline for password in guarded.passwords.values())
        assert local.redis_password not in cmdline
    conf = local.state_dir / "nats.conf"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    assert json.loads(conf.read_text().split("users = [", 1)[1].split("\n")[1].strip().rstrip(","))["user"]
    assert os.access(conf, os.R_OK)


def test_the_scheduler_identity_keeps_its_snapshots_and_reads_its_history(guarded):
    """Its rebuild's short-lived consumers and its snapshot object store (services/scheduler/rebuild.py)."""
    from whaleflux.scheduler.rebuild import SNAPSHOT_BUCKET, read_stream, snapshot_store
    from whaleflux.shared.events import JobRejected

    assert SNAPSHOT_BUCKET == SCHEDULER_BUCKET

    async def scenario() -> list[str]:
        refused = Refusals()
        bus = Bus(await guarded.connect("scheduler", refused), "test")
        try:
            await bus.ensure_streams()
            await bus.publish(s.JOB_REJECTED, JobRejected(job_id="j1", reason="too big"))
            store = await asyncio.wait_for(snapshot_store(bus), 10)
            await asyncio.wait_for(store.put("jobs", b"x" * 300_000), 10)  # several chunks
            await asyncio.wait_for(store.put("jobs", b"folded"), 10)  # replaces (purges) the old chunks
            assert (await asyncio.wait_for(store.get("jobs"), 10)).data == b"folded"
            got = [data async for _seq, _env, data in read_stream(bus, "WHALEFLUX_JOBS", [s.JOB_REJECTED])]
            assert [d.job_id for d in got if isinstance(d, JobRejected)] == ["j1"]
            return refused.errors
        finally:
            await bus.nc.close()

    assert asyncio.run(scenario()) == []


def test_docs_show_the_identities_as_the_code_grants_them():
    from pathlib import Path

    from whaleflux.shared.permissions import documented_identities, markdown_table

    doc = (Path(__file__).resolve().parents[1] / "docs" / "security.md").read_text()
    marked = doc.split("<!-- identities", 1)[1] if "<!-- identities" in doc else ""
    shown = marked.split("-->\n", 1)[1].split("<!-- /identities -->")[0] if marked else ""
    # A new consumer or publisher changes the table: paste the output of
    #   .venv/bin/python -c "from whaleflux.shared.permissions import *; print(markdown_table(documented_identities()))"
    # between the markers.
    assert shown == markdown_table(documented_identities()), "docs/security.md: the identities table is out of date"


def test_up_issues_each_identity_a_private_password_kept_across_runs(tmp_path):
    from whaleflux.local import issue_identities

    identities = stack_identities([NODE], "agent")
    first = dict((i.user, p) for i, p in issue_identities(tmp_path / "secrets", identities, "operator-pw-0123456"))
    again = dict((i.user, p) for i, p in issue_identities(tmp_path / "secrets", identities, "operator-pw-0123456"))
    assert first == again and first["operator"] == "operator-pw-0123456"
    assert len(set(first.values())) == len(first) == 9
    for path in (tmp_path / "secrets").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE((tmp_path / "secrets").stat().st_mode) == 0o700
    assert (tmp_path / "secrets" / "scheduler.nats").read_text() == first["scheduler"]
