"""GPU and node events: telemetry batches, registration, heartbeats, drains and undrains, GPU cordons (see
docs/events/)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import AwareDatetime, BaseModel, Field

from .event_data import MODEL_CONFIG, Attempt, Count, EventData, Int, JobId, NonNeg, Percent, Token


class GpuSample(BaseModel):
    """One GPU at one instant. Metrics a device does not support are None, never 0."""

    model_config = MODEL_CONFIG
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
    ecc_uncorrected: Count | None = None
    xid_errors: list[Int] = Field(default_factory=list, description="XIDs seen since the previous sample")
    # Added in v1 before release; all optional, absent where the device does not support them.
    memory_free_mib: NonNeg | None = None
    memory_reserved_mib: NonNeg | None = None
    shutdown_temperature_c: Annotated[float, Field(ge=0, le=200)] | None = None
    thermal_margin_c: Annotated[float, Field(ge=-100, le=200)] | None = Field(
        None, description="degrees below the slowdown limit, as the device reports it"
    )
    ecc_corrected: Count | None = None
    remapped_rows_correctable: Count | None = None
    remapped_rows_uncorrectable: Count | None = None
    row_remap_failure: bool | None = None
    pcie_replay_count: Count | None = None
    pcie_tx_bytes_per_s: NonNeg | None = None
    pcie_rx_bytes_per_s: NonNeg | None = None
    nvlink_links_active: Annotated[int, Field(ge=0, le=64)] | None = None
    nvlink_crc_errors: Count | None = Field(None, description="flit + data CRC errors, all links")
    nvlink_replay_errors: Count | None = None
    nvlink_recovery_errors: Count | None = None
    nvlink_bandwidth_bytes: NonNeg | None = Field(None, description="rx + tx bytes over all links since boot")
    tensor_active: Annotated[float, Field(ge=0, le=1)] | None = Field(
        None, description="ratio of cycles the tensor pipe is active")
    # Added in v1 before release: the rest of dcgm-exporter's default counters; None where the device or the
    # backend has none (the NVML backend reads no DCGM profiling field: gr_engine_active, dram_active).
    encoder_util_pct: Percent | None = Field(None, description="video encoder utilization, NVML's average")
    decoder_util_pct: Percent | None = Field(None, description="video decoder utilization, NVML's average")
    gr_engine_active: Annotated[float, Field(ge=0, le=1)] | None = Field(
        None, description="ratio of time the graphics or compute engine is active (DCGM profiling)")
    dram_active: Annotated[float, Field(ge=0, le=1)] | None = Field(
        None, description="ratio of cycles the device memory interface is sending or receiving (DCGM profiling)")
    processes: list[GpuProcess] = Field(default_factory=list)


class GpuProcess(BaseModel):
    """A process holding GPU memory; `job_id` when the agent launched it."""

    model_config = MODEL_CONFIG
    pid: Count
    used_mib: NonNeg
    job_id: str | None = None


class GpuIdentity(BaseModel):
    model_config = MODEL_CONFIG
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
    seq: Count
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
    # Added in v1 before release: the node's self-fence budget (its supervisors stop their jobs after this long
    # without a heartbeat out) and their grace, so the scheduler holds a lost node's jobs long enough; None: older.
    fence_after_s: float | None = Field(None, gt=0, le=86_400)
    stop_grace_s: float | None = Field(None, ge=0, le=3600)


class AttemptReport(BaseModel):
    """One attempt the node holds: running under its supervisor, or ended (with its recorded exit) and
    listed for a while after its job.finished was published, so the scheduler can reconcile both ways;
    or refused (never started: its placement's `start_by` had passed), listed as long."""

    model_config = MODEL_CONFIG
    job_id: JobId
    attempt: Attempt
    rank: Count | None = None
    # Added in v1 before release: "refused" (a placement that came after its start_by; never started).
    state: Literal["running", "exited", "refused"]
    started_at: AwareDatetime | None = None
    exit_code: Int | None = None
    finished_at: AwareDatetime | None = None
    interrupted: str | None = Field(
        None, description="why the node stopped it (a planned stop), if it did; why it refused it (state refused)")


class NodeHeartbeat(EventData):
    event_name: ClassVar[str] = "node.heartbeat"
    cluster: Token
    node: Token
    seq: Count
    running_jobs: list[str] = Field(default_factory=list)
    # Added in v1 before release: the node is the authority on what runs on it. Every attempt it
    # runs, and those that ended recently, with their recorded exit (None: an agent too old to say).
    attempts: list[AttemptReport] | None = None
    # Added in v1 before release: why the node takes no new work, as its agent found it (a full, read-only or
    # failing disk: "attempt store: no space left on device, 0 B free"); None: the node is healthy.
    fault: str | None = Field(None, max_length=500)


Verdict = Literal["pass", "warn", "fail"]


class GpuCheck(BaseModel):
    """One check of a GPU's burn-in: its verdict, why, and what it measured (units in each figure's name)."""

    model_config = MODEL_CONFIG
    check: Literal["compute", "memory", "bandwidth", "thermal", "health"]
    verdict: Verdict
    reasons: list[str] = Field(default_factory=list)
    figures: dict[str, float] = Field(default_factory=dict)


class GpuReportCard(BaseModel):
    """One GPU's burn-in: the worst verdict of its checks, every reason, every check."""

    model_config = MODEL_CONFIG
    uuid: str = Field(min_length=1, max_length=96)
    index: int = Field(ge=0, le=255)
    model: str
    verdict: Verdict
    reasons: list[str] = Field(default_factory=list)
    checks: list[GpuCheck] = Field(default_factory=list)


class GpuValidated(EventData):
    """A node's GPUs were burnt in (the agent's validation gate): a report card per GPU. A GPU that failed is
    quarantined: the node registers without it."""

    event_name: ClassVar[str] = "gpu.validated"
    cluster: Token
    node: Token
    reason: str = Field(description="why the node was burnt in: first registration, a GPU fault, ...")
    started_at: AwareDatetime
    finished_at: AwareDatetime
    duration_s: NonNeg = Field(description="the compute and thermal stress")
    intensity: Literal["low", "normal", "max"]
    checks: list[Literal["compute", "memory", "bandwidth", "thermal"]]
    verdict: Verdict
    gpus: list[GpuReportCard]
    quarantined: list[str] = Field(default_factory=list, description="UUIDs of the GPUs left out of registration")


class NodeDrainRequested(EventData):
    """Take no new work on the node and move its jobs elsewhere (alerting, an operator)."""

    event_name: ClassVar[str] = "node.drain_requested"
    cluster: Token
    node: Token
    reason: str
    fingerprint: str | None = Field(None, description="the alert that asked for it, if any")



class NodeUndrained(EventData):
    """An operator let a drained node take work again (the scheduler, once it has)."""

    event_name: ClassVar[str] = "node.undrained"
    cluster: Token
    node: Token


# "alert": a critical alert fires on the GPU (alerting's alert.raised), until its alert.resolved.
GpuCordonCause = Literal["operator", "xid", "ecc", "missing", "alert"]


class GpuCordoned(EventData):
    """A GPU is out of placement: an operator cordoned it, or the scheduler quarantined it for a fault (a fatal
    XID, an uncorrectable ECC or row-remap failure, or no telemetry while its node heartbeats)."""

    event_name: ClassVar[str] = "gpu.cordoned"
    cluster: Token
    node: Token
    gpu_uuid: str = Field(min_length=1, max_length=96)
    gpu_index: int = Field(ge=0, le=255)
    cause: GpuCordonCause
    reason: str = Field(min_length=1, max_length=500)


class GpuUncordoned(EventData):
    """A GPU takes work again: an operator uncordoned it, or it reported healthy for the scheduler's hold time."""

    event_name: ClassVar[str] = "gpu.uncordoned"
    cluster: Token
    node: Token
    gpu_uuid: str = Field(min_length=1, max_length=96)
    gpu_index: int = Field(ge=0, le=255)
    by: Literal["operator", "scheduler"]
    reason: str = Field(min_length=1, max_length=500)
    accepted_ecc_errors: Count = Field(
        0, description="uncorrectable ECC errors and remap failures the GPU had when an operator cleared it: only "
                       "more than these quarantine it again")
