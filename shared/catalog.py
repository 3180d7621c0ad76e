"""GPU model facts (gpu_models.yaml) and fleet files, loaded into typed objects."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from .datafiles import DATA_DIR, DEFAULT_ASSETS, DEFAULT_FLEET  # noqa: F401  (re-exported)


class GpuModel(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    key: str
    names: list[str]
    memory_mib: int
    memory_gb: int
    tdp_w: float
    idle_power_w: float
    min_power_limit_w: float
    ecc: bool
    nvlink_gbps: float
    memory_bandwidth_tbps: float
    bf16_dense_tflops: float
    temp_shutdown_c: float
    temp_slowdown_c: float
    temp_max_operating_c: float
    mem_temp_max_c: float | None = None
    speed: dict[str, float]


@lru_cache(maxsize=4)
def gpu_models(path: str | None = None) -> dict[str, GpuModel]:
    """Models keyed by their short name (H100, H200, A100, RTX4090)."""
    doc = yaml.safe_load(Path(path or DATA_DIR / "gpu_models.yaml").read_text())
    return {key: GpuModel(key=key, **spec) for key, spec in doc["models"].items()}


@lru_cache(maxsize=4)
def multi_gpu_efficiency(path: str | None = None) -> dict[str, float]:
    """Speed factor of a multi-GPU job by interconnect: nvlink, pcie, cross_node."""
    doc = yaml.safe_load(Path(path or DATA_DIR / "gpu_models.yaml").read_text())
    return {key: float(value) for key, value in doc["multi_gpu_efficiency"].items()}


def model_key(name: str) -> str | None:
    """Map a device name ("NVIDIA H100 80GB HBM3") or key to the catalogue key."""
    for key, model in gpu_models().items():
        if name == key or name in model.names:
            return key
    return None


class FleetGroup(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=r"^[A-Za-z0-9_-]+$")
    gpu_model: str
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1, le=64)
    interconnect: Literal["nvlink", "pcie"]
    cluster: str = Field(pattern=r"^[A-Za-z0-9_-]+$")
    pool: str
    ownership: Literal["owned", "leased", "cloud"]
    racks: int = Field(ge=1)


class FleetNode(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    group: str
    cluster: str
    rack: str
    pool: str
    ownership: str
    gpu_model: str
    gpus: int
    interconnect: Literal["nvlink", "pcie"]


class Fleet(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    groups: list[FleetGroup]

    def nodes(self) -> list[FleetNode]:
        """Nodes are named `<group>-NN`, spread round-robin over the group's racks."""
        out = []
        for g in self.groups:
            for i in range(g.nodes):
                out.append(
                    FleetNode(
                        name=f"{g.name}-{i + 1:02d}",
                        group=g.name,
                        cluster=g.cluster,
                        rack=f"{g.name}-rack{i % g.racks + 1}",
                        pool=g.pool,
                        ownership=g.ownership,
                        gpu_model=g.gpu_model,
                        gpus=g.gpus_per_node,
                        interconnect=g.interconnect,
                    )
                )
        return out


def load_fleet(path: str | Path = DEFAULT_FLEET) -> Fleet:
    fleet = Fleet.model_validate(yaml.safe_load(Path(path).read_text()))
    known = gpu_models()
    for g in fleet.groups:
        if g.gpu_model not in known:
            raise ValueError(f"{path}: group {g.name!r}: unknown gpu_model {g.gpu_model!r} (known: {sorted(known)})")
    return fleet
