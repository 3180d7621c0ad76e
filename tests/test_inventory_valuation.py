"""Inventory values owned GPUs with billing's price book, read over HTTP in billing's own JSON shape (issue 17, 5)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from whaleflux.billing.pricebook import entry_json, parse_pricebook
from whaleflux.inventory.app import InventorySettings, build
from whaleflux.servers import QuietHandler, serve_http

BOOK = """\
prices:
  - {model: H100, ownership: owned, effective_from: 2026-01-01, usd_per_kwh: "0.20", overhead_per_gpu_month: "600"}
"""


class BillingPrices:
    """A real HTTP server answering GET /v1/pricebook with what billing's route writes for BOOK."""

    def __init__(self, status: int = 200):
        book = parse_pricebook(BOOK)
        body = json.dumps({"source": "test", "applied_at": None, "entries": [entry_json(e) for e in book.entries],
                           "reference": [entry_json(e) for e in book.reference], "last_error": None}).encode()

        class Handler(QuietHandler):
            def do_GET(self):
                self.send_response(status if self.path == "/v1/pricebook" else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

        self.httpd = serve_http(Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


async def test_billings_price_book_is_fetched_and_kept_when_billing_fails_later():
    from whaleflux.inventory.valuation import owned_price

    good, bad = BillingPrices(), BillingPrices(status=500)
    try:
        _, inv = build(InventorySettings(billing_url=good.url))
        assert await inv.refresh_prices()
        now = datetime(2026, 3, 1, tzinfo=UTC)
        assert inv.prices is not None
        row = owned_price(inv.prices, "H100", now)
        assert row is not None and str(row.overhead_per_gpu_month) == "600" and str(row.usd_per_kwh) == "0.20"
        inv.settings.billing_url = bad.url
        assert not await inv.refresh_prices()
        assert inv.prices is not None and owned_price(inv.prices, "H100", now) == row  # the last good copy stays
    finally:
        good.close()
        bad.close()
