"""The attempts a report charges, as columns: one list per tag, no object per attempt. Pure, no I/O.

A million-interval report charges a quarter of a million attempts; one `JobInfo`
per attempt, made to be looked up once and read for one tag, cost more than the
overlap cut. `Attempts` keeps the tags as the ledger's columns hand them over
(`usage.UsageColumns.jobs`) and reads as a mapping of attempt key to `JobInfo`,
made on each lookup, for the code that asks for one attempt.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from itertools import compress
from operator import attrgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from .columns import I64, codes

__all__ = ["Attempts", "JobInfo"]


@dataclass(slots=True)
class JobInfo:
    """An attempt's tags. Not frozen (never changed once made, though): a frozen dataclass's `__init__` costs
    four times as much."""

    job_id: str
    attempt: int
    team: str
    project: str
    model: str
    running: bool = False  # not ended yet: held up to the report's end


TAGS = ("job_id", "attempt", "team", "project", "model", "running")


@dataclass(frozen=True, eq=False)
class Attempts(Mapping[str, JobInfo]):
    """Attempt `names[i]` (`"<job_id>:<attempt>"`, distinct) has the tags at index `rows[i]` (i without `rows`)
    of each column: a report's attempts in its intervals' order read the ledger's columns where they lie."""

    names: list[str]
    job_id: list[str]
    attempt: list[int]
    team: list[str]
    project: list[str]
    model: list[str]
    running: list[bool]
    rows: I64 | None = None

    @classmethod
    def of(cls, jobs: Mapping[str, JobInfo], names: list[str] | None = None) -> Attempts:
        """The attempts `names` (every one of `jobs` by default), in that order."""
        if isinstance(jobs, Attempts):
            return jobs if names is None else jobs.pick(names)
        names = list(jobs) if names is None else names
        infos = list(map(jobs.__getitem__, names))
        job_id, attempt, team, project, model, running = (list(map(attrgetter(tag), infos)) for tag in TAGS)
        return cls(names, job_id, attempt, team, project, model, running)

    @cached_property
    def index(self) -> dict[str, int]:
        return dict(zip(self.names, range(len(self.names)), strict=True))

    def __getitem__(self, key: str) -> JobInfo:
        return self.info(self.index[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, key: object) -> bool:
        return key in self.index

    def info(self, i: int) -> JobInfo:
        r = i if self.rows is None else int(self.rows[i])
        return JobInfo(self.job_id[r], self.attempt[r], self.team[r], self.project[r], self.model[r],
                       self.running[r])

    def infos(self) -> list[JobInfo]:
        if self.rows is None:
            return list(map(JobInfo, self.job_id, self.attempt, self.team, self.project, self.model, self.running))
        return list(map(self.info, range(len(self))))

    def column(self, tag: str) -> list[Any]:
        """One tag (`TAGS`) of every attempt, in order."""
        if tag not in TAGS:
            raise KeyError(tag)
        values: list[Any] = getattr(self, tag)
        return values if self.rows is None else list(map(values.__getitem__, self.rows.tolist()))

    def array(self, tag: str) -> npt.NDArray[Any]:
        """A numeric tag (attempt, running) of every attempt, in order."""
        if tag not in TAGS:
            raise KeyError(tag)
        values = np.asarray(getattr(self, tag))
        return values if self.rows is None else values[self.rows]

    def codes(self, tag: str) -> tuple[list[Any], I64]:
        """The distinct values of one tag, and each attempt's index among them."""
        names, code = codes(getattr(self, tag))
        if self.rows is None:
            return names, code
        code = code[self.rows]
        used = np.bincount(code, minlength=len(names)) > 0
        if used.all():
            return names, code
        return list(compress(names, used.tolist())), (np.cumsum(used) - 1)[code]

    def pick(self, names: list[str]) -> Attempts:
        """The attempts `names`, in that order (itself when that is its own order)."""
        if names is self.names or names == self.names:
            return self
        at = np.fromiter(map(self.index.__getitem__, names), np.int64, len(names))
        return self.view(names, at if self.rows is None else self.rows[at])

    def view(self, names: list[str], rows: I64) -> Attempts:
        """The attempts `names`, attempt i at row `rows[i]` of the same columns."""
        return Attempts(names, self.job_id, self.attempt, self.team, self.project, self.model, self.running, rows)
