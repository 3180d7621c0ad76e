"""Why a job is where it is, in words (`GET /v1/jobs/{id}/why`, `whaleflux jobs why`). Pure."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from datetime import datetime, tzinfo

from .placement.moments import at, in_words, local
from .records import GpuQuarantine, JobRecord

# A waiting job's `why` names at most this many quarantined GPUs (then how many more).
QUARANTINE_LINES = 10


def quarantine_line(q: GpuQuarantine) -> str:
    """One quarantined GPU; its moments put in words where the reason is shown (`spoken`)."""
    held = f", healthy since {at(q.healthy_since.timestamp())}" if q.healthy_since else ""
    return f"quarantined: {q.node} GPU {q.index} ({q.cause}: {q.reason}; since {at(q.since.timestamp())}{held})"


def why(job: JobRecord, quarantined: Iterable[GpuQuarantine] = (), models: Mapping[str, str] | None = None) -> str:
    """Why the job is where it is, in words; with the quarantined GPUs (and each node's model), those that matter
    to it: a waiting job's of the models it may use, an active job's own."""
    lines = []
    if job.state == "pending":
        lines.append(f"waiting: {job.reason or 'not yet considered by a placement pass'}")
    elif job.state in ("placed", "running") and job.parts:
        lines.append(f"{job.state} as a gang on {len(job.parts)} nodes, attempt {job.attempt}:")
        lines += [f"  rank {p.rank}: {p.node} ({p.gpu_model}), {p.state}, GPUs {', '.join(p.gpu_uuids)}"
                  for p in job.parts]
        if job.placed_because:
            lines.append(f"placed there because: {job.placed_because}")
    elif job.state in ("placed", "running"):
        gpus = ", ".join(job.gpu_uuids)
        lines.append(f"{job.state} on {job.node} ({job.gpu_model}), attempt {job.attempt}, GPUs {gpus}")
        if job.placed_because:
            lines.append(f"placed there because: {job.placed_because}")
    elif job.state == "rejected":
        lines.append(f"rejected: {job.reason}")
    elif job.state == "cancelled":
        ran = f" after attempt {job.attempt}" if job.attempt else " before it ran"
        lines.append(f"cancelled{ran}: {(job.reason or '').removeprefix('cancelled: ')}")
    else:
        end = f"exit code {job.exit_code}" if job.exit_code is not None else (job.reason or "")
        if job.parts and job.reason and job.exit_code is not None:
            end += f" ({job.reason})"
        where = f" on {', '.join(job.nodes)}" if job.parts else ""
        lines.append(f"{job.state} after attempt {job.attempt}{where}: {end}")
    out = sorted(quarantined, key=lambda q: (q.node, q.index))
    if job.state == "pending":
        allowed = set(job.spec.gpu_models)
        mine = [q for q in out if not allowed or (models or {}).get(q.node) in allowed]
        lines += [quarantine_line(q) for q in mine[:QUARANTINE_LINES]]
        if len(mine) > QUARANTINE_LINES:
            lines.append(f"quarantined: {len(mine) - QUARANTINE_LINES} more GPU(s) (whaleflux gpus list)")
    elif job.state in ("placed", "running"):
        lines += [quarantine_line(q) for q in out if q.uuid in job.gpu_uuids]
    lines += [f"requeued: {r}" for r in job.requeues]
    return "\n".join(lines)


def spoken(text: str, now: datetime, zone: tzinfo | None = None) -> str:
    """A reason as a person reads it at `now`: each moment in `zone` (default this machine's local time) and how
    far off it is."""
    return in_words(text, local(now, zone))


def reason_key(text: str) -> str:
    """A short key of a reason as the scheduler holds it: it changes when the reason does, not when only the
    clock moves on (`whaleflux submit --wait` prints a reason again when its key changes)."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]
