"""Placement core: pure code, no I/O. Filters -> scorers -> select, configured by a `Profile`."""

from .cluster import ClusterState
from .framework import FIRST_FIT, Profile, explain_wait, place, place_on
from .model import (
    Decision,
    GpuState,
    Infeasible,
    Interconnects,
    JobRequest,
    ModelFacts,
    NodeShare,
    NodeState,
    Placement,
    Unschedulable,
)

__all__ = [
    "ClusterState", "Decision", "FIRST_FIT", "GpuState", "Infeasible", "Interconnects", "JobRequest",
    "ModelFacts", "NodeShare", "NodeState", "Placement", "Profile", "Unschedulable", "explain_wait",
    "place", "place_on",
]
