"""A node's identity cannot touch any consumer but its own with its own filter, and a submitter submits only for
its teams: each forbidden act tried against a real nats-server that enforces the permissions `up` writes."""

from __future__ import annotations

import asyncio
import functools
import json
import secrets
from collections.abc import Awaitable, Callable

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import BadRequestError, NotFoundError

from whaleflux.servers import LocalServers
from whaleflux.shared import subjects as s
from whaleflux.shared.bus import REASON_HEADER, Bus, ConsumerNeedsReplacing, batch_handler
from whaleflux.shared.envelope import InvalidEvent
from whaleflux.shared.events import JobPlaced, JobSubmitted, misaddressed
from whaleflux.shared.permissions import agent_identity, stack_identities, submitter_identity
from whaleflux.shared.streams import CONSUMERS, agent_consumer

from .processes import fetch_at_least, until
from .test_nats_permissions import AGENT, NODE, OTHER, OTHER_AGENT, Guarded

JOBS = "WHALEFLUX_JOBS"
VISION = "vision-ci"  # a submitter for team vision only
OWN_FILTER = s.node_jobs(*NODE)


class Violations:
    """The permission violations the server reports on a connection, awaited by subject."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.changed = asyncio.Condition()

    async def record(self, exc: Exception) -> None:
        async with self.changed:
            self.errors.append(str(exc).lower())
            self.changed.notify_all()

    async def refused(self, subject: str, act: Callable[[], Awaitable[object]]) -> None:
        """Try `act`, which requests `subject`: the server reports it refused and no answer comes."""
        expected = f'permissions violation for publish to "{subject.lower()}"'
        task = asyncio.ensure_future(act())
        try:
            async with self.changed:
                await asyncio.wait_for(self.changed.wait_for(lambda: any(expected in e for e in self.errors)), 10)
        finally:
            task.cancel()
        with pytest.raises((asyncio.CancelledError, nats.errors.TimeoutError)):
            await task  # never answered: the request did not reach JetStream


@pytest.fixture
def guarded(tmp_path):
    """nats-server with every identity of a stack, a second node's agent and a submitter for team vision."""
    identities = [(identity, secrets.token_urlsafe(16)) for identity in stack_identities([NODE], AGENT)]
    identities += [(agent_identity([OTHER]), secrets.token_urlsafe(16)),
                   (submitter_identity(["vision"], user=VISION), secrets.token_urlsafe(16))]
    local = LocalServers(tmp_path / "servers", "unused", "unused", secrets.token_urlsafe(16),
                         identities=identities).start()
    try:
        yield Guarded(local, {identity.user: password for identity, password in identities})
    finally:
        local.stop()


async def _bus(guarded: Guarded, user: str, violations: Violations | None = None) -> Bus:
    """`user`'s bus, connected as shared/bus.py connects (its own inbox)."""
    nc = await nats.connect(guarded.servers.nats_url, user=user, password=guarded.passwords[user],
                            error_cb=violations.record if violations else None, allow_reconnect=False,
                            inbox_prefix=s.inbox_prefix(user))
    return Bus(nc, "test")


async def _streams_and_agent_consumers(guarded: Guarded) -> None:
    bus = await _bus(guarded, "scheduler")
    await bus.ensure_streams()
    await bus.nc.close()
    for user, node in ((AGENT, NODE), (OTHER_AGENT, OTHER)):
        bus = await _bus(guarded, user)
        await bus.ensure_consumer(agent_consumer(*node))  # what the agent does at start: allowed
        await bus.nc.close()


def _config(name: str, filter_subject: str | None, *, named: bool = True) -> ConsumerConfig:
    return ConsumerConfig(name=name if named else None, durable_name=name, filter_subject=filter_subject,
                          deliver_policy=DeliverPolicy.NEW, ack_policy=AckPolicy.EXPLICIT)


def test_a_nodes_identity_is_refused_every_consumer_change_but_its_own(guarded):
    """With a node's credentials: its durable with filter `job.>`, deleting its own or another node's consumer,
    editing its own with another filter, the legacy DURABLE.CREATE, a consumer of another name and an ephemeral
    one are all refused by the server; a body whose filter differs from the permitted subject's is refused by
    JetStream itself. Its own consumer keeps its one filter throughout."""
    create = f"$JS.API.CONSUMER.CREATE.{JOBS}"

    async def scenario() -> None:
        await _streams_and_agent_consumers(guarded)
        violations = Violations()
        bus = await _bus(guarded, AGENT, violations)
        js = bus.nc.jetstream(timeout=30)
        try:
            await violations.refused(f"{create}.{AGENT}.job.>",
                                     lambda: js.add_consumer(JOBS, _config(AGENT, "job.>")))
            await violations.refused(f"{create}.{AGENT}.{s.job_placed(*OTHER)}",
                                     lambda: js.add_consumer(JOBS, _config(AGENT, s.job_placed(*OTHER))))
            await violations.refused(f"{create}.{AGENT}", lambda: js.add_consumer(JOBS, _config(AGENT, None)))
            await violations.refused(f"$JS.API.CONSUMER.DELETE.{JOBS}.{AGENT}",
                                     lambda: js.delete_consumer(JOBS, AGENT))
            await violations.refused(f"$JS.API.CONSUMER.DELETE.{JOBS}.{OTHER_AGENT}",
                                     lambda: js.delete_consumer(JOBS, OTHER_AGENT))
            await violations.refused(f"$JS.API.CONSUMER.DURABLE.CREATE.{JOBS}.{AGENT}",
                                     lambda: js.add_consumer(JOBS, _config(AGENT, "job.>", named=False)))
            await violations.refused(f"{create}.sniffer.{OWN_FILTER}",
                                     lambda: js.add_consumer(JOBS, _config("sniffer", OWN_FILTER)))
            await violations.refused(f"{create}.{OTHER_AGENT}.{s.node_jobs(*OTHER)}",
                                     lambda: js.add_consumer(JOBS, _config(OTHER_AGENT, s.node_jobs(*OTHER))))
            await violations.refused(create, lambda: js.add_consumer(JOBS, ConsumerConfig(filter_subject="job.>")))
            # On the one create subject it is allowed, a config that widens the filter: refused by JetStream.
            for config in ({"filter_subject": "job.>"}, {"filter_subjects": ["job.>"]},
                           {"filter_subject": OWN_FILTER, "filter_subjects": [OWN_FILTER, "job.>"]}, {}):
                body = {"stream_name": JOBS, "config": {"name": AGENT, "durable_name": AGENT, "ack_policy": "explicit",
                                                        "deliver_policy": "new", **config}}
                with pytest.raises(BadRequestError):
                    await js._api_request(f"{create}.{AGENT}.{OWN_FILTER}", json.dumps(body).encode(), timeout=10)
            own = await js.consumer_info(JOBS, AGENT)
            assert (own.config.filter_subject, own.config.filter_subjects or []) == (OWN_FILTER, [])
        finally:
            await bus.nc.close()
        bus = await _bus(guarded, "scheduler")
        try:
            assert (await bus.js.consumer_info(JOBS, OTHER_AGENT)).config.filter_subject == s.node_jobs(*OTHER)
            with pytest.raises(NotFoundError):
                await bus.js.consumer_info(JOBS, "sniffer")
        finally:
            await bus.nc.close()

    asyncio.run(scenario())


def test_an_agent_moves_its_older_consumer_to_its_one_filter_itself_and_an_operator_replaces_what_it_cannot(
        guarded):
    """An agent consumer declared before (two filters) is updated in place by the node's own identity: it keeps
    its position and now takes its orders on one filter. A change the server refuses to make in place is named
    (ConsumerNeedsReplacing) and nothing is deleted; once an identity allowed to delete it has, the agent
    creates it again."""
    spec = agent_consumer(*NODE)

    async def scenario() -> None:
        await _streams_and_agent_consumers(guarded)
        scheduler = await _bus(guarded, "scheduler")  # its rebuild may create and delete any consumer of JOBS
        violations = Violations()
        agent = await _bus(guarded, AGENT, violations)
        try:
            await scheduler.js.delete_consumer(JOBS, AGENT)
            older = ConsumerConfig(name=AGENT, durable_name=AGENT, deliver_policy=DeliverPolicy.NEW,
                                   ack_policy=AckPolicy.EXPLICIT, max_deliver=spec.max_deliver,
                                   filter_subjects=[s.job_placed(*NODE), s.job_preempted(*NODE)])
            await scheduler.js.add_consumer(JOBS, older)
            placed = JobPlaced(job_id="j1", attempt=1, cluster=NODE[0], node=NODE[1], gpu_model="A100",
                               gpu_uuids=["GPU-1"], gpu_indices=[0], command=["true"], team="t", project="p")
            await scheduler.publish(s.job_placed(*NODE), placed)
            got = await (await agent.js.pull_subscribe_bind(AGENT, JOBS)).fetch(1, timeout=10)
            await got[0].ack_sync()
            before = await agent.js.consumer_info(JOBS, AGENT)

            await agent.ensure_consumer(spec)
            after = await agent.js.consumer_info(JOBS, AGENT)
            assert (after.config.filter_subject, after.config.filter_subjects or []) == (OWN_FILTER, [])
            assert after.delivered.stream_seq == before.delivered.stream_seq, "the position is kept"

            # An older consumer whose back-off list the new max_deliver cannot hold: the server will not update it.
            await scheduler.js.delete_consumer(JOBS, AGENT)
            await scheduler.js.add_consumer(JOBS, ConsumerConfig(
                name=AGENT, durable_name=AGENT, deliver_policy=DeliverPolicy.NEW, ack_policy=AckPolicy.EXPLICIT,
                filter_subject=s.job_placed(*NODE), max_deliver=20, backoff=[1.0] * 10))
            with pytest.raises(ConsumerNeedsReplacing, match=f"consumer {AGENT} of {JOBS} must be replaced"):
                await agent.ensure_consumer(spec)
            assert violations.errors == [], "the agent never tried to delete it"
            await scheduler.js.delete_consumer(JOBS, AGENT)
            await agent.ensure_consumer(spec)
            again = await agent.js.consumer_info(JOBS, AGENT)
            assert again.config.filter_subject == OWN_FILTER and again.config.max_deliver == spec.max_deliver
        finally:
            await agent.nc.close()
            await scheduler.nc.close()

    asyncio.run(scenario())


# ---------------------------------------------------------------------- submissions, by team


def _job(job_id: str, team: str) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, name=job_id, team=team, command=["true"])


def test_a_submitter_publishes_only_its_own_teams_submissions(guarded):
    async def scenario() -> None:
        await _streams_and_agent_consumers(guarded)
        violations = Violations()
        bus = await _bus(guarded, VISION, violations)
        try:
            env = await bus.publish(s.job_submitted("vision"), _job("v1", "vision"))
            assert env.type == "io.whaleflux.job.submitted.v1"
            for subject in (s.job_submitted("default"), s.JOB_SUBMITTED, f"{s.job_submitted('vision')}.x"):
                await violations.refused(subject, functools.partial(bus.publish, subject, _job("x", "vision")))
        finally:
            await bus.nc.close()
        bus = await _bus(guarded, "scheduler")
        try:
            assert (await bus.js.stream_info(JOBS)).state.messages == 1  # only its own team's submission
        finally:
            await bus.nc.close()

    asyncio.run(scenario())


def test_a_submission_naming_another_team_than_its_subject_is_never_taken():
    with pytest.raises(InvalidEvent, match="subject names team vision but data names default"):
        misaddressed(s.job_submitted("vision"), _job("j", "default"))
    misaddressed(s.job_submitted("ml.nlp"), _job("j", "ml.nlp"))
    misaddressed(s.JOB_SUBMITTED, _job("j", "default"))  # bare: older history, taken as it is
    with pytest.raises(ValueError, match="not a valid subject token"):
        s.job_submitted("a..b")


async def test_the_scheduler_dead_letters_a_submission_whose_subject_names_another_team(bus_and_redis):
    """The scheduler's own consumer declaration: a submitter of team vision that names team default in the data
    is dead-lettered at once with the reason; its own team's, and a bare one of older history, are handled."""
    bus, redis = bus_and_redis
    handled: list[str] = []

    @batch_handler
    async def scheduler_jobs(events):
        handled.extend(data.job_id for _, data in events)

    bus.start_consumer(CONSUMERS["scheduler-jobs"], scheduler_jobs, redis, "wf:test")
    await bus.publish(s.job_submitted("vision"), _job("forged", "default"))
    await bus.publish(s.job_submitted("vision"), _job("own", "vision"))
    await bus.publish(s.JOB_SUBMITTED, _job("old-history", "default"))
    sub = await bus.js.pull_subscribe(f"{s.DEADLETTER_PREFIX}.>", durable="test-dl", stream="WHALEFLUX_DEADLETTER")
    [dead] = await fetch_at_least(sub, 1)
    await until(lambda: sorted(handled) == ["old-history", "own"])
    assert (dead.subject, dead.headers["WhaleFlux-Stage"], dead.headers[REASON_HEADER]) == (
        "deadletter.job.submitted.vision", "validation", "subject names team vision but data names default")
    assert dead.headers["WhaleFlux-Consumer"] == "scheduler-jobs"


async def test_the_schedulers_rebuild_folds_team_submissions_and_skips_one_naming_another_team(bus_and_redis):
    """The rebuild reads the stream itself: submissions on their team's subject and bare ones of older history are
    folded, one whose subject names another team than its data is not."""
    from whaleflux.scheduler.rebuild import JOB_HISTORY, read_stream

    bus, _ = bus_and_redis
    for job_id, subject, team in (("forged", s.job_submitted("vision"), "default"),
                                  ("own", s.job_submitted("vision"), "vision"),
                                  ("old-history", s.JOB_SUBMITTED, "default")):
        await bus.publish(subject, _job(job_id, team))
    read = [getattr(data, "job_id", None) async for _, _, data in read_stream(bus, JOBS, JOB_HISTORY)]
    assert read == ["own", "old-history"]
