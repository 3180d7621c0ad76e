"""What agents registered: each node's record, folded from registrations and heartbeats, its GPUs' status. No I/O.

A node that stops reporting is `missing` (computed on read, against the
service clock) with the time it was last seen; its GPUs are never deleted.
A GPU the scheduler keeps out (gpu.cordoned) is `missing` when it went
missing from telemetry, `unhealthy` for a fault or an operator's cordon.
`last_seen` is the agent's clock (the envelope `time`) and only moves forward.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from pydantic import BaseModel

from whaleflux.shared.events import EventData, GpuIdentity, NodeHeartbeat, NodeRegistered

from .reconcile import DiscoveredGpu


class NodeRecord(BaseModel):
    cluster: str
    node: str
    rack: str | None
    pool: str | None
    registered_at: datetime
    last_seen: datetime
    gpus: list[GpuIdentity]


class GpuRow(BaseModel):
    uuid: str
    index: int
    model: str
    name: str
    serial: str | None
    memory_total_mib: float
    node: str
    cluster: str
    pool: str | None
    status: str
    last_seen: datetime
    rack: str | None = None
    pci_bus_id: str | None = None
    driver_version: str | None = None
    vbios_version: str | None = None
    registered_at: datetime | None = None


def seen(current: NodeRecord | None, at: datetime, data: EventData) -> NodeRecord | None:
    """The node's record after a registration or heartbeat sent at `at`; None: nothing to write.

    A registration replaces rack, pool and GPUs and keeps the first `registered_at`;
    a heartbeat before any registration is dropped (the registration will follow).
    """
    if isinstance(data, NodeRegistered):
        return NodeRecord(
            cluster=data.cluster, node=data.node, rack=data.rack, pool=data.pool,
            registered_at=current.registered_at if current else at,
            last_seen=max(at, current.last_seen) if current else at,
            gpus=data.gpus,
        )
    if isinstance(data, NodeHeartbeat) and current is not None:
        return current.model_copy(update={"last_seen": max(at, current.last_seen)})
    return None


def gpu_status(node_quiet: bool, cordon: str | None) -> str:
    """`missing`: its node went quiet, or the scheduler found it gone from telemetry; `unhealthy`: the scheduler
    keeps it out for a fault (XID, ECC) or an operator's cordon; else `active`."""
    if node_quiet or cordon == "missing":
        return "missing"
    return "unhealthy" if cordon is not None else "active"


def gpu_rows(nodes: list[NodeRecord], now: datetime, missing_after: timedelta,
             cordons: Mapping[str, str] | None = None) -> list[GpuRow]:
    """Flatten nodes to GPUs with a status (`gpu_status`; `cordons`: uuid -> why the scheduler keeps it out)."""
    cordons = cordons or {}
    rows = []
    for n in nodes:
        quiet = now - n.last_seen > missing_after
        for g in n.gpus:
            status = gpu_status(quiet, cordons.get(g.uuid))
            rows.append(
                GpuRow(
                    uuid=g.uuid, index=g.index, model=g.model, name=g.name, serial=g.serial,
                    memory_total_mib=g.memory_total_mib, node=n.node, cluster=n.cluster, pool=n.pool,
                    status=status, last_seen=n.last_seen, rack=n.rack, pci_bus_id=g.pci_bus_id,
                    driver_version=g.driver_version, vbios_version=g.vbios_version, registered_at=n.registered_at,
                )
            )
    return sorted(rows, key=lambda r: (r.node, r.index))


def discovered(nodes: list[NodeRecord], now: datetime, missing_after: timedelta,
               cordons: Mapping[str, str] | None = None) -> list[DiscoveredGpu]:
    """The registered GPUs as reconciliation takes them."""
    return [
        DiscoveredGpu(r.uuid, r.index, r.model, r.node, r.cluster, r.rack, r.pool, r.status, r.last_seen,
                      r.registered_at or r.last_seen)
        for r in gpu_rows(nodes, now, missing_after, cordons)
    ]
