"""Is this node batch to be stored, retried later or refused, and why? No I/O.

Checked in this order: a sample time too far from now is refused; a node that
has not registered its GPUs yet is retried (the registration may still be in
flight); a GPU the node did not register is refused; then the batch is judged
against the node's last stored one (`judge`).

An agent numbers its batches per node from 1 each time it starts, so a
sequence number lower than the last one is not by itself an error: if the
sample time is newer than the last stored one, the agent restarted. A batch
whose sequence number and sample time are both not newer than what is stored
is a duplicate (same seq) or arrived out of order.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum

from whaleflux.shared.events import GpuTelemetry

REGISTRATION_RETRY_S = 1.0


class Verdict(str, Enum):
    NEW = "new"
    RESTART = "seq_reset"
    DUPLICATE = "duplicate_seq"
    OUT_OF_ORDER = "out_of_order"


@dataclass(frozen=True)
class Last:
    """A node's last stored batch: its sequence number and sample time (epoch seconds)."""

    seq: int
    t: float


def judge(last: Last | None, seq: int, t: float) -> Verdict:
    """Classify a batch with (`seq`, sample time `t`) given the node's last stored one."""
    if last is None or seq > last.seq and t >= last.t:
        return Verdict.NEW
    if t > last.t:
        return Verdict.RESTART if seq <= last.seq else Verdict.NEW
    return Verdict.DUPLICATE if seq == last.seq else Verdict.OUT_OF_ORDER


@dataclass(frozen=True)
class Refused:
    """Not stored: dead-lettered with `reason`, or retried after `retry_s` when that is set."""

    reason: str
    retry_s: float | None = None
    flagged: Verdict | None = None  # counted in whaleflux_telemetry_batches_flagged_total


def admit(
    data: GpuTelemetry, known: set[str], last: Last | None, now: datetime, max_skew_s: float
) -> Verdict | Refused:
    """NEW or RESTART for a batch to store (RESTART is counted), else why it is not stored."""
    skew = abs(data.sample_time - now)
    if skew > timedelta(seconds=max_skew_s):
        return Refused(f"sample_time is {skew.total_seconds():.0f}s away from now (limit {max_skew_s:.0f}s)")
    if not known:
        return Refused(f"node {data.cluster}/{data.node} has not registered its GPUs", retry_s=REGISTRATION_RETRY_S)
    unknown = [g.uuid for g in data.gpus if g.uuid not in known]
    if unknown:
        return Refused(f"unknown GPU uuid(s) for node {data.cluster}/{data.node}: {', '.join(unknown[:4])}")
    verdict = judge(last, data.seq, data.sample_time.timestamp())
    if last is not None and verdict in (Verdict.DUPLICATE, Verdict.OUT_OF_ORDER):
        stored = datetime.fromtimestamp(last.t, UTC).isoformat()
        return Refused(
            f"{verdict.value}: seq {data.seq} sampled {data.sample_time.isoformat()} from {data.cluster}/{data.node}, "
            f"but seq {last.seq} sampled {stored} is already stored",
            flagged=verdict,
        )
    return verdict


def gone_and_back(present: set[str], known: set[str], gone: set[str]) -> tuple[set[str], set[str]]:
    """GPUs of the node that just vanished from its batches, and gone GPUs that are back in this one."""
    return known - present - gone, present & gone
