"""Kept for importers of the old name: the stored configuration document is `shared.config_store`."""

from __future__ import annotations

from .config_store import StoredConfig

__all__ = ["StoredConfig"]
