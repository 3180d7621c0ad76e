"""GPU quarantine: which GPUs take no new work, and when they may again. Pure (no I/O).

A GPU is quarantined for what its samples show (a fatal XID, `gpu_flags.FATAL_XIDS`; uncorrectable ECC
errors or a row-remap failure beyond those an operator accepted, `gpu_flags.ecc_errors`) or for going
missing (no sample for `missing_s` while its node heartbeats and sends telemetry). It takes work again once
it has reported healthy for `hold_s` without a break, or when an operator uncordons it. An operator's cordon
holds until the operator lifts it. A GPU on which a critical alert fires (alerting's alert.raised) is out until
the alert resolves, or an operator uncordons it; while one fires, nothing else hands it back. A node's drain and
undrain never touch any of this (an undrain with --force uncordons its GPUs out for alerts).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from whaleflux.shared import subjects
from whaleflux.shared.events import GpuCordonCause, GpuCordoned, GpuSample, GpuUncordoned
from whaleflux.shared.gpu_flags import ecc_errors, fatal_xids

from .records import GpuQuarantine
from .transitions import Announcement


@dataclass(frozen=True)
class QuarantinePolicy:
    # How long a GPU quarantined for a fault must report healthy before it takes work again.
    hold_s: float = 300.0
    # A GPU of a node that heartbeats and sends telemetry is missing after this long without a sample.
    missing_s: float = 30.0


@dataclass(frozen=True)
class Gpu:
    """Which GPU: its node and its place there."""

    cluster: str
    node: str
    uuid: str
    index: int


@dataclass(frozen=True)
class Problem:
    cause: GpuCordonCause
    reason: str


@dataclass(frozen=True)
class Step:
    """What a judgement changed: the record to keep (None: the GPU is free of quarantine) and the event to send."""

    record: GpuQuarantine | None
    event: Announcement | None = None


def sample_problem(sample: GpuSample, accepted_ecc: int = 0) -> Problem | None:
    """What in this sample quarantines the GPU, if anything."""
    xids = fatal_xids(sample)
    if xids:
        return Problem("xid", f"XID {', '.join(str(x) for x in xids)}")
    errors = ecc_errors(sample)
    if errors > accepted_ecc:
        return Problem("ecc", f"{errors} uncorrectable ECC error(s) or row-remap failure")
    return None


def missing_problem(last_sample: float | None, node_sampled: float | None, node_heard: float | None,
                    watching_since: float, now: float, policy: QuarantinePolicy) -> Problem | None:
    """A GPU is missing when its node is alive (heard within `missing_s`) and sends telemetry (a batch within
    `missing_s`) but no sample of this GPU came for `missing_s`; a GPU not sampled since we started watching
    counts from then. A node that sends no telemetry at all is not judged by it."""
    if node_heard is None or now - node_heard > policy.missing_s:
        return None
    if node_sampled is None or now - node_sampled > policy.missing_s:
        return None
    age = now - max(last_sample if last_sample is not None else watching_since, watching_since)
    if age <= policy.missing_s:
        return None
    return Problem("missing", f"no telemetry for {age:.0f} s while its node heartbeats")


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def cordoned(record: GpuQuarantine) -> Announcement:
    data = GpuCordoned(cluster=record.cluster, node=record.node, gpu_uuid=record.uuid, gpu_index=record.index,
                       cause=record.cause, reason=record.reason)
    return Announcement(subjects.gpu_cordoned(record.cluster, record.node), data,
                        f"cordoned-{record.uuid}-{_ms(record.since)}")


def uncordoned(record: GpuQuarantine, by: str, reason: str, accepted_ecc: int = 0) -> Announcement:
    data = GpuUncordoned(cluster=record.cluster, node=record.node, gpu_uuid=record.uuid, gpu_index=record.index,
                         by="operator" if by == "operator" else "scheduler", reason=reason,
                         accepted_ecc_errors=accepted_ecc)
    return Announcement(subjects.gpu_uncordoned(record.cluster, record.node), data,
                        f"uncordoned-{record.uuid}-{_ms(record.since)}")


def judge(current: GpuQuarantine | None, gpu: Gpu, problem: Problem | None, sampled_healthy: bool, now: datetime,
          policy: QuarantinePolicy) -> Step | None:
    """The GPU's quarantine after what was just seen of it (None: unchanged).

    `problem`: a fault seen now. `sampled_healthy`: a sample without a fault arrived now (a GPU that is
    merely not missing yet proves nothing). A new fault starts a quarantine (gpu.cordoned); a fault during
    one restarts its hold; healthy samples for `hold_s` end it (gpu.uncordoned). An operator's cordon is
    neither ended nor changed by samples.
    """
    if problem is not None:
        if current is None:
            record = GpuQuarantine(cluster=gpu.cluster, node=gpu.node, uuid=gpu.uuid, index=gpu.index,
                                   cause=problem.cause, reason=problem.reason, since=now)
            return Step(record, cordoned(record))
        if current.healthy_since is not None:
            return Step(current.model_copy(update={"healthy_since": None}))
        return None
    if current is None or current.cause in ("operator", "alert") or not sampled_healthy:
        return None
    healthy_since = current.healthy_since or now
    if now - healthy_since >= timedelta(seconds=policy.hold_s):
        if current.alerts:  # healthy samples, but a critical alert still fires: out for that now
            return Step(current.model_copy(update={"cause": "alert", "reason": alert_reason(current.alerts),
                                                   "healthy_since": None}))
        return Step(None, uncordoned(current, "scheduler", f"healthy for {policy.hold_s:g} s"))
    if current.healthy_since is None:
        return Step(current.model_copy(update={"healthy_since": now}))
    return None


def cordon(current: GpuQuarantine | None, gpu: Gpu, reason: str, now: datetime) -> Step | None:
    """An operator's cordon: it replaces a fault's quarantine (it holds until the operator lifts it)."""
    if current is not None and current.cause == "operator":
        return None
    record = GpuQuarantine(cluster=gpu.cluster, node=gpu.node, uuid=gpu.uuid, index=gpu.index, cause="operator",
                           reason=reason, since=now, alerts=current.alerts if current else {})
    return Step(record, cordoned(record))


def uncordon(current: GpuQuarantine | None, accepted_ecc: int) -> Step | None:
    """An operator lifts a cordon or a fault's quarantine; the ECC errors the GPU has now are accepted (only more
    quarantine it again). None: the GPU was not quarantined."""
    if current is None:
        return None
    return Step(None, uncordoned(current, "operator", "uncordoned by an operator", accepted_ecc))



def alert_reason(alerts: dict[str, str]) -> str:
    """"GPUTemperatureHigh firing": the rules of the critical alerts firing on a GPU."""
    return ", ".join(sorted(set(alerts.values()))) + " firing"


def alert_fired(current: GpuQuarantine | None, gpu: Gpu, fingerprint: str, rule: str, now: datetime) -> Step | None:
    """A critical alert fires on the GPU: out until it resolves (gpu.cordoned, cause "alert"). A GPU already out
    for something else stays out for that, and remembers the alert (None: nothing changed)."""
    if current is None:
        alerts = {fingerprint: rule}
        record = GpuQuarantine(cluster=gpu.cluster, node=gpu.node, uuid=gpu.uuid, index=gpu.index, cause="alert",
                               reason=alert_reason(alerts), since=now, alerts=alerts)
        return Step(record, cordoned(record))
    if current.alerts.get(fingerprint) == rule:
        return None
    alerts = {**current.alerts, fingerprint: rule}
    update: dict[str, object] = {"alerts": alerts}
    if current.cause == "alert":
        update["reason"] = alert_reason(alerts)
    return Step(current.model_copy(update=update))


def alert_ended(current: GpuQuarantine | None, fingerprint: str, rule: str) -> Step | None:
    """A critical alert on the GPU resolved: a GPU out for alerts alone takes work again once none fires
    (gpu.uncordoned). A quarantine rebuilt from history knows no fingerprints, only its reason (`alert_reason`):
    the resolution of a rule it names ends it."""
    if current is None:
        return None
    rebuilt = current.cause == "alert" and not current.alerts
    if fingerprint not in current.alerts and not (rebuilt and rule in current.reason.removesuffix(" firing")
                                                  .split(", ")):
        return None
    alerts = {k: v for k, v in current.alerts.items() if k != fingerprint}
    if current.cause != "alert":
        return Step(current.model_copy(update={"alerts": alerts}))
    if alerts:
        return Step(current.model_copy(update={"alerts": alerts, "reason": alert_reason(alerts)}))
    return Step(None, uncordoned(current, "scheduler", "its critical alert resolved"))
