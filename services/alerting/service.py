"""The alerting shell: events in, the decision modules decide, the store saves, the delivery pipeline posts.

Three steps, each crash-safe on its own:
1. rules (`rules/`) turn samples, heartbeats, events and findings into firing and
   resolved transitions (`firing.py`); each is one MULTI with its `alert.raised`
   / `alert.resolved` outbox entry;
2. `alerting-notify` consumes the ALERTS stream (ours and other services'):
   `dispatch/intake.py` assigns incidents, groups and times notifications, and in
   one MULTI the groups, incidents, queued deliveries and `node.drain_requested`
   (when a rule asks for it, once per node per incident) are saved;
3. the delivery loop runs each due delivery through `delivery/`'s pipeline and
   records the outcome (the notification log) or queues it again.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from datetime import datetime

import httpx

from whaleflux.shared import subjects
from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.events import (
    AlertRaised,
    AlertResolved,
    Envelope,
    EventData,
    GpuTelemetry,
    JobFinished,
    JobRejected,
    JobSubmitted,
    NodeHeartbeat,
    NodeRegistered,
    NodeUndrained,
)
from whaleflux.shared.runtime import Runtime

from .config import AlertingConfig, ConfigError, load_config
from .delivery.directory import Directory
from .delivery.http import post_json
from .delivery.model import Delivery
from .delivery.pipeline import Pipeline, standard
from .delivery.stages import Finished, RateLimit, record
from .dispatch.intake import Ack, Changes, Intake
from .dispatch.silences import Silence
from .firing import FiringAlerts
from .guardians import FindingsSource
from .receivers import Body
from .rules.engine import NodeInfo, RuleEngine, Transition
from .settings import WEBHOOK_URLS_ENV, AlertingSettings
from .store import AlertStore

# Registrations and heartbeats older than this (a replay) give topology, not liveness.
LIVENESS_HORIZON_S = 3600.0
EXPIRE_INCIDENTS_EVERY_S = 10.0


class Alerting:
    """The service's state in memory (rule engine, firing alerts, dispatch, receivers) and its handlers and loops."""

    def __init__(self, runtime: Runtime, settings: AlertingSettings, store: AlertStore,
                 environ: Mapping[str, str] = os.environ) -> None:
        self.rt, self.settings, self.store, self.environ = runtime, settings, store, environ
        self.log = runtime.log
        self.config = load_config(settings.rules_path)  # a bad file at start-up stops the service, naming the line
        self.rules_loaded_at = self.started_at = runtime.clock()
        self.rules_error: list[str] = []
        self._rules_stamp = self._stamp()
        self.engine = RuleEngine(self.config, gpu_models())
        self.firing = FiringAlerts(runtime.source)
        self.intake = Intake(self.config, runtime.source)
        self.directory = self._directory(self.config)
        self.rate_limit = RateLimit()
        self.http = httpx.AsyncClient()
        self.pipeline: Pipeline = standard(lambda: self.directory, self._muted, self.rate_limit,
                                           settings.external_url, self._send, settings.alerting_delivery_max_age_s)
        self.findings = FindingsSource(settings.inventory_url, self.http, self.log, settings.client_headers())
        self._lock = asyncio.Lock()  # one dispatch step at a time (consumer, API, tick)
        self._wake = asyncio.Event()  # deliveries were queued

    async def on_ready(self) -> None:
        """Load what is kept in memory from the store."""
        snap = await self.store.load()
        now = self.rt.clock()
        self.firing = FiringAlerts(self.rt.source, snap.firing)
        for fp, a in snap.firing.items():
            self.engine.restore_firing(fp, a.rule, a.labels, a.starts_at, now)
        for (cluster, node), info in snap.topology.items():
            self.engine.observe_node(cluster, node, info, datetime.fromtimestamp(0, now.tzinfo))
        for job_id, cls in snap.job_classes.items():
            self.engine.observe_job(job_id, cls, snap.job_owners.get(job_id))
        self.intake = Intake(self.config, self.rt.source, snap.groups, snap.incidents, snap.silences, snap.acks)
        await self.rt.publish_staged()

    async def on_stop(self) -> None:
        await self.http.aclose()

    # ---------------------------------------------------------------- configuration

    def _directory(self, config: AlertingConfig) -> Directory:
        return Directory(config.receivers, self.environ, {WEBHOOK_URLS_ENV: self.settings.webhook_urls})

    def _stamp(self) -> tuple[float, int] | None:
        try:
            st = self.settings.rules_path.stat()
            return (st.st_mtime, st.st_size)
        except OSError:
            return None

    def reload_rules(self) -> list[str]:
        """Re-read the rules file; on error keep the rules in force and return the problems."""
        try:
            config = load_config(self.settings.rules_path)
        except ConfigError as exc:
            self.rules_error = exc.errors
            self.log.error("rules.reload_failed", errors=exc.errors)
            return exc.errors
        self.config = config
        self.engine.set_config(config)
        self.intake.set_config(config)
        self.directory = self._directory(config)
        self.rate_limit.reset()
        self.rules_error, self.rules_loaded_at = [], self.rt.clock()
        self.log.info("rules.reloaded", rules=len(config.rules), file=str(self.settings.rules_path))
        return []

    async def reload_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            stamp = self._stamp()
            if stamp != self._rules_stamp:
                self._rules_stamp = stamp
                self.reload_rules()

    # ---------------------------------------------------------------- inputs -> transitions

    async def on_telemetry(self, env: Envelope, data: EventData) -> None:
        if isinstance(data, GpuTelemetry):
            await self._apply(self.engine.observe_telemetry(data, self.rt.clock()))

    async def on_node(self, env: Envelope, data: EventData) -> None:
        if not isinstance(data, (NodeRegistered, NodeHeartbeat)):
            return
        now = self.rt.clock()
        seen = min(env.time, now)
        info = None
        if isinstance(data, NodeRegistered):
            info = NodeInfo(rack=data.rack, pool=data.pool,
                            gpus=tuple((g.uuid, g.name, g.pci_bus_id or "") for g in data.gpus))
            await self.store.save_node(data.cluster, data.node, info)
        cluster, node = data.cluster, data.node
        if (now - seen).total_seconds() > LIVENESS_HORIZON_S:
            if info is not None:
                self.engine.nodes[(cluster, node)] = info
            return
        self.engine.observe_node(cluster, node, info, seen)

    async def on_undrained(self, env: Envelope, data: EventData) -> None:
        """An operator undrained a node (the scheduler's node.undrained): the incidents forget their drains there,
        so a later cause drains it again."""
        if not isinstance(data, NodeUndrained):
            return
        async with self._lock:
            await self._save(self.intake.undrained(data.cluster, data.node))

    async def on_event(self, env: Envelope, data: EventData) -> None:
        if isinstance(data, JobSubmitted):
            # The workload class of the job's GPUs while it runs (baselines per model and class), and whose
            # job it is (its failure alerts go to its team).
            owner = (data.team, data.project)
            self.engine.observe_job(data.job_id, data.workload_class, owner)
            await self.store.save_job_class(data.job_id, data.workload_class, owner)
            return
        await self._apply(self.engine.observe_event(data.event_name, data, self.rt.clock()))
        # A failed attempt may be retried: its job is remembered until it succeeds or is rejected.
        if (isinstance(data, JobFinished) and data.exit_code == 0) or isinstance(data, JobRejected):
            self.engine.forget_job(data.job_id)
            await self.store.forget_job_class(data.job_id)

    async def _apply(self, transitions: list[Transition]) -> None:
        changed = False
        for tr in transitions:
            change = self.firing.change(tr, self.rt.clock())
            if change is None:
                continue
            await self.store.save_alert(change)
            self.firing.commit(change)
            changed = True
            kind = "raised" if change.raised else "resolved"
            self.log.info(f"alert.{kind}", fingerprint=change.fingerprint, rule=change.alert.rule,
                          summary=change.alert.summary)
        if changed:
            await self.rt.publish_staged()

    # ---------------------------------------------------------------- alerts -> groups -> deliveries

    async def on_alert(self, env: Envelope, data: EventData) -> None:
        """Group an alert event (ours or another service's) and queue what is due."""
        if not isinstance(data, (AlertRaised, AlertResolved)):
            return
        async with self._lock:
            changes = self.intake.receive(data, self.rt.clock())
            await self._save(changes)
        if changes.drains:
            for out in changes.drains:
                self.log.warning("node.drain_requested", node=out.envelope.subject, subject=out.subject, rule=data.rule)
            await self.rt.publish_staged()

    async def _save(self, changes: Changes) -> None:
        deliveries = [d for n in changes.notifications for d in self.directory.plan(n)]
        await self.store.save_changes(changes, deliveries)
        if deliveries:
            self._wake.set()

    async def publish_alerts(self, events: list[tuple[str, AlertRaised | AlertResolved]]) -> None:
        """Alerts posted to /api/v2/alerts onto the ALERTS stream (the event id makes a re-sent alert a no-op);
        `alerting-notify` groups and routes them like every other alert event."""
        for event_id, data in events:
            subject = subjects.ALERT_RAISED if isinstance(data, AlertRaised) else subjects.ALERT_RESOLVED
            env = self.rt.envelope(data, subject=data.fingerprint, event_id=event_id, correlation_id=data.fingerprint)
            await self.rt.bus.publish_envelope(subject, env)

    def firing_alerts(self) -> list[AlertRaised]:
        """Every alert firing now, oldest first: our rules' and other sources' (billing's budgets, /api/v2)."""
        ours = self.firing.by_start()
        return sorted([*ours, *self.intake.others()], key=lambda a: (a.starts_at, a.fingerprint))

    async def acknowledge(self, fingerprint: str, by: str, comment: str) -> Ack | None:
        """Acknowledge a firing alert (ours or another source's); None when none fires with that fingerprint."""
        alert = self.firing.alerts.get(fingerprint) or next(
            (a for a in self.intake.others() if a.fingerprint == fingerprint), None)
        if alert is None:
            return None
        now = self.rt.clock()
        ack = Ack(by=by, comment=comment, at=now, starts_at=alert.starts_at)
        async with self._lock:
            changes = self.intake.acknowledge(fingerprint, ack, now)
            await self.store.save_ack(fingerprint, ack)
            await self._save(changes)
        return ack

    async def save_silence(self, silence: Silence) -> None:
        await self.store.save_silence(silence)
        self.intake.silences[silence.id] = silence

    def _muted(self, labels: dict[str, str], fingerprint: str, now: datetime) -> bool:
        silences, inhibited = self.intake.muted(labels, fingerprint, now)
        return bool(silences) or inhibited

    # ---------------------------------------------------------------- time-driven work

    async def tick_loop(self) -> None:
        last_expire = self.rt.clock()
        while True:
            await asyncio.sleep(self.settings.alerting_tick_s)
            now = self.rt.clock()
            await self._apply(self.engine.tick(now))
            due = self.intake.dispatcher.next_due()
            if due is not None and due <= now:
                async with self._lock:
                    await self._save(self.intake.flush(now))
            if (now - last_expire).total_seconds() > EXPIRE_INCIDENTS_EVERY_S:
                last_expire = now
                await self.store.forget_incidents(self.intake.correlator.expire(now))

    async def findings_loop(self) -> None:
        await asyncio.sleep(min(2.0, self.settings.alerting_findings_poll_s))
        while True:
            if self.engine.finding_rules:
                await self.poll_findings()
            await asyncio.sleep(self.settings.alerting_findings_poll_s)

    async def poll_findings(self) -> bool:
        """Fetch inventory's findings once and feed them to the cost guardians; False when inventory did not answer."""
        now = self.rt.clock()
        findings = await self.findings.fetch(now)
        if findings is None:
            return False  # keep what fires: an unreachable inventory is no reason to resolve (or raise) anything
        await self._apply(self.engine.observe_findings(findings, now))
        return True

    # ---------------------------------------------------------------- delivery

    async def delivery_loop(self) -> None:
        """Each receiver's due deliveries on a task of its own, in order: a slow or failing endpoint (its tries,
        its timeouts) holds up no other receiver."""
        busy: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                for name in [n for n, task in busy.items() if task.done()]:
                    busy.pop(name).result()  # a bug in a delivery surfaces here (and the loop is restarted)
                self._wake.clear()
                now = self.rt.clock()
                for name, ds in _by_receiver(await self.store.due(now)).items():
                    if name not in busy:  # a busy receiver's newer deliveries wait for its task to end
                        busy[name] = asyncio.create_task(self._deliver_in_order(ds), name=f"deliver:{name}")
                nxt = await self.store.next_due(after=now)
                wait = min(max(nxt - now.timestamp(), 0.01), 1.0) if nxt is not None else 1.0
                woken = asyncio.ensure_future(self._wake.wait())
                await asyncio.wait([woken, *busy.values()], timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
        finally:
            for task in busy.values():
                task.cancel()

    async def _deliver_in_order(self, deliveries: list[Delivery]) -> None:
        for d in sorted(deliveries, key=lambda d: (d.created_at, d.id)):
            await self.deliver(d)

    async def deliver(self, d: Delivery) -> None:
        """One delivery through the pipeline, then its outcome recorded (log) or the delivery queued again."""
        job, outcome = await self.pipeline.run(d, self.rt.clock())
        if isinstance(outcome, Finished):
            entry = record(job, outcome, self.rt.clock())
            await self.store.finish(entry)
            self.log.info("delivery." + outcome.status, receiver=d.receiver, delivery=d.id, attempts=d.attempts,
                          http_status=outcome.http_status, reason=outcome.reason)
        elif outcome.error is None:
            await self.store.postpone(d.id, outcome.at)
        else:
            await self.store.retry(d, outcome.at)
            self.log.warning("delivery.retry", receiver=d.receiver, delivery=d.id, attempt=d.attempts,
                             reason=outcome.error)

    async def _send(self, url: str, body: Body) -> int:
        return await post_json(self.http, url, body, self.rt.clock)


def _by_receiver(deliveries: list[Delivery]) -> dict[str, list[Delivery]]:
    out: dict[str, list[Delivery]] = {}
    for d in deliveries:
        out.setdefault(d.receiver, []).append(d)
    return out
