"""FOCUS 1.3 split cost allocation: a window's idle rows shared back to the teams or projects that used each pool
and model, in proportion to their GPU-hours, exact to the last digit. Pure, no I/O."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from typing import Any

from .allocation import split_by_use
from .pricing import MICRO

Row = dict[str, Any]  # one FOCUS row: column -> Decimal, str, dict (Tags), bool or None

SPLIT_METHOD_ID = "whaleflux-idle-by-gpu-hours"
SPLIT_BY = ("team", "project")
UNALLOCATED: Row = {"AllocatedMethodId": None, "AllocatedMethodDetails": None, "AllocatedResourceId": None,
                     "AllocatedResourceName": None, "AllocatedTags": None}
_SUMMABLE = ("BilledCost", "EffectiveCost", "ContractedCost", "ListCost", "PricingQuantity", "ConsumedQuantity")
_RATIO = Decimal("0.000000001")


def split_idle(rows: list[Row], by: str) -> list[Row]:
    """Each idle usage row (the origin charge) replaced by its allocated charges, one per `by` key that used the
    row's pool and model, shares in proportion to that use (GPU-hours); every summable column split exactly to
    its last digit (largest remainder), so allocated charges add up to their origin. A pool nobody used keeps
    its idle row unallocated."""
    if by not in SPLIT_BY:
        raise ValueError(f"share_idle_by: {by!r} is not one of {', '.join(SPLIT_BY)}")
    use: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in rows:
        if r["ChargeCategory"] == "Usage" and not r["x_Idle"] and r["PricingUnit"] == "GPU-Hours":
            use[(r["x_Pool"], r["x_GpuModel"])][r[_BY_COLUMN[by]]] += _units(r["ConsumedQuantity"])
    out: list[Row] = []
    for r in rows:
        users = use.get((r["x_Pool"], r["x_GpuModel"]))
        if not (r["x_Idle"] and r["ChargeCategory"] == "Usage" and users):
            out.append(r)
            continue
        ratios = split_by_use(_units(Decimal(1), _RATIO), users)
        parts = {c: split_by_use(_units(r[c]), users) for c in _SUMMABLE if r.get(c) is not None}
        total_hours = sum(users.values())
        for key in sorted(users):
            part = {c: _from_units(v[key]) for c, v in parts.items()}
            applied = r.get("ContractApplied")
            if applied:
                [e] = applied["Elements"]
                applied = {"Elements": [{**e, "ContractCommitmentAppliedCost": part["EffectiveCost"],
                                         "ContractCommitmentAppliedQuantity": part.get("PricingQuantity")}]}
            out.append({
                **r, **part, "ContractApplied": applied, "AllocatedMethodId": SPLIT_METHOD_ID,
                "AllocatedMethodDetails": {"Elements": [{
                    "AllocatedRatio": _from_units(ratios[key], _RATIO), "UsageUnit": "GPU-Hours",
                    "UsageQuantity": _from_units(users[key])}], "x_PoolGpuHours": _from_units(total_hours)},
                "AllocatedResourceId": f"{by}/{key}", "AllocatedResourceName": key, "AllocatedTags": {by: key},
                "ChargeDescription": f"{r['ChargeDescription']}, shared back to {by} {key}",
            })
    return out


_BY_COLUMN = {"team": "x_Team", "project": "x_Project"}


def _units(x: Decimal, unit: Decimal = MICRO) -> int:
    """`x` as a whole number of `unit` (every amount and quantity here is kept to it)."""
    n = x / unit
    if n != n.to_integral_value():
        raise ValueError(f"{x} is not a whole number of {unit}")
    return int(n)


def _from_units(n: int, unit: Decimal = MICRO) -> Decimal:
    return n * unit
