"""The fault kinds of the simulated fleet, what each one means and the parameters each one takes: plain tables,
no pydantic, so the CLI can name them in its help without importing models (its start-up stays light)."""

from __future__ import annotations

from typing import Literal

FaultKind = Literal["cooling", "ecc-dbe", "xid79", "xid48", "nvlink-crc", "vram-leak", "foreign-memory", "gpu-vanish",
                    "vram-flip", "pcie-degraded", "node-silent"]

FAULT_HELP: dict[str, str] = {
    "cooling": "cooling failure: the GPU's temperature runs away past its slowdown limit and it throttles",
    "ecc-dbe": "an uncorrectable (double-bit) ECC error: volatile DBE count and uncorrectable remapped rows rise",
    "xid79": "XID 79, the GPU has fallen off the bus: reported once, then the GPU stops answering",
    "xid48": "XID 48, a double-bit ECC error the driver reports as an XID event",
    "nvlink-crc": "a burst of NVLink CRC errors over the next seconds",
    "vram-leak": "the process of the job on this GPU leaks memory until the GPU is full",
    "foreign-memory": "a process WhaleFlux did not start holds memory_mib of the GPU (busy or idle)"
                      " until the agent restarts",
    "gpu-vanish": "the GPU disappears from the node without an XID",
    "vram-flip": "a VRAM cell flips `bits` bits: a burn-in's memory test finds it (ECC corrects one bit, not two)",
    "pcie-degraded": "the GPU's PCIe link trained at x4: host<->device copies run at a quarter of the spec",
    "node-silent": "the node stops publishing telemetry and heartbeats (for duration_s, or until restart)",
}

GPU_FAULTS = frozenset(FAULT_HELP) - {"node-silent"}

# The parameters each kind takes (field names of `Fault`); any other parameter set for a kind is refused.
FAULT_PARAMS: dict[str, tuple[str, ...]] = {
    "cooling": ("cooling_factor",),
    "nvlink-crc": ("crc_errors",),
    "vram-leak": ("leak_mib_per_s",),
    "foreign-memory": ("memory_mib",),
    "vram-flip": ("bits",),
    "node-silent": ("duration_s",),
}
PARAMETERS = ("duration_s", "leak_mib_per_s", "memory_mib", "crc_errors", "cooling_factor", "bits")
# Why duration_s is refused for the kinds other than node-silent: their state stays on the GPU.
NO_DURATION = ("a GPU fault lasts until the agent restarts (a vram-leak until the job's process ends);"
               " only node-silent can end on its own")
