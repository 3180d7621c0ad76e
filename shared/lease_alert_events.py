"""Lease and alert events: lease.expiring, lease.expired, alert.raised, alert.resolved (see docs/events/)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import AwareDatetime, Field

from .event_data import MAX_INT, Count, EventData


class LeaseExpiring(EventData):
    event_name: ClassVar[str] = "lease.expiring"
    contract_id: str
    provider: str
    ends_at: AwareDatetime
    notice_deadline: AwareDatetime | None = None
    horizon_days: Count
    days_left: float
    gpu_count: Annotated[int, Field(ge=1, le=MAX_INT)]
    nodes: list[str]
    monthly_cost_usd: str = Field(pattern=r"^\d+(\.\d+)?$", description="decimal as a string")
    auto_renew: bool = False
    # Which deadline this horizon counts down to: the lease's end, or the last day to give notice.
    deadline: Literal["end", "notice"] = "end"
    notice_deadline_passed: bool = False
    gpu_models: list[str] = Field(default_factory=list)
    summary: str = ""


class LeaseExpired(EventData):
    """A lease reached its end date without a renewal being declared."""

    event_name: ClassVar[str] = "lease.expired"
    contract_id: str
    provider: str
    ended_at: AwareDatetime
    gpu_count: Annotated[int, Field(ge=1, le=MAX_INT)]
    nodes: list[str]
    gpu_models: list[str] = Field(default_factory=list)
    monthly_cost_usd: str = Field(pattern=r"^\d+(\.\d+)?$", description="decimal as a string")
    summary: str = ""


class AlertRaised(EventData):
    event_name: ClassVar[str] = "alert.raised"
    fingerprint: str
    rule: str
    severity: Literal["info", "warning", "critical"]
    category: Literal["health", "thermal", "cost", "capacity", "job"] = "health"
    summary: str
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    value: float | None = None
    starts_at: AwareDatetime
    # Added in v1 before release: Alertmanager's endsAt for an alert that must be re-sent to keep firing (one
    # posted to /api/v2/alerts): it resolves by itself at this time unless raised again with a later one.
    # None (every WhaleFlux rule's alert): it fires until its alert.resolved.
    ends_at: AwareDatetime | None = None


class AlertResolved(EventData):
    event_name: ClassVar[str] = "alert.resolved"
    fingerprint: str
    rule: str
    labels: dict[str, str]
    summary: str
    starts_at: AwareDatetime
    ends_at: AwareDatetime

