"""What services say to each other over HTTP, typed; and the one fold of `job.*` events they share.

The producing service uses these models as its routes' `response_model`; a
consumer parses the response with them (`TypeAdapter(list[Asset])`), so a
renamed or retyped field fails loudly at the boundary instead of pricing a GPU
as unknown. Events themselves are in `shared.events`.
"""

from __future__ import annotations

from .holders import JOB_EVENTS, GpuHolders, Holder, HolderChange, JobHolds, fold_holders, gpus_involved
from .inventory import (
    ASSETS,
    FINDINGS,
    LEASES,
    Asset,
    CapacityRow,
    Declarations,
    Finding,
    FindingKind,
    LeaseRow,
    LeaseTerms,
    Money,
    PurchaseTerms,
)
from .jobs import JobPart, JobRecord, JobStateName, JobWhy

__all__ = [
    "ASSETS", "FINDINGS", "JOB_EVENTS", "LEASES", "Asset", "CapacityRow", "Declarations", "Finding", "FindingKind",
    "GpuHolders", "Holder", "HolderChange", "JobHolds", "JobPart", "JobRecord", "JobStateName", "JobWhy",
    "LeaseRow", "LeaseTerms", "Money", "PurchaseTerms",
    "fold_holders", "gpus_involved",
]
