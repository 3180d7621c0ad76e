"""Leases: each contract's current term and GPUs, and which expiry notices are due at a given time. No I/O.

A horizon of H days fires once when `now` enters [deadline - H days, deadline),
for two deadlines per contract: the end of the term and the last day to give
notice (end - notice_days). When several horizons of one deadline are reached
at once (the service was down, or the lease was declared late) only the
nearest one is announced and the others are marked done, so users get one
message that is current rather than a burst of stale ones.

Event ids carry the contract, horizon, deadline kind and deadline date, so a
notice fires once per horizon per term across restarts and replicas, and a
renewal (a later end date, or a contiguous successor contract) gets its own
horizons instead of the old ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Literal

from whaleflux.shared.events import LeaseExpired, LeaseExpiring

from .assets import Contract, Declarations, add_months, day_start
from .reconcile import GpuAsset

DEFAULT_HORIZONS_DAYS = (30, 7, 1)


def last_day(exclusive_end: datetime) -> date:
    """The last whole day before an exclusive end at midnight UTC."""
    return (exclusive_end - timedelta(microseconds=1)).date()


@dataclass(frozen=True)
class Lease:
    contract: Contract
    gpu_uuids: tuple[str, ...]
    nodes: tuple[str, ...]
    models: tuple[str, ...]
    gpu_count: int
    term_end: datetime  # the current term's end; auto-renewal rolls it forward
    notice_deadline: datetime | None
    renewed_by: str | None  # a contiguous successor contract for the same assets

    @property
    def monthly_cost(self) -> Decimal:
        return self.contract.monthly_price_per_gpu * self.gpu_count

    @property
    def covered_through(self) -> date:
        """The last day the current term covers (as declared: `end`, inclusive)."""
        return last_day(self.term_end)

    @property
    def notice_by(self) -> date | None:
        """The last day to give notice (the deadline is the end of this day, UTC)."""
        return None if self.notice_deadline is None else last_day(self.notice_deadline)

    def state(self, now: datetime) -> str:
        """pending, active, renewed (a successor follows), or expired."""
        if now < self.contract.starts_at:
            return "pending"
        if now >= self.term_end:
            return "renewed" if self.renewed_by else "expired"
        return "active"


def term_end(contract: Contract, now: datetime) -> datetime:
    """End of the term in force at `now`: an auto-renewing lease rolls forward by its minimum term."""
    end = contract.ends_at
    if contract.auto_renew:
        while end <= now:
            end = day_start(add_months(end.date(), contract.minimum_term_months))
    return end


def leases(decl: Declarations, assets: list[GpuAsset], now: datetime) -> list[Lease]:
    """Every declared contract with the GPUs and nodes it covers."""
    out = []
    for c in decl.contracts:
        users = [a for a in decl.assets if c.id in a.leases]
        gpus = [g for g in assets if c.id in g.contracts]
        seen_nodes = {g.node for g in gpus}
        # Declared nodes that never registered still count with their declared size.
        unseen = sum(a.gpus or 0 for a in users if a.node and a.node not in seen_nodes)
        nodes = sorted(seen_nodes | {a.node for a in users if a.node})
        successors = []
        for a in users:
            nxt = [decl.contract(ref) for ref in a.leases]
            successors.append(next((n.id for n in nxt if n and n.id != c.id and n.starts_at == c.ends_at), None))
        renewed_by = successors[0] if successors and all(successors) else None
        end = term_end(c, now)
        out.append(
            Lease(
                contract=c,
                gpu_uuids=tuple(sorted(g.uuid for g in gpus)),
                nodes=tuple(nodes),
                models=tuple(sorted({g.model for g in gpus} | {a.model for a in users if a.model})),
                gpu_count=len(gpus) + unseen,
                term_end=end,
                notice_deadline=end - timedelta(days=c.notice_days) if c.notice_days else None,
                renewed_by=renewed_by,
            )
        )
    return out


@dataclass(frozen=True)
class Notice:
    kind: Literal["expiring", "expired"]
    lease: Lease
    deadline: Literal["end", "notice"]
    deadline_at: datetime
    horizon_days: int
    event_id: str


def expiring_id(contract_id: str, horizon: int, kind: str, deadline: datetime) -> str:
    return f"lease-expiring-{contract_id}-{horizon}d-{kind}-{deadline:%Y%m%d}"


def expired_id(contract_id: str, end: datetime) -> str:
    return f"lease-expired-{contract_id}-{end:%Y%m%d}"


def due_notices(
    all_leases: list[Lease], horizons: tuple[int, ...], now: datetime, fired: set[str]
) -> tuple[list[Notice], list[str]]:
    """Notices to publish now, and every id to record as done (published or superseded)."""
    publish: list[Notice] = []
    done: list[str] = []
    for lease in all_leases:
        c = lease.contract
        if lease.renewed_by or lease.gpu_count < 1:
            continue
        if now >= lease.term_end:
            eid = expired_id(c.id, lease.term_end)
            if eid not in fired:
                publish.append(Notice("expired", lease, "end", lease.term_end, 0, eid))
                done.append(eid)
            continue
        deadlines: list[tuple[Literal["end", "notice"], datetime]] = [("end", lease.term_end)]
        if lease.notice_deadline is not None:
            deadlines.append(("notice", lease.notice_deadline))
        for kind, at in deadlines:
            reached = sorted(h for h in set(horizons) if at - timedelta(days=h) <= now < at)
            if not reached:
                continue
            ids = [expiring_id(c.id, h, kind, at) for h in reached]
            if ids[0] not in fired:
                publish.append(Notice("expiring", lease, kind, at, reached[0], ids[0]))
            done.extend(i for i in ids if i not in fired)
    return publish, done


def _span(delta: timedelta) -> str:
    hours = delta.total_seconds() / 3600
    if hours < 48:
        return f"{max(1, math.ceil(hours))} hours"
    return f"{round(hours / 24)} days"


def describe(lease: Lease) -> str:
    """'3 leased A100 nodes (24 GPUs) of contract X (provider)'."""
    n = len(lease.nodes)
    models = "/".join(lease.models) or "GPU"
    c = lease.contract
    return f"{n} leased {models} node{'s' if n != 1 else ''} ({lease.gpu_count} GPUs) of contract {c.id} ({c.provider})"


def notice_event(notice: Notice, now: datetime) -> LeaseExpiring | LeaseExpired:
    """The event for a notice, with a one-line summary people can act on."""
    lease, c = notice.lease, notice.lease.contract
    cost = format(lease.monthly_cost, "f")
    if notice.kind == "expired":
        return LeaseExpired(
            contract_id=c.id, provider=c.provider, ended_at=lease.term_end, gpu_count=lease.gpu_count,
            nodes=list(lease.nodes), gpu_models=list(lease.models), monthly_cost_usd=cost,
            summary=f"{describe(lease)} expired after {lease.covered_through:%Y-%m-%d} (its last day covered); "
                    f"${cost}/month no longer covered",
        )
    passed = lease.notice_deadline is not None and now >= lease.notice_deadline
    if notice.deadline == "end":
        tail = (
            "notice deadline passed — renew or release?" if passed
            else f"give notice by {lease.notice_by:%Y-%m-%d} (the last day) — renew or release?"
            if lease.notice_by
            else "renew or release?"
        )
        summary = (f"{describe(lease)} expire in {_span(lease.term_end - now)} (last day covered "
                   f"{lease.covered_through:%Y-%m-%d}); {tail}")
    else:
        renew = f" and auto-renews for {c.minimum_term_months} month(s)" if c.auto_renew else ""
        summary = (
            f"{describe(lease)}: notice deadline in {_span(notice.deadline_at - now)} (last day to give notice "
            f"{last_day(notice.deadline_at):%Y-%m-%d}); the lease covers through "
            f"{lease.covered_through:%Y-%m-%d}{renew} — renew or release?"
        )
    if c.auto_renew and notice.deadline == "end":
        summary += f" (auto-renews for {c.minimum_term_months} month(s) at ${cost}/month)"
    return LeaseExpiring(
        contract_id=c.id, provider=c.provider, ends_at=lease.term_end, notice_deadline=lease.notice_deadline,
        horizon_days=notice.horizon_days, days_left=round((lease.term_end - now).total_seconds() / 86400, 3),
        gpu_count=lease.gpu_count, nodes=list(lease.nodes), monthly_cost_usd=cost, auto_renew=c.auto_renew,
        deadline=notice.deadline, notice_deadline_passed=passed, gpu_models=list(lease.models), summary=summary,
    )
