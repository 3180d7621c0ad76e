"""Cost guardians: which of inventory's findings (GET /v1/findings) a `finding` rule alerts on. Pure."""

from __future__ import annotations

from typing import Any

from whaleflux.shared.contracts import Finding

from ..config import FindingRule
from .series import fingerprint


def finding_identity(rule: FindingRule, finding: Finding) -> dict[str, str]:
    """The labels that make one finding alert: the rule's `key` fields (from `detail`, else the finding itself).

    A finding that carries none of them is identified by its GPUs instead.
    """
    ident: dict[str, str] = {"finding": rule.finding}
    for k in rule.key:
        v = finding.detail.get(k, getattr(finding, k, None))
        if v is not None and not isinstance(v, (dict, list)):
            ident[k] = str(v)
    if len(ident) == 1:
        gpus = sorted(finding.gpus)
        ident["gpus"] = fingerprint({"gpus": ",".join(gpus)} if gpus else {"summary": finding.summary})
    return ident


def matching(rule: FindingRule, findings: list[Finding]) -> dict[str, tuple[dict[str, str], Finding]]:
    """fingerprint -> (identity labels, finding) of the findings this rule alerts on."""
    present: dict[str, tuple[dict[str, str], Finding]] = {}
    for f in findings:
        if f.kind != rule.finding:
            continue
        usd = monthly_usd(f)
        if usd is not None and usd < rule.min_monthly_usd:
            continue
        ident = finding_identity(rule, f)
        present[fingerprint({"alertname": rule.name, **ident})] = (ident, f)
    return present


def summary_values(rule: FindingRule, ident: dict[str, str], finding: Finding) -> dict[str, Any]:
    """The fields a finding rule's summary template may use."""
    usd = monthly_usd(finding)
    return {**finding.detail, **ident, "summary": finding.summary, "finding": rule.finding,
            "monthly_usd": usd if usd is not None else float("nan"), "gpus": len(finding.gpus), "value": usd}


def monthly_usd(finding: Finding) -> float | None:
    """The monthly cost as a number for thresholds and templates; None when inventory does not know it."""
    return None if finding.monthly_usd is None else float(finding.monthly_usd)
