"""Which nodes are alive, by their heartbeats: healthy, suspect, or lost. Pure (no I/O, no clock).

A node silent for `suspect_after_s` takes no new work but keeps its jobs (a
brief blip is not a failure). Silent for `lost_after_s` it is lost and its jobs
move elsewhere, unless most nodes went silent together: then the fault is far
more likely on the scheduler's side (bus, network, its own pause) than on the
nodes, and moving every job would cause a storm: nothing is declared lost or
suspect, and placement goes on as if all were well. The guard remembers: when
such an episode ends (fewer are silent), the nodes still silent get
`lost_after_s` afresh before any is declared lost — they were silent for the
same reason as the rest, and are likely a moment from speaking again.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LivenessPolicy:
    suspect_after_s: float = 5.0
    lost_after_s: float = 10.0
    # More than this fraction of nodes silent at once: assume our side failed.
    mass_silence_fraction: float = 0.5


@dataclass(frozen=True)
class Liveness:
    suspect: frozenset[str] = frozenset()
    lost: frozenset[str] = frozenset()
    # Most of the fleet is silent: `held_back` are the silent nodes not acted on.
    mass_silence: bool = False
    held_back: frozenset[str] = frozenset()
    silent_ages: Mapping[str, float] = field(default_factory=dict)


def assess(last_seen: Mapping[str, float], now: float, since: float, policy: LivenessPolicy) -> Liveness:
    """Classify nodes by the age of their last heartbeat.

    `last_seen`: node -> time of its last heartbeat, for nodes
    not already declared lost (those left the fleet's count, so a fleet losing
    nodes one by one over days never looks like a mass silence); `since`: when
    this scheduler started watching. A node is never older than that, so a
    scheduler that was down does not blame the nodes for its own absence.
    """
    ages = {n: now - max(t, since) for n, t in last_seen.items()}
    silent = {n: a for n, a in ages.items() if a >= policy.suspect_after_s}
    over = frozenset(n for n, a in silent.items() if a >= policy.lost_after_s)
    if ages and len(silent) > policy.mass_silence_fraction * len(ages):
        return Liveness(mass_silence=True, held_back=frozenset(silent), silent_ages=silent)
    return Liveness(frozenset(silent) - over, over, silent_ages=silent)


def judged_from(registered: Iterable[str], heard: Mapping[str, float], registered_at: Mapping[str, float],
                out: Collection[str]) -> dict[str, float]:
    """node -> the time `assess` ages it from, for the registered nodes not `out` (lost or draining already).

    Its last heartbeat, or its registration if later (a registration is a sign of life too); a node never heard
    is judged by its registration, so one that registers and dies before its first heartbeat is found lost. A
    time not known (0: registered before this scheduler watched, never heard since) is `assess`'s `since`.
    """
    return {k: max(heard.get(k, 0.0), registered_at.get(k, 0.0)) for k in registered if k not in out}


def watch_start(in_storm: bool, live: Liveness, since: float, now: float) -> float:
    """When ages count from after this check: from now if a mass silence just ended, else as before."""
    return now if in_storm and not live.mass_silence else since
