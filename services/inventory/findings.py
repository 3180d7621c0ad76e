"""Findings: where money is wasted or capacity sits unused, each with the monthly cost at stake. No I/O."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Literal

from .reconcile import GpuAsset, Reconciliation
from .rollups import HourRow
from .valuation import valuation

Kind = Literal["idle-allocated", "reserved-idle", "consolidation", "capacity", "undeclared", "never-seen", "mismatch",
               "quarantined"]


@dataclass(frozen=True)
class Finding:
    kind: Kind
    severity: Literal["info", "warning"]
    summary: str
    monthly_usd: Decimal | None = None  # what the GPUs concerned cost per month; None if unknown
    gpus: tuple[str, ...] = ()
    detail: dict[str, str] = field(default_factory=dict)


def money(value: Decimal | None) -> str:
    return "cost unknown" if value is None else f"${value:,.2f}/month"


def _cost(gpus: list[GpuAsset]) -> Decimal | None:
    """Sum of monthly costs; None if any GPU's cost is unknown."""
    costs = [g.monthly_cost for g in gpus]
    known = [c for c in costs if c is not None]
    return None if len(known) < len(costs) else sum(known, Decimal(0))


def idle_allocated(
    last_hour: list[HourRow], assets: dict[str, GpuAsset], holders: dict[str, str], threshold_pct: float = 5.0
) -> list[Finding]:
    """GPUs allocated the whole last hour whose mean utilization stayed under `threshold_pct`, per node."""
    by_node: dict[str, list[GpuAsset]] = defaultdict(list)
    for row in last_hour:
        a = assets.get(row.key)
        if a is None or row.allocated_fraction < 0.99 or row.mean_util_allocated is None:
            continue
        if row.mean_util_allocated < threshold_pct:
            by_node[a.node].append(a)
    out = []
    for node, gpus in sorted(by_node.items()):
        jobs = sorted({holders[g.uuid] for g in gpus if g.uuid in holders})
        cost = _cost(gpus)
        out.append(
            Finding(
                "idle-allocated", "warning",
                f"{node}: {len(gpus)}x {gpus[0].model} ({gpus[0].ownership}) allocated but under {threshold_pct:g}% "
                f"utilized for the last hour (jobs {', '.join(jobs) or '?'}) — {money(cost)}{valuation(gpus)}",
                cost, tuple(g.uuid for g in gpus), {"node": node, "jobs": ",".join(jobs)},
            )
        )
    return out


def reserved_idle(
    assets: list[GpuAsset], last_active: dict[str, datetime], now: datetime, min_hours: float = 72
) -> list[Finding]:
    """GPUs nobody was allocated for at least `min_hours`, grouped by model, ownership and pool."""
    groups: dict[tuple[str, str, str], list[tuple[GpuAsset, float]]] = defaultdict(list)
    for a in assets:
        if a.status != "active":
            continue
        since = max(last_active.get(a.uuid, a.registered_at), a.registered_at)
        idle_h = (now - since).total_seconds() / 3600
        if idle_h >= min_hours:
            groups[(a.model, a.ownership, a.pool)].append((a, idle_h))
    out = []
    for (model, ownership, pool), items in sorted(groups.items()):
        gpus = [a for a, _ in items]
        hours = math.floor(min(h for _, h in items))
        cost = _cost(gpus)
        out.append(
            Finding(
                "reserved-idle", "warning",
                f"{len(gpus)}x {model} ({ownership}, pool {pool}) idle {hours} h — {money(cost)}{valuation(gpus)}",
                cost, tuple(a.uuid for a in gpus),
                {"idle_hours": str(hours), "model": model, "pool": pool, "ownership": ownership},
            )
        )
    return out


def consolidation(
    pool_rows: list[HourRow], assets: list[GpuAsset], threshold: float = 0.3, days: float = 3
) -> list[Finding]:
    """Pools allocated under `threshold` on average over the window, with how many GPUs their peak needed."""
    by_pool: dict[str, list[HourRow]] = defaultdict(list)
    for row in pool_rows:
        by_pool[row.key].append(row)
    gpus_by_pool: dict[str, list[GpuAsset]] = defaultdict(list)
    for a in assets:
        gpus_by_pool[a.pool].append(a)
    out = []
    for pool, rows in sorted(by_pool.items()):
        span_h = sum(1 for _ in rows)
        if span_h < days * 24 - 1:
            continue  # not enough history to judge
        pool_assets = gpus_by_pool.get(pool, [])
        if pool_assets and min(g.registered_at for g in pool_assets) > min(r.hour for r in rows) + timedelta(hours=1):
            continue  # the pool is younger than the window: its empty early hours say nothing
        capacity = sum(r.gpus for r in rows) * 3600
        mean = sum(r.allocated_s for r in rows) / capacity if capacity else 0.0
        if mean >= threshold:
            continue
        total = rows[-1].gpus
        peak = max(math.ceil(r.allocated_s / 3600 - 1e-9) for r in rows)
        free = total - max(peak, 1)
        pool_gpus = gpus_by_pool.get(pool, [])
        known = [g.monthly_cost for g in pool_gpus if g.monthly_cost is not None]
        per_gpu = (sum(known, Decimal(0)) / len(known)).quantize(Decimal("0.01")) if known else None
        cost = per_gpu * free if per_gpu is not None and free > 0 else None
        advice = (
            f"its busiest hour needed {peak} GPUs: consolidating onto {max(peak, 1)} would free {free}"
            if free > 0 else "keep its size"
        )
        out.append(
            Finding(
                "consolidation", "info",
                f"pool {pool}: {total} GPUs {mean:.0%} allocated over the last {days:g} days; {advice} — {money(cost)}"
                f"{valuation(pool_gpus)}",
                cost, tuple(g.uuid for g in pool_gpus),
                {"pool": pool, "mean_allocated": f"{mean:.4f}", "peak_gpus": str(peak), "gpus_freeable": str(free)},
            )
        )
    return out


@dataclass(frozen=True)
class CapacityRow:
    model: str
    pool: str
    gpus: int
    free: int
    free_nodes: int  # nodes with every GPU free


def capacity(assets: list[GpuAsset], allocated: set[str], draining: Set[str] = frozenset()) -> list[CapacityRow]:
    """Free GPUs and whole free nodes per model and pool: a GPU is free as `gpus list` says it is (not missing,
    not quarantined: `active`; not allocated; its node not draining: `draining` holds "cluster/node" keys)."""
    nodes: dict[tuple[str, str], dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for a in assets:
        if a.status == "active":
            nodes[(a.model, a.pool)][a.node].append(a.uuid not in allocated and f"{a.cluster}/{a.node}" not in draining)
    rows = []
    for (model, pool), per_node in sorted(nodes.items()):
        flags = [f for fs in per_node.values() for f in fs]
        rows.append(CapacityRow(model, pool, len(flags), sum(flags), sum(1 for fs in per_node.values() if all(fs))))
    return rows


@dataclass(frozen=True)
class QueuedJob:
    """A submitted job not yet placed, as far as inventory has seen."""

    job_id: str
    gpus: int
    models: tuple[str, ...]  # empty: any model
    expected_runtime_s: float | None


def _job_phrase(job: QueuedJob) -> str:
    runtime = f"{job.expected_runtime_s / 3600:.0f} h " if job.expected_runtime_s else ""
    models = "/".join(job.models) if job.models else "any GPU"
    return f"a {runtime}job needing {job.gpus}x {models} is queued ({job.job_id})"


def capacity_finding(rows: list[CapacityRow], queued: Sequence[QueuedJob] = ()) -> Finding:
    """What could run now and what waits: '2 H100 nodes idle in onprem; a 48 h job needing 8x H100 is queued'."""
    parts = []
    for r in rows:
        if r.free_nodes:
            parts.append(f"{r.free_nodes} {r.model} node{'s' if r.free_nodes != 1 else ''} idle in {r.pool}")
        if r.free:
            parts.append(f"{r.free}/{r.gpus} {r.model} GPUs free in {r.pool}")
    text = "capacity now: " + ("; ".join(parts) or "no free GPUs")
    if queued:
        longest = max(queued, key=lambda j: (j.expected_runtime_s or 0, j.gpus))
        text += f"; {len(queued)} job{'s' if len(queued) != 1 else ''} queued, e.g. {_job_phrase(longest)}"
        # Free GPUs of a model a queued job may use, yet it waits: usually a shape or placement problem.
        stuck = [
            j for j in queued
            if any(r.free >= j.gpus and (not j.models or r.model in j.models) for r in rows)
        ]
        if stuck:
            text += f"; {len(stuck)} of them could fit in free GPUs now — check `whaleflux jobs` for why they wait"
    return Finding("capacity", "info", text, None, (), {"queued_jobs": str(len(queued))})


def reconciliation_findings(rec: Reconciliation, assets: dict[str, GpuAsset]) -> list[Finding]:
    """Undeclared GPUs (counted as owned-unknown), declarations never seen, and mismatches."""
    out = []
    if rec.undeclared:
        nodes = sorted({assets[u].node for u in rec.undeclared if u in assets})
        out.append(
            Finding(
                "undeclared", "warning",
                f"{len(rec.undeclared)} GPUs registered but not declared (counted as owned-unknown): "
                f"nodes {', '.join(nodes)}",
                None, tuple(rec.undeclared),
            )
        )
    out += [Finding("never-seen", "warning", text) for text in rec.never_seen]
    out += [Finding("mismatch", "warning", text) for text in rec.mismatches]
    return out


@dataclass(frozen=True)
class Validation:
    """A GPU's last burn-in, as the agent's gpu.validated reported it."""

    uuid: str
    cluster: str
    node: str
    index: int
    verdict: Literal["pass", "warn", "fail"]
    at: datetime
    reasons: tuple[str, ...] = ()


def quarantined(validations: Iterable[Validation], now: datetime) -> list[Finding]:
    """GPUs whose last burn-in failed: left out of their node's registration until a burn-in passes."""
    out = []
    for v in sorted(validations, key=lambda v: (v.cluster, v.node, v.index)):
        if v.verdict != "fail":
            continue
        hours = max((now - v.at).total_seconds(), 0.0) / 3600
        why = v.reasons[0] if v.reasons else "no reason given"
        summary = f"GPU {v.index} of {v.node} failed its burn-in {hours:.1f} h ago: {why}"
        out.append(Finding("quarantined", "warning", summary, gpus=(v.uuid,),
                           detail={"cluster": v.cluster, "node": v.node, "validated_at": v.at.isoformat(),
                                   "age_h": f"{hours:.1f}", "reasons": "; ".join(v.reasons)}))
    return out
