"""Declared against discovered: what each registered GPU is (ownership, place, price), what does not match. No I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import Literal

from .assets import HOURS_PER_MONTH, Asset, Contract, Declarations, Ownership, Purchase

UNDECLARED: Literal["owned-unknown"] = "owned-unknown"


@dataclass(frozen=True)
class DiscoveredGpu:
    """A GPU as agents registered it."""

    uuid: str
    index: int
    model: str
    node: str
    cluster: str
    rack: str | None
    pool: str | None
    status: str  # active | missing | unhealthy (discovery.gpu_status)
    last_seen: datetime
    registered_at: datetime


@dataclass(frozen=True)
class GpuAsset:
    """One GPU with what was declared about it merged in."""

    uuid: str
    index: int
    model: str
    node: str
    status: str
    last_seen: datetime
    registered_at: datetime
    ownership: Ownership | Literal["owned-unknown"]
    declared: bool
    site: str | None
    cluster: str
    rack: str | None
    pool: str
    contract: Contract | None = None  # the lease in force now (or the latest one)
    contracts: tuple[str, ...] = ()
    purchase: Purchase | None = None
    hourly_price_per_gpu: Decimal | None = None
    since: date | None = None  # declared start (cloud; owned without a purchase)
    monthly_cost: Decimal | None = None  # what the GPU costs per month whether used or not; None if unknown
    depreciated: bool = False  # owned and fully depreciated at reconciliation time (amortization 0)
    valued: str = ""  # owned: "billing" once valued with billing's price book (valuation.py), else amortization only


@dataclass(frozen=True)
class Reconciliation:
    assets: list[GpuAsset]
    never_seen: list[str] = field(default_factory=list)  # declarations no registered GPU matches
    undeclared: list[str] = field(default_factory=list)  # GPU uuids registered but not declared
    mismatches: list[str] = field(default_factory=list)


def current_contract(contracts: list[Contract], now: datetime) -> Contract | None:
    """The contract whose term holds `now`; else the next one to start; else the last one to end."""
    if not contracts:
        return None
    for c in contracts:
        if c.starts_at <= now < c.ends_at:
            return c
    upcoming = [c for c in contracts if c.starts_at > now]
    if upcoming:
        return min(upcoming, key=lambda c: c.starts_at)
    return max(contracts, key=lambda c: c.ends_at)


def monthly_cost(asset: Asset, contract: Contract | None, now: datetime) -> Decimal | None:
    """Cost of one GPU per month from its ownership terms."""
    if asset.ownership == "leased" and contract is not None:
        return contract.monthly_price_per_gpu
    if asset.ownership == "owned" and asset.purchase is not None:
        return asset.purchase.monthly_cost(now)
    if asset.ownership == "cloud" and asset.hourly_price_per_gpu is not None:
        return asset.hourly_price_per_gpu * HOURS_PER_MONTH
    return None


def reconcile(decl: Declarations, discovered: list[DiscoveredGpu], now: datetime) -> Reconciliation:
    """Merge declarations into the discovered GPUs and list what does not match."""
    by_node = {a.node: a for a in decl.assets if a.node}
    by_gpu = {a.gpu: a for a in decl.assets if a.gpu}
    seen_nodes = {g.node for g in discovered}
    seen_gpus = {g.uuid for g in discovered}
    assets, undeclared, mismatches = [], [], []
    per_node: dict[str, int] = {}
    for g in discovered:
        per_node[g.node] = per_node.get(g.node, 0) + 1
        a = by_gpu.get(g.uuid) or by_node.get(g.node)
        if a is None:
            undeclared.append(g.uuid)
            assets.append(
                GpuAsset(
                    uuid=g.uuid, index=g.index, model=g.model, node=g.node, status=g.status, last_seen=g.last_seen,
                    registered_at=g.registered_at, ownership=UNDECLARED, declared=False, site=None,
                    cluster=g.cluster, rack=g.rack, pool=g.pool or "unassigned",
                )
            )
            continue
        if a.model and a.model != g.model:
            mismatches.append(f"{a.label}: declared model {a.model}, GPU {g.uuid} registered as {g.model}")
        contracts = [c for c in (decl.contract(ref) for ref in a.leases) if c is not None]
        contract = current_contract(contracts, now)
        assets.append(
            GpuAsset(
                uuid=g.uuid, index=g.index, model=g.model, node=g.node, status=g.status, last_seen=g.last_seen,
                registered_at=g.registered_at, ownership=a.ownership, declared=True, site=a.site,
                cluster=a.cluster or g.cluster, rack=a.rack or g.rack, pool=a.pool or g.pool or "unassigned",
                contract=contract, contracts=tuple(a.leases), purchase=a.purchase,
                hourly_price_per_gpu=a.hourly_price_per_gpu, since=a.since,
                monthly_cost=monthly_cost(a, contract, now),
                depreciated=a.ownership == "owned" and a.purchase is not None and a.purchase.monthly_cost(now) == 0,
            )
        )
    never_seen = [
        f"{a.label} ({a.ownership}, pool {a.pool or '-'}) is declared but never registered"
        for a in decl.assets
        if (a.node and a.node not in seen_nodes) or (a.gpu and a.gpu not in seen_gpus)
    ]
    for a in decl.assets:
        if a.node and a.gpus and a.node in seen_nodes and per_node.get(a.node) != a.gpus:
            mismatches.append(f"{a.label}: declared {a.gpus} GPUs, {per_node.get(a.node)} registered")
    assets.sort(key=lambda x: (x.node, x.index))
    return Reconciliation(assets=assets, never_seen=never_seen, undeclared=undeclared, mismatches=mismatches)
