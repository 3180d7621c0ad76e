"""Metering and pricing: Decimal money with a documented rounding rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from whaleflux.billing.pricing import REFERENCE_RATES, cost, gpu_seconds, to_cents

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def test_gpu_seconds_multiply_by_gpu_count_and_keep_milliseconds():
    assert gpu_seconds(T0, T0 + timedelta(seconds=90, microseconds=1500), 2) == Decimal("180.003")
    assert gpu_seconds(T0, T0 - timedelta(seconds=5), 1) == Decimal("0.000")


def test_one_h100_hour_costs_the_reference_rate():
    assert cost(Decimal(3600), REFERENCE_RATES["H100"]) == Decimal("6.880000")
    assert to_cents(cost(Decimal(1800), REFERENCE_RATES["A100"])) == Decimal("1.72")  # 1.71545 rounds half up
