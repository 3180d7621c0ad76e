"""Kept for importers of the old name: the transactional outbox is `shared.outbox_store`."""

from __future__ import annotations

from .outbox_store import Outbox

__all__ = ["Outbox"]
