"""A gang spanning nodes: what one part's report means for the whole job. Pure (no I/O).

Each node of a gang runs its part (one process per node) and reports
job.started / job.finished / job.failed for it with its `rank`. All or
nothing: the job is running once every part started, succeeded once every
part exited 0; the first part that fails (non-zero exit, or failed to run)
fails the whole attempt, and the parts still running are stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from whaleflux.shared.events import JobFailed, JobFinished, JobStarted

from .placement import Placement
from .records import JobPart, JobRecord


@dataclass(frozen=True)
class GangStep:
    """What to do after a part's report.

    `save`: the record changed, nothing else happens; `succeeded`: every part
    exited 0; `failed`: the attempt failed (`reason`), and `stop` are the parts
    still running that must be stopped; `ignore`: not a part of this attempt.
    """

    action: Literal["ignore", "save", "succeeded", "failed"]
    stop: tuple[JobPart, ...] = ()
    reason: str = ""


def parts_of(p: Placement) -> list[JobPart]:
    """The parts of a placement that spans nodes (rank 0 is the placement's first node); [] for one node."""
    if not p.others:
        return []
    return [
        JobPart(rank=i, cluster=s.cluster, node=s.node, gpu_model=s.model, gpu_uuids=list(s.gpu_uuids),
                gpu_indices=list(s.gpu_indices))
        for i, s in enumerate(p.shares)
    ]


def on_part_report(job: JobRecord, report: JobStarted | JobFinished | JobFailed) -> GangStep:
    """Apply one part's report of the current attempt to the gang's record (changed in place)."""
    rank = report.rank or 0
    if rank >= len(job.parts) or job.parts[rank].node != report.node or job.parts[rank].cluster != report.cluster:
        return GangStep("ignore")
    part = job.parts[rank]
    if isinstance(report, JobStarted):
        if part.state != "placed":
            return GangStep("ignore")  # redelivered
        part.state, part.started_at = "running", report.started_at
        if job.state == "placed" and all(p.state != "placed" for p in job.parts):
            job.state = "running"
            job.started_at = max(p.started_at for p in job.parts if p.started_at is not None)
        return GangStep("save")
    if part.state == "exited":
        return GangStep("ignore")  # redelivered
    ended: datetime = report.finished_at if isinstance(report, JobFinished) else report.failed_at
    part.state, part.finished_at, part.exit_code = "exited", ended, report.exit_code
    part.started_at = part.started_at or report.started_at
    if isinstance(report, JobFinished) and report.exit_code == 0:
        if all(p.state == "exited" and p.exit_code == 0 for p in job.parts):
            job.state, job.exit_code = "succeeded", 0
            job.finished_at = max(p.finished_at for p in job.parts if p.finished_at is not None)
            job.started_at = job.started_at or min(p.started_at for p in job.parts if p.started_at is not None)
            return GangStep("succeeded")
        return GangStep("save")
    why = report.reason if isinstance(report, JobFailed) else f"exit code {report.exit_code}"
    stop = tuple(p for p in job.parts if p.state != "exited")
    return GangStep("failed", stop, f"rank {rank} on {report.node} failed ({why})")
