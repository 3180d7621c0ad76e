"""Event contracts: one CloudEvents 1.0 envelope and a typed, versioned model per event.

The envelope's `type` is `io.whaleflux.<name>.v<version>`; its `data` is validated
against the model registered for that type. Breaking a model means adding a new
version, never changing an existing one.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, ValidationError, create_model

TYPE_PREFIX = "io.whaleflux."

NonNeg = Annotated[float, Field(ge=0)]
Percent = Annotated[float, Field(ge=0, le=100)]
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+$")]
# Names that become NATS subject tokens (cluster, node): no dots.
Token = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
# Short enough that derived event ids ("placed-<job>-<attempt>") fit the envelope's id.
JobId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]


class EventData(BaseModel):
    """Base of every event payload; subclasses set `event_name` and `version`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    event_name: ClassVar[str]
    version: ClassVar[int] = 1

    @classmethod
    def event_type(cls) -> str:
        return f"{TYPE_PREFIX}{cls.event_name}.v{cls.version}"


# --------------------------------------------------------------------------- GPUs


class GpuSample(BaseModel):
    """One GPU at one instant. Metrics a device does not support are None, never 0."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    uuid: str = Field(min_length=1, max_length=96)
    index: int = Field(ge=0, le=255)
    model: str
    utilization_gpu_pct: Percent
    utilization_memory_pct: Percent | None = None
    memory_used_mib: NonNeg
    memory_total_mib: Annotated[float, Field(gt=0)]
    temperature_c: Annotated[float, Field(ge=-40, le=200)]
    memory_temperature_c: Annotated[float, Field(ge=-40, le=200)] | None = None
    slowdown_temperature_c: Annotated[float, Field(ge=0, le=200)] | None = None
    power_w: NonNeg | None = None
    power_limit_w: NonNeg | None = None
    energy_j: NonNeg | None = None
    sm_clock_mhz: NonNeg | None = None
    mem_clock_mhz: NonNeg | None = None
    throttle_reasons: list[str] = Field(default_factory=list)
    ecc_uncorrected: Annotated[int, Field(ge=0)] | None = None
    xid_errors: list[int] = Field(default_factory=list, description="XIDs seen since the previous sample")
    # Added in v1 before release; all optional, absent where the device does not support them.
    memory_free_mib: NonNeg | None = None
    memory_reserved_mib: NonNeg | None = None
    shutdown_temperature_c: Annotated[float, Field(ge=0, le=200)] | None = None
    thermal_margin_c: Annotated[float, Field(ge=-100, le=200)] | None = Field(
        None, description="degrees below the slowdown limit, as the device reports it"
    )
    ecc_corrected: Annotated[int, Field(ge=0)] | None = None
    remapped_rows_correctable: Annotated[int, Field(ge=0)] | None = None
    remapped_rows_uncorrectable: Annotated[int, Field(ge=0)] | None = None
    row_remap_failure: bool | None = None
    pcie_replay_count: Annotated[int, Field(ge=0)] | None = None
    pcie_tx_bytes_per_s: NonNeg | None = None
    pcie_rx_bytes_per_s: NonNeg | None = None
    nvlink_links_active: Annotated[int, Field(ge=0, le=64)] | None = None
    nvlink_crc_errors: Annotated[int, Field(ge=0)] | None = Field(None, description="flit + data CRC errors, all links")
    nvlink_replay_errors: Annotated[int, Field(ge=0)] | None = None
    nvlink_recovery_errors: Annotated[int, Field(ge=0)] | None = None
    nvlink_bandwidth_bytes: NonNeg | None = Field(None, description="rx + tx bytes over all links since boot")
    tensor_active: Annotated[float, Field(ge=0, le=1)] | None = Field(None, description="ratio of cycles the tensor pipe is active")
    processes: list["GpuProcess"] = Field(default_factory=list)


class GpuProcess(BaseModel):
    """A process holding GPU memory; `job_id` when the agent launched it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    pid: int = Field(ge=0)
    used_mib: NonNeg
    job_id: str | None = None


class GpuIdentity(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    uuid: str = Field(min_length=1, max_length=96)
    index: int = Field(ge=0, le=255)
    model: str
    name: str
    serial: str | None = None
    memory_total_mib: Annotated[float, Field(gt=0)]
    pci_bus_id: str | None = None
    driver_version: str | None = None
    vbios_version: str | None = None


class GpuTelemetry(EventData):
    """All GPUs of one node at one sample time (one message per node per interval)."""

    event_name: ClassVar[str] = "gpu.telemetry"
    cluster: Token
    node: Token
    seq: int = Field(ge=0)
    sample_time: AwareDatetime
    gpus: list[GpuSample]


class NodeRegistered(EventData):
    event_name: ClassVar[str] = "node.registered"
    cluster: Token
    node: Token
    rack: str | None = None
    pool: str | None = None
    interconnect: Literal["nvlink", "pcie"] = "pcie"
    agent_version: str
    gpus: list[GpuIdentity]


class AttemptReport(BaseModel):
    """One attempt the node holds: running under its supervisor, or ended (with its recorded exit) and
    listed for a while after its job.finished was published, so the scheduler can reconcile both ways."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    job_id: JobId
    attempt: int = Field(ge=1)
    rank: Annotated[int, Field(ge=0)] | None = None
    state: Literal["running", "exited"]
    started_at: AwareDatetime | None = None
    exit_code: int | None = None
    finished_at: AwareDatetime | None = None
    interrupted: str | None = Field(None, description="why the node stopped it (a planned stop), if it did")


class NodeHeartbeat(EventData):
    event_name: ClassVar[str] = "node.heartbeat"
    cluster: Token
    node: Token
    seq: int = Field(ge=0)
    running_jobs: list[str] = Field(default_factory=list)
    # Added in v1 before release: the node is the authority on what runs on it. Every attempt it
    # runs, and those that ended recently, with their recorded exit (None: an agent too old to say).
    attempts: list[AttemptReport] | None = None


class NodeDrainRequested(EventData):
    """Take no new work on the node and move its jobs elsewhere (alerting, an operator)."""

    event_name: ClassVar[str] = "node.drain_requested"
    cluster: Token
    node: Token
    reason: str
    fingerprint: str | None = Field(None, description="the alert that asked for it, if any")


# --------------------------------------------------------------------------- jobs


class JobSubmitted(EventData):
    """A request to run a job. Any system may publish it (see docs/events/)."""

    event_name: ClassVar[str] = "job.submitted"
    job_id: JobId
    name: str = Field(min_length=1, max_length=128)
    team: Name = "default"
    project: Name = "default"
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    gpus: int = Field(default=1, ge=1, le=1024)
    gpu_models: list[str] = Field(default_factory=list, description="allowed models; empty means any")
    min_memory_mib: NonNeg = 0
    expected_runtime_s: Annotated[float, Field(gt=0)] | None = Field(None, description="the submitter's estimate, if any")
    submitted_by: str | None = None
    # Added in v1 before release; all optional with defaults.
    workload_class: Literal["llm-train", "finetune", "inference", "small"] = Field(
        "small", description="what kind of work: picks the GPU model that runs it fastest"
    )
    priority: Literal["high", "normal", "low"] = "normal"
    preemptible: bool = Field(False, description="may be stopped (SIGTERM, grace, then requeued) for higher-priority work")
    checkpoint_dir: str | None = Field(
        None, description="passed as WHALEFLUX_CHECKPOINT_DIR; default <agent home>/checkpoints/<job_id>"
    )
    resume: Literal["checkpoint", "restart"] = Field(
        "checkpoint", description="after a preemption or failover: resume from the checkpoint dir, or start over"
    )
    nvlink: bool = Field(
        False,
        description="all GPUs on one node whose GPUs are joined by NVLink; when false, a job larger than any"
        " node it may use runs as a gang across nodes (one process per node, all or nothing)",
    )
    labels: dict[Name, Name] = Field(default_factory=dict, description="placement constraints, e.g. {\"pool\": \"onprem\"}")
    service: Name | None = Field(None, description="inference service name: its replicas are spread across nodes")
    restart_on_failure: bool = Field(False, description="requeue the job when it exits non-zero or fails")


class JobPlaced(EventData):
    event_name: ClassVar[str] = "job.placed"
    job_id: JobId
    attempt: int = Field(ge=1)
    cluster: Token
    node: Token
    gpu_model: str
    gpu_uuids: list[str] = Field(min_length=1)
    gpu_indices: list[int]
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    team: Name
    project: Name
    # Added in v1 before release: where the job keeps checkpoints, and whether this attempt resumes.
    checkpoint_dir: str | None = None
    resume: bool = False
    # Added in v1 before release: a gang spanning nodes gets one job.placed per node (a "part"); absent
    # (None) for a job on one node, so its events are unchanged.
    rank: Annotated[int, Field(ge=0)] | None = Field(None, description="this node's rank in a gang spanning nodes")
    gang_nodes: list[Token] | None = Field(
        None, description="every node of the gang in rank order; the first (rank 0) is the coordinator"
    )
    gang_gpus: Annotated[int, Field(ge=2)] | None = Field(None, description="GPUs of the whole gang, all nodes")

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
    attempt: int = Field(ge=1)
    cluster: Token
    node: Token
    reason: str
    grace_s: float = Field(5.0, ge=0, le=3600)


class JobRequeued(EventData):
    """The job went back to the queue; its next placement is attempt `attempt + 1`."""

    event_name: ClassVar[str] = "job.requeued"
    job_id: JobId
    attempt: int = Field(ge=1, description="the attempt that was stopped or lost")
    cluster: Token
    node: Token
    reason: str
    cause: Literal["preempted", "node_lost", "node_drained", "restart_on_failure", "interrupted", "attempt_lost"]
    # Added in v1 before release: every node of a gang's attempt in rank order (`node` is rank 0); None for one node.
    gang_nodes: list[Token] | None = None


class JobStarted(EventData):
    event_name: ClassVar[str] = "job.started"
    job_id: JobId
    attempt: int = Field(ge=1)
    cluster: Token
    node: Token
    gpu_uuids: list[str]
    pid: int
    started_at: AwareDatetime
    # Added in v1 before release: which part of a gang spanning nodes (None: a job on one node).
    rank: Annotated[int, Field(ge=0)] | None = None


class JobFinished(EventData):
    event_name: ClassVar[str] = "job.finished"
    job_id: JobId
    attempt: int = Field(ge=1)
    cluster: Token
    node: Token
    exit_code: int
    started_at: AwareDatetime
    finished_at: AwareDatetime
    # Added in v1 before release: which part of a gang spanning nodes (None: a job on one node).
    rank: Annotated[int, Field(ge=0)] | None = None
    # Added in v1 before release: set when the node stopped the job for a planned stop (agent or
    # `up` shut down): not the job's own failure; the scheduler requeues it to resume.
    interrupted: str | None = None


class JobRejected(EventData):
    """The job can never run on this fleet (e.g. more GPUs per node than any node has)."""

    event_name: ClassVar[str] = "job.rejected"
    job_id: JobId
    reason: str


class JobFailed(EventData):
    """The job could not run or its process died abnormally (not a plain non-zero exit)."""

    event_name: ClassVar[str] = "job.failed"
    job_id: JobId
    attempt: int = Field(ge=1)
    cluster: Token
    node: Token
    reason: str
    exit_code: int | None = None
    started_at: AwareDatetime | None = None
    failed_at: AwareDatetime
    # Added in v1 before release: which part of a gang spanning nodes (None: a job on one node).
    rank: Annotated[int, Field(ge=0)] | None = None


# --------------------------------------------------------------------------- leases and alerts


class LeaseExpiring(EventData):
    event_name: ClassVar[str] = "lease.expiring"
    contract_id: str
    provider: str
    ends_at: AwareDatetime
    notice_deadline: AwareDatetime | None = None
    horizon_days: int = Field(ge=0)
    days_left: float
    gpu_count: int = Field(ge=1)
    nodes: list[str]
    monthly_cost_usd: str = Field(pattern=r"^\d+(\.\d+)?$", description="decimal as a string")
    auto_renew: bool = False
    # Which deadline this horizon counts down to: the lease's end, or the last day to give notice.
    deadline: Literal["end", "notice"] = "end"
    notice_deadline_passed: bool = False
    gpu_models: list[str] = Field(default_factory=list)
    summary: str = ""


class LeaseExpired(EventData):
    """A lease reached its end date without a renewal being declared."""

    event_name: ClassVar[str] = "lease.expired"
    contract_id: str
    provider: str
    ended_at: AwareDatetime
    gpu_count: int = Field(ge=1)
    nodes: list[str]
    gpu_models: list[str] = Field(default_factory=list)
    monthly_cost_usd: str = Field(pattern=r"^\d+(\.\d+)?$", description="decimal as a string")
    summary: str = ""


class AlertRaised(EventData):
    event_name: ClassVar[str] = "alert.raised"
    fingerprint: str
    rule: str
    severity: Literal["info", "warning", "critical"]
    category: Literal["health", "thermal", "cost", "capacity", "job"] = "health"
    summary: str
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    value: float | None = None
    starts_at: AwareDatetime


class AlertResolved(EventData):
    event_name: ClassVar[str] = "alert.resolved"
    fingerprint: str
    rule: str
    labels: dict[str, str]
    summary: str
    starts_at: AwareDatetime
    ends_at: AwareDatetime


EVENT_MODELS: tuple[type[EventData], ...] = (
    GpuTelemetry,
    NodeRegistered,
    NodeHeartbeat,
    NodeDrainRequested,
    JobSubmitted,
    JobPlaced,
    JobStarted,
    JobFinished,
    JobFailed,
    JobRejected,
    JobPreempted,
    JobRequeued,
    LeaseExpiring,
    LeaseExpired,
    AlertRaised,
    AlertResolved,
)
REGISTRY: dict[str, type[EventData]] = {m.event_type(): m for m in EVENT_MODELS}


# --------------------------------------------------------------------------- envelope


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Envelope(BaseModel):
    """CloudEvents 1.0 structured-mode envelope (JSON)."""

    model_config = ConfigDict(extra="forbid")
    specversion: Literal["1.0"]
    id: str = Field(min_length=1, max_length=128)
    source: str = Field(min_length=1)
    type: str = Field(min_length=1)
    time: AwareDatetime
    subject: str | None = None
    datacontenttype: Literal["application/json"] = "application/json"
    # CloudEvents extension attribute: ties together the events of one flow (a job, an alert).
    correlationid: str | None = None
    data: dict[str, Any]
    _wire: bytes | None = PrivateAttr(default=None)  # the bytes it was decoded from

    def wire(self) -> bytes:
        """The event's bytes: exactly as received when it was decoded, else its encoding."""
        return self._wire if self._wire is not None else encode(self)


class InvalidEvent(Exception):
    """The bytes are not a valid WhaleFlux event; `reason` says why (no payload values)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def new_event_id() -> str:
    return uuid.uuid4().hex


def make_envelope(
    data: EventData,
    *,
    source: str,
    subject: str | None = None,
    event_id: str | None = None,
    correlation_id: str | None = None,
    time: datetime | None = None,
) -> Envelope:
    return Envelope(
        specversion="1.0",
        id=event_id or new_event_id(),
        source=source,
        type=data.event_type(),
        time=time or utcnow(),
        subject=subject,
        correlationid=correlation_id,
        data=data.model_dump(mode="json"),
    )


def encode(envelope: Envelope) -> bytes:
    return envelope.model_dump_json(exclude_none=True).encode()


# One envelope model per event type with `data` typed, joined in a union tagged by
# `type`: a valid event is parsed and validated from its bytes in one pydantic pass,
# about twice as fast as json.loads + envelope + data (see bench/RESULTS.md, Telemetry).
_ENVELOPE_FIELDS = tuple(n for n in Envelope.model_fields if n != "data")
_TYPED_ENVELOPES = TypeAdapter(
    Annotated[
        Union[tuple(
            create_model(f"{m.__name__}Envelope", __base__=Envelope, type=(Literal[t], ...), data=(m, ...))
            for t, m in REGISTRY.items()
        )],
        Field(discriminator="type"),
    ]
)


def decode(raw: bytes) -> tuple[Envelope, EventData]:
    """Parse and validate an event; raise InvalidEvent with a reason naming the field."""
    typed, data = decode_typed(raw)
    if type(typed) is Envelope:
        return typed, data
    env = Envelope.model_construct(
        **{n: getattr(typed, n) for n in _ENVELOPE_FIELDS},
        data=data.model_dump(mode="json", exclude_none=True),  # as encode() puts it on the wire
    )
    return env, data


def decode_typed(raw: bytes) -> tuple[Envelope, EventData]:
    """Like `decode`, but the envelope's `data` is the validated model itself, not a dict.

    For high-rate consumers (bus batch mode): turning the model back into a dict
    costs as much as validating it. The envelope is an Envelope subclass.
    """
    try:
        typed = _TYPED_ENVELOPES.validate_json(raw)
    except ValidationError:
        # Invalid somewhere: the step-by-step path below names the problem the
        # way it always has (not JSON / envelope / unknown type / data field).
        return _decode_stepwise(raw)
    typed._wire = raw
    return typed, typed.data


def _decode_stepwise(raw: bytes) -> tuple[Envelope, EventData]:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidEvent(f"not JSON: {exc.msg if hasattr(exc, 'msg') else exc}") from None
    try:
        env = Envelope.model_validate(doc)
    except ValidationError as exc:
        raise InvalidEvent("envelope: " + _describe(exc)) from None
    model = REGISTRY.get(env.type)
    if model is None:
        raise InvalidEvent(f"unknown event type or version {env.type!r}")
    try:
        data = model.model_validate(env.data)
    except ValidationError as exc:
        raise InvalidEvent(f"{env.type}: " + _describe(exc)) from None
    return env, data


def _describe(exc: ValidationError) -> str:
    """Name each bad field and what is wrong with it, without echoing its value."""
    parts = []
    for err in exc.errors(include_url=False, include_input=False)[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
