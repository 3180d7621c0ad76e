"""Decoding events: bytes -> a valid envelope and its typed data, or InvalidEvent naming the field.

Every event model is registered here by its type (`io.whaleflux.<name>.v<version>`).
"""

from __future__ import annotations

import functools
import json
import operator
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError, create_model

from .envelope import Envelope, InvalidEvent, keep_wire
from .event_data import EventData
from .fleet_events import (
    GpuCordoned,
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
from .subjects import node_mismatch, team_mismatch

EVENT_MODELS: tuple[type[EventData], ...] = (
    GpuTelemetry,
    NodeRegistered,
    NodeHeartbeat,
    NodeDrainRequested,
    NodeUndrained,
    GpuValidated,
    GpuCordoned,
    GpuUncordoned,
    JobSubmitted,
    JobPlaced,
    JobStarted,
    JobFinished,
    JobFailed,
    JobRejected,
    JobPreempted,
    JobRequeued,
    JobCancelled,
    LeaseExpiring,
    LeaseExpired,
    AlertRaised,
    AlertResolved,
)
REGISTRY: dict[str, type[EventData]] = {m.event_type(): m for m in EVENT_MODELS}

_ENVELOPE_FIELDS = tuple(n for n in Envelope.model_fields if n != "data")


def _typed_envelopes() -> TypeAdapter[Envelope]:
    """One envelope model per event type with `data` typed, joined in a union tagged by `type`: a valid event
    is parsed and validated from its bytes in one pydantic pass, about twice as fast as json.loads + envelope +
    data (see bench/RESULTS.md, Telemetry)."""
    models: list[Any] = []
    for event_type, model in REGISTRY.items():
        tag: Any = Literal[event_type]
        models.append(create_model(f"{model.__name__}Envelope", __base__=Envelope, type=(tag, ...),
                                   data=(model, ...)))
    union: Any = functools.reduce(operator.or_, models)
    tagged: Any = Annotated[union, Field(discriminator="type")]
    return TypeAdapter(tagged)


_TYPED_ENVELOPES = _typed_envelopes()


def decode(raw: bytes) -> tuple[Envelope, EventData]:
    """Parse and validate an event; raise InvalidEvent with a reason naming the field."""
    typed, data = decode_typed(raw)
    if type(typed) is Envelope:
        return typed, data
    env = Envelope.model_construct(
        **{n: getattr(typed, n) for n in _ENVELOPE_FIELDS},
        **(typed.model_extra or {}),  # extension attributes travel on
        data=data.model_dump(mode="json", exclude_none=True),  # as encode() puts it on the wire
    )
    keep_wire(env, raw)
    return env, data


def decode_typed(raw: bytes) -> tuple[Envelope, EventData]:
    """Like `decode`, but the envelope's `data` is the validated model itself, not a dict.

    For high-rate consumers (bus batch mode): turning the model back into a dict
    costs as much as validating it. The envelope is an Envelope subclass.
    """
    try:
        typed = _TYPED_ENVELOPES.validate_json(raw)
    except ValidationError:
        # Invalid somewhere: the step-by-step path below names the problem the
        # way it always has (not JSON / envelope / unknown type / data field).
        return _decode_stepwise(raw)
    keep_wire(typed, raw)
    data: EventData = getattr(typed, "data")  # noqa: B009 - a typed envelope's data is the model, not a dict
    return typed, data


def misaddressed(subject: str, data: EventData) -> None:
    """Raise InvalidEvent if the event names another node or team than its subject does: NATS lets a node's
    identity publish only its own nodes' subjects and a submitter's only its teams' submissions, and this keeps
    them from reporting about other nodes, or submitting for other teams, in the data."""
    why = (node_mismatch(subject, getattr(data, "cluster", None), getattr(data, "node", None))
           or team_mismatch(subject, getattr(data, "team", None)))
    if why is not None:
        raise InvalidEvent(why)


def _decode_stepwise(raw: bytes) -> tuple[Envelope, EventData]:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidEvent(f"not JSON: {exc.msg if hasattr(exc, 'msg') else exc}") from None
    except RecursionError:
        raise InvalidEvent("not JSON: nested too deeply") from None
    try:
        env = Envelope.model_validate(doc)
    except ValidationError as exc:
        raise InvalidEvent("envelope: " + _describe(exc)) from None
    model = REGISTRY.get(env.type)
    if model is None:
        raise InvalidEvent(f"unknown event type or version {env.type!r}")
    try:
        data = model.model_validate(env.data)
    except ValidationError as exc:
        raise InvalidEvent(f"{env.type}: " + _describe(exc)) from None
    return env, data


def _describe(exc: ValidationError) -> str:
    """Name each bad field and what is wrong with it, without echoing its value."""
    parts = []
    for err in exc.errors(include_url=False, include_input=False)[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)
