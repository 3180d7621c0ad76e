"""Which replica of a scaled-out service runs what: partitions by node, and the one `main` unit. Pure: no I/O.

The telemetry stream stores each batch under `gpu.telemetry.<cluster>.<node>.<partition>` (a JetStream subject
transform, `streams.py`), the partition a hash of the node's tokens. A service run as several replicas
(`WHALEFLUX_SCALE_OUT=true`) splits its work into units:

- `p0` … `p<N-1>`: its partitioned consumers' partition k (one durable consumer per partition), so all of one
  GPU's samples, series and rule state are handled by one replica;
- `main`: everything else (its other consumers and its background loops), run by one replica at a time.

Every replica computes the same `assign` from the same list of live members and runs a unit only while it
holds that unit's lease (`partition_store.py`); `ownership.py` is the shell that does it.
"""

from __future__ import annotations

from collections.abc import Sequence

MAIN = "main"
# Partitions of the telemetry stream. Fixed for a deployment's life (the stream's subject transform): a service
# can run as up to this many replicas that share the work.
PARTITIONS = 8


def partition_unit(k: int) -> str:
    return f"p{k}"


def units(partitions: int = PARTITIONS) -> list[str]:
    """A scaled-out service's units: `main`, then one per partition."""
    return [MAIN, *(partition_unit(k) for k in range(partitions))]


def assign(unit_names: Sequence[str], members: Sequence[str]) -> dict[str, str]:
    """unit -> the member that should run it: `main` on the first member (by name), the partitions dealt in turn
    starting at the next one, so two replicas of a service with 8 partitions run 4 each, one of them also `main`.
    Deterministic: every member that sees the same members computes the same assignment."""
    ordered = sorted(set(members))
    if not ordered:
        return {}
    out: dict[str, str] = {}
    dealt = 1
    for unit in unit_names:
        if unit == MAIN:
            out[unit] = ordered[0]
        else:
            out[unit] = ordered[dealt % len(ordered)]
            dealt += 1
    return out


def fnv1a_32(data: bytes) -> int:
    h = 0x811C9DC5
    for byte in data:
        h ^= byte
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


def partition_of(cluster: str, node: str, partitions: int = PARTITIONS) -> int:
    """The partition nats-server's `{{partition(N,1,2)}}` puts a node's subject in (FNV-1a of the tokens
    joined), so a service can tell which nodes its partitions hold (tests check it against a real server)."""
    return fnv1a_32(f"{cluster}{node}".encode()) % partitions


def owned_partitions(owned_units: Sequence[str]) -> set[int]:
    return {int(unit[1:]) for unit in owned_units if unit != MAIN}


def moves(before: dict[str, str], after: dict[str, str]) -> Sequence[str]:
    """Units whose member changed between two assignments (what a join or a loss hands over)."""
    return sorted(unit for unit in set(before) | set(after) if before.get(unit) != after.get(unit))
