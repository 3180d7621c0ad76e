"""What is wrong with a GPU right now, from its latest sample: the one rule telemetry's views and the console's
fleet pages both show. No I/O."""

from __future__ import annotations

from .events import GpuSample

HOT_MARGIN_C = 5.0
# XIDs after which a GPU must not take work until it is reset: 79 fallen off the bus, 48 double-bit ECC error,
# 94 contained and 95 uncontained ECC error.
FATAL_XIDS = frozenset({48, 79, 94, 95})
THERMAL_REASONS = {"sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown", "hw_power_brake_slowdown"}


def flags(sample: GpuSample, last_xid: int | None, stale: bool) -> list[str]:
    """Short names the monitor highlights: stale, hot, throttled, xid, ecc, nvlink, mem_full."""
    out = []
    if stale:
        out.append("stale")
    slowdown = sample.slowdown_temperature_c
    if slowdown is not None and sample.temperature_c >= slowdown - HOT_MARGIN_C:
        out.append("hot")
    if THERMAL_REASONS & set(sample.throttle_reasons):
        out.append("throttled")
    if sample.xid_errors or last_xid:
        out.append("xid")
    if ecc_errors(sample):
        out.append("ecc")
    if sample.nvlink_crc_errors:
        out.append("nvlink")
    if sample.memory_used_mib >= 0.98 * sample.memory_total_mib:
        out.append("mem_full")
    return out


def ecc_errors(sample: GpuSample) -> int:
    """Uncorrectable ECC errors, rows that could not be remapped and a row-remap failure, added up: 0 is healthy."""
    failure = 1 if sample.row_remap_failure else 0
    return (sample.ecc_uncorrected or 0) + (sample.remapped_rows_uncorrectable or 0) + failure


def fatal_xids(sample: GpuSample) -> list[int]:
    """The XIDs of this sample after which the GPU must not take work (see FATAL_XIDS)."""
    return [x for x in sample.xid_errors if x in FATAL_XIDS]
