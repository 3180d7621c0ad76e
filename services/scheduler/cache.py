"""What the leading replica knows its store holds, parsed: the store's write-through cache (see `SchedulerStore`).

Pure bookkeeping, no I/O: a write is described by effects that are applied to
the cache only once its transaction committed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from whaleflux.shared.events import NodeRegistered

from .records import JobRecord, NodeCondition


@dataclass
class Cache:
    """Exact for one (epoch, token): a wiped or rebuilt store or a new lease starts a new one."""

    key: tuple[str | None, int]
    raw: dict[str, str] = field(default_factory=dict)  # job id -> its record's JSON as stored
    parsed: dict[str, JobRecord] = field(default_factory=dict)  # shared with the pass: never changed in place
    regs: dict[str, NodeRegistered] | None = None
    conditions: dict[str, NodeCondition] | None = None
    alloc: dict[str, str] | None = None
    # Bumped by every committed write; `written` holds, for each part written ("regs", "conditions",
    # "alloc", "job:<id>"), the write's number. A read from Redis fills a part of the cache only if that
    # part was not written meanwhile (its answer might predate that write): writes elsewhere, which go
    # on all the time under load, do not keep it from filling.
    gen: int = 0
    written: dict[str, int] = field(default_factory=dict)

    def fills(self, part: str, since: int) -> bool:
        """Whether a read of `part` begun at write number `since` may fill the cache."""
        return self.written.get(part, 0) <= since


Effect = Callable[[Cache], None]


def job_written(job_id: str, raw: str) -> Effect:
    def effect(c: Cache) -> None:
        c.written[f"job:{job_id}"] = c.gen
        c.raw[job_id] = raw
        c.parsed.pop(job_id, None)  # parsed again when a pass needs it
    return effect


def job_unknown(job_id: str) -> Effect:
    """The job's record is known only after EXEC (SET NX): read again when asked."""
    def effect(c: Cache) -> None:
        c.written[f"job:{job_id}"] = c.gen
        c.raw.pop(job_id, None)
        c.parsed.pop(job_id, None)
    return effect


def alloc_set(gpus: list[str], job_id: str | None) -> Effect:
    """The GPUs now held by `job_id` (None: released)."""
    def effect(c: Cache) -> None:
        c.written["alloc"] = c.gen
        if c.alloc is not None:
            for gpu in gpus:
                if job_id is None:
                    c.alloc.pop(gpu, None)
                else:
                    c.alloc[gpu] = job_id
    return effect


def condition_set(node_key: str, condition: NodeCondition | None) -> Effect:
    def effect(c: Cache) -> None:
        c.written["conditions"] = c.gen
        if c.conditions is not None:
            if condition is None:
                c.conditions.pop(node_key, None)
            else:
                c.conditions[node_key] = condition
    return effect


def registered(node_key: str, reg: NodeRegistered) -> Effect:
    def effect(c: Cache) -> None:
        c.written["regs"] = c.gen
        if c.regs is not None:
            c.regs[node_key] = reg
    return effect
