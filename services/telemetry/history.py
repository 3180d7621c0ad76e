"""GPU history points, their compact stored form, and the minute rollup. No I/O.

Raw points are kept per GPU for `raw_retention_s` (at the agents' interval,
1 s by default); beyond that, one rollup per GPU per minute holds the mean and
peak of each gauge and the energy counter at the minute's first and last point.
`rollup()` defines it; the store script (store.py) computes the same in Redis
as samples are stored, each node's minutes at their own offset after the minute.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from math import isfinite

from whaleflux.shared.events import GpuSample


def _num(x: float | None) -> str:
    """A number as json.dumps writes it (repr for finite floats)."""
    if x is None:
        return "null"
    return repr(x) if isfinite(x) else json.dumps(x)


@dataclass(frozen=True)
class Point:
    """One GPU at one instant, as history keeps it."""

    t: float  # epoch seconds
    util: float
    mem_mib: float
    temp_c: float
    power_w: float | None
    energy_j: float | None
    sm_clock_mhz: float | None

    @classmethod
    def of(cls, t: float, s: GpuSample) -> Point:
        return cls(t, s.utilization_gpu_pct, s.memory_used_mib, s.temperature_c, s.power_w, s.energy_j, s.sm_clock_mhz)

    def encode(self) -> str:
        """Compact JSON list; the timestamp makes each stored member unique."""
        fields = [self.t, self.util, self.mem_mib, self.temp_c, self.power_w, self.energy_j, self.sm_clock_mhz]
        return json.dumps(fields, separators=(",", ":"))

    @staticmethod
    def encode_sample(t: float, s: GpuSample) -> str:
        """Exactly `Point.of(t, s).encode()`, at a third of the cost (the ingest path runs this per GPU)."""
        return f"[{_num(t)},{_num(s.utilization_gpu_pct)},{_num(s.memory_used_mib)},{_num(s.temperature_c)}," \
               f"{_num(s.power_w)},{_num(s.energy_j)},{_num(s.sm_clock_mhz)}]"

    @classmethod
    def decode(cls, raw: str) -> Point:
        return cls(*json.loads(raw))

    def as_dict(self) -> dict[str, float | None]:
        return {"t": self.t, "util": self.util, "mem_mib": self.mem_mib, "temp_c": self.temp_c,
                "power_w": self.power_w, "energy_j": self.energy_j, "sm_clock_mhz": self.sm_clock_mhz}


@dataclass(frozen=True)
class Rollup:
    """Aggregate of the raw points of one GPU in [t, t + 60)."""

    t: float  # minute start, epoch seconds
    n: int
    util_mean: float
    util_max: float
    mem_mean: float
    mem_max: float
    temp_mean: float
    temp_max: float
    power_mean: float | None
    power_max: float | None
    energy_first: float | None
    energy_last: float | None

    def encode(self) -> str:
        return json.dumps(list(self.__dict__.values()), separators=(",", ":"))

    @classmethod
    def decode(cls, raw: str) -> Rollup:
        return cls(*json.loads(raw))

    def as_dict(self) -> dict[str, float | None]:
        return dict(self.__dict__)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def rollup(minute_start: float, points: list[Point]) -> Rollup | None:
    """The minute rollup of `points` (all inside that minute), or None when there are none."""
    if not points:
        return None
    points = sorted(points, key=lambda p: p.t)
    powers = [p.power_w for p in points if p.power_w is not None]
    energies = [p.energy_j for p in points if p.energy_j is not None]
    return Rollup(
        t=minute_start,
        n=len(points),
        util_mean=round(_mean([p.util for p in points]), 2),
        util_max=max(p.util for p in points),
        mem_mean=round(_mean([p.mem_mib for p in points]), 1),
        mem_max=max(p.mem_mib for p in points),
        temp_mean=round(_mean([p.temp_c for p in points]), 2),
        temp_max=max(p.temp_c for p in points),
        power_mean=round(_mean(powers), 2) if powers else None,
        power_max=max(powers) if powers else None,
        energy_first=energies[0] if energies else None,
        energy_last=energies[-1] if energies else None,
    )


ROLL_SPREAD_S = 30.0


def roll_offset(node_key: str, grace_s: float) -> float:
    """How long after a minute ends a node's GPUs are rolled up for it.

    The grace for late samples plus a per-node share of `ROLL_SPREAD_S`: agents
    that sample in step would otherwise have every GPU of the fleet rolled in
    the same second, a burst that delays the samples stored behind it.
    """
    return grace_s + zlib.crc32(node_key.encode()) % int(ROLL_SPREAD_S * 100) / 100


def minutes_to_roll(prev_t: float | None, t: float, offset_s: float) -> list[float]:
    """Minute starts to roll up for a node whose stored history moves on from sample time `prev_t` to `t`.

    Minute m is rolled once `offset_s` has passed after its end: by the first
    batch of the node sampled after that (or by the sweep's clock, for a node
    that fell silent). Only minutes up to the one holding `prev_t` can hold
    points; rolling one again replaces its rollup.
    """
    if prev_t is None:
        return []
    done = (prev_t - offset_s) // 60 - 1  # the last minute rolled when `prev_t` was stored
    due = min((t - offset_s) // 60 - 1, prev_t // 60)
    return [m * 60.0 for m in range(int(done) + 1, int(due) + 1)]


def resolution_for(since: float, now: float, raw_retention_s: float) -> str:
    """`raw` when the window starts inside the raw retention, else `1m`."""
    return "raw" if since >= now - raw_retention_s else "1m"
