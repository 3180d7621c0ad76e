"""The CloudEvents 1.0 envelope every event travels in, and its encoding."""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

from .clock import system_clock
from .event_data import EventData


def utcnow() -> datetime:
    """The wall clock: only for a caller that passes no `time` to `make_envelope` (give it your clock's)."""
    return system_clock()


# CloudEvents 1.0: extension attribute names are lowercase letters and digits (at most 20 advised);
# their values in the JSON format are strings, integers (signed 32-bit) or booleans.
_EXTENSION_NAME = re.compile(r"^[a-z0-9]{1,20}$")
_INT32 = 2**31
# `data` is JSON: application/json, or a `+json` type, with or without parameters.
_JSON_MEDIA_TYPE = re.compile(r"^application/([a-z0-9.+-]+\+)?json\s*(;.*)?$", re.IGNORECASE)


class Envelope(BaseModel):
    """CloudEvents 1.0 structured-mode envelope (JSON): its required and optional attributes, and extensions.

    `data` must be JSON (validated strictly against the event type's model by `decode`); `data_base64`
    is refused. Extension attributes (`traceparent`, `tracestate`, ...) are kept and travel on.
    """

    model_config = ConfigDict(extra="allow")
    # The bytes it was decoded from (`keep_wire`), in a slot of its own: a pydantic private attribute would
    # cost every decode a post-init hook, a third of decoding a job event (bench/RESULTS.md, issue 17).
    __slots__ = ("_wire",)
    specversion: Literal["1.0"]
    id: str = Field(min_length=1, max_length=128)
    source: str = Field(min_length=1, max_length=1024)
    type: str = Field(min_length=1, max_length=256)
    time: AwareDatetime
    subject: str | None = Field(None, min_length=1, max_length=1024)
    datacontenttype: str = Field("application/json", max_length=256)
    dataschema: str | None = Field(None, min_length=1, max_length=1024)
    # CloudEvents extension attribute: ties together the events of one flow (a job, an alert).
    correlationid: str | None = Field(None, max_length=256)
    data: dict[str, Any]

    @field_validator("datacontenttype")
    @classmethod
    def _json_content(cls, value: str) -> str:
        if not _JSON_MEDIA_TYPE.match(value):
            raise ValueError("must be application/json (parameters allowed): data is JSON")
        return value

    @model_validator(mode="after")
    def _extensions(self) -> Envelope:
        for name, value in (self.model_extra or {}).items():
            if name == "data_base64":
                raise ValueError("data_base64: binary data is not accepted, data must be JSON")
            if not _EXTENSION_NAME.match(name):
                raise ValueError(f"{name[:40]!r}: an extension attribute name is 1-20 lowercase letters or digits")
            if value is None or isinstance(value, bool) or (isinstance(value, str) and len(value) <= 4096):
                continue
            if not isinstance(value, int) or not -_INT32 <= value < _INT32:
                raise ValueError(f"{name}: an extension attribute is a string, a 32-bit integer or a boolean")
        return self

    def wire(self) -> bytes:
        """The event's bytes: exactly as received when it was decoded, else its encoding."""
        wire: bytes | None = getattr(self, "_wire", None)  # unset: made here, or a copy
        return wire if wire is not None else encode(self)


def keep_wire(envelope: Envelope, raw: bytes) -> None:
    """Remember the bytes `envelope` was decoded from (`Envelope.wire`)."""
    object.__setattr__(envelope, "_wire", raw)  # a slot, not a field: past pydantic's __setattr__


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
