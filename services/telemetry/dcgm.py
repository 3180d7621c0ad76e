"""GPU metrics in dcgm-exporter's exposition: its metric names, types, units and labels. No I/O.

Existing Prometheus rules and Grafana dashboards written for dcgm-exporter
(e.g. dashboard 12239) work against this unchanged. Counters keep
dcgm-exporter's names, without the `_total` suffix prometheus_client would
add, which is why this module writes the text format itself.

Labels as dcgm-exporter sets them (`gpu`, `UUID`, `pci_bus_id`, `device`,
`modelName`, `Hostname`, `DCGM_FI_DRIVER_VERSION`), plus `cluster`, `instance`
(the node, so a per-instance dashboard selects a node when Prometheus scrapes
with `honor_labels: true`) and, while a job holds the GPU, `hpc_job` (the job
id, dcgm-exporter's label for it: a `job` label would overwrite Prometheus's own
under `honor_labels: true`), `team` and `project`. A metric the GPU does not
report is left out, never written as 0.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client.utils import floatToGoString

from whaleflux.shared.events import GpuIdentity, GpuSample

_go_float: Callable[[float], str] = floatToGoString  # as prometheus_client writes numbers (it has no types)


@dataclass(frozen=True)
class JobLabels:
    job: str
    team: str
    project: str


@dataclass(frozen=True)
class GpuState:
    """What /metrics knows of one GPU: its latest sample and where it is."""

    cluster: str
    node: str
    sample: GpuSample
    identity: GpuIdentity | None = None
    job: JobLabels | None = None
    last_xid: int = 0


@dataclass(frozen=True)
class Family:
    name: str
    type: str  # gauge | counter
    help: str
    value: Callable[[GpuState], float | None]


def _s(attr: str, scale: float = 1.0) -> Callable[[GpuState], float | None]:
    def get(st: GpuState) -> float | None:
        v = getattr(st.sample, attr)
        return None if v is None else float(v) * scale

    return get


def _ratio(attr: str) -> Callable[[GpuState], float | None]:
    return _s(attr)


FAMILIES: tuple[Family, ...] = (
    Family("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", _s("sm_clock_mhz")),
    Family("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", _s("mem_clock_mhz")),
    Family("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", _s("memory_temperature_c")),
    Family("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", _s("temperature_c")),
    Family("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", _s("power_w")),
    Family("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ).",
           _s("energy_j", 1000.0)),
    Family("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", _s("pcie_replay_count")),
    Family("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", _s("utilization_gpu_pct")),
    Family("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", _s("utilization_memory_pct")),
    Family("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", _s("encoder_util_pct")),
    Family("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", _s("decoder_util_pct")),
    Family("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.",
           lambda st: float(st.last_xid)),
    Family("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", _s("memory_free_mib")),
    Family("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", _s("memory_used_mib")),
    Family("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", _s("memory_reserved_mib")),
    Family("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors.",
           _s("ecc_corrected")),
    Family("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.",
           _s("ecc_uncorrected")),
    Family("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries.",
           _s("nvlink_replay_errors")),
    Family("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink recovery errors.",
           _s("nvlink_recovery_errors")),
    Family("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes.",
           _s("nvlink_bandwidth_bytes")),
    Family("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors",
           _s("remapped_rows_uncorrectable")),
    Family("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors",
           _s("remapped_rows_correctable")),
    Family("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", _s("row_remap_failure")),
    Family("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.",
           _ratio("gr_engine_active")),
    Family("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.",
           _ratio("tensor_active")),
    Family("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
           "Ratio of cycles the device memory interface is active sending or receiving data.",
           _ratio("dram_active")),
    Family("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge",
           "The rate of data transmitted over the PCIe bus - including both protocol headers and data "
           "payloads - in bytes per second.",
           _s("pcie_tx_bytes_per_s")),
    Family("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge",
           "The rate of data received over the PCIe bus - including both protocol headers and data "
           "payloads - in bytes per second.",
           _s("pcie_rx_bytes_per_s")),
    # Not a DCGM field: DCGM splits CRC errors into flit and data counters, NVML's sum is what we have.
    Family("whaleflux_gpu_nvlink_crc_errors_total", "counter", "NVLink CRC errors (flit + data), all links.",
           _s("nvlink_crc_errors")),
)


def labels(st: GpuState) -> dict[str, str]:
    """dcgm-exporter's labels for one GPU, plus cluster, instance and the job holding it."""
    ident = st.identity
    out = {
        "gpu": str(st.sample.index),
        "UUID": st.sample.uuid,
        "pci_bus_id": (ident.pci_bus_id if ident and ident.pci_bus_id else ""),
        "device": f"nvidia{st.sample.index}",
        "modelName": ident.name if ident else st.sample.model,
        "Hostname": st.node,
        "DCGM_FI_DRIVER_VERSION": (ident.driver_version if ident and ident.driver_version else ""),
        "cluster": st.cluster,
        "instance": st.node,
    }
    if st.job is not None:
        out.update(hpc_job=st.job.job, team=st.job.team, project=st.job.project)
    return out


# GeForce cards before Blackwell (RTX 50) have no DCGM profiling metrics: DCGM_FI_PROF_* is left out for them
# whatever the agent reports. A GeForce is named so by the device, or has a catalogue id such as RTX4090.
_GEFORCE_ID = re.compile(r"RTX ?(\d{4})(TI|SUPER)?", re.IGNORECASE)


def has_profiling(st: GpuState) -> bool:
    """Whether the GPU can have DCGM profiling metrics (DCGM_FI_PROF_*): not a GeForce before Blackwell."""
    name = st.identity.name if st.identity else ""
    geforce = _GEFORCE_ID.fullmatch(st.sample.model) or (_GEFORCE_ID.search(name) if "GeForce" in name else None)
    return geforce is None or geforce.group(1).startswith("50")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(states: Iterable[GpuState]) -> str:
    """The text exposition (format 0.0.4) of every family that at least one GPU reports."""
    states = list(states)
    label_text = [",".join(f'{k}="{_escape(v)}"' for k, v in labels(st).items()) for st in states]
    out: list[str] = []
    profiling = [has_profiling(st) for st in states]
    for fam in FAMILIES:
        lines = []
        prof = fam.name.startswith("DCGM_FI_PROF_")
        for st, lt, can in zip(states, label_text, profiling, strict=True):
            value = fam.value(st) if can or not prof else None
            if value is not None:
                lines.append(f"{fam.name}{{{lt}}} {_go_float(value)}\n")
        if lines:
            out.append(f"# HELP {fam.name} {fam.help}\n# TYPE {fam.name} {fam.type}\n")
            out.extend(lines)
    return "".join(out)
