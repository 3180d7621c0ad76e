"""Energy attribution: what one telemetry batch adds to each GPU's energy and to the attempt holding it. Pure.

Each GPU reports its energy counter (joules since boot). The increase since
the last reading is the energy drawn; it counts towards the GPU's hour (the
hour of the sample) and, while an attempt holds the GPU, towards that
attempt. Utilization samples while allocated feed the attempt's efficiency.
A reading not newer than the last adds nothing (a redelivered batch is not
counted twice even without id dedup); a smaller value (driver reload) starts
a new baseline rather than counting a negative draw. Who holds a GPU is the
shared fold of `job.*` events (`shared.contracts.holders`); its energy counts
towards the holding attempt from the attempt's start (what a GPU draws between
placement and start is the GPU's alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from whaleflux.shared.contracts import Holder
from whaleflux.shared.events import GpuTelemetry

from .ownership import to_ms

HOUR_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class Reading:
    """A GPU's energy counter at a sample time (`joules` None: the GPU reported no counter)."""

    t_ms: int
    joules: float | None


@dataclass
class EnergyUpdate:
    """What to add for one batch: joules per (GPU, holder) in the batch's hour, new readings, utilization."""

    hour_ms: int
    joules: list[tuple[str, str | None, float]] = field(default_factory=list)  # (gpu, holder, joules > 0)
    readings: dict[str, Reading] = field(default_factory=dict)
    util: list[tuple[str, float]] = field(default_factory=list)  # (holder, utilization %)

    @property
    def empty(self) -> bool:
        return not (self.joules or self.readings or self.util)


def energy_delta(last: tuple[int, float] | None, t_ms: int, joules: float) -> tuple[float, bool]:
    """Joules drawn since the last reading of a GPU's energy counter, and whether to keep the new reading."""
    if last is None:
        return 0.0, True
    last_ms, last_j = last
    if t_ms <= last_ms:
        return 0.0, False
    if joules < last_j:
        return 0.0, True
    return joules - last_j, True


def charged_to(holder: Holder | None) -> str | None:
    """The attempt (`<job>:<attempt>`) a GPU's energy and utilization count towards: its holder's, once running."""
    return holder.attempt_key if holder is not None and holder.started_at is not None else None


def attribute(batch: GpuTelemetry, lasts: Sequence[Reading | None], holders: Sequence[str | None]) -> EnergyUpdate:
    """The update for one batch, given each GPU's last reading and holder (in the batch's GPU order)."""
    t_ms = to_ms(batch.sample_time)
    update = EnergyUpdate(t_ms - t_ms % HOUR_MS)
    for g, last, holder in zip(batch.gpus, lasts, holders, strict=True):
        if last is not None and t_ms <= last.t_ms:
            continue  # a redelivered or older sample: counted already
        if g.energy_j is not None:
            previous = (last.t_ms, last.joules) if last is not None and last.joules is not None else None
            delta, _ = energy_delta(previous, t_ms, g.energy_j)
            if delta > 0:
                update.joules.append((g.uuid, holder, delta))
        update.readings[g.uuid] = Reading(t_ms, g.energy_j)
        if holder:
            update.util.append((holder, g.utilization_gpu_pct))
    return update
