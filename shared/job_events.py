"""Job events: submitted, placed, started, finished, failed, rejected, preempted, requeued, cancelled.

Their schemas: docs/events/.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, ClassVar, Literal

from pydantic import AwareDatetime, Field, field_validator

from .event_data import Attempt, Count, EventData, Int, JobId, JobName, Name, NonNeg, OsText, Token


def default_name(command: Sequence[str]) -> str:
    """A job's name when none is given: its command as a name may hold it (slashes and control characters
    become spaces, at most 128 characters)."""
    text = " ".join(re.sub(r"[/\\\x00-\x1f\x7f]+", " ", " ".join(command)).split())[:128]
    return text if text.strip(".") else "job"


class JobSubmitted(EventData):
    """A request to run a job, on subject `job.submitted.<team>`: any system may publish it for its teams."""

    event_name: ClassVar[str] = "job.submitted"
    job_id: JobId
    name: JobName
    team: Name = "default"
    project: Name = "default"
    command: list[OsText] = Field(min_length=1)
    env: dict[OsText, OsText] = Field(default_factory=dict)
    workdir: OsText | None = Field(
        None, description="relative to the job's area on the node (its default), or inside a root allowed its team")
    gpus: int = Field(default=1, ge=1, le=1024)
    gpu_models: list[str] = Field(default_factory=list, description="allowed models; empty means any")
    min_memory_mib: NonNeg = 0
    expected_runtime_s: Annotated[float, Field(gt=0)] | None = Field(
        None, description="the submitter's estimate, if any")
    submitted_by: str | None = None
    # Added in v1 before release; all optional with defaults.
    workload_class: Literal["llm-train", "finetune", "inference", "small"] = Field(
        "small", description="what kind of work: picks the GPU model that runs it fastest"
    )
    priority: Literal["high", "normal", "low"] = "normal"
    preemptible: bool = Field(
        False, description="may be stopped (SIGTERM, grace, then requeued) for higher-priority work")
    checkpoint_dir: OsText | None = Field(
        None, description="passed as WHALEFLUX_CHECKPOINT_DIR; relative to the job's area (default: its"
        " `checkpoints` folder), or inside a root allowed its team"
    )
    resume: Literal["checkpoint", "restart"] = Field(
        "checkpoint", description="after a preemption or failover: resume from the checkpoint dir, or start over"
    )
    nvlink: bool = Field(
        False,
        description="all GPUs on one node whose GPUs are joined by NVLink; when false, a job larger than any"
        " node it may use runs as a gang across nodes (one process per node, all or nothing)",
    )
    labels: dict[Name, Name] = Field(
        default_factory=dict, description="placement constraints, e.g. {\"pool\": \"onprem\"}")
    service: Name | None = Field(None, description="inference service name: its replicas are spread across nodes")
    restart_on_failure: bool = Field(False, description="requeue the job when it exits non-zero or fails")

    @field_validator("workdir", "checkpoint_dir")
    @classmethod
    def _no_way_up(cls, value: str | None) -> str | None:
        # The rest of the rule (absolute paths only inside the team's allowed roots) needs the site's
        # settings: the scheduler and the agent apply it (shared/job_paths.py).
        if value is not None and ".." in value.split("/"):
            raise ValueError("must not contain '..'")
        if value is not None and not value.strip():
            raise ValueError("must not be empty")
        return value


class JobPlaced(EventData):
    event_name: ClassVar[str] = "job.placed"
    job_id: JobId
    attempt: Attempt
    cluster: Token
    node: Token
    gpu_model: str
    gpu_uuids: list[str] = Field(min_length=1)
    gpu_indices: list[Int]
    command: list[OsText] = Field(min_length=1)
    env: dict[OsText, OsText] = Field(default_factory=dict)
    workdir: OsText | None = None
    team: Name
    project: Name
    # Added in v1 before release: where the job keeps checkpoints, and whether this attempt resumes.
    checkpoint_dir: OsText | None = None
    resume: bool = False
    # Added in v1 before release: a gang spanning nodes gets one job.placed per node (a "part"); absent
    # (None) for a job on one node, so its events are unchanged.
    rank: Count | None = Field(None, description="this node's rank in a gang spanning nodes")
    gang_nodes: list[Token] | None = Field(
        None, description="every node of the gang in rank order; the first (rank 0) is the coordinator"
    )
    gang_gpus: Annotated[int, Field(ge=2, le=1_000_000)] | None = Field(
        None, description="GPUs of the whole gang, all nodes")
    # Added in v1 before release: the placement's fencing token. The node never starts it later than this (by its
    # own clock), so the scheduler can requeue an attempt it never heard of once the node's clock is past it.
    start_by: AwareDatetime | None = Field(
        None, description="the node must not start this attempt after this time; absent: no deadline (older"
        " schedulers)")

    @property
    def part(self) -> int:
        """This placement's rank in its gang (0 for a job on one node)."""
        return self.rank or 0


class JobPreempted(EventData):
    """Stop this attempt of the job on its node (SIGTERM, grace, SIGKILL); the scheduler has requeued it.

    Sent for preemption by a higher-priority job, a move by the queue policy
    (to faster GPUs, or out of a blocked job's way), a drained node, and to
    fence a node declared lost that comes back still running the job.
    """

    event_name: ClassVar[str] = "job.preempted"
    job_id: JobId
    attempt: Attempt
    cluster: Token
    node: Token
    reason: str
    grace_s: float = Field(5.0, ge=0, le=3600)


class JobRequeued(EventData):
    """The job went back to the queue; its next placement is attempt `attempt + 1`."""

    event_name: ClassVar[str] = "job.requeued"
    job_id: JobId
    attempt: Attempt = Field(description="the attempt that was stopped or lost")
    cluster: Token
    node: Token
    reason: str
    cause: Literal["preempted", "node_lost", "node_drained", "restart_on_failure", "interrupted", "attempt_lost"]
    # Added in v1 before release: every node of a gang's attempt in rank order (`node` is rank 0); None for one node.
    gang_nodes: list[Token] | None = None
    # Added in v1 before release: after a preemption of a job that resumes from its checkpoint, the runtime
    # estimate left (seconds on the reference GPU) that the queue policy uses for it from now on.
    estimate_left_s: float | None = Field(None, ge=0)


class JobStarted(EventData):
    event_name: ClassVar[str] = "job.started"
    job_id: JobId
    attempt: Attempt
    cluster: Token
    node: Token
    gpu_uuids: list[str]
    pid: Int
    started_at: AwareDatetime
    # Added in v1 before release: which part of a gang spanning nodes (None: a job on one node).
    rank: Count | None = None


# job.finished's `log_tail`: the last lines of a failed attempt's log, bounded (20 x 400 characters).
LOG_TAIL_LINES = 20
LOG_LINE_MAX = 400
LogLine = Annotated[str, Field(max_length=LOG_LINE_MAX)]


class JobFinished(EventData):
    event_name: ClassVar[str] = "job.finished"
    job_id: JobId
    attempt: Attempt
    cluster: Token
    node: Token
    exit_code: Int
    started_at: AwareDatetime
    finished_at: AwareDatetime
    # Added in v1 before release: which part of a gang spanning nodes (None: a job on one node).
    rank: Count | None = None
    # Added in v1 before release: set when the node stopped the job for a planned stop (agent or
    # `up` shut down): not the job's own failure; the scheduler requeues it to resume.
    interrupted: str | None = None
    # Added in v1 before release: the last lines of the attempt's log when it exited non-zero (not for a
    # planned stop), secrets masked; absent (None) for a success and from older agents.
    log_tail: list[LogLine] | None = Field(
        None, max_length=LOG_TAIL_LINES, description="the last log lines of a failed attempt, oldest first")


class JobRejected(EventData):
    """The job can never run on this fleet (e.g. more GPUs per node than any node has)."""

    event_name: ClassVar[str] = "job.rejected"
    job_id: JobId
    reason: str


class JobFailed(EventData):
    """The job could not run or its process died abnormally (not a plain non-zero exit)."""

    event_name: ClassVar[str] = "job.failed"
    job_id: JobId
    attempt: Attempt
    cluster: Token
    node: Token
    reason: str
    exit_code: Int | None = None
    started_at: AwareDatetime | None = None
    failed_at: AwareDatetime
    # Added in v1 before release: which part of a gang spanning nodes (None: a job on one node).
    rank: Count | None = None



class JobCancelled(EventData):
    """The job was cancelled: it left the queue, or its attempt was told to stop (job.preempted); never run again."""

    event_name: ClassVar[str] = "job.cancelled"
    job_id: JobId
    attempt: Count = Field(0, description="the attempt that was running (0: it never ran)")
    reason: str
    cancelled_by: str | None = None


def submitted_event_id(job_id: str) -> str:
    """The event id of a job's job.submitted: fixed by the job, so publishing it again (a retry after an
    unanswered publish) is a duplicate that JetStream drops."""
    return f"submitted-{job_id}"
