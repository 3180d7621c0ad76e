"""Typed cross-service responses (shared.contracts): what inventory sends parses, money stays exact, a renamed
field fails at the boundary."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest
from pydantic import ValidationError

from whaleflux.shared.contracts import ASSETS, FINDINGS, LEASES, Asset

ASSET = {
    "uuid": "GPU-1", "index": 0, "model": "H100", "node": "h100-01", "status": "active",
    "last_seen": "2026-12-01T12:00:00+00:00", "ownership": "leased", "declared": True, "site": "fra",
    "cluster": "onprem", "rack": None, "pool": "train", "monthly_cost_usd": "1800.50",
    "lease": {"contract_id": "L1", "provider": "acme", "start": "2026-01-01", "end": "2026-12-31",
              "monthly_price_per_gpu_usd": "1800.50", "minimum_term_months": 12, "auto_renew": False,
              "notice_days": 30},
    "contracts": ["L1"], "purchase": None, "hourly_price_per_gpu_usd": None,
}
FINDING = {"kind": "reserved-idle", "severity": "warning", "summary": "2 GPUs idle 3 days", "monthly_usd": "3601",
           "gpus": ["GPU-1", "GPU-2"], "detail": {"pool": "train"}}
LEASE = {"contract_id": "L1", "provider": "acme", "state": "active", "start": "2026-01-01",
         "ends_at": "2027-01-01T00:00:00+00:00", "days_left": 31.5, "notice_deadline": None, "notice_days_left": None,
         "auto_renew": False, "minimum_term_months": 12, "renewed_by": None, "gpu_count": 8, "nodes": ["h100-01"],
         "gpu_models": ["H100"], "monthly_price_per_gpu_usd": "1800.50", "monthly_cost_usd": "14404.00"}


def test_an_asset_as_inventory_sends_it_parses_with_money_as_decimals_and_goes_back_the_same():
    [asset] = ASSETS.validate_python([ASSET])
    assert asset.lease is not None and asset.lease.monthly_price_per_gpu_usd == Decimal("1800.50")
    assert asset.lease.start == date(2026, 1, 1) and asset.ownership == "leased"
    again = asset.model_dump(mode="json")
    assert again["monthly_cost_usd"] == "1800.50" and again["lease"]["monthly_price_per_gpu_usd"] == "1800.50"
    assert Asset.model_validate(again) == asset


def test_money_is_written_as_a_plain_decimal_string_never_in_exponent_form():
    asset = Asset.model_validate({**ASSET, "monthly_cost_usd": Decimal("1E+3")})
    assert asset.model_dump(mode="json")["monthly_cost_usd"] == "1000"


def test_a_renamed_or_retyped_field_fails_at_the_boundary_naming_it():
    renamed = {k: v for k, v in ASSET.items() if k != "ownership"} | {"owner": "leased"}
    with pytest.raises(ValidationError, match="ownership"):
        ASSETS.validate_python([renamed])
    with pytest.raises(ValidationError, match="monthly_cost_usd"):
        ASSETS.validate_python([{**ASSET, "monthly_cost_usd": "a lot"}])


def test_a_field_added_later_by_the_producer_is_ignored_by_consumers():
    [asset] = ASSETS.validate_python([{**ASSET, "warranty_until": "2028-01-01"}])
    assert "warranty_until" not in asset.model_dump()


def test_findings_and_leases_parse_as_inventory_sends_them():
    [finding] = FINDINGS.validate_python([FINDING])
    assert finding.monthly_usd == Decimal("3601") and finding.detail == {"pool": "train"}
    with pytest.raises(ValidationError, match="kind"):
        FINDINGS.validate_python([{**FINDING, "kind": "no-such-kind"}])
    [lease] = LEASES.validate_python([LEASE])
    assert lease.nodes == ["h100-01"] and lease.ends_at.year == 2027 and lease.monthly_cost_usd == Decimal("14404.00")
