"""Event contracts: one CloudEvents 1.0 envelope and a typed, versioned model per event.

The envelope's `type` is `io.whaleflux.<name>.v<version>`; its `data` is validated
against the model registered for that type. Breaking a model means adding a new
version, never changing an existing one.

The models live by kind (`fleet_events`, `job_events`, `lease_alert_events`), the
envelope in `envelope`, decoding in `event_codec`; this module is where every
service imports them from.
"""

from __future__ import annotations

from .envelope import Envelope, InvalidEvent, encode, make_envelope, new_event_id, utcnow
from .event_codec import EVENT_MODELS, REGISTRY, decode, decode_typed, misaddressed
from .event_data import TYPE_PREFIX, EventData, JobId, Name, NonNeg, Percent, Token
from .fleet_events import (
    AttemptReport,
    GpuCheck,
    GpuCordonCause,
    GpuCordoned,
    GpuIdentity,
    GpuProcess,
    GpuReportCard,
    GpuSample,
    GpuTelemetry,
    GpuUncordoned,
    GpuValidated,
    NodeDrainRequested,
    NodeHeartbeat,
    NodeRegistered,
    NodeUndrained,
)
from .job_events import (
    JobCancelled,
    JobFailed,
    JobFinished,
    JobPlaced,
    JobPreempted,
    JobRejected,
    JobRequeued,
    JobStarted,
    JobSubmitted,
)
from .lease_alert_events import AlertRaised, AlertResolved, LeaseExpired, LeaseExpiring

__all__ = [
    "EVENT_MODELS", "REGISTRY", "TYPE_PREFIX", "AlertRaised", "AlertResolved", "AttemptReport", "Envelope",
    "EventData", "GpuCheck", "GpuCordonCause", "GpuCordoned", "GpuIdentity", "GpuProcess", "GpuReportCard",
    "GpuSample", "GpuTelemetry", "GpuUncordoned", "GpuValidated", "InvalidEvent", "JobCancelled", "JobFailed",
    "JobFinished", "JobId", "JobPlaced", "JobPreempted", "JobRejected", "JobRequeued", "JobStarted", "JobSubmitted",
    "LeaseExpired", "LeaseExpiring", "Name", "NodeDrainRequested", "NodeHeartbeat", "NodeRegistered",
    "NodeUndrained", "NonNeg", "Percent", "Token", "decode", "decode_typed", "encode", "make_envelope",
    "misaddressed", "new_event_id", "utcnow",
]
