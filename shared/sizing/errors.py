"""The one error the sizing core raises for bad input."""

from __future__ import annotations


class SizingError(ValueError):
    """Bad input: names the offending field so a CLI or API can say what to fix."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
