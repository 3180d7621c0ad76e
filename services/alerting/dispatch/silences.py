"""Silences: mute alerts whose labels match, between a start and an end."""

from __future__ import annotations

from datetime import datetime

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

from .matchers import Matcher, matches_all, parse_matchers


class Silence(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    matchers: list[str] = Field(min_length=1, description="Alertmanager matchers, e.g. Hostname=\"h100-01\"")
    starts_at: AwareDatetime
    ends_at: AwareDatetime
    created_by: str = Field(min_length=1, max_length=128)
    comment: str = Field(min_length=1, max_length=1000)
    expired_at: AwareDatetime | None = None

    @field_validator("matchers")
    @classmethod
    def _parse(cls, value: list[str]) -> list[str]:
        parse_matchers(value)
        return value

    @model_validator(mode="after")
    def _order(self) -> Silence:
        if self.ends_at <= self.starts_at:
            raise ValueError("ends_at: must be after starts_at")
        return self

    def parsed(self) -> list[Matcher]:
        return parse_matchers(self.matchers)

    def active(self, now: datetime) -> bool:
        end = min(self.ends_at, self.expired_at) if self.expired_at else self.ends_at
        return self.starts_at <= now < end

    def state(self, now: datetime) -> str:
        if self.active(now):
            return "active"
        return "pending" if now < self.starts_at else "expired"


def silenced_by(labels: dict[str, str], silences: list[Silence], now: datetime) -> list[str]:
    """Ids of the active silences that mute an alert with these labels."""
    return [s.id for s in silences if s.active(now) and matches_all(s.parsed(), labels)]
