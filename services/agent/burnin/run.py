"""Drive a burn-in: stress, memory test and copies through an exerciser, while sampling the GPUs through the backend.

The exerciser does the work on the devices (`cuda.py` on real GPUs,
`simulated.py` for simulated ones) and owns the clock the run is timed by
(virtual for the simulator); the backend (NVML or simulated) is sampled once
before, every `sample_every_s` during the stress, and once after, so that
ECC counters, throttle reasons, clocks, power and temperature are judged the
way the agent's telemetry sees them. The judgement is card.py's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from whaleflux.shared.events import GpuCheck, GpuIdentity, GpuReportCard, GpuSample, GpuValidated

from ..backend import GpuBackend
from .card import (
    DEFAULT_THRESHOLDS,
    BandwidthRun,
    ComputeRun,
    Measurements,
    MemoryRun,
    Thresholds,
    Verdict,
    report_card,
    worst,
)
from .plan import BurnInPlan, Check, Intensity, PlanError
from .ptx import PATTERNS
from .spec import gpu_spec

# The job id the backend is told holds the GPUs during the stress (NVML maps nothing to it; the simulator loads them).
BURN_IN_JOB = "burn-in"


class Exerciser(Protocol):
    """Runs the device side of a burn-in on GPUs given by their backend index."""

    def now(self) -> datetime:
        """The time the run is at (the wall clock, or the simulator's)."""

    def compute(self, indices: list[int], seconds: float) -> dict[int, ComputeRun]:
        """Keep these GPUs computing at once for about `seconds`; what each did (a GPU that failed is left out)."""

    def memory(self, indices: list[int], fraction: float) -> dict[int, MemoryRun]:
        """Write and verify every pattern over `fraction` of each GPU's free memory."""

    def bandwidth(self, indices: list[int]) -> dict[int, BandwidthRun]:
        """Host<->device, device-local and peer copy bandwidth of each GPU."""

    def close(self) -> None:
        """Release what the exerciser holds on the devices."""


class BurnInReport(BaseModel):
    """What `whaleflux test-gpu --json` prints, and what gpu.validated carries (with the node)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    started_at: AwareDatetime
    finished_at: AwareDatetime
    duration_s: float = Field(ge=0, description="the stress asked for")
    intensity: Intensity
    checks: list[Check]
    verdict: Verdict
    gpus: list[GpuReportCard]
    sample_cpu_ms_per_gpu: float | None = Field(None, description="CPU time of one backend sample, per GPU")

    def validated(self, cluster: str, node: str, reason: str) -> GpuValidated:
        """The gpu.validated event of this burn-in; GPUs that failed are the quarantined ones."""
        return GpuValidated(cluster=cluster, node=node, reason=reason, quarantined=[c.uuid for c in self.gpus
                            if c.verdict == "fail"], **self.model_dump(exclude={"sample_cpu_ms_per_gpu"}))


def select_gpus(identities: list[GpuIdentity], selector: str) -> list[GpuIdentity]:
    """"all", an index or a UUID; PlanError naming --gpu for one the node does not have."""
    if selector == "all":
        return list(identities)
    chosen = [g for g in identities if selector in (g.uuid, str(g.index))]
    if not chosen:
        have = ", ".join(f"{g.index} ({g.uuid})" for g in identities) or "none"
        raise PlanError(f"--gpu: no GPU {selector!r} on this node; it has {have}")
    return chosen


class _Sampler:
    """Samples the chosen GPUs through the backend, timing the CPU each sample costs."""

    def __init__(self, backend: GpuBackend, uuids: set[str]):
        self.backend = backend
        self.uuids = uuids
        self.cpu_s = 0.0
        self.gpu_samples = 0

    def take(self, now: datetime) -> dict[int, GpuSample]:
        t = time.process_time()
        batch = [s for s in self.backend.sample(now) if s.uuid in self.uuids]
        self.cpu_s += time.process_time() - t
        self.gpu_samples += len(batch)
        return {s.index: s for s in batch}

    @property
    def cpu_ms_per_gpu(self) -> float | None:
        return round(1000 * self.cpu_s / self.gpu_samples, 3) if self.gpu_samples else None


def _stress(backend: GpuBackend, ex: Exerciser, plan: BurnInPlan, gpus: list[GpuIdentity], m: dict[int, Measurements],
            sampler: _Sampler, progress: Callable[[str], None]) -> None:
    """Compute for the plan's duration, sampling between steps; the compute totals go on the measurements."""
    indices = [g.index for g in gpus]
    uuids = [g.uuid for g in gpus]
    totals = {i: [0.0, 0.0] for i in indices}
    backend.job_started(uuids, BURN_IN_JOB)
    try:
        done = 0.0
        while done < plan.duration_s:
            step = min(plan.sample_every_s, plan.duration_s - done)
            for i, run in ex.compute(indices, step).items():
                totals[i][0] += run.flops
                totals[i][1] += run.seconds
            done += step
            for i, sample in sampler.take(ex.now()).items():
                m[i].during.append(sample)
            if int(done) % 30 == 0 or done >= plan.duration_s:
                progress(f"stress: {done:.0f} of {plan.duration_s:.0f} s")
    finally:
        backend.job_stopped(uuids)
    if "compute" in plan.checks:
        for i, (flops, seconds) in totals.items():
            if seconds > 0:
                m[i].compute = ComputeRun(flops, seconds)


def run_burnin(backend: GpuBackend, ex: Exerciser, plan: BurnInPlan, thresholds: Thresholds = DEFAULT_THRESHOLDS,
               progress: Callable[[str], None] = lambda _: None) -> BurnInReport:
    """Run the plan on the chosen GPUs and judge each; the exerciser is closed at the end."""
    gpus = select_gpus(backend.identities(), plan.gpus)
    indices = [g.index for g in gpus]
    started = ex.now()
    m = {g.index: Measurements(thermal="thermal" in plan.checks) for g in gpus}
    sampler = _Sampler(backend, {g.uuid for g in gpus})
    try:
        for i, sample in sampler.take(started).items():
            m[i].before = sample
        if plan.stresses:
            _stress(backend, ex, plan, gpus, m, sampler, progress)
        if "memory" in plan.checks:
            progress(f"memory: {len(PATTERNS)} patterns over {100 * plan.memory_fraction:.0f}% of free VRAM")
            for i, mem in ex.memory(indices, plan.memory_fraction).items():
                m[i].memory = mem
        if "bandwidth" in plan.checks:
            progress("bandwidth: host<->device, device-local and peer copies")
            for i, bw in ex.bandwidth(indices).items():
                m[i].bandwidth = bw
        for i, sample in sampler.take(ex.now()).items():
            m[i].after = sample
    finally:
        ex.close()
    cards = [report_card(g.uuid, g.index, g.model, m[g.index], gpu_spec(g.model), thresholds) for g in gpus]
    return BurnInReport(
        started_at=started, finished_at=ex.now(), duration_s=plan.duration_s if plan.stresses else 0.0,
        intensity=plan.intensity, checks=list(plan.checks), verdict=worst([c.verdict for c in cards]), gpus=cards,
        sample_cpu_ms_per_gpu=sampler.cpu_ms_per_gpu,
    )



def unusable(gpus: list[GpuIdentity], plan: BurnInPlan, at: datetime, why: str) -> BurnInReport:
    """The report of a burn-in that could not run (no CUDA, a driver error): every GPU fails, saying why."""
    cards = [GpuReportCard(uuid=g.uuid, index=g.index, model=g.model, verdict="fail", reasons=[f"health: {why}"],
                           checks=[GpuCheck(check="health", verdict="fail", reasons=[f"health: {why}"])])
             for g in gpus]
    return BurnInReport(started_at=at, finished_at=at, duration_s=0.0, intensity=plan.intensity,
                        checks=list(plan.checks), verdict="fail", gpus=cards)
