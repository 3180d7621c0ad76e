"""Hourly rollups per GPU and per pool: allocated fraction and mean utilization while allocated. No I/O.

Allocation time comes from the scheduler's job events (placed at the
`job.placed` envelope time, released at `finished_at` / `failed_at`), summed
as exact timedeltas so a day of allocations adds up to the microsecond.
Utilization comes from telemetry samples, accumulated per GPU and hour as
sums and counts (split by whether the GPU was allocated at the sample time).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class Allocation:
    """GPUs held by one job attempt from `start` until `end` (None: still held)."""

    key: str
    gpu_uuids: tuple[str, ...]
    start: datetime
    end: datetime | None = None


@dataclass
class UtilSums:
    """Telemetry of one GPU in one hour: utilization sums and sample counts."""

    allocated_sum: float = 0.0
    allocated_n: int = 0
    total_sum: float = 0.0
    total_n: int = 0

    def add(self, other: UtilSums) -> None:
        self.allocated_sum += other.allocated_sum
        self.allocated_n += other.allocated_n
        self.total_sum += other.total_sum
        self.total_n += other.total_n


@dataclass(frozen=True)
class HourRow:
    key: str  # GPU uuid or pool name
    hour: datetime
    gpus: int
    allocated_s: float
    allocated_fraction: float
    mean_util_allocated: float | None  # percent; None when no sample fell in an allocation
    mean_util: float | None


def hour_floor(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def allocated_time(
    allocs: list[Allocation], start: datetime, end: datetime, now: datetime
) -> dict[tuple[str, datetime], timedelta]:
    """Allocated time per (GPU, hour) within [start, end), open allocations counted up to `now`."""
    out: dict[tuple[str, datetime], timedelta] = defaultdict(timedelta)
    for a in allocs:
        s, e = max(a.start, start), min(a.end or now, end, now)
        while s < e:
            hour = hour_floor(s)
            piece_end = min(hour + HOUR, e)
            for gpu in a.gpu_uuids:
                out[(gpu, hour)] += piece_end - s
            s = piece_end
    return out


def rollup(
    groups: dict[str, str],
    allocs: list[Allocation],
    util: dict[tuple[str, datetime], UtilSums],
    start: datetime,
    end: datetime,
    now: datetime,
) -> list[HourRow]:
    """Rows per (group, hour) for hours overlapping [start, min(end, now)); `groups` maps GPU uuid -> group key."""
    stop = min(end, now)
    members: dict[str, int] = defaultdict(int)
    for key in groups.values():
        members[key] += 1
    alloc = allocated_time([a for a in allocs], start, stop, now)
    rows = []
    hour = hour_floor(start)
    while hour < stop:
        span = (min(hour + HOUR, stop) - max(hour, start)).total_seconds()
        held: dict[str, timedelta] = defaultdict(timedelta)
        sums: dict[str, UtilSums] = defaultdict(UtilSums)
        for gpu, key in groups.items():
            held[key] += alloc.get((gpu, hour), timedelta(0))
            if (gpu, hour) in util:
                sums[key].add(util[(gpu, hour)])
        for key in sorted(members):
            s = sums.get(key, UtilSums())
            secs = held[key].total_seconds()
            rows.append(
                HourRow(
                    key=key, hour=hour, gpus=members[key], allocated_s=secs,
                    allocated_fraction=secs / (members[key] * span) if span > 0 else 0.0,
                    mean_util_allocated=s.allocated_sum / s.allocated_n if s.allocated_n else None,
                    mean_util=s.total_sum / s.total_n if s.total_n else None,
                )
            )
        hour += HOUR
    return rows


def last_active(allocs: list[Allocation], now: datetime) -> dict[str, datetime]:
    """When each GPU was last allocated (`now` while it still is)."""
    out: dict[str, datetime] = {}
    for a in allocs:
        t = a.end or now
        for gpu in a.gpu_uuids:
            if gpu not in out or t > out[gpu]:
                out[gpu] = t
    return out


def sample_sums(samples: list[tuple[str, float]], allocated: set[str]) -> dict[str, UtilSums]:
    """Fold one telemetry batch ((uuid, utilization %) pairs) into per-GPU sums."""
    out = {}
    for uuid, pct in samples:
        held = uuid in allocated
        out[uuid] = UtilSums(pct if held else 0.0, 1 if held else 0, pct, 1)
    return out
