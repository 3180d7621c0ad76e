"""Billing service: meters GPU-seconds per job attempt from the job lifecycle and prices them.

Exactly once by construction: every write is keyed by (job, attempt) and is a
pure function of the events, so a redelivered or replayed event rewrites the
same values and totals never count a charge twice.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from decimal import Decimal
from typing import Literal

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from whaleflux.shared.bus import Retry
from whaleflux.shared.events import Envelope, JobFailed, JobFinished, JobPlaced
from whaleflux.shared.service import ServiceBase, run_service
from whaleflux.shared.settings import CommonSettings

from .pricing import REFERENCE_RATES, Rate, cost, gpu_seconds, to_cents


class BillingSettings(CommonSettings):
    http_port: int = 8704


class UsageRecord(BaseModel):
    job_id: str
    attempt: int
    team: str
    project: str
    gpu_model: str
    gpus: int
    node: str
    started_at: datetime
    ended_at: datetime
    gpu_seconds: Decimal
    usd_per_gpu_hour: Decimal
    cost_usd: Decimal


class CostRow(BaseModel):
    key: str
    jobs: int
    gpu_hours: Decimal
    cost_usd: Decimal


def aggregate(records: list[UsageRecord], by: str) -> list[CostRow]:
    """Sum usage by job, team, project or model; costs shown to the cent."""
    seconds: dict[str, Decimal] = defaultdict(Decimal)
    money: dict[str, Decimal] = defaultdict(Decimal)
    jobs: dict[str, set[str]] = defaultdict(set)
    for r in records:
        key = {"job": r.job_id, "team": r.team, "project": r.project, "model": r.gpu_model}[by]
        seconds[key] += r.gpu_seconds
        money[key] += r.cost_usd
        jobs[key].add(r.job_id)
    rows = [
        CostRow(key=k, jobs=len(jobs[k]), gpu_hours=(seconds[k] / 3600).quantize(Decimal("0.0001")), cost_usd=to_cents(money[k]))
        for k in seconds
    ]
    return sorted(rows, key=lambda r: (-r.cost_usd, r.key))


class BillingService(ServiceBase):
    name = "billing"

    def __init__(self, settings: BillingSettings, rates: dict[str, Rate] | None = None, **kw):
        super().__init__(settings, **kw)
        self.rates = rates or REFERENCE_RATES

    def consumers(self):
        return {"billing-jobs": self.on_job_event}

    def _alloc_key(self, job_id: str, attempt: int) -> str:
        return f"{self.prefix}:alloc:{job_id}:{attempt}"

    async def on_job_event(self, env: Envelope, data) -> None:
        if isinstance(data, JobPlaced):
            await self.redis.set(self._alloc_key(data.job_id, data.attempt), data.model_dump_json())
        elif isinstance(data, JobFinished):
            await self._charge(data.job_id, data.attempt, data.started_at, data.finished_at)
        elif isinstance(data, JobFailed) and data.started_at is not None:
            await self._charge(data.job_id, data.attempt, data.started_at, data.failed_at)

    async def _charge(self, job_id: str, attempt: int, started: datetime, ended: datetime) -> None:
        raw = await self.redis.get(self._alloc_key(job_id, attempt))
        if raw is None:
            raise Retry(f"no placement recorded for job {job_id} attempt {attempt}")
        placed = JobPlaced.model_validate_json(raw)
        rate = self.rates.get(placed.gpu_model)
        if rate is None:
            raise Retry(f"no price for GPU model {placed.gpu_model}")
        secs = gpu_seconds(started, ended, len(placed.gpu_uuids))
        record = UsageRecord(
            job_id=job_id,
            attempt=attempt,
            team=placed.team,
            project=placed.project,
            gpu_model=placed.gpu_model,
            gpus=len(placed.gpu_uuids),
            node=placed.node,
            started_at=started,
            ended_at=ended,
            gpu_seconds=secs,
            usd_per_gpu_hour=rate.usd_per_gpu_hour,
            cost_usd=cost(secs, rate),
        )
        await self.redis.hset(f"{self.prefix}:usage", f"{job_id}:{attempt}", record.model_dump_json())
        self.log.debug("usage.recorded", job_id=job_id, attempt=attempt, gpu_seconds=str(secs), cost_usd=str(record.cost_usd))

    async def usage(self) -> list[UsageRecord]:
        raw = await self.redis.hgetall(f"{self.prefix}:usage")
        return [UsageRecord.model_validate_json(v) for v in raw.values()]

    def add_routes(self, app: FastAPI, admin) -> None:
        @app.get("/v1/costs", tags=["costs"])
        async def costs(by: Literal["job", "team", "project", "model"] = "team") -> dict:
            """Metered GPU-hours and cost, grouped; `rates` says where prices come from."""
            records = await self.usage()
            return {
                "by": by,
                "rows": aggregate(records, by),
                "total_usd": to_cents(sum((r.cost_usd for r in records), Decimal(0))),
                "rates": {k: {"usd_per_gpu_hour": v.usd_per_gpu_hour, "source": v.source, "as_of": v.as_of} for k, v in self.rates.items()},
            }

        @app.get("/v1/costs/jobs/{job_id}", tags=["costs"])
        async def job_cost(job_id: str) -> list[UsageRecord]:
            """Every metered attempt of one job."""
            records = [r for r in await self.usage() if r.job_id == job_id]
            if not records:
                raise HTTPException(404, f"no usage recorded for job {job_id!r}")
            return sorted(records, key=lambda r: r.attempt)


def main() -> None:
    run_service(BillingService(BillingSettings()))
