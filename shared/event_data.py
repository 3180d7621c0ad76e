"""The base of every event payload and the field types the event models share.

Every event model and its parts refuse NaN and Infinity (`MODEL_CONFIG`), and every
integer is bounded (`Int`, `Count`, `Attempt`): a value Redis and JSON readers keep exactly.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field

TYPE_PREFIX = "io.whaleflux."
# The largest integer a JSON reader or a Lua number keeps exactly (2^53 - 1).
MAX_INT = 2**53 - 1
# Every event model and its nested models: no unknown fields, immutable, finite numbers only.
MODEL_CONFIG = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

Int = Annotated[int, Field(ge=-MAX_INT, le=MAX_INT)]
Count = Annotated[int, Field(ge=0, le=MAX_INT)]
Attempt = Annotated[int, Field(ge=1, le=1_000_000)]
NonNeg = Annotated[float, Field(ge=0)]
Percent = Annotated[float, Field(ge=0, le=100)]
# Names and job ids become file names on a node (a job's area, its logs): a first character that is not a dot
# keeps "." and ".." (and hidden files) out; no slash can appear.
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")]
# Names that become NATS subject tokens (cluster, node): no dots.
Token = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
# Short enough that derived event ids ("placed-<job>-<attempt>") fit the envelope's id.
JobId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")]
# A job's display name: printable text without a slash or a backslash, never "." or "..".
JobName = Annotated[str, Field(min_length=1, max_length=128,
                               pattern=r"^[^/\\\x00-\x1f\x7f]*[^/\\.\x00-\x1f\x7f][^/\\\x00-\x1f\x7f]*$")]
# Text that reaches a process or a file system (command words, paths, environment): no NUL byte.
OsText = Annotated[str, Field(max_length=65536, pattern=r"^[^\x00]*$")]


class EventData(BaseModel):
    """Base of every event payload; subclasses set `event_name` and `version`."""

    model_config = MODEL_CONFIG
    event_name: ClassVar[str]
    version: ClassVar[int] = 1

    @classmethod
    def event_type(cls) -> str:
        return f"{TYPE_PREFIX}{cls.event_name}.v{cls.version}"
