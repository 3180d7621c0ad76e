"""The JSON answers of billing's API, built from computed costs. Pure.

Money goes out as decimal strings (never floats), times as ISO 8601.
"""

from __future__ import annotations

import dataclasses
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from pydantic import BaseModel

from . import allocation as alloc
from .costing import Costed
from .metering import UsageRecord
from .ownership import from_ms, to_ms
from .pricing import MICRO

HOUR_MS = 3_600_000
ROUNDING = ("per job and rate segment to 1e-6 USD; each shown line its own amount to the cent (half-up); "
            "totals are sums of shown lines; rounding_usd: rows and idle lines rounded apart")


def plain(obj: Any) -> Any:
    """JSON-ready: Decimals as strings (never floats), datetimes ISO, dataclasses as dicts."""
    if isinstance(obj, Decimal):
        return format(obj, "f")
    if isinstance(obj, (datetime, date)):
        return obj.isoformat()
    if isinstance(obj, BaseModel):
        return plain(obj.model_dump())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [plain(v) for v in (sorted(obj) if isinstance(obj, set) else obj)]
    return obj


def costs_report(c: Costed, by: str, share_idle: bool, running: bool = False) -> dict[str, Any]:
    """`GET /v1/costs`: rows, idle lines, totals, where prices came from and the cloud rates in force."""
    sb = alloc.showback(c.cb, by, share_idle, running)
    rows = plain(sb.rows)
    # Utilization is measured live and not rebuilt by a replay: beside the rows, so rows stay a pure
    # function of the job stream and the prices.
    efficiency = {r["key"]: r.pop("efficiency_pct") for r in rows}
    book = c.book
    return {
        "by": by,
        "from": from_ms(c.cb.start_ms).isoformat(), "to": from_ms(c.cb.end_ms).isoformat(),
        "rows": rows,
        "efficiency_pct": efficiency,
        "idle": plain(sb.idle),
        "total_usd": plain(sb.allocated_usd),
        "totals": {"fleet_usd": plain(sb.fleet_usd), "allocated_usd": plain(sb.allocated_usd),
                   "idle_usd": plain(sb.idle_usd), "unshared_idle_usd": plain(sb.unshared_idle_usd),
                   "running_usd": plain(sb.running_usd), "rounding_usd": plain(sb.rounding_usd),
                   "share_idle": share_idle, "running_as_rows": running},
        "pricing": {"inventory": c.inputs.pricing, "pricebook": book.source, "notes": c.cb.notes,
                    "rounding": ROUNDING},
        "overlaps": [{"gpu": o.gpu, "charged": o.kept, "not_charged": o.dropped,
                      "from": from_ms(max(o.start_ms, c.cb.start_ms)).isoformat(),
                      "to": from_ms(min(o.end_ms, c.cb.end_ms)).isoformat()}
                     for o in c.overlaps if o.start_ms < c.cb.end_ms and o.end_ms > c.cb.start_ms],
        "rates": {e.model: {"usd_per_gpu_hour": plain(e.usd_per_gpu_hour), "source": e.source, "as_of": e.as_of,
                            "reference": e.reference}
                  for e in book.all_entries()[::-1] if e.ownership == "cloud"},
    }


def gpu_hour_rate(record: UsageRecord, c: Costed, power_usd: Decimal, gpu_ms: int) -> Decimal | None:
    """What the attempt's GPUs cost per GPU-hour: their fixed rate (price book and ownership terms) where the
    attempt started, plus the measured power charged per GPU-hour held. Taken from the prices, not from the
    rounded cost (a job of a tenth of a second costs a few micro-dollars: its cost / its time is noise).
    None when a GPU of it has no price."""
    at = to_ms(record.started_at)
    fixed = []
    for uuid in record.gpu_uuids:
        gc = c.gpus.get(uuid)
        if gc is None or not gc.segments:
            return None
        fixed.append(gc.segments[gc.find(at)].usd_per_ms * HOUR_MS)
    if not fixed:
        return None
    rate = sum(fixed, Decimal(0)) / len(fixed) + (power_usd * HOUR_MS / gpu_ms if gpu_ms else Decimal(0))
    return rate.quantize(Decimal("0.0001"))


def job_line(record: UsageRecord, c: Costed) -> dict[str, Any]:
    """One attempt of `GET /v1/costs/jobs/{id}`: its record with its cost over its whole allocation (`c`).

    A running attempt is costed up to now: its `gpu_seconds` and `cost_usd` so far, `so_far` true. The rate is
    what its GPUs cost per GPU-hour (`gpu_hour_rate`); null when they have no price ("no price" on every surface)."""
    jc = c.cb.jobs.get(record.key)
    usd = jc.usd if jc else Decimal(0)
    running = record.ended_at is None
    gpu_ms = jc.gpu_ms if jc else 0
    seconds = Decimal(gpu_ms) / 1000 if running else record.gpu_seconds
    rate = gpu_hour_rate(record, c, jc.power_usd if jc else Decimal(0), gpu_ms)
    return {**record.model_dump(mode="json"), "gpu_seconds": plain(seconds.quantize(Decimal("0.001"))),
            "cost_usd": plain(usd.quantize(MICRO)), "fixed_usd": plain(jc.fixed_usd if jc else Decimal(0)),
            "power_usd": plain(jc.power_usd if jc else Decimal(0)), "usd_per_gpu_hour": plain(rate),
            "so_far": running,
            "efficiency_pct": None if not jc or jc.util_mean is None else round(jc.util_mean, 1)}
