"""Trace simulator: replays a job CSV through the real queue and placement code on a virtual clock."""

from .engine import request_for, simulate
from .metrics import JobOutcome, SimReport, TeamReport
from .rules import LIVE, ExecutorRules
from .workload import SimJob, read_jobs, with_estimate_noise

__all__ = [
    "LIVE", "ExecutorRules", "JobOutcome", "SimJob", "SimReport", "TeamReport", "read_jobs", "request_for",
    "simulate", "with_estimate_noise",
]
