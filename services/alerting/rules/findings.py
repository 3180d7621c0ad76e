"""Cost guardians: which of inventory's findings (GET /v1/findings) a `finding` rule alerts on. Pure."""

from __future__ import annotations

from typing import Any

from ..config import FindingRule
from .series import fingerprint

Finding = dict[str, Any]  # one item of GET /v1/findings: {kind, severity, summary, monthly_usd, gpus, detail}


def finding_identity(rule: FindingRule, finding: Finding) -> dict[str, str]:
    """The labels that make one finding alert: the rule's `key` fields (from `detail`, else the finding itself).

    A finding that carries none of them is identified by its GPUs instead.
    """
    detail = _detail(finding)
    ident: dict[str, str] = {"finding": rule.finding}
    for k in rule.key:
        v = detail.get(k, finding.get(k))
        if v is not None and not isinstance(v, (dict, list)):
            ident[k] = str(v)
    if len(ident) == 1:
        gpus = sorted(str(g) for g in finding.get("gpus") or [])
        by = {"gpus": ",".join(gpus)} if gpus else {"summary": str(finding.get("summary"))}
        ident["gpus"] = fingerprint(by)
    return ident


def matching(rule: FindingRule, findings: list[Finding]) -> dict[str, tuple[dict[str, str], Finding]]:
    """fingerprint -> (identity labels, finding) of the findings this rule alerts on."""
    present: dict[str, tuple[dict[str, str], Finding]] = {}
    for f in findings:
        if not isinstance(f, dict) or f.get("kind") != rule.finding:
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
    return {**_detail(finding), **ident, "summary": finding.get("summary", ""), "finding": rule.finding,
            "monthly_usd": usd if usd is not None else float("nan"), "gpus": len(finding.get("gpus") or []),
            "value": usd}


def monthly_usd(finding: Finding) -> float | None:
    """A JSON number or decimal string (inventory sends money as strings); None when absent or not a number."""
    value = finding.get("monthly_usd")
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _detail(finding: Finding) -> dict[str, Any]:
    detail = finding.get("detail")
    return detail if isinstance(detail, dict) else {}
