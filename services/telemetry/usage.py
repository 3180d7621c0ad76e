"""A job's GPU usage over its run, from the history of its GPUs. No I/O."""

from __future__ import annotations

from pydantic import BaseModel

from .history import Point, Rollup


class JobUsage(BaseModel):
    """Mean and peak utilization and memory over the job's GPUs and run; energy in joules."""

    job_id: str
    gpus: int
    samples: int
    util_mean_pct: float | None
    util_peak_pct: float | None
    mem_mean_mib: float | None
    mem_peak_mib: float | None
    energy_j: float | None
    resolution: str
    complete: bool  # the job has finished and its usage will not change


def _energy(first: float | None, last: float | None) -> float | None:
    if first is None or last is None:
        return None
    # A counter that went backwards (driver reload) would give negative energy: count none.
    return max(last - first, 0.0)


def from_points(job_id: str, per_gpu: dict[str, list[Point]], complete: bool) -> JobUsage:
    """Usage from raw points, per GPU; energy is the counter's rise between first and last point."""
    pts = [p for ps in per_gpu.values() for p in ps]
    energies = []
    for ps in per_gpu.values():
        es = [p.energy_j for p in sorted(ps, key=lambda p: p.t) if p.energy_j is not None]
        if es:
            energies.append(_energy(es[0], es[-1]))
    return JobUsage(
        job_id=job_id,
        gpus=len(per_gpu),
        samples=len(pts),
        util_mean_pct=round(sum(p.util for p in pts) / len(pts), 2) if pts else None,
        util_peak_pct=max(p.util for p in pts) if pts else None,
        mem_mean_mib=round(sum(p.mem_mib for p in pts) / len(pts), 1) if pts else None,
        mem_peak_mib=max(p.mem_mib for p in pts) if pts else None,
        energy_j=round(sum(e for e in energies if e is not None), 1) if energies else None,
        resolution="raw",
        complete=complete,
    )


def from_rollups(job_id: str, per_gpu: dict[str, list[Rollup]], complete: bool) -> JobUsage:
    """Usage from minute rollups (jobs older than the raw retention): means weighted by point count."""
    rs = [r for lst in per_gpu.values() for r in lst]
    n = sum(r.n for r in rs)
    energies = []
    for lst in per_gpu.values():
        lst = sorted(lst, key=lambda r: r.t)
        firsts = [r.energy_first for r in lst if r.energy_first is not None]
        lasts = [r.energy_last for r in lst if r.energy_last is not None]
        if firsts and lasts:
            energies.append(_energy(firsts[0], lasts[-1]))
    return JobUsage(
        job_id=job_id,
        gpus=len(per_gpu),
        samples=n,
        util_mean_pct=round(sum(r.util_mean * r.n for r in rs) / n, 2) if n else None,
        util_peak_pct=max(r.util_max for r in rs) if rs else None,
        mem_mean_mib=round(sum(r.mem_mean * r.n for r in rs) / n, 1) if n else None,
        mem_peak_mib=max(r.mem_max for r in rs) if rs else None,
        energy_j=round(sum(e for e in energies if e is not None), 1) if energies else None,
        resolution="1m",
        complete=complete,
    )
