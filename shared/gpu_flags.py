"""What is wrong with a GPU right now, from its latest sample: the one rule telemetry's views and the console's
fleet pages both show. No I/O."""

from __future__ import annotations

from .events import GpuSample

HOT_MARGIN_C = 5.0
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
    if sample.ecc_uncorrected or sample.remapped_rows_uncorrectable or sample.row_remap_failure:
        out.append("ecc")
    if sample.nvlink_crc_errors:
        out.append("nvlink")
    if sample.memory_used_mib >= 0.98 * sample.memory_total_mib:
        out.append("mem_full")
    return out
