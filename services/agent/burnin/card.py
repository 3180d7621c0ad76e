"""The report card of a burn-in: measurements and samples in, pass / warn / fail with each reason out. Pure.

Each check judges what it measured against the model's spec (spec.py) with the
thresholds below; the card's verdict is its worst check's. A `health` check is
always on the card: ECC counters, row remapping and XIDs over the whole run.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Literal

from whaleflux.shared.events import GpuCheck, GpuReportCard, GpuSample

from .spec import GpuSpec

Verdict = Literal["pass", "warn", "fail"]  # as GpuCheck and GpuReportCard (shared/fleet_events.py)
_RANK: dict[str, int] = {"pass": 0, "warn": 1, "fail": 2}
GB = 1e9
THERMAL_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown")
HW_REASONS = ("hw_slowdown", "hw_power_brake_slowdown")
CRITICAL_XIDS = frozenset({31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120})


@dataclass(frozen=True)
class Thresholds:
    """Ratios are of the spec figure: under `*_warn` warns, under `*_fail` fails."""

    compute_warn: float = 0.80
    compute_fail: float = 0.50
    bandwidth_warn: float = 0.60
    bandwidth_fail: float = 0.30
    coverage_warn: float = 0.50  # memory test reached less of the VRAM than this
    margin_warn_c: float = 3.0  # hottest sample within this of the slowdown limit


DEFAULT_THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class ComputeRun:
    flops: float
    seconds: float

    @property
    def tflops(self) -> float:
        return self.flops / self.seconds / 1e12 if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class MemoryRun:
    bytes_tested: int
    bytes_total: int
    passes: int  # patterns written and verified
    mismatches: int
    seconds: float
    bad_addresses: tuple[int, ...] = ()

    @property
    def gbps(self) -> float:
        """Bytes written plus read per second, in GB/s."""
        return 2 * self.bytes_tested * self.passes / self.seconds / GB if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class BandwidthRun:
    """Copy bandwidth in GB/s: host to device, device to host (pinned memory), device-local, and to each peer."""

    h2d_gbps: float
    d2h_gbps: float
    d2d_gbps: float | None = None
    peer_gbps: dict[int, float] = field(default_factory=dict)
    peer_link: str = "nvlink"  # what joins the peers, for the spec to compare with


@dataclass
class Measurements:
    """Everything a burn-in learnt about one GPU."""

    compute: ComputeRun | None = None
    memory: MemoryRun | None = None
    bandwidth: BandwidthRun | None = None
    before: GpuSample | None = None
    during: list[GpuSample] = field(default_factory=list)
    after: GpuSample | None = None
    thermal: bool = False  # judge `during` as the thermal check (else it only feeds the health check)


def worst(verdicts: list[Verdict]) -> Verdict:
    """The most severe verdict (pass when there is none)."""
    return max(verdicts, key=_RANK.__getitem__, default="pass")


def _grade(ratio: float, warn: float, fail: float) -> Verdict:
    return "fail" if ratio < fail else "warn" if ratio < warn else "pass"


def judge_compute(run: ComputeRun, spec: GpuSpec | None, th: Thresholds) -> GpuCheck:
    figures = {"tflops_fp32": round(run.tflops, 2), "seconds": round(run.seconds, 1)}
    if spec is None or not spec.fp32_tflops:
        return GpuCheck(check="compute", verdict="pass", figures=figures)
    ratio = run.tflops / spec.fp32_tflops
    figures |= {"spec_tflops_fp32": spec.fp32_tflops, "of_spec": round(ratio, 3)}
    verdict = _grade(ratio, th.compute_warn, th.compute_fail)
    under = f"{100 * (1 - ratio):.0f}% under the {spec.model}'s {spec.fp32_tflops:g}"
    reasons = [] if verdict == "pass" else [f"compute: {run.tflops:.1f} TFLOP/s fp32, {under}"]
    return GpuCheck(check="compute", verdict=verdict, reasons=reasons, figures=figures)


def judge_memory(run: MemoryRun, th: Thresholds) -> GpuCheck:
    coverage = run.bytes_tested / run.bytes_total if run.bytes_total else 0.0
    figures = {"tested_gb": round(run.bytes_tested / GB, 2), "coverage": round(coverage, 3), "patterns": run.passes,
               "mismatches": run.mismatches, "gbps": round(run.gbps, 1)}
    reasons: list[str] = []
    verdicts: list[Verdict] = []
    if run.mismatches:
        where = ", ".join(f"0x{a:x}" for a in sorted(set(run.bad_addresses))[:4])
        reasons.append(f"memory: {run.mismatches} mismatches in {run.bytes_tested / GB:.1f} GB tested"
                       + (f" (at {where})" if where else ""))
        verdicts.append("fail")
    if coverage < th.coverage_warn:
        reasons.append(f"memory: tested only {100 * coverage:.0f}% of the VRAM (others hold the rest)")
        verdicts.append("warn")
    return GpuCheck(check="memory", verdict=worst(verdicts), reasons=reasons, figures=figures)


def judge_bandwidth(run: BandwidthRun, spec: GpuSpec | None, th: Thresholds) -> GpuCheck:
    figures: dict[str, float] = {"h2d_gbps": round(run.h2d_gbps, 1), "d2h_gbps": round(run.d2h_gbps, 1)}
    if run.d2d_gbps is not None:
        figures["d2d_gbps"] = round(run.d2d_gbps, 1)
    for peer, gbps in sorted(run.peer_gbps.items()):
        figures[f"peer{peer}_gbps"] = round(gbps, 1)
    compared: list[tuple[str, float, float | None, str]] = [
        ("host→device", run.h2d_gbps, spec.pcie_gbps if spec else None, "PCIe x16"),
        ("device→host", run.d2h_gbps, spec.pcie_gbps if spec else None, "PCIe x16"),
    ]
    if run.d2d_gbps is not None:
        compared.append(("device memory", run.d2d_gbps, spec.memory_bandwidth_gbps if spec else None, "HBM"))
    peer_spec = (spec.nvlink_gbps if run.peer_link == "nvlink" else spec.pcie_gbps) if spec else None
    compared += [(f"to GPU {p}", g, peer_spec, run.peer_link) for p, g in sorted(run.peer_gbps.items())]
    reasons, verdicts = [], []
    for what, gbps, wanted, link in compared:
        if not wanted:
            continue
        ratio = gbps / wanted
        verdict = _grade(ratio, th.bandwidth_warn, th.bandwidth_fail)
        verdicts.append(verdict)
        if verdict != "pass":
            under = f"{100 * (1 - ratio):.0f}% under the {link} spec of {wanted:g}"
            reasons.append(f"bandwidth: {what} {gbps:.1f} GB/s, {under}")
    return GpuCheck(check="bandwidth", verdict=worst(verdicts), reasons=reasons, figures=figures)


def judge_thermal(samples: list[GpuSample], spec: GpuSpec | None, th: Thresholds) -> GpuCheck:
    if not samples:
        return GpuCheck(check="thermal", verdict="fail", reasons=["thermal: no sample of the GPU during the stress"])
    hottest = max(samples, key=lambda s: s.temperature_c)
    clocks = [s.sm_clock_mhz for s in samples if s.sm_clock_mhz is not None]
    power = [s.power_w for s in samples if s.power_w is not None]
    figures: dict[str, float] = {"samples": len(samples), "max_temperature_c": hottest.temperature_c}
    if clocks:
        figures |= {"median_sm_clock_mhz": statistics.median(clocks), "min_sm_clock_mhz": min(clocks)}
    if power:
        figures |= {"mean_power_w": round(statistics.fmean(power), 1), "max_power_w": max(power)}
    slowdown = hottest.slowdown_temperature_c or (spec.temp_slowdown_c if spec else None)
    if slowdown is not None:
        figures["slowdown_temperature_c"] = slowdown
    thermal = [s for s in samples if set(s.throttle_reasons) & set(THERMAL_REASONS)]
    hw = [s for s in samples if set(s.throttle_reasons) & set(HW_REASONS)]
    figures |= {"thermal_throttled_samples": len(thermal), "hw_slowdown_samples": len(hw),
                "power_capped_samples": sum("sw_power_cap" in s.throttle_reasons for s in samples)}
    reasons: list[str] = []
    verdicts: list[Verdict] = []
    if thermal:
        first = thermal[0]
        names = sorted({r for s in thermal for r in s.throttle_reasons if r in THERMAL_REASONS})
        reasons.append(f"thermal: throttled at {first.temperature_c:.0f} °C ({', '.join(names)}) "
                       f"in {len(thermal)} of {len(samples)} samples")
        verdicts.append("fail")
    elif slowdown is not None and hottest.temperature_c >= slowdown - th.margin_warn_c:
        reasons.append(f"thermal: reached {hottest.temperature_c:.0f} °C, "
                       f"within {th.margin_warn_c:g} °C of slowdown at {slowdown:g}")
        verdicts.append("warn")
    if hw:
        names = sorted({r for s in hw for r in s.throttle_reasons if r in HW_REASONS})
        reasons.append(f"thermal: hardware slowdown ({', '.join(names)}) in {len(hw)} of {len(samples)} samples")
        verdicts.append("warn")
    return GpuCheck(check="thermal", verdict=worst(verdicts), reasons=reasons, figures=figures)


def _delta(before: int | None, after: int | None) -> int:
    return max((after or 0) - (before or 0), 0) if after is not None else 0


def judge_health(m: Measurements) -> GpuCheck:
    """ECC counters and row remapping before and after, XIDs seen during the run, a GPU that stopped answering."""
    seen = [s for s in (m.before, *m.during, m.after) if s is not None]
    reasons: list[str] = []
    verdicts: list[Verdict] = []
    if m.after is None:
        reasons.append("health: the GPU stopped answering during the burn-in")
        verdicts.append("fail")
    b, a = m.before, m.after or (m.during[-1] if m.during else None)
    dbe = _delta(b.ecc_uncorrected if b else None, a.ecc_uncorrected if a else None)
    sbe = _delta(b.ecc_corrected if b else None, a.ecc_corrected if a else None)
    remapped = _delta(b.remapped_rows_uncorrectable if b else None, a.remapped_rows_uncorrectable if a else None)
    xids = sorted({x for s in seen for x in s.xid_errors})
    figures = {"ecc_uncorrected_new": dbe, "ecc_corrected_new": sbe, "remapped_uncorrectable_new": remapped,
               "xids": len(xids)}
    if dbe:
        reasons.append(f"health: {dbe} new uncorrectable ECC error(s)")
        verdicts.append("fail")
    if sbe:
        reasons.append(f"health: {sbe} new corrected ECC error(s)")
        verdicts.append("warn")
    remap_failed = any(s.row_remap_failure for s in seen)
    if remapped or remap_failed:
        failed = " and a remap failed" if remap_failed else ""
        reasons.append(f"health: rows remapped for uncorrectable errors{failed}")
        verdicts.append("fail")
    if xids:
        critical = [x for x in xids if x in CRITICAL_XIDS]
        reasons.append(f"health: XID {', '.join(map(str, xids))} during the run")
        verdicts.append("fail" if critical else "warn")
    return GpuCheck(check="health", verdict=worst(verdicts), reasons=reasons, figures=figures)


def report_card(uuid: str, index: int, model: str, m: Measurements, spec: GpuSpec | None,
                th: Thresholds = DEFAULT_THRESHOLDS) -> GpuReportCard:
    """Judge one GPU's measurements; checks that did not run are not on the card."""
    checks: list[GpuCheck] = []
    if m.compute is not None:
        checks.append(judge_compute(m.compute, spec, th))
    if m.memory is not None:
        checks.append(judge_memory(m.memory, th))
    if m.bandwidth is not None:
        checks.append(judge_bandwidth(m.bandwidth, spec, th))
    if m.thermal:
        checks.append(judge_thermal(m.during, spec, th))
    checks.append(judge_health(m))
    return GpuReportCard(uuid=uuid, index=index, model=model, verdict=worst([c.verdict for c in checks]),
                         reasons=[r for c in checks for r in c.reasons], checks=checks)
