"""Per-class figures of two replays side by side: is any class of jobs worse off than under the baseline?

A class is one value of one dimension: GPU count, memory tier (the fleet's
GPU memory sizes: the smallest GPU a job fits), priority, team, workload
class, duration (on A100). For each: jobs, mean JCT, mean, p99 and max wait
(first start - submit) under both policies, and the ratios. A class is
worse off when its mean JCT is higher than the baseline's, or its longest
wait is longer by more than `WAIT_SLACK_S` (a start-up's worth: one pass,
one stop).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .metrics import JobOutcome, SimReport, percentile

WAIT_SLACK_S = 60.0
DURATION_BOUNDS_H = ((1.0, "< 1 h"), (6.0, "1-6 h"), (24.0, "6-24 h"), (float("inf"), ">= 24 h"))


@dataclass(frozen=True)
class ClassStats:
    jobs: int
    mean_jct_s: float
    mean_wait_s: float
    p99_wait_s: float
    max_wait_s: float


@dataclass(frozen=True)
class ClassRow:
    dimension: str
    value: str
    base: ClassStats
    other: ClassStats

    @property
    def jct_ratio(self) -> float:
        return self.other.mean_jct_s / self.base.mean_jct_s if self.base.mean_jct_s else 1.0

    @property
    def max_wait_ratio(self) -> float:
        if self.base.max_wait_s <= 0:
            return 1.0 if self.other.max_wait_s <= WAIT_SLACK_S else float("inf")
        return self.other.max_wait_s / self.base.max_wait_s

    @property
    def worse(self) -> bool:
        """Worse off than under the baseline on mean JCT or on the longest wait."""
        return self.jct_ratio > 1.0 or self.other.max_wait_s > self.base.max_wait_s + WAIT_SLACK_S


def _gpus(o: JobOutcome) -> str:
    return "1" if o.gpus == 1 else "2-4" if o.gpus <= 4 else "5-8" if o.gpus <= 8 else "> 8"


def _duration(o: JobOutcome) -> str:
    return next(label for bound, label in DURATION_BOUNDS_H if o.duration_s / 3600 < bound)


def _memory(tiers: tuple[float, ...]) -> Callable[[JobOutcome], str]:
    def tier(o: JobOutcome) -> str:
        fits = next((t for t in tiers if o.min_vram_gb <= t), None)
        return f"<= {fits:.0f} GB" if fits is not None else f"> {tiers[-1]:.0f} GB" if tiers else "any"
    return tier


def dimensions(tiers: tuple[float, ...]) -> list[tuple[str, Callable[[JobOutcome], str]]]:
    """The class dimensions and how each names a job's class."""
    return [
        ("GPUs", _gpus), ("memory", _memory(tiers)), ("priority", lambda o: o.priority), ("team", lambda o: o.team),
        ("workload", lambda o: o.workload_class), ("duration", _duration),
    ]


def stats(outcomes: Sequence[JobOutcome]) -> ClassStats:
    """Figures of the finished jobs among `outcomes`."""
    done = [o for o in outcomes if o.finish_s is not None and o.first_start_s is not None]
    jct = [o.finish_s - o.submit_s for o in done if o.finish_s is not None]
    waits = sorted(o.first_start_s - o.submit_s for o in done if o.first_start_s is not None)
    n = len(done)
    return ClassStats(n, sum(jct) / n if n else 0.0, sum(waits) / n if n else 0.0, percentile(waits, 99),
                      waits[-1] if waits else 0.0)


def class_rows(base: SimReport, other: SimReport) -> list[ClassRow]:
    """Every class of every dimension, the baseline's figures beside the other policy's."""
    rows = []
    for dim, name_of in dimensions(base.memory_tiers_gb or other.memory_tiers_gb):
        groups: dict[str, tuple[list[JobOutcome], list[JobOutcome]]] = defaultdict(lambda: ([], []))
        for o in base.outcomes:
            groups[name_of(o)][0].append(o)
        for o in other.outcomes:
            groups[name_of(o)][1].append(o)
        for value in sorted(groups, key=_natural):
            b, x = groups[value]
            rows.append(ClassRow(dim, value, stats(b), stats(x)))
    return rows


def _natural(value: str) -> tuple[int, str]:
    digits = "".join(c for c in value if c.isdigit())
    return (int(digits) if digits else 0, value)


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def table(rows: Sequence[ClassRow], base: str, other: str) -> list[list[str]]:
    """Header and one line per class: jobs, mean JCT, mean/p99/max wait (h) for both, the ratios."""
    head = ["class", "jobs", f"JCT {base}", f"JCT {other}", "JCT ratio", f"wait mean/p99/max {base}",
            f"wait mean/p99/max {other}", "max wait ratio", "worse"]
    out = [head]
    for r in rows:
        waits = [f"{_h(s.mean_wait_s)} / {_h(s.p99_wait_s)} / {_h(s.max_wait_s)}" for s in (r.base, r.other)]
        out.append([f"{r.dimension} {r.value}", str(r.base.jobs), _h(r.base.mean_jct_s), _h(r.other.mean_jct_s),
                    f"{r.jct_ratio:.2f}", *waits, f"{r.max_wait_ratio:.2f}", "WORSE" if r.worse else ""])
    return out
