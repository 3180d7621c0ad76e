"""Workload classes: which class of job holds a GPU (baselines are learned per model and class)."""

from __future__ import annotations

from collections import OrderedDict

from whaleflux.shared.events import GpuSample

JOB_CLASS_KEEP = 200_000
IDLE_BELOW_PCT = 5.0


class WorkloadClasses:
    """Job id -> workload class, from job.submitted; the oldest are forgotten beyond JOB_CLASS_KEEP."""

    def __init__(self) -> None:
        self.jobs: OrderedDict[str, str] = OrderedDict()

    def observe(self, job_id: str, workload_class: str) -> None:
        self.jobs[job_id] = workload_class
        self.jobs.move_to_end(job_id)
        while len(self.jobs) > JOB_CLASS_KEEP:
            self.jobs.popitem(last=False)

    def forget(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)

    def of(self, sample: GpuSample) -> str:
        """`idle`, the class of the WhaleFlux job on the GPU, or `unknown` (a process we did not start)."""
        for p in sample.processes:
            if p.job_id:
                cls = self.jobs.get(p.job_id)
                if cls is None and "-r" in p.job_id:  # a replica of a service: `<id>-r<i>`
                    cls = self.jobs.get(p.job_id.rsplit("-r", 1)[0])
                if cls is not None:
                    return cls
        if not sample.processes and (sample.utilization_gpu_pct or 0) < IDLE_BELOW_PCT:
            return "idle"
        return "unknown"
