"""The node's own disks, where the agent keeps its attempt records and the jobs' logs: a fault of theirs is the node's.

A full, over-quota, read-only or failing disk (ENOSPC, EDQUOT, EROFS, EIO) is no job's failure: the agent takes
no new work, says why in its heartbeats ("attempt store: no space left on device, 0 B free"), hands back what it
could not start as not started, and takes work again once a later check finds the disks usable. What a check
concludes (`shortage`, `node_fault`, `size_text`) is pure; `free_bytes`, `probe` and `check` are the I/O.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

# Write errors that say the disk, not the job, is at fault, and how a node's reason names them.
DISK_FAULTS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EIO: "input/output error",
}
# Free space below which no attempt starts: room for its records (a few KiB) and a start of its log.
MIN_FREE_BYTES = 16 * 1024 * 1024
PROBE = ".whaleflux-probe"


@dataclass(frozen=True)
class Store:
    """One folder the agent writes to: what a node's reason calls it ("attempt store", "log directory")."""

    name: str
    path: Path


class DiskFault(Exception):
    """A store of the node cannot take writes; the message is the node's reason."""


def node_fault(exc: BaseException) -> str | None:
    """What an error says about the node's disk ("no space left on device"), or None when it is no disk fault.

    Follows the error's causes, so a disk error wrapped by what it interrupted is still found."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_FAULTS:
            return DISK_FAULTS[current.errno]
        current = current.__cause__ or current.__context__
    return None


def size_text(n: int) -> str:
    """Bytes as people read them: `0 B`, `512 B`, `1.5 KiB`, `16 MiB`."""
    value = float(max(0, n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" or value >= 100 or value.is_integer() else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def reason(store: str, problem: str, free: int | None) -> str:
    """A node's reason: `<store>: <problem>, <free> free` (without the free space when it is unknown)."""
    return f"{store}: {problem}" + ("" if free is None else f", {size_text(free)} free")


def shortage(store: str, free: int, min_free: int) -> str | None:
    """Why `store` cannot take an attempt with `free` bytes left, or None when it has `min_free` or more."""
    if free >= min_free:
        return None
    problem = DISK_FAULTS[errno.ENOSPC] if free == 0 else f"less than {size_text(min_free)} free"
    return reason(store, problem, free)


def free_bytes(path: Path) -> int:
    """The bytes an unprivileged writer may still use in `path`'s file system."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def probe(path: Path) -> None:
    """Write, sync and remove a small file in `path`: raises the OSError a real write would."""
    target = path / PROBE
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"whaleflux disk probe\n")
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        try:
            os.unlink(target)
        except FileNotFoundError:
            pass


def check(stores: list[Store], min_free: int, *, write: bool = False) -> str | None:
    """The first store's fault (too little free space, or with `write` a probe write that fails), or None.

    Errors that are no disk fault (a folder not made yet, permissions) are not the disk's: they pass."""
    for store in stores:
        try:
            free = free_bytes(store.path)
        except OSError as exc:
            problem = node_fault(exc)
            if problem is not None:
                return reason(store.name, problem, None)
            continue
        short = shortage(store.name, free, min_free)
        if short is not None:
            return short
        if write:
            try:
                probe(store.path)
            except OSError as exc:
                problem = node_fault(exc)
                if problem is not None:
                    return reason(store.name, problem, _free_or_none(store.path))
    return None


def _free_or_none(path: Path) -> int | None:
    try:
        return free_bytes(path)
    except OSError:
        return None


def fault_of_write(store: Store, exc: BaseException) -> str | None:
    """The node's reason for a failed write to `store`, or None when the error is no disk fault."""
    problem = node_fault(exc)
    return None if problem is None else reason(store.name, problem, _free_or_none(store.path))
