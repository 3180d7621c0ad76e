"""Is this telemetry batch new, a duplicate, out of order, or the first after an agent restart? No I/O.

An agent numbers its batches per node from 1 each time it starts, so a
sequence number lower than the last one is not by itself an error: if the
sample time is newer than the last stored one, the agent restarted. A batch
whose sequence number and sample time are both not newer than what is stored
is a duplicate (same seq) or arrived out of order.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Verdict(str, Enum):
    NEW = "new"
    RESTART = "seq_reset"
    DUPLICATE = "duplicate_seq"
    OUT_OF_ORDER = "out_of_order"


@dataclass(frozen=True)
class Last:
    seq: int
    t: float  # sample time, epoch seconds

    def encode(self) -> str:
        return f"{self.seq} {self.t}"

    @classmethod
    def decode(cls, raw: str) -> "Last":
        seq, t = raw.split()
        return cls(int(seq), float(t))


def judge(last: Last | None, seq: int, t: float) -> Verdict:
    """Classify a batch with (`seq`, sample time `t`) given the node's last stored one."""
    if last is None or seq > last.seq and t >= last.t:
        return Verdict.NEW
    if t > last.t:
        return Verdict.RESTART if seq <= last.seq else Verdict.NEW
    return Verdict.DUPLICATE if seq == last.seq else Verdict.OUT_OF_ORDER
