"""Pages of a long list (the fleet's node table at 1,000 nodes): which slice, and the links around it. No I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    number: int  # 1-based, clamped to the pages there are
    pages: int
    first: int  # 1-based position of the first item shown (0 when there are none)
    total: int

    @property
    def last(self) -> int:
        return self.first + len(self.items) - 1 if self.items else 0

    @property
    def previous(self) -> int | None:
        return self.number - 1 if self.number > 1 else None

    @property
    def next(self) -> int | None:
        return self.number + 1 if self.number < self.pages else None


def page_of(items: list[T], number: int, size: int) -> Page[T]:
    """The `number`th page of `size` items; a number past either end shows the nearest page."""
    pages = max(1, -(-len(items) // size))
    number = min(max(1, number), pages)
    start = (number - 1) * size
    shown = items[start:start + size]
    return Page(shown, number, pages, start + 1 if shown else 0, len(items))
