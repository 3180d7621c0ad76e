"""The CloudEvents 1.0 envelope every event travels in, and its encoding."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, PrivateAttr

from .clock import system_clock
from .event_data import EventData


def utcnow() -> datetime:
    """The wall clock: only for a caller that passes no `time` to `make_envelope` (give it your clock's)."""
    return system_clock()


class Envelope(BaseModel):
    """CloudEvents 1.0 structured-mode envelope (JSON)."""

    model_config = ConfigDict(extra="forbid")
    specversion: Literal["1.0"]
    id: str = Field(min_length=1, max_length=128)
    source: str = Field(min_length=1)
    type: str = Field(min_length=1)
    time: AwareDatetime
    subject: str | None = None
    datacontenttype: Literal["application/json"] = "application/json"
    # CloudEvents extension attribute: ties together the events of one flow (a job, an alert).
    correlationid: str | None = None
    data: dict[str, Any]
    _wire: bytes | None = PrivateAttr(default=None)  # the bytes it was decoded from

    def wire(self) -> bytes:
        """The event's bytes: exactly as received when it was decoded, else its encoding."""
        return self._wire if self._wire is not None else encode(self)


class InvalidEvent(Exception):
    """The bytes are not a valid WhaleFlux event; `reason` says why (no payload values)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def new_event_id() -> str:
    return uuid.uuid4().hex


def make_envelope(
    data: EventData,
    *,
    source: str,
    subject: str | None = None,
    event_id: str | None = None,
    correlation_id: str | None = None,
    time: datetime | None = None,
) -> Envelope:
    return Envelope(
        specversion="1.0",
        id=event_id or new_event_id(),
        source=source,
        type=data.event_type(),
        time=time or utcnow(),
        subject=subject,
        correlationid=correlation_id,
        data=data.model_dump(mode="json"),
    )


def encode(envelope: Envelope) -> bytes:
    return envelope.model_dump_json(exclude_none=True).encode()
