"""A fleet file and gpu_models.yaml turned into the placement core's nodes and facts."""

from __future__ import annotations

from pathlib import Path

import yaml

from whaleflux.shared.catalog import Fleet, gpu_models
from whaleflux.shared.datafiles import DATA_DIR

from ..placement import GpuState, Interconnects, ModelFacts, NodeState


def fleet_nodes(fleet: Fleet) -> list[NodeState]:
    """One NodeState per fleet node, every GPU free, in fleet order."""
    models = gpu_models()
    nodes = []
    for n in fleet.nodes():
        mem = models[n.gpu_model].memory_mib
        gpus = tuple(GpuState(f"{n.name}-gpu{i}", i, mem) for i in range(n.gpus))
        nodes.append(NodeState(n.name, n.cluster, n.gpu_model, n.interconnect, gpus, pool=n.pool))
    return nodes


def model_facts() -> dict[str, ModelFacts]:
    """Speeds by workload class for every model in gpu_models.yaml."""
    return {key: ModelFacts(key, dict(m.speed)) for key, m in gpu_models().items()}


def interconnects(path: str | Path | None = None) -> Interconnects:
    """`multi_gpu_efficiency` from gpu_models.yaml."""
    doc = yaml.safe_load(Path(path or DATA_DIR / "gpu_models.yaml").read_text())
    eff = doc.get("multi_gpu_efficiency", {})
    return Interconnects(
        nvlink=eff.get("nvlink", 1.0), pcie=eff.get("pcie", 0.75), cross_node=eff.get("cross_node", 0.9)
    )
