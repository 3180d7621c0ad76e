"""Thermal rule: a GPU at or above its slowdown temperature.

The threshold is the one the device reports when it reports one, else the
model's default from gpu_models.yaml. The alert clears only once the GPU is
HYSTERESIS_C below the threshold, so a GPU hovering at the limit does not flap.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from whaleflux.shared.catalog import GpuModel
from whaleflux.shared.events import GpuSample

RULE = "GPUTemperatureHigh"
HYSTERESIS_C = 3.0


@dataclass(frozen=True)
class ThermalVerdict:
    firing: bool
    resolved: bool
    threshold_c: float


def fingerprint(labels: dict[str, str]) -> str:
    """Stable id of an alert: the same labels always give the same fingerprint."""
    canon = "\x00".join(f"{k}={labels[k]}" for k in sorted(labels))
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


def threshold(sample: GpuSample, model: GpuModel | None) -> float | None:
    if sample.slowdown_temperature_c is not None:
        return sample.slowdown_temperature_c
    return model.temp_slowdown_c if model else None


def evaluate(sample: GpuSample, model: GpuModel | None) -> ThermalVerdict | None:
    """None when no threshold is known for this GPU."""
    limit = threshold(sample, model)
    if limit is None:
        return None
    return ThermalVerdict(
        firing=sample.temperature_c >= limit,
        resolved=sample.temperature_c < limit - HYSTERESIS_C,
        threshold_c=limit,
    )
