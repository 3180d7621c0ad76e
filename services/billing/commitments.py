"""FOCUS 1.3 contract commitment dataset: one row per lease contract the fleet holds GPUs under. Pure, no I/O.

A lease is a commitment to pay for GPU time whatever the use: category
`Usage`, quantity in GPU-months over the whole term (extended to its minimum
term), cost the fees owed over that term. Its id (`ContractCommitmentId` =
`ContractId` = the lease contract) is the `CommitmentDiscountId` and the
`ContractApplied` id of the cost and usage rows it covers (exports.py), so a
consumer joins the two datasets and sees used and unused commitment.
"""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal

from .exports import commitment_id
from .exports import focus_time as _t
from .focus_split import Row
from .ownership import GpuCost, from_ms, lease_term, month_start, next_month, to_ms
from .pricing import MICRO

COMMITMENT_COLUMNS = [
    "BillingCurrency", "ContractCommitmentCategory", "ContractCommitmentCost", "ContractCommitmentDescription",
    "ContractCommitmentId", "ContractCommitmentPeriodEnd", "ContractCommitmentPeriodStart",
    "ContractCommitmentQuantity", "ContractCommitmentType", "ContractCommitmentUnit", "ContractId",
    "ContractPeriodEnd", "ContractPeriodStart", "x_Provider", "x_Gpus", "x_GpuModels",
]


def _gpu_months(start_ms: int, end_ms: int) -> Decimal:
    """Calendar-month fractions between two instants (a whole month counts 1)."""
    months = Decimal(0)
    m = month_start(from_ms(start_ms))
    while to_ms(m) < end_ms:
        lo, hi = max(to_ms(m), start_ms), min(to_ms(next_month(m)), end_ms)
        months += Decimal(hi - lo) / Decimal(to_ms(next_month(m)) - to_ms(m))
        m = next_month(m)
    return months


def commitment_rows(gpus: dict[str, GpuCost]) -> list[Row]:
    """One row per lease contract: its term, GPU-months committed and the fees owed over the term."""
    by_contract: dict[str, list[GpuCost]] = defaultdict(list)
    starts = {}
    for gc in gpus.values():
        cid = commitment_id(gc)
        if cid is not None and gc.terms.lease_start is not None:
            by_contract[cid].append(gc)
            starts[cid] = gc.terms.lease_start
    rows = []
    for cid, members in sorted(by_contract.items()):
        t = members[0].terms
        start, end = (to_ms(x) for x in lease_term(starts[cid], t.lease_end, t.minimum_term_months))
        months = _gpu_months(start, end)
        quantity = months * len(members)
        monthly = [gc.terms.lease_monthly for gc in members]
        cost = None if None in monthly else sum((m * months for m in monthly if m is not None), Decimal(0))
        rows.append({
            "BillingCurrency": "USD", "ContractCommitmentCategory": "Usage",
            "ContractCommitmentCost": None if cost is None else cost.quantize(MICRO),
            "ContractCommitmentDescription": f"lease of {len(members)} {t.model} GPU(s) from "
                                             f"{t.lease_provider or 'lessor'}, owed whatever the use",
            "ContractCommitmentId": cid, "ContractCommitmentPeriodStart": _t(start),
            "ContractCommitmentPeriodEnd": _t(end), "ContractCommitmentQuantity": quantity.quantize(MICRO),
            "ContractCommitmentType": "GPU lease", "ContractCommitmentUnit": "GPU-Months", "ContractId": cid,
            "ContractPeriodStart": _t(start), "ContractPeriodEnd": _t(end),
            "x_Provider": t.lease_provider, "x_Gpus": len(members),
            "x_GpuModels": ",".join(sorted({gc.terms.model for gc in members})),
        })
    return rows
