"""Trace simulator: replays a job CSV through the real queue and placement code on a virtual clock."""

from .engine import simulate
from .metrics import SimReport, TeamReport
from .workload import SimJob, read_jobs

__all__ = ["SimJob", "SimReport", "TeamReport", "read_jobs", "simulate"]
