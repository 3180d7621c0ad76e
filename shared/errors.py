"""The errors the service runtime maps to HTTP answers (re-exported by `shared.runtime`)."""

from __future__ import annotations


class StateUnavailable(Exception):
    """The state store is unreachable, or lost and being rebuilt: nothing can be decided now (503)."""


class BadRequest(ValueError):
    """Bad input from a client: the one error the runtime answers with 400 (and its message)."""
