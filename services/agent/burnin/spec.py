"""What a GPU model should achieve, from gpu_models.yaml (datasheet figures)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from whaleflux.shared.catalog import model_key
from whaleflux.shared.datafiles import DATA_DIR

# One direction of an x16 link, GB/s, by PCIe generation (128b/130b encoding from gen 3 on).
PCIE_X16_GBPS = {3: 15.75, 4: 31.5, 5: 63.0, 6: 121.0}


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet figures a burn-in compares its measurements with (GB/s are 1e9 bytes per second)."""

    model: str
    fp32_tflops: float | None
    bf16_dense_tflops: float | None
    memory_gb: float
    memory_bandwidth_gbps: float | None
    pcie_gbps: float | None  # one direction, x16
    nvlink_gbps: float | None  # one direction, all links of one GPU
    temp_slowdown_c: float | None
    temp_max_operating_c: float | None
    ecc: bool


@lru_cache(maxsize=4)
def _models(path: str | None) -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(Path(path or DATA_DIR / "gpu_models.yaml").read_text())
    return dict(doc["models"])


def gpu_spec(model: str, path: str | None = None) -> GpuSpec | None:
    """The spec of a catalogue key or device name ("H200", "NVIDIA H200"); None for a model not in the file."""
    key = model_key(model) if path is None else model
    raw = _models(path).get(key or model)
    if raw is None:
        return None
    nvlink = float(raw.get("nvlink_gbps") or 0)
    bandwidth = raw.get("memory_bandwidth_tbps")
    return GpuSpec(
        model=key or model,
        fp32_tflops=_opt(raw.get("fp32_tflops")),
        bf16_dense_tflops=_opt(raw.get("bf16_dense_tflops")),
        memory_gb=float(raw["memory_gb"]),
        memory_bandwidth_gbps=float(bandwidth) * 1000 if bandwidth is not None else None,
        pcie_gbps=PCIE_X16_GBPS.get(int(raw["pcie_gen"])) if raw.get("pcie_gen") else None,
        # The datasheet's NVLink figure is both directions together.
        nvlink_gbps=nvlink / 2 if nvlink else None,
        temp_slowdown_c=_opt(raw.get("temp_slowdown_c")),
        temp_max_operating_c=_opt(raw.get("temp_max_operating_c")),
        ecc=bool(raw.get("ecc", False)),
    )


def _opt(value: float | int | None) -> float | None:
    return None if value is None else float(value)
