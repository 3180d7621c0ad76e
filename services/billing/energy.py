"""Energy and utilization from each GPU's own samples, exact over any stretch of time. Pure, no I/O.

Each GPU reports its energy counter (joules since boot) and its utilization at
sample times. Billing keeps, per GPU, a time series of running totals
(`Reading`): the energy drawn since its first reading (`cum_j`; a smaller
counter after a driver reload starts a new baseline instead of a negative
draw), and utilization x time over the time its samples cover (`util_ms`,
`cov_ms`; a sample covers the time since the one before, at most
`MAX_GAP_MS`, 15 minutes). The energy drawn, or the utilization, over [a, b) is the
difference of the totals at b and at a, each interpolated linearly between the
samples around it. So any window and any allocation interval is exact: a
window that starts mid-hour counts from its start, one that ends mid-hour
stops at its end, a fixed past window does not change once samples after its
end exist, and an attempt's energy is what its GPUs drew while it held them,
whatever order events and samples arrived or were replayed in. Before a GPU's
first sample and after its latest nothing is known: nothing is counted there.

A reading not newer than the last adds nothing (a redelivered batch is not
counted twice even without id dedup).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from whaleflux.shared.events import GpuTelemetry

from .ownership import to_ms

MAX_GAP_MS = 900_000  # a utilization sample stands for at most the 15 minutes before it


@dataclass(frozen=True, slots=True)
class Reading:
    """One sample of a GPU: its raw counter (None: no counter) and the running totals up to it."""

    t_ms: int
    joules: float | None
    cum_j: float = 0.0
    util_ms: float = 0.0
    cov_ms: int = 0

    def encode(self) -> str:
        raw = "" if self.joules is None else repr(self.joules)
        return f"{self.t_ms}|{raw}|{self.cum_j!r}|{self.util_ms!r}|{self.cov_ms}"

    @staticmethod
    def decode(text: str) -> Reading:
        parts = text.split("|")
        t_ms, raw = int(parts[0]), parts[1]
        if len(parts) < 5:  # a reading kept before the running totals: a new baseline
            return Reading(t_ms, float(raw) if raw else None)
        return Reading(t_ms, float(raw) if raw else None, float(parts[2]), float(parts[3]), int(parts[4]))


def next_reading(last: Reading | None, t_ms: int, joules: float | None, util_pct: float) -> Reading | None:
    """The reading a new sample makes after `last`; None when it is not newer (counted already)."""
    if last is None:
        return Reading(t_ms, joules)
    if t_ms <= last.t_ms:
        return None
    drawn = 0.0
    if joules is not None and last.joules is not None and joules >= last.joules:
        drawn = joules - last.joules  # smaller: a driver reload, a new baseline
    covered = min(t_ms - last.t_ms, MAX_GAP_MS)
    return Reading(t_ms, joules, last.cum_j + drawn, last.util_ms + util_pct * covered, last.cov_ms + covered)


def readings(batch: GpuTelemetry, lasts: Sequence[Reading | None]) -> dict[str, Reading]:
    """The new reading of each GPU of a batch, given each one's last (in the batch's GPU order)."""
    t_ms = to_ms(batch.sample_time)
    out = {}
    for g, last in zip(batch.gpus, lasts, strict=True):
        new = next_reading(last, t_ms, g.energy_j, g.utilization_gpu_pct)
        if new is not None:
            out[g.uuid] = new
    return out


@dataclass(frozen=True)
class Totals:
    """Running totals at one instant, interpolated: energy drawn, utilization x time, time covered."""

    cum_j: float
    util_ms: float
    cov_ms: float


def totals_at(series: Sequence[Reading], t_ms: int, times: Sequence[int] | None = None) -> Totals:
    """The running totals at `t_ms` from a GPU's samples sorted by time (those around `t_ms` suffice);
    `times`: the samples' times, when the caller keeps them."""
    if not series:
        return Totals(0.0, 0.0, 0.0)
    i = bisect.bisect_right(times if times is not None else [r.t_ms for r in series], t_ms)
    if i == 0:
        first = series[0]
        return Totals(first.cum_j, first.util_ms, first.cov_ms)
    before = series[i - 1]
    if i == len(series) or before.t_ms == t_ms:
        return Totals(before.cum_j, before.util_ms, before.cov_ms)
    after = series[i]
    f = (t_ms - before.t_ms) / (after.t_ms - before.t_ms)
    return Totals(before.cum_j + f * (after.cum_j - before.cum_j),
                  before.util_ms + f * (after.util_ms - before.util_ms),
                  before.cov_ms + f * (after.cov_ms - before.cov_ms))


class Series:
    """The samples of every GPU a question touches, sorted by time: energy and utilization over any [a, b)."""

    def __init__(self, by_gpu: dict[str, list[Reading]]):
        self.by_gpu = {g: sorted(rs, key=lambda r: r.t_ms) for g, rs in by_gpu.items()}
        self._times = {g: [r.t_ms for r in rs] for g, rs in self.by_gpu.items()}

    def at(self, gpu: str, t_ms: int) -> Totals:
        return totals_at(self.by_gpu.get(gpu, ()), t_ms, self._times.get(gpu))

    def joules(self, gpu: str, a: int, b: int) -> float:
        """Energy one GPU drew over [a, b)."""
        return 0.0 if b <= a else max(self.at(gpu, b).cum_j - self.at(gpu, a).cum_j, 0.0)

    def utilization(self, gpu: str, a: int, b: int) -> tuple[float, float]:
        """(utilization % x ms, ms covered by samples) of one GPU over [a, b)."""
        if b <= a:
            return 0.0, 0.0
        lo, hi = self.at(gpu, a), self.at(gpu, b)
        return hi.util_ms - lo.util_ms, hi.cov_ms - lo.cov_ms
