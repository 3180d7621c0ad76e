"""The base of every event payload and the field types the event models share."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field

TYPE_PREFIX = "io.whaleflux."

NonNeg = Annotated[float, Field(ge=0)]
Percent = Annotated[float, Field(ge=0, le=100)]
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+$")]
# Names that become NATS subject tokens (cluster, node): no dots.
Token = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
# Short enough that derived event ids ("placed-<job>-<attempt>") fit the envelope's id.
JobId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]


class EventData(BaseModel):
    """Base of every event payload; subclasses set `event_name` and `version`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    event_name: ClassVar[str]
    version: ClassVar[int] = 1

    @classmethod
    def event_type(cls) -> str:
        return f"{TYPE_PREFIX}{cls.event_name}.v{cls.version}"

