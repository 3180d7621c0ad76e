"""What the console reads from the other services' HTTP APIs, typed.

Tolerant readers: only the fields a page shows, unknown fields ignored, so a service may add
fields without breaking the console. GPU samples reuse the event contract itself; the scheduler's job records
are its own response models (`shared.contracts.jobs`), one source for the API and the console.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from whaleflux.shared.events import GpuSample


class Read(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


# --------------------------------------------------------------------------- telemetry


class GpuJob(Read):
    job_id: str
    name: str | None = None
    team: str | None = None
    project: str | None = None


class GpuRow(Read):
    """One GPU's latest sample as telemetry's /v1/gpus serves it."""

    cluster: str
    node: str
    sample_time: datetime
    gpu: GpuSample
    age_s: float
    stale: bool
    flags: list[str] = Field(default_factory=list)
    last_xid: int | None = None
    job: GpuJob | None = None

    @property
    def temp_ratio(self) -> float | None:
        """Temperature as a share of the slowdown limit: 1.0 is where the GPU starts to throttle."""
        limit = self.gpu.slowdown_temperature_c
        return self.gpu.temperature_c / limit if limit else None

    @property
    def memory_pct(self) -> float:
        return 100.0 * self.gpu.memory_used_mib / self.gpu.memory_total_mib


class FleetSummary(Read):
    gpus: int
    nodes: int
    power_w: float
    stale: int
    hot: int
    throttled: int
    erroring: int
    with_job: int = 0
    health: str = "unknown"  # shared/fleet_health.py: `unknown` with no fresh sample, never `healthy`


class HistoryPoint(Read):
    t: float
    util: float | None = None
    mem_mib: float | None = None
    temp_c: float | None = None
    power_w: float | None = None


class GpuHistory(Read):
    uuid: str
    resolution: str
    points: list[dict[str, Any]]


# --------------------------------------------------------------------------- scheduler


class NodeStatus(Read):
    node: str
    cluster: str
    model: str | None = None
    gpus: int
    free: int  # as `gpus list` counts them: not allocated, not quarantined, its node taking work
    draining: int = 0  # not allocated, not quarantined, on a node that drains
    quarantined: list[int] = []  # the indices of its quarantined GPUs
    status: str
    reason: str | None = None
    heartbeat_age_s: float | None = None


# The scheduler's job records (`/v1/jobs`, `/v1/jobs/{id}`, `/v1/jobs/{id}/why`) are read with its own
# response models, from the one source both use: `shared.contracts.jobs` (JobRecord, JobPart, JobWhy).


# --------------------------------------------------------------------------- alerting


class Ack(Read):
    by: str
    comment: str = ""
    at: datetime | None = None


class Alert(Read):
    fingerprint: str
    rule: str
    severity: str
    category: str = "health"
    summary: str
    labels: dict[str, str] = Field(default_factory=dict)
    starts_at: datetime
    incident: str | None = None
    acknowledged: Ack | None = None
    silenced_by: list[str] = Field(default_factory=list)
    inhibited: bool = False

    def silence_matchers(self) -> list[str]:
        """What a silence for this alert matches by default: this rule on this GPU (or node)."""
        matchers = [f'alertname="{self.rule}"']
        for key in ("UUID", "Hostname"):
            if key in self.labels:
                matchers.append(f'{key}="{self.labels[key]}"')
                break
        return matchers


class Incident(Read):
    id: str
    title: str
    correlation: str | None = None
    opened_at: datetime | None = None
    last_at: datetime | None = None
    firing: int = 0
    members: int = 0
    open: bool = True
    drained_nodes: list[str] = Field(default_factory=list)


class Silence(Read):
    id: str
    matchers: list[str]
    starts_at: datetime
    ends_at: datetime
    created_by: str
    comment: str
    state: str


class NotificationRow(Read):
    delivery_id: str
    receiver: str
    status: str
    notification_status: str | None = None
    title: str = ""
    attempts: int = 0
    http_status: int | None = None
    reason: str | None = None
    last_error: str | None = None
    created_at: datetime | None = None
    latency_ms: float | None = None


# --------------------------------------------------------------------------- billing


class CostRow(Read):
    key: str
    jobs: int
    gpu_hours: str
    cost_usd: str
    idle_share_usd: str = "0"
    total_usd: str


class IdleLine(Read):
    pool: str
    model: str
    ownership: str
    gpus: int
    fleet_usd: str
    allocated_usd: str
    idle_usd: str
    idle_pct: float | None = None


class CostReport(Read):
    by: str
    from_: datetime = Field(alias="from")
    to: datetime
    rows: list[CostRow]
    efficiency_pct: dict[str, float | None] = Field(default_factory=dict)
    idle: list[IdleLine] = Field(default_factory=list)
    totals: dict[str, Any] = Field(default_factory=dict)
    total_usd: str
    pricing: dict[str, Any] = Field(default_factory=dict)


class AttemptCost(Read):
    attempt: int
    gpu_model: str | None = None
    gpus: int = 1
    node: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    state: str
    gpu_seconds: str
    cost_usd: str
    usd_per_gpu_hour: str | None = None
    so_far: bool = False  # still running: its cost up to now


class BudgetTerms(Read):
    scope: str
    name: str = "all"
    amount_usd: str


class Budget(Read):
    """A budget's month so far: spend, the two projections to the month's end, last week against its forecast."""

    budget: BudgetTerms
    period_end: datetime | None = None
    spend_to_date: str
    projected_burn: str
    projected_trend: str
    projected_pct: float
    last_week_usd: str | None = None
    last_week_forecast_usd: str | None = None

    @property
    def spent_pct(self) -> float:
        return 100.0 * float(self.spend_to_date) / float(self.budget.amount_usd)


class TcoMonth(Read):
    month: int
    own_usd: str | None = None
    lease_usd: str | None = None
    cloud_usd: str | None = None


class Tco(Read):
    months: list[TcoMonth]
    break_even_vs_cloud: int | None = None
    break_even_vs_lease: int | None = None
    cheapest: str | None = None
    assumptions: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------- inventory


class InventoryGroup(Read):
    key: str
    gpus: int
    active: int
    missing: int
    allocated: int
    mean_util_allocated: float | None = None


class Lease(Read):
    contract_id: str
    provider: str | None = None
    state: str
    ends_at: datetime | None = None
    days_left: float | None = None
    notice_deadline: datetime | None = None
    notice_days_left: float | None = None
    auto_renew: bool = False
    gpu_count: int = 0
    nodes: list[str] = Field(default_factory=list)
    gpu_models: list[str] = Field(default_factory=list)
    monthly_cost_usd: str | None = None


class Finding(Read):
    kind: str
    severity: str
    summary: str
    monthly_usd: str | None = None
    gpus: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------- sizing (scheduler's POST /v1/size)


class MemoryItem(Read):
    label: str
    bytes: int
    counted: bool = True
    note: str = ""


class SizingOption(Read):
    gpu: str
    count: int
    split: str
    per_gpu_bytes: int
    capacity_bytes: int
    budget_bytes: int | None = None  # what the stack may use of it (vLLM: gpu_memory_utilization); "fits" within it
    tokens_per_s: float | None = None
    seconds: float | None = None
    cost_usd: float | None = None
    usd_per_hour: float | None = None
    usd_per_million_tokens: float | None = None
    best_split: bool = True
    time_rank: int | None = None


class SizingReport(Read):
    summary: str
    workload: dict[str, Any] = Field(default_factory=dict)
    memory: list[MemoryItem] = Field(default_factory=list)
    memory_total_bytes: int = 0
    options: list[SizingOption] = Field(default_factory=list)
    per_gpu_model: list[str] = Field(default_factory=list)
    assumptions: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
